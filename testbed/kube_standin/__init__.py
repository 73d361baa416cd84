"""Stand-ins for the parts of Kubernetes fabric-dra talks to, for tests, benchmarks and the demo:
an API server (:mod:`kube_standin.apiserver`), the kubelet's plugin-registration and DRA client
side (:mod:`kube_standin.kubelet_client`), and a control plane with kubelets
(:mod:`kube_standin.cluster`). See docs/testing.md."""
