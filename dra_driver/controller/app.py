"""Wiring of ``fabric-dra controller``: leader election around the publisher, the node labeller
and (with ``--binding-conditions``) the claim binder, plus the probe endpoint.

Only the leader reads the inventory and writes; a follower waits on the Lease. Losing the lease
cancels every writer at once (the elector steps down before the lease can expire for others).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from dra_driver.controller.binding_conditions import ClaimBinder
from dra_driver.controller.devices import PublishPolicy
from dra_driver.controller.drainrules import DrainRules
from dra_driver.controller.features import (
    CounterLayout,
    KeptFields,
    ResourceApiMissing,
    TaintsMode,
    device_taint_rules_version,
    probe_counter_layout,
    probe_slice_fields,
    require_resource_v1,
)
from dra_driver.controller.health import HealthServer
from dra_driver.controller.linktaints import LinkTaints
from dra_driver.controller.managers import Fleet, ManagerGate
from dra_driver.controller.metrics import INVENTORY_VERSION, IS_LEADER
from dra_driver.controller.nodelabels import NodeLabeler
from dra_driver.controller.pluginpods import PluginNodes
from dra_driver.controller.publisher import SlicePublisher
from dra_driver.controller.quarantine import ManagerCounts, Quarantine, QuarantineEvents
from dra_driver.controller.resourcenames import publisher_of
from dra_driver.linkerrors import ErrorThresholds
from manager_api.client import ManagerClient
from manager_api.feed import FeedMode, InventoryFeed
from manager_api.fleet import ManagerEndpoint
from manager_api.models import Inventory
from plumbing.backoff import Backoff
from plumbing.fsutil import atomic_write
from plumbing.kube import ApiError, KubeClient
from plumbing.kube.events import EventRecorder
from plumbing.kube.leader import LeaderElector
from plumbing.logs import get_logger

__all__ = ["Controller", "ControllerOptions", "default_identity"]

log = get_logger(__name__)


#: the controller's defaults for the link-errors taint: stricter than the plugin's health verdict
CONTROLLER_LINK_THRESHOLDS = ErrorThresholds(
    correctable_per_minute=10.0, window_seconds=60.0, sustain_seconds=300.0, recover_seconds=600.0
)


def _gauge_version(inventory: Inventory) -> None:
    """What the controller does with each inventory its feed reads, beyond keeping it."""
    INVENTORY_VERSION.set(inventory.version)


def default_identity() -> str:
    """The pod name in a cluster (POD_NAME from the downward API), else host + pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


@dataclass
class _Fabric:
    """One manager's writers while leading."""

    gate: ManagerGate
    publisher: SlicePublisher
    binder: ClaimBinder | None = None

    def status(self) -> dict[str, Any]:
        gate, publisher = self.gate, self.publisher
        return {
            "up": gate.up,
            "publisher": publisher.policy.publisher,
            "pools": sorted(p.pool for p in gate.latest.pools) if gate.latest else [],
            "inventoryVersion": gate.feed.latest.version if gate.feed.latest else None,
            "inventoryError": gate.feed.last_error,
            "slicesSyncedVersion": publisher.synced_version,
        }


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
    #: drains as DeviceTaintRules ("rules"), slice taints ("slices"), or rules where served ("auto")
    drain_taints: str = "auto"
    #: the effect of the link-errors taint, and when a link's errors earn it
    link_taint_effect: str = "NoSchedule"
    link_thresholds: ErrorThresholds = CONTROLLER_LINK_THRESHOLDS
    host: str = "0.0.0.0"  # noqa: S104 - probes reach the pod IP
    port: int = 8081
    ready_file: str | None = None
    #: label selector of the kubelet plugin's pods; set, nodes are labelled only where one is Ready
    plugin_pod_selector: str | None = None
    plugin_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    #: a manager whose inventory has been unreadable this long has its pools' devices tainted
    manager_down_grace: float = 30.0


