"""The node agent's shell: NVML, the kubelet's device-plugin socket and the Node it writes."""
