"""Wiring of ``fabric-dra controller``: leader election around the publisher, the node labeller
and (with ``--binding-conditions``) the claim binder, plus the probe endpoint.

Only the leader reads the inventory and writes; a follower waits on the Lease. Losing the lease
cancels every writer at once (the elector steps down before the lease can expire for others).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from dra_driver.controller.binding_conditions import ClaimBinder
from dra_driver.controller.devices import PublishPolicy
from dra_driver.controller.features import (
    CounterLayout,
    KeptFields,
    ResourceApiMissing,
    TaintsMode,
    probe_counter_layout,
    probe_slice_fields,
    require_resource_v1,
)
from dra_driver.controller.health import HealthServer
from dra_driver.controller.inventory_feed import FeedMode, InventoryFeed
from dra_driver.controller.metrics import IS_LEADER
from dra_driver.controller.nodelabels import NodeLabeler
from dra_driver.controller.pluginpods import PluginNodes
from dra_driver.controller.publisher import SlicePublisher
from dra_driver.controller.quarantine import ManagerCounts, Quarantine, QuarantineEvents
from manager_api.client import ManagerClient
from plumbing.backoff import Backoff
from plumbing.fsutil import atomic_write
from plumbing.kube import ApiError, KubeClient
from plumbing.kube.events import EventRecorder
from plumbing.kube.leader import LeaderElector
from plumbing.logs import get_logger

__all__ = ["Controller", "ControllerOptions", "default_identity"]

log = get_logger(__name__)


def default_identity() -> str:
    """The pod name in a cluster (POD_NAME from the downward API), else host + pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class ControllerOptions:
    driver: str
    publisher: str = "default"
    leader_elect: bool = False
    lease_name: str = "fabric-dra-controller"
    lease_namespace: str = "default"
    identity: str = ""
    binding_conditions: bool = False
    device_taints: TaintsMode = "auto"
    #: publish bindsToNode without binding conditions: "auto" where the API server keeps it
    binds_to_node: TaintsMode = "auto"
    resync_period: float = 300.0
    #: "changes": the manager's change feed after one full read; "full": every change read whole
    inventory_feed: FeedMode = "changes"
    bind_timeout: float = 300.0
    busy_timeout: float = 30.0
    release_grace: float = 30.0
    #: consecutive failed attaches that take a device out of allocation
    quarantine_after: int = 3
    #: how long a device stays out the first time (doubling each time after, up to 1 h)
    quarantine_seconds: float = 60.0
    host: str = "0.0.0.0"  # noqa: S104 - probes reach the pod IP
    port: int = 8081
    ready_file: str | None = None
    #: label selector of the kubelet plugin's pods; set, nodes are labelled only where one is Ready
    plugin_pod_selector: str | None = None
    plugin_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


