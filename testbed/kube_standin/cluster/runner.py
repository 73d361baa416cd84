"""The stand-in control plane and kubelets as one asyncio component."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kube_standin.cluster.claims import ClaimController
from kube_standin.cluster.deployments import DeploymentController
from kube_standin.cluster.events import EventRecorder
from kube_standin.cluster.kubelet import DraNodeClient, KubeletLoop, PluginManagerClient
from kube_standin.cluster.scheduler import Scheduler, SchedulerConfig
from kube_standin.cluster.taint_eviction import TaintEvictionController
from plumbing.backoff import Backoff
from plumbing.kube import AlreadyExists, ApiError, KubeClient
from plumbing.kube.informer import Informer
from plumbing.kube.resources import (
    DEPLOYMENTS,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULE_VERSIONS,
    DEVICE_TAINT_RULES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    Resource,
)
from plumbing.logs import get_logger

__all__ = ["NodeSpec", "StandInCluster"]

log = get_logger(__name__)


@dataclass
class NodeSpec:
    """A node the stand-in kubelet runs: registered as a Node object if missing."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    #: the kubelet's plugin registry dir (``<driver>-reg.sock`` sockets); None: no DRA plugins
    registry_dir: Path | None = None


class StandInCluster:
    """Deployment, ResourceClaim and device-taint eviction controllers, the scheduler, and one
    kubelet per node."""

    def __init__(
        self,
        kube: KubeClient,
        nodes: list[NodeSpec],
        *,
        scheduler: SchedulerConfig | None = None,
        client_factory: Callable[[NodeSpec], DraNodeClient] | None = None,
    ) -> None:
        self.kube = kube
        self.node_specs = nodes
        host = socket.gethostname()

        informer = self._make_informer

        self.pods = informer(PODS)
        self.nodes = informer(NODES)
        self.claims = informer(RESOURCE_CLAIMS)
        self.templates = informer(RESOURCE_CLAIM_TEMPLATES)
        self.slices = informer(RESOURCE_SLICES)
        self.classes = informer(DEVICE_CLASSES)
        self.deployments = informer(DEPLOYMENTS)
        self._informers = [
            self.pods,
            self.nodes,
            self.claims,
            self.templates,
            self.slices,
            self.classes,
            self.deployments,
        ]
        self.deployment_controller = DeploymentController(
            kube, self.deployments, self.pods, EventRecorder(kube, "deployment-controller", host)
        )
        self.claim_controller = ClaimController(
            kube,
            self.pods,
            self.claims,
            self.templates,
            EventRecorder(kube, "resource-claim-controller", host),
        )
        self.taint_eviction = TaintEvictionController(
            kube,
            self.pods,
            self.claims,
            self.slices,
            EventRecorder(kube, "device-taint-eviction-controller", host),
        )
        self.scheduler = Scheduler(
            kube,
            pods=self.pods,
            nodes=self.nodes,
            claims=self.claims,
            slices=self.slices,
            classes=self.classes,
            events=EventRecorder(kube, "default-scheduler", host),
            config=scheduler,
        )
        make_client = client_factory or _registry_client
        self.kubelets = [
            KubeletLoop(
                kube,
                spec.name,
                self.pods,
                self.claims,
                make_client(spec),
                EventRecorder(kube, "kubelet", spec.name),
            )
            for spec in nodes
        ]
        self.ready = asyncio.Event()

    def _make_informer(self, resource: Resource) -> Informer:
        # A test control plane: after an API error, list again soon rather than back off far.
        return Informer(self.kube, resource, backoff=Backoff(initial=0.2, maximum=5.0))

    async def watch_taint_rules(self) -> None:
        """Where the API server serves DeviceTaintRules (gate DRADeviceTaintRules), the scheduler and
        the eviction controller read them too, in the newest version served."""
        for version in DEVICE_TAINT_RULE_VERSIONS:
            try:
                listing = await self.kube.request("GET", f"/apis/{DEVICE_TAINT_RULES.group}/{version}")
            except ApiError:
                continue
            if any(r.get("name") == DEVICE_TAINT_RULES.plural for r in listing.get("resources") or []):
                rules = self._make_informer(DEVICE_TAINT_RULES.with_version(version))
                self._informers.append(rules)
                self.scheduler.rules = self.taint_eviction.rules = rules
                log.info("DeviceTaintRules served: the scheduler and the eviction read them", version=version)
                return

    async def register_nodes(self) -> None:
        for spec in self.node_specs:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": spec.name,
                    "labels": {"kubernetes.io/hostname": spec.name, **spec.labels},
                },
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
            }
            with contextlib.suppress(AlreadyExists):
                await self.kube.create(NODES, node)
                log.info("node registered", node=spec.name)

    async def run(self) -> None:
        await self.register_nodes()
        await self.watch_taint_rules()
        async with asyncio.TaskGroup() as group:
            for informer in self._informers:
                group.create_task(informer.run())
            for informer in self._informers:
                await informer.synced.wait()
            group.create_task(self.deployment_controller.run())
            group.create_task(self.claim_controller.run())
            group.create_task(self.taint_eviction.run())
            group.create_task(self.scheduler.run())
            for kubelet in self.kubelets:
                group.create_task(kubelet.run())
            self.ready.set()
            log.info("stand-in control plane running", nodes=[s.name for s in self.node_specs])


class _NoPlugins:
    async def prepare(self, driver: str, claims: object) -> dict[str, str]:
        raise OSError(f"no plugin registry dir configured; cannot reach driver {driver}")

    async def unprepare(self, driver: str, claims: object) -> dict[str, str]:
        raise OSError(f"no plugin registry dir configured; cannot reach driver {driver}")

    async def close(self) -> None:
        return None


def _registry_client(spec: NodeSpec) -> DraNodeClient:
    if spec.registry_dir is None:
        return _NoPlugins()
    return PluginManagerClient(spec.registry_dir)
