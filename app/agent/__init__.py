"""The node agent (``schedext agent``): NVML, the kubelet's device plugin and the Node's
annotations, a shell around the pure decisions of :mod:`extender.devices`."""
