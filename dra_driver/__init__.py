"""fabric-dra's Kubernetes side: the kubelet plugin, the ResourceSlice controller, the scheduler's
device selection (for ``explain``) and the kubelet's protocol bindings."""