class Controller:
    def __init__(
        self,
        options: ControllerOptions,
        kube: KubeClient,
        managers: list[tuple[ManagerEndpoint, ManagerClient]],
    ) -> None:
        """``managers``: every fabric manager with its client, in the order that decides which
        keeps a pool two of them report (:class:`~manager_api.fleet.PoolOwners`)."""
        self.options = options
        self.kube = kube
        self.managers = managers
        self.identity = options.identity or default_identity()
        self._ready = False
        self._leader = False
        self._lead_task: asyncio.Task[None] | None = None
        #: each manager's writers while leading, by manager name ("" for --manager-url's)
        self.fabrics: dict[str, _Fabric] = {}
        self.fleet: Fleet | None = None
        self.url = ""
        #: what the API server keeps, found out once per process (a dry-run write)
        self._kept: KeptFields | None = None
        self._counters: CounterLayout | None = None
        #: the version of resource.k8s.io the drain rules are written in; None: drains are slice taints
        self._rules_version: str | None = None

    # -- status -------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        first = next(iter(self.fabrics.values()), None)
        feed = first.gate.feed if first else None
        publisher = first.publisher if first else None
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
            "managers": {
                endpoint.label: self.fabrics[endpoint.name].status()
                for endpoint, _ in self.managers
                if endpoint.name in self.fabrics
            },
            "drainTaints": (
                f"rules ({self._rules_version})"
                if self._rules_version
                else "slices"
                if self.fabrics
                else None
            ),
            "linkTaintEffect": self.options.link_taint_effect,
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

    async def _drain_rules_version(self) -> str | None:
        """The version of resource.k8s.io to write drain rules in, or None for slice taints (then
        the rules this controller wrote before, under another mode, are deleted)."""
        mode = self.options.drain_taints
        version = await device_taint_rules_version(self.kube)
        if mode == "slices":
            if version is not None:
                await self._drop_drain_rules(version)
            return None
        if version is None and mode == "rules":
            log.error(
                "--drain-taints rules, but the API server serves no devicetaintrules (feature gate "
                "DRADeviceTaintRules, and in 1.36 --runtime-config resource.k8s.io/v1beta2=true): "
                "drains are published as slice taints"
            )
        log.info(
            "drain taints decided",
            path=f"DeviceTaintRule {version}" if version else "slice taints",
            mode=mode,
        )
        return version

    async def _drop_drain_rules(self, version: str) -> None:
        """Delete the drain rules of this controller's publishers (one per manager): drains are
        slice taints now."""
        opts, deleted = self.options, 0
        for endpoint, _ in self.managers:
            publisher = publisher_of(opts.publisher, endpoint.name) if endpoint.name else opts.publisher
            rules = DrainRules(self.kube, driver=opts.driver, publisher=publisher, version=version)
            try:
                deleted += await rules.sync(Inventory(version=0, pools=[], devices=[], nodes=[]))
            except ApiError as err:
                log.warning(
                    "cannot delete this controller's drain DeviceTaintRules", error=str(err).splitlines()[0]
                )
                return
        if deleted:
            log.info(
                "drains are slice taints (--drain-taints slices): own DeviceTaintRules deleted", rules=deleted
            )

    async def _policy(self) -> PublishPolicy:
        """What every publisher writes, from the options and what the API server keeps."""
        opts = self.options
        kept = await self._kept_fields()
        self._rules_version = await self._drain_rules_version()
        counters = await self._counter_layout()
        if not kept.shares:
            log.warning(
                "the API server drops allowMultipleAllocations (feature gate DRAConsumableCapacity is "
                "off): memory pools that make chunks on demand are not published"
            )
        taints = kept.taints if opts.device_taints == "auto" else opts.device_taints == "on"
        binds = kept.binds_to_node if opts.binds_to_node == "auto" else opts.binds_to_node == "on"
        log.info(
            "leading: publishing resource slices",
            driver=opts.driver,
            device_taints=taints,
            binds_to_node=binds or opts.binding_conditions,
            binding_conditions=opts.binding_conditions,
            managers=",".join(e.label for e, _ in self.managers),
        )
        return PublishPolicy(
            driver=opts.driver,
            device_taints=taints,
            binding_conditions=opts.binding_conditions,
            binds_to_node=binds,
            publisher=opts.publisher,
            evict_quarantined=not opts.binding_conditions,
            counters=counters,
            shares=kept.shares,
            link_taint_effect=opts.link_taint_effect,
            drain_rules=self._rules_version is not None,
        )

    async def _lead_once(self) -> None:
        policy = await self._policy()
        self.fleet = Fleet([e for e, _ in self.managers])
        self.fabrics = {}
        async with asyncio.TaskGroup() as tasks:
            for endpoint, client in self.managers:
                self._run_fabric(tasks, endpoint, client, policy, self.fleet)

    def _run_fabric(
        self,
        tasks: asyncio.TaskGroup,
        endpoint: ManagerEndpoint,
        client: ManagerClient,
        policy: PublishPolicy,
        fleet: Fleet,
    ) -> None:
        """One manager's writers: its gate, publisher and node labeller (their own publisher name
        for a named manager, so each owns only its slices and labels), and its binder or its
        attach-failure counts; none waits on another manager's."""
        opts = self.options
        if endpoint.name:
            policy = dataclasses.replace(policy, publisher=publisher_of(opts.publisher, endpoint.name))
        gate = ManagerGate(
            endpoint,
            InventoryFeed(client, mode=opts.inventory_feed, on_publish=_gauge_version),
            fleet,
            down_grace=opts.manager_down_grace,
        )
        publisher_box: list[SlicePublisher] = []
        quarantine = Quarantine(
            threshold=opts.quarantine_after,
            initial=opts.quarantine_seconds,
            on_change=lambda: publisher_box[0].trigger() if publisher_box else None,
        )
        links = LinkTaints(
            opts.link_thresholds, on_change=lambda: publisher_box[0].trigger() if publisher_box else None
        )
        publisher = SlicePublisher(self.kube, policy, quarantine=quarantine, link_taints=links)
        publisher_box.append(publisher)
        gate.on_availability = publisher.set_fabric_available
        gate.on_refiltered = publisher.refresh
        fabric = _Fabric(gate, publisher)
        self.fabrics[endpoint.name] = fabric
        plugin_nodes = (
            PluginNodes(self.kube, namespace=opts.plugin_namespace, selector=opts.plugin_pod_selector)
            if opts.plugin_pod_selector
            else None
        )
        labeler = NodeLabeler(self.kube, opts.driver, publisher=policy.publisher, plugin_nodes=plugin_nodes)
        events = EventRecorder(self.kube, controller=f"{opts.driver}/controller", instance=self.identity)
        tasks.create_task(gate.feed.run())
        tasks.create_task(gate.run())
        tasks.create_task(publisher.run(gate, resync_period=opts.resync_period))
        tasks.create_task(links.run(gate))
        if self._rules_version is not None:
            rules = DrainRules(
                self.kube, driver=opts.driver, publisher=policy.publisher, version=self._rules_version
            )
            tasks.create_task(rules.run(gate, resync_period=opts.resync_period))
        # labels follow what is published, not the inventory: a pod steered to a warm node must
        # find the node-local slice there
        tasks.create_task(labeler.run(publisher.published))
        if not opts.binding_conditions:
            # The plugin attaches at prepare time: only the manager sees the failures.
            noticer = QuarantineEvents(self.kube, events, opts.driver)
            tasks.create_task(ManagerCounts(gate, quarantine, noticer.record).run())
            return
        # each binder attaches only the devices of its own manager's pools (ClaimBinder.targets)
        fabric.binder = ClaimBinder(
            self.kube,
            client,
            gate,
            driver=opts.driver,
            bind_timeout=opts.bind_timeout,
            busy_timeout=opts.busy_timeout,
            release_grace=opts.release_grace,
            quarantine=quarantine,
            events=events,
        )
        tasks.create_task(fabric.binder.run())
