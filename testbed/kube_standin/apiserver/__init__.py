"""Stand-ins for the parts of Kubernetes fabric-dra talks to, for tests and the local demo:
an API server (:mod:`kube_standin.apiserver.app`) and the kubelet's plugin-registration and
DRA client side (:mod:`kube_standin.kubelet_client`). See docs/testing.md."""

__all__: list[str] = []
