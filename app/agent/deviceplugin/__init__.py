"""The kubelet device-plugin API, as generated from the upstream proto."""
