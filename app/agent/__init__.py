"""The node agent (schedext agent): NVML, the Node documents and the kubelet device plugin."""
