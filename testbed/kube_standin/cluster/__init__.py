"""A stand-in Kubernetes control plane and kubelet for the local demo and the tests.

It runs against the API test server (or any API server) over HTTP with
:class:`plumbing.kube.KubeClient`: a Deployment controller, the ResourceClaim controller,
the device-taint eviction controller, a scheduler that allocates devices with
:mod:`dra_driver.selection` (the code behind ``fabric-dra explain``), and one kubelet per node
that calls the node's DRA plugins over their unix sockets. Start it in-process with
:class:`StandInCluster`, or as a process with ``python -m kube_standin.cluster``.
"""

from kube_standin.cluster.kubelet import KUBELET_FINALIZER, ClaimRef, DraNodeClient, PluginManagerClient
from kube_standin.cluster.runner import NodeSpec, StandInCluster
from kube_standin.cluster.scheduler import SchedulerConfig

__all__ = [
    "KUBELET_FINALIZER",
    "ClaimRef",
    "DraNodeClient",
    "NodeSpec",
    "PluginManagerClient",
    "SchedulerConfig",
    "StandInCluster",
]