class Controller:
    def __init__(self, options: ControllerOptions, kube: KubeClient, manager: ManagerClient) -> None:
        self.options = options
        self.kube = kube
        self.manager = manager
        self.identity = options.identity or default_identity()
        self._ready = False
        self._leader = False
        self._lead_task: asyncio.Task[None] | None = None
        self.feed: InventoryFeed | None = None
        self.publisher: SlicePublisher | None = None
        self.binder: ClaimBinder | None = None
        self.url = ""
        #: what the API server keeps, found out once per process (a dry-run write)
        self._kept: KeptFields | None = None
        self._counters: CounterLayout | None = None

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        feed, publisher = self.feed, self.publisher
        return {
            "identity": self.identity,
            "driver": self.options.driver,
            "publisher": self.options.publisher,
            "leader": self._leader,
            "inventoryVersion": feed.latest.version if feed and feed.latest else None,
            "inventoryError": feed.last_error if feed else None,
            "inventoryResyncs": feed.resyncs if feed else None,
            "slicesSyncedVersion": publisher.synced_version if publisher else None,
            "deviceTaints": publisher.policy.device_taints if publisher else None,
            "bindingConditions": publisher.policy.binding_conditions if publisher else None,
            "bindsToNode": (
                publisher.policy.binds_to_node or publisher.policy.binding_conditions if publisher else None
            ),
            "partitions": publisher.policy.counters.value if publisher else None,
            "memoryShares": publisher.policy.shares if publisher else None,
        }

    # -- lifecycle ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        health = HealthServer(ready=lambda: self._ready, status=self.status)
        self.url = await health.start(self.options.host, self.options.port)
        log.info("controller listening for probes and metrics", url=self.url, identity=self.identity)
        try:
            await self._wait_for_api(stop)
            if stop.is_set():
                return
            self._ready = True
            if self.options.ready_file:
                atomic_write(self.options.ready_file, self.url + "\n", durable=False)
            if self.options.leader_elect:
                elector = LeaderElector(
                    self.kube,
                    name=self.options.lease_name,
                    namespace=self.options.lease_namespace,
                    identity=self.identity,
                    lease_duration=self.options.lease_duration,
                    renew_deadline=self.options.renew_deadline,
                    retry_period=self.options.retry_period,
                    on_change=self._on_leadership,
                )
                election = asyncio.create_task(elector.run())
                await stop.wait()
                election.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await election
            else:
                await self._on_leadership(True)
                await stop.wait()
            await self._on_leadership(False)
        finally:
            await health.stop()

    async def _wait_for_api(self, stop: asyncio.Event) -> None:
        """Until the API server answers and serves resource.k8s.io/v1; a missing API is fatal."""
        backoff = Backoff(initial=0.5, maximum=10.0)
        while not stop.is_set():
            try:
                await require_resource_v1(self.kube)
                return
            except ResourceApiMissing:
                raise
            except ApiError as err:
                delay = backoff.next()
                log.warning("Kubernetes API not reachable yet", error=str(err), retry_in=round(delay, 2))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _on_leadership(self, leading: bool) -> None:
        self._leader = leading
        IS_LEADER.set(1 if leading else 0)
        if leading and (self._lead_task is None or self._lead_task.done()):
            self._lead_task = asyncio.create_task(self._lead())
        elif not leading and self._lead_task is not None:
            self._lead_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._lead_task
            self._lead_task = None

    async def _lead(self) -> None:
        """Run every writer while leading; an unexpected failure restarts them after a pause."""
        backoff = Backoff(initial=1.0, maximum=30.0)
        while True:
            started = time.monotonic()
            try:
                await self._lead_once()
            except Exception as err:
                delay = backoff.next()
                log.exception(
                    "controller loop failed; restarting it", error=str(err), retry_in=round(delay, 2)
                )
                if time.monotonic() - started > 60:
                    backoff.reset()
                await asyncio.sleep(delay)

    async def _kept_fields(self) -> KeptFields:
        """What the API server keeps of taints and bindsToNode; asked and logged once."""
        if self._kept is None:
            self._kept = await probe_slice_fields(self.kube, self.options.driver)
            log.info(
                "API server features decided",
                device_taints="kept" if self._kept.taints else "dropped (unhealthy devices are withheld)",
                binds_to_node="kept" if self._kept.binds_to_node else "dropped",
                how=self._kept.source,
                device_taints_mode=self.options.device_taints,
                binds_to_node_mode=self.options.binds_to_node,
            )
        return self._kept

    async def _counter_layout(self) -> CounterLayout:
        """Where the API server wants GPU partitions' counters, if anywhere; asked and logged once,
        with what partitions can do in this mode."""
        if self._counters is None:
            self._counters = await probe_counter_layout(self.kube, self.options.driver)
            if self._counters is CounterLayout.OFF:
                log.warning(
                    "the API server drops shared counters (feature gate DRAPartitionableDevices is off): "
                    "GPUs are published whole, without partitions"
                )
            elif not self.options.binding_conditions:
                log.warning(
                    "without --binding-conditions, GPU partitions are offered only of GPUs already on a "
                    "node (holding partitions there, or kept warm there), in that node's slice; a free GPU "
                    "is offered whole: run with --binding-conditions so the first partition claim can "
                    "bring a GPU to its node (docs/controller.md, 'GPU partitions')"
                )
            log.info("GPU partition counters decided", layout=self._counters.value)
        return self._counters

    async def _lead_once(self) -> None:
        opts = self.options
        kept = await self._kept_fields()
        counters = await self._counter_layout()
        if not kept.shares:
            log.warning(
                "the API server drops allowMultipleAllocations (feature gate DRAConsumableCapacity is "
                "off): memory pools that make chunks on demand are not published"
            )
        taints = kept.taints if opts.device_taints == "auto" else opts.device_taints == "on"
        binds = kept.binds_to_node if opts.binds_to_node == "auto" else opts.binds_to_node == "on"
        policy = PublishPolicy(
            driver=opts.driver,
            device_taints=taints,
            binding_conditions=opts.binding_conditions,
            binds_to_node=binds,
            publisher=opts.publisher,
            evict_quarantined=not opts.binding_conditions,
            counters=counters,
            shares=kept.shares,
        )
        log.info(
            "leading: publishing resource slices",
            driver=opts.driver,
            device_taints=taints,
            binds_to_node=binds or opts.binding_conditions,
            binding_conditions=opts.binding_conditions,
        )
        self.feed = InventoryFeed(self.manager, mode=opts.inventory_feed)
        quarantine = Quarantine(
            threshold=opts.quarantine_after,
            initial=opts.quarantine_seconds,
            on_change=lambda: self.publisher.trigger() if self.publisher else None,
        )
        self.publisher = SlicePublisher(self.kube, policy, quarantine=quarantine)
        plugin_nodes = (
            PluginNodes(self.kube, namespace=opts.plugin_namespace, selector=opts.plugin_pod_selector)
            if opts.plugin_pod_selector
            else None
        )
        labeler = NodeLabeler(self.kube, opts.driver, publisher=opts.publisher, plugin_nodes=plugin_nodes)
        events = EventRecorder(self.kube, controller=f"{opts.driver}/controller", instance=self.identity)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self.feed.run())
            tasks.create_task(self.publisher.run(self.feed, resync_period=opts.resync_period))
            # labels follow what is published, not the inventory: a pod steered to a warm node must
            # find the node-local slice there
            tasks.create_task(labeler.run(self.publisher.published))
            if not opts.binding_conditions:
                # The plugin attaches at prepare time: only the manager sees the failures.
                noticer = QuarantineEvents(self.kube, events, opts.driver)
                tasks.create_task(ManagerCounts(self.feed, quarantine, noticer.record).run())
            if opts.binding_conditions:
                self.binder = ClaimBinder(
                    self.kube,
                    self.manager,
                    self.feed,
                    driver=opts.driver,
                    bind_timeout=opts.bind_timeout,
                    busy_timeout=opts.busy_timeout,
                    release_grace=opts.release_grace,
                    quarantine=quarantine,
                    events=events,
                )
                tasks.create_task(self.binder.run())
