"""Software stand-ins for what a laptop or CI machine lacks: a Redfish composable fabric, and the
pieces of a Kubernetes control plane and kubelet that the local demo and the tests need."""
