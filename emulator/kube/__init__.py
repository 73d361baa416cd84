"""Stand-ins for the parts of Kubernetes fabric-dra talks to, for tests and the local demo:
an API server (:mod:`emulator.kube.apiserver`) and the kubelet's plugin-registration and
DRA client side (:mod:`emulator.kube.kubelet`). See docs/testing.md."""

__all__: list[str] = []
