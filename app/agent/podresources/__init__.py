"""The kubelet PodResources API, as generated from the upstream proto."""
