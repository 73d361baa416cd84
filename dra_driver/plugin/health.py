"""Device health for the kubelet: the ``v1alpha1.DRAResourceHealth`` stream (NodeWatchResources).

The fabric is the source: the manager's inventory carries every device's Redfish
``Status.Health`` and binding. The backend follows it by the manager's change feed (one
:class:`~manager_api.feed.InventoryFeed` per manager: the inventory read whole once, then ``GET
/api/v1/inventory/changes`` answering only the devices changed, and read whole again only after a
``410 ResyncRequired``), so a change costs this plugin what changed, not the whole inventory. A
prepared device is

- HEALTHY when the fabric reports it ``OK`` or ``Warning`` (still usable) and bound to this node
  for the claim (a partition: its GPU, with the partition held here for the claim; a share: its
  pool, with the share connected here for the claim), and (where the host is scanned) its sysfs
  directory still exists;
- UNHEALTHY when it is ``Critical``, unavailable, bound elsewhere or no longer bound, or gone
  from the host;
- UNKNOWN while the fabric manager cannot be reached (or with the no-op backend).

A device whose PCIe link has trained below what it negotiated at attach, for longer than the
hysteresis of :mod:`.linkhealth` allows, or whose link's error counters grow past its thresholds,
is UNHEALTHY too, and its claim's ``status.devices`` entry says ``LinkHealthy: False`` (reason
``LinkDegraded`` or ``PCIeErrors``; ``True`` again once it has recovered).

UNHEALTHY needs evidence from the fabric, and an inventory read before a claim was prepared is
no evidence that the claim's device is not bound here: it may predate the attach. Such an
inventory only says the device is unhealthy if it is ``Critical``; otherwise the device is
HEALTHY on the attach the fabric manager confirmed for the prepare, until an inventory read that
began after the prepare says otherwise. (Reporting from the older inventory made every freshly
attached device UNHEALTHY for 40 to 400 ms, until the next read: issue 15, item 12.)

The manager is asked at most once per ``min_poll_interval`` (1 s): every attach on any node
moves its version, and a request per change on every node would cost the manager and each plugin
more than the health reports are worth. A claim prepared here is the exception: a read
(``timeoutSeconds=0`` on the change feed) confirms its device, sent ``confirm_interval`` (0.5 s)
after the read before it at the earliest, so the claims a busy node prepares meanwhile share one
read instead of one each (until then each is HEALTHY on its attach, as above).

A read that changes nothing of this node's prepared devices — the feed keeps a device that did not
change the very object it was, and asks for this node's changes only (``node=``), but a manager
without that filter answers the long poll for every attach or detach anywhere in the fabric — is
taken in without judging anything again: no link observation, no new report. Only a
change of one of this node's devices, a claim prepared or unprepared here, its first confirming
read, or the manager lost or found again makes the monitor judge (``judgements`` counts them).

Each report lists every prepared device; it is re-sent every ``resend_seconds`` because the
kubelet treats a device it has not heard about within its health timeout (30 s) as unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import grpc

from dra_driver.plugin.backend import DeviceBackend
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimState, PreparedDevice
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.claimstatus import ClaimStatusWriter, LinkHealth
from dra_driver.plugin.hostdev import HostScanner
from dra_driver.plugin.linkhealth import HEALTHY, Link, LinkJudge
from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from manager_api.models import BindingState, Device, Health
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["HEALTH_SERVICE", "DeviceHealthReport", "HealthMonitor", "health_servicer"]

log = get_logger(__name__)

#: The name the kubelet looks for in PluginInfo.supported_versions: the gRPC service name
#: (k8s.io/kubelet/pkg/apis/dra-health/v1alpha1, DRAResourceHealth_ServiceDesc.ServiceName).
HEALTH_SERVICE = "v1alpha1.DRAResourceHealth"

DeviceHealthReport = list[tuple[str, str, int]]  # (pool, device, HealthStatus)


class _CutShort:
    pass


CUT_SHORT = _CutShort()


class HealthMonitor:
    def __init__(
        self,
        backend: DeviceBackend,
        store: CheckpointStore,
        *,
        node: str,
        scanner: HostScanner | None = None,
        resend_seconds: float = 10.0,
        poll_timeout: float = 30.0,
        min_poll_interval: float = 1.0,
        confirm_interval: float = 0.5,
        links: LinkJudge | None = None,
        status: ClaimStatusWriter | None = None,
    ) -> None:
        self.backend = backend
        self.links = links
        self.status = status
        #: (claim UID, device key) → the reason its LinkHealthy was last said with
        self._link_said: dict[tuple[str, str], str] = {}
        #: (claim UID, device key) → the fabric's record of it the link judge last observed
        self._observed: dict[tuple[str, str], Device] = {}
        self.store = store
        self.node = node
        self.scanner = scanner
        self.resend_seconds = resend_seconds
        self.poll_timeout = poll_timeout
        self.min_poll_interval = min_poll_interval
        self.confirm_interval = confirm_interval
        #: ``time.monotonic()`` when the last read was sent
        self._last_sent = -math.inf
        #: (claim UID, device key) → the fabric's record of each prepared device as last judged
        self._judged: dict[tuple[str, str], Device | None] = {}
        #: how often a read of the fabric made the monitor judge its devices again
        self.judgements = 0
        self._fabric: dict[str, Device] | None = None
        self._version: int | None = None
        #: ``time.monotonic()`` when the read that gave ``_fabric`` was sent: it shows the fabric
        #: as it was then or later
        self._fabric_since = -math.inf
        #: claim UID → when this monitor first saw it prepared (its attach confirmed before that);
        #: claims prepared before the monitor started count as prepared from the beginning
        self._prepared: dict[str, float] = dict.fromkeys(self._completed(), -math.inf)
        #: set when a claim is first seen prepared: a long poll in flight is sent again
        self._newly_prepared = asyncio.Event()
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._judging: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow_fabric(), name="health-follow-fabric")
        if self.links is not None:
            self._judging = asyncio.create_task(self._judge_links_every(), name="health-judge-links")

    async def stop(self) -> None:
        for task in (self._task, self._judging):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def notify(self) -> None:
        """Something changed (a claim prepared or unprepared, or the fabric): send a report."""
        self._note_prepared()
        # Replace the event so that every stream waiting on the old one wakes, none misses it.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def _completed(self) -> list[str]:
        return [uid for uid, e in self.store.claims().items() if e.state is ClaimState.PREPARE_COMPLETED]

    def _note_prepared(self) -> None:
        """Record when each prepared claim was first seen; forget claims no longer prepared."""
        now = time.monotonic()
        completed = self._completed()
        fresh = any(uid not in self._prepared for uid in completed)
        self._prepared = {uid: self._prepared.get(uid, now) for uid in completed}
        if fresh:
            self._newly_prepared.set()

    def _unconfirmed(self) -> bool:
        """Some claim was prepared after the read that gave the fabric view was sent."""
        return any(seen >= self._fabric_since for seen in self._prepared.values())

    async def _long_poll(self) -> tuple[int, dict[str, Device]] | _CutShort | None:
        """The inventory once its version moves, or ``CUT_SHORT`` when a claim is prepared first:
        this poll was sent before that claim's attach, so its answer cannot speak for it."""
        self._newly_prepared.clear()
        poll = asyncio.ensure_future(self.backend.watch_devices(self._version, self.poll_timeout))
        prepared = asyncio.ensure_future(self._newly_prepared.wait())
        try:
            await asyncio.wait({poll, prepared}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            # neither is awaited: awaiting here could swallow a cancellation of this monitor
            prepared.cancel()
            cut_short = not poll.done()
            if cut_short:
                poll.cancel()
        return CUT_SHORT if cut_short else poll.result()

    async def _follow_fabric(self) -> None:
        backoff = Backoff(initial=0.5, maximum=10.0)
        while True:
            if self._unconfirmed():
                # the claims prepared within the interval share one confirming read
                await asyncio.sleep(max(0.0, self._last_sent + self.confirm_interval - time.monotonic()))
            sent = self._last_sent = time.monotonic()
            try:
                if self._unconfirmed():
                    # a claim's device is reported on its attach alone until a read sent after
                    # it: make that read now, without waiting for the version to move
                    result = await self.backend.watch_devices(None, self.poll_timeout)
                else:
                    polled = await self._long_poll()
                    if isinstance(polled, _CutShort):
                        continue
                    result = polled
            except asyncio.CancelledError:
                raise
            except Exception as err:  # any failure: devices become Unknown, retry
                if self._fabric is not None:
                    log.warning("lost the fabric manager; device health is unknown", error=str(err))
                self._fabric, self._version = None, None
                self.notify()
                await backoff.sleep()
                continue
            if result is None:
                return  # this backend has no fabric to follow
            backoff.reset()
            changed = self._version is not None and result[0] != self._version
            news = self._takes_news(result[1], sent)
            self._version, self._fabric = result
            self._fabric_since = sent
            if news:
                self.judgements += 1
                self._observe_links()
                self._judge_links()  # a new uncorrectable error is news now, not at the next pass
                self.notify()
            if changed:
                # Every attach anywhere moves the inventory version; under churn that would be an
                # inventory read per change on every node. At most one per interval: a health
                # change reaches the kubelet within it (its own health timeout is 30 s). A claim
                # prepared here is the exception: a read within the confirm interval.
                await self._rest(sent)

    def _takes_news(self, fabric: dict[str, Device], sent: float) -> bool:
        """Whether a read sent at ``sent`` that gave ``fabric`` says anything new of this node's
        prepared devices: a record that is not the very object last judged, a claim prepared or
        unprepared since, a claim it is the first read after, the manager found again."""
        judged: dict[tuple[str, str], Device | None] = {}
        confirms = False
        for uid, entry in self.store.claims().items():
            if entry.state is not ClaimState.PREPARE_COMPLETED:
                continue
            seen = self._prepared.get(uid, math.inf)
            confirms |= self._fabric_since <= seen < sent
            for d in entry.devices:
                judged[(uid, d.key)] = self._fabric_device(d, fabric)
        same = judged.keys() == self._judged.keys() and all(judged[k] is self._judged[k] for k in judged)
        self._judged = judged
        return self._fabric is None or confirms or not same or bool(self.backend.blind_pools())

    async def _rest(self, sent: float) -> None:
        """Until ``min_poll_interval`` after ``sent``, or until a claim prepared here wants its
        confirming read (the loop waits out ``confirm_interval`` for it)."""
        while not self._unconfirmed():
            left = sent + self.min_poll_interval - time.monotonic()
            if left <= 0:
                return
            self._newly_prepared.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._newly_prepared.wait(), left)

    # -- link health --------------------------------------------------------------------------

    def _observe_links(self) -> None:
        """Each prepared device's link as this read of the fabric reports it (reads made before a
        claim's attach say nothing of its link)."""
        if self.links is None or self._fabric is None:
            return
        watched = []
        observed: dict[tuple[str, str], Device] = {}
        for uid, entry in self.store.claims().items():
            if entry.state is not ClaimState.PREPARE_COMPLETED:
                continue
            for d in entry.devices:
                watched.append((uid, d.key))
                info = self._fabric_device(d)
                if info is None or self._fabric_since <= self._prepared.get(uid, math.inf):
                    continue
                observed[(uid, d.key)] = info
                # the change feed keeps a device that did not change the very object it was: the
                # same reading again tells the judge nothing that time alone does not
                if self._observed.get((uid, d.key)) is not info:
                    link = Link(info.pcie_generation, info.pcie_width)
                    self.links.observe(uid, d.key, link, info.pcie_errors)
        self._observed = observed
        self.links.keep(watched)

    async def _judge_links_every(self, seconds: float = 5.0) -> None:
        """Hysteresis runs on time, not only on reads: judge the links every few seconds."""
        while True:
            await asyncio.sleep(seconds)
            if self._judge_links():
                self.notify()

    def _judge_links(self) -> bool:
        """Say each device whose link verdict turned (its claim's LinkHealthy); whether any did."""
        if self.links is None:
            return False
        turned = False
        for uid, entry in self.store.claims().items():
            if entry.state is not ClaimState.PREPARE_COMPLETED:
                continue
            said = []
            for d in entry.devices:
                verdict = self.links.verdict(uid, d.key)
                if verdict is None or self._link_said.get((uid, d.key), HEALTHY) == verdict.reason:
                    continue
                self._link_said[(uid, d.key)] = verdict.reason
                turned = True
                log.warning(
                    f"device link unhealthy ({verdict.reason})"
                    if verdict.degraded
                    else "device link recovered",
                    claim=uid,
                    device=d.key,
                    node=self.node,
                    detail=verdict.message,
                )
                said.append(
                    LinkHealth(
                        d.pool, d.device, d.share_id, not verdict.degraded, verdict.reason, verdict.message
                    )
                )
            if said and self.status is not None:
                self.status.publish(ClaimRef(uid, entry.namespace, entry.name), said)
        live = {(uid, d.key) for uid, e in self.store.claims().items() for d in e.devices}
        self._link_said = {k: v for k, v in self._link_said.items() if k in live}
        return turned

    def _link_degraded(self, uid: str, device: PreparedDevice) -> bool:
        return self._link_said.get((uid, device.key), HEALTHY) != HEALTHY

    def _fabric_device(self, device: PreparedDevice, view: dict[str, Device] | None = None) -> Device | None:
        """What the fabric (``view``, else the one judged) says of ``device`` (a partition: of its
        GPU): by pool and name where the view has it so (several managers, whose device names may
        repeat), else by name."""
        fabric = (self._fabric if view is None else view) or {}
        name = device.parent or device.device
        return fabric.get(f"{device.pool}/{name}") or fabric.get(name)

    def _status(self, uid: str, device: PreparedDevice) -> int:
        host_path = device.host.sysfs_path if device.host else None
        if self.scanner is not None and host_path is not None and not self.scanner.present_path(host_path):
            return health_pb2.UNHEALTHY
        if self._fabric is None:
            return health_pb2.UNKNOWN
        # a partition's health is its GPU's, a share's its pool's
        info = self._fabric_device(device)
        if self._fabric_since <= self._prepared.get(uid, math.inf):
            # read before this claim's attach: only the device's own health counts
            critical = info is not None and info.health is Health.CRITICAL
            return health_pb2.UNHEALTHY if critical else health_pb2.HEALTHY
        if info is None and device.pool in self.backend.blind_pools():
            return health_pb2.UNKNOWN  # its manager (one of several) cannot be read now
        if info is None or info.state is BindingState.UNAVAILABLE:
            return health_pb2.UNHEALTHY
        if not self._held_here(uid, device, info):
            return health_pb2.UNHEALTHY
        if self._link_degraded(uid, device):
            return health_pb2.UNHEALTHY
        return health_pb2.UNHEALTHY if info.health is Health.CRITICAL else health_pb2.HEALTHY

    def _held_here(self, uid: str, device: PreparedDevice, info: Device) -> bool:
        """Whether the fabric holds the claim's device on this node: bound to it, its partition
        held here for the claim, its share connected here for it."""
        if device.share_id is not None:
            pool = info.memory_pool
            share = next((s for s in pool.shares if s.share_id == device.share_id), None) if pool else None
            return share is not None and (share.node, share.claim_uid) == (self.node, uid)
        if info.node != self.node:
            return False
        if device.parent is not None:
            return any(
                (h.partition, h.claim_uid, h.node) == (device.device, uid, self.node) for h in info.partitions
            )
        return info.claim_uid is None or info.claim_uid == uid

    def report(self) -> DeviceHealthReport:
        self._note_prepared()
        out: DeviceHealthReport = []
        for uid, entry in sorted(self.store.claims().items()):
            if entry.state is not ClaimState.PREPARE_COMPLETED:
                continue
            for d in entry.devices:
                out.append((d.pool, d.device, self._status(uid, d)))
        return out

    async def reports(self) -> AsyncGenerator[DeviceHealthReport, None]:
        """A report now, then on every change and at least every ``resend_seconds``."""
        while True:
            changed = self._changed
            yield self.report()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), self.resend_seconds)


class _HealthServicer(health_grpc.DRAResourceHealthServicer):
    def __init__(self, monitor: HealthMonitor) -> None:
        self.monitor = monitor

    async def NodeWatchResources(
        self, request: health_pb2.NodeWatchResourcesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[health_pb2.NodeWatchResourcesResponse]:
        last: DeviceHealthReport | None = None
        last_sent = 0.0
        async for report in self.monitor.reports():
            now = time.time()
            if report == last and now - last_sent < self.monitor.resend_seconds:
                continue
            last, last_sent = report, now
            yield health_pb2.NodeWatchResourcesResponse(
                devices=[
                    health_pb2.DeviceHealth(
                        device=health_pb2.DeviceIdentifier(pool_name=pool, device_name=device),
                        health=status,  # type: ignore[arg-type]
                        last_updated_time=int(now),
                    )
                    for pool, device, status in report
                ]
            )


def health_servicer(monitor: HealthMonitor, server: grpc.aio.Server) -> list[str]:
    health_grpc.add_DRAResourceHealthServicer_to_server(_HealthServicer(monitor), server)
    return [HEALTH_SERVICE]
