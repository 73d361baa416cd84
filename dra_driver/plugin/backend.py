"""Device backends: how a claimed device gets to this host and away again.

:class:`FabricBackend` is the real one: bind through the fabric manager (keyed by claim UID +
device, so a retry never binds twice), then wait until this host sees the device in sysfs; on
release, remove it host-side and ask for the detach. :class:`NoopBackend` does nothing and
answers at once, so a benchmark measures the plugin's own overhead (claim read, checkpoint, CDI).

A device the claim got from the warm pool after another claim, which the fabric cannot reset, is
answered ``resetRequired``: once it is visible, and before prepare goes on to the CDI spec, the
plugin resets it (:meth:`HostScanner.reset`, a PCIe function-level reset through sysfs) and reports
it; after a failed reset the manager power-cycles it for the claim and the plugin waits for it
again (docs/plugin.md "Reset between tenants").

A **partition** device (``gpu0-1g10gb-3``) is answered with its GPU: once the GPU is visible the
backend carves the partition out of it (:class:`~dra_driver.plugin.partitioner.Partitioner`), after
the claim's record says it is about to (:class:`AttachNotes`), so that a crash in between finds
its own partition again and never takes another's. A **share** of a memory pool is attached with
the allocation's share ID and size (:class:`MemoryShares`); the backend waits until the host sees
a new region of that size from the pool's device and, in kmem mode, onlines its memory
(:class:`~dra_driver.plugin.hostmemory.HostMemory`). Release undoes each in reverse before the
detach: the partition destroyed, the memory offlined (never taken away online).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Protocol, TypeVar

from dra_driver.errors import KubeletPluginError
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import DeviceIdentity, HostDevice, HostScanner
from dra_driver.plugin.hostmemory import HostMemory, MemoryFailed, MemoryRecord
from dra_driver.plugin.metrics import observe_phase
from dra_driver.plugin.partitioner import Partition, Partitioner, PartitionFailed
from manager_api.attaching import AttachPolicy, AttachProgress, attach_until_attached
from manager_api.client import ManagerClient
from manager_api.errors import DeviceNotFound, FabricError, FabricUnavailable
from manager_api.feed import InventoryFeed
from manager_api.models import (
    MAX_WAIT_SECONDS,
    Attachment,
    AttachmentState,
    BindingState,
    Device,
    DeviceType,
)
from manager_api.partitions import PartitionDevice, parse_partition
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = [
    "AttachNotes",
    "AttachedDevice",
    "DeviceBackend",
    "FabricBackend",
    "NoopBackend",
    "ShareAsk",
    "StillDetaching",
    "held_by_claim",
]

log = get_logger(__name__)

_K = TypeVar("_K")

#: :meth:`FabricBackend._bind`: POST the attachment until the fabric says attached
_Bind = Callable[[str, str, str | None, str | None, "ShareAsk | None", str | None], Awaitable[Attachment]]


@contextlib.asynccontextmanager
async def _locked(locks: dict[_K, asyncio.Lock], key: _K) -> AsyncIterator[None]:
    lock = locks.setdefault(key, asyncio.Lock())
    async with lock:
        yield


class StillDetaching(KubeletPluginError, FabricError):
    """The fabric accepted the detach but has not finished it yet (retriable)."""

    code = "StillDetaching"
    retriable = True


@dataclass(frozen=True, slots=True)
class ShareAsk:
    """A share of a memory pool, as the claim's allocation result names it."""

    share_id: str
    memory_bytes: int
    mode: MemoryMode = MemoryMode.DEVDAX


@dataclass(frozen=True, slots=True)
class AttachedDevice:
    """A device bound to this node for a claim, as the fabric describes it and the host sees it;
    for a partition, the GPU it is carved from and the partition; for a share, its memory."""

    device: Device
    host: HostDevice | None
    #: a partition device: the placement the manager gave the claim
    placement: PartitionDevice | None = None
    partition: Partition | None = None
    memory: MemoryRecord | None = None
    #: a share: its size on this host (the allocation's consumed capacity)
    share_bytes: int | None = None


class AttachNotes:
    """What the backend tells its caller on the way, and asks of it; each does nothing unless
    overridden. The plugin's attach records the first durably (:mod:`dra_driver.plugin.attach`)."""

    async def visible(self, attached: AttachedDevice) -> None:
        """The device is bound and visible; a partition is about to be made or memory onlined:
        record that this claim is making it, so a crash in between finds it again as its own."""

    def reserve(self, host: HostDevice) -> None:
        """``host`` is this claim's from now on: no other claim may take it."""

    def exclude(self, *, shared: bool) -> Collection[str]:
        """Host devices other claims hold; ``shared``: for a partition, whose GPU may be shared
        with other claims' partitions (only devices held whole are left out then)."""
        return ()

    def partition_users(self, gpu_path: str) -> set[str]:
        """The other claims that have (or are making) partitions of the GPU at ``gpu_path``."""
        return set()


class DeviceBackend(Protocol):
    name: str

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        notes: AttachNotes,
        pool: str | None = None,
        namespace: str | None = None,
        share: ShareAsk | None = None,
        known: PreparedDevice | None = None,
    ) -> AttachedDevice:
        """Bind ``device`` (of ``pool``, when the claim names one; ``share`` of it for a memory
        pool) to this node for the claim (of ``namespace``, which the manager records), wait until
        the host sees it, and make it usable (a partition made, memory onlined). ``known`` is what
        the claim's record already says of it (a retry after a crash)."""
        ...

    async def release(
        self, claim_uid: str, prepared: PreparedDevice, *, within: float, last_on_gpu: bool = True
    ) -> None:
        """Undo what this node made of the device (a partition, onlined memory), remove it
        host-side and detach it; raises :class:`StillDetaching` past ``within`` s. A partition's
        GPU is removed host-side only when ``last_on_gpu`` (no other claim has partitions there)."""
        ...

    async def bindings(self) -> list[Device] | None:
        """Devices the fabric has bound (or is binding) to this node; None when it cannot say."""
        ...

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        """Why an attach still running has not finished yet (the last transient error), if known."""
        ...

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        """The fabric's devices by name, once its inventory version passes ``after`` (long poll)."""
        ...

    def blind_pools(self) -> frozenset[str]:
        """Pools whose devices' health is unknown while the rest of the view is read (the pools of
        one manager among several that cannot be read now)."""
        ...

    async def aclose(self) -> None: ...


def identity_of(device: Device, *, memory_bytes: int | None = None) -> DeviceIdentity:
    """What the host scanner looks for, of the manager's answer about ``device`` (a share's region
    has the share's size, not its pool's)."""
    identity = DeviceFacts(**DeviceFacts.of(device)).identity()
    return identity if memory_bytes is None else dataclasses.replace(identity, memory_bytes=memory_bytes)


def held_by_claim(devices: list[Device], node: str) -> dict[str, dict[str, Device]]:
    """Claim UID → {device key → fabric device} of what the fabric holds on ``node`` for claims:
    devices bound whole, partitions of GPUs (keyed by partition name) and pools' shares (keyed
    ``<pool>-<share id>``)."""
    held: dict[str, dict[str, Device]] = {}
    for device in devices:
        if device.memory_pool is not None:
            for share in device.memory_pool.shares:
                if share.node == node:
                    held.setdefault(share.claim_uid, {})[f"{device.name}-{share.share_id}"] = device
            continue
        if device.node != node or device.state not in (BindingState.BOUND, BindingState.ATTACHING):
            continue
        for holder in device.partitions:
            if holder.node == node:
                held.setdefault(holder.claim_uid, {})[holder.partition] = device
        if device.claim_uid:
            held.setdefault(device.claim_uid, {})[device.name] = device
    return held


class _Pending(AttachProgress):
    """Keeps why an attach still running has not finished, for the kubelet's answer meanwhile."""

    def __init__(self, backend: FabricBackend, claim_uid: str, device: str) -> None:
        self._backend, self._key = backend, (claim_uid, device)

    def before_request(self) -> None:
        crash_point("plugin.prepare.before-attach")

    def retrying(self, err: FabricError) -> None:
        claim_uid, device = self._key
        self._backend.note_pending(claim_uid, device, err)
        log.warning(
            "attach failed, retrying", claim=claim_uid, device=device, node=self._backend.node, error=str(err)
        )

    async def attaching(self, attachment: Attachment, waited: float) -> None:
        claim_uid, device = self._key
        # 202 attaching: the same request is a long poll on the same operation (no second bind).
        progress = FabricError(
            f"the fabric has been working on it for {waited:.0f}s "
            f"(operation {attachment.operation_id or 'unknown'})",
            device=device,
            node=self._backend.node,
        )
        self._backend.note_pending(claim_uid, device, progress)


class FabricBackend:
    name = "fabric"

    def __init__(
        self,
        client: ManagerClient,
        scanner: HostScanner,
        *,
        node: str,
        visible_timeout: float,
        host_removal: bool,
        retry_budget: float = 60.0,
        attach_give_up: float = 900.0,
        partitioner: Partitioner | None = None,
        memory: HostMemory | None = None,
    ) -> None:
        self.client = client
        #: the manager's inventory as device health follows it: read whole once, then only what
        #: changed (every attach anywhere is a change; a burst would otherwise have every plugin
        #: re-read and parse the whole inventory per attach)
        self.feed = InventoryFeed(client, node=node)
        self.scanner = scanner
        self.node = node
        self.visible_timeout = visible_timeout
        self.host_removal = host_removal and scanner.real_host
        self.retry_budget = retry_budget
        self.attach_give_up = attach_give_up
        #: makes partitions of this host's GPUs (none: partition claims fail with one line)
        self.partitioner = partitioner
        self.memory = memory or HostMemory(scanner.root, real_host=scanner.real_host)
        #: (claim UID, device) → the last transient error of an attach that is still retrying
        self._pending: dict[tuple[str, str], FabricError] = {}
        #: (claim UID, device) → when its attach started (``time.monotonic()``)
        self._started: dict[tuple[str, str], float] = {}
        #: one partition change at a time per GPU (its sysfs path): a placement is checked and
        #: taken without another claim's change in between
        self._gpu_locks: dict[str, asyncio.Lock] = {}
        #: attaches and releases the shares of a memory pool
        self.shares = MemoryShares(
            self._bind, scanner, self.memory, node=node, visible_timeout=visible_timeout
        )

    def note_pending(self, claim_uid: str, device: str, err: FabricError) -> None:
        """Why the attach of ``device`` for ``claim_uid``, still running, has not finished yet."""
        self._pending[(claim_uid, device)] = err

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        key = (claim_uid, device)
        if key in self._pending:
            return self._pending[key]
        if key in self._started:
            waited = time.monotonic() - self._started[key]
            return FabricError(f"the fabric manager has been attaching it for {waited:.0f}s", device=device)
        return None

    async def _bind(
        self,
        claim_uid: str,
        device: str,
        pool: str | None = None,
        namespace: str | None = None,
        share: ShareAsk | None = None,
        key: str | None = None,
    ) -> Attachment:
        """POST the attachment until the fabric says attached; transient failures are retried."""
        key = key or device
        started = self._started[(claim_uid, key)] = time.monotonic()
        policy = AttachPolicy(
            wait_seconds=MAX_WAIT_SECONDS,
            retry_until=started + self.retry_budget,
            attaching_until=started + self.attach_give_up,
        )
        try:
            return await attach_until_attached(
                self.client,
                device,
                self.node,
                claim_uid,
                policy,
                pool=pool,
                namespace=namespace,
                progress=_Pending(self, claim_uid, key),
                share_id=share.share_id if share is not None else None,
                memory_bytes=share.memory_bytes if share is not None else None,
            )
        finally:
            self._pending.pop((claim_uid, key), None)
            self._started.pop((claim_uid, key), None)

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        notes: AttachNotes,
        pool: str | None = None,
        namespace: str | None = None,
        share: ShareAsk | None = None,
        known: PreparedDevice | None = None,
    ) -> AttachedDevice:
        if share is not None:
            return await self.shares.attach(claim_uid, device, notes, pool, namespace, share)
        with observe_phase("attach"):
            attachment = await self._bind(claim_uid, device, pool, namespace)
        crash_point("plugin.prepare.after-attach")
        info = attachment.device
        placement = self._placement(attachment)
        host = await self._visible(info, lambda: notes.exclude(shared=placement is not None))
        if attachment.reset_required:
            info, host = await self._reset(claim_uid, info, host, notes, pool, namespace, placement)
        attached = AttachedDevice(device=info, host=host, placement=placement)
        if placement is not None:
            notes.reserve(host)
            await notes.visible(attached)
            crash_point("plugin.prepare.before-partition")
            with observe_phase("partition"):
                partition = await self._make_partition(host, placement, known)
            crash_point("plugin.prepare.after-partition")
            attached = dataclasses.replace(attached, partition=partition)
        crash_point("plugin.prepare.after-visible")
        log.info(
            "device attached and visible",
            claim=claim_uid,
            device=device,
            node=self.node,
            sysfs=host.sysfs_path,
            partition=attached.partition.uuid if attached.partition else None,
        )
        return attached

    async def _visible(self, info: Device, exclude: Callable[[], Collection[str]]) -> HostDevice:
        with observe_phase("visible"):
            return await self.scanner.wait_visible(
                identity_of(info), within=self.visible_timeout, exclude=exclude
            )

    # -- partitions -----------------------------------------------------------------------------

    def _placement(self, attachment: Attachment) -> PartitionDevice | None:
        """The partition the manager gave the claim (its answer's ``partition``), or None."""
        if attachment.partition is None:
            return None
        gpu = attachment.device
        what = f"partition {attachment.partition} of GPU {gpu.name}"
        if gpu.partition_table is None:
            raise PartitionFailed(
                f"{what}: the fabric manager names no partition table for the GPU, so the partition "
                "cannot be made; check the manager's partition catalog",
                permanent=True,
            )
        placement = parse_partition(attachment.partition, {gpu.name: gpu.partition_table})
        if placement is None:
            raise PartitionFailed(
                f"{what}: table {gpu.partition_table.name} has no such placement", permanent=True
            )
        return placement

    def _partitioner(self, what: str) -> Partitioner:
        if self.partitioner is None:
            raise PartitionFailed(f"{what}: this node makes no GPU partitions", permanent=True)
        return self.partitioner

    async def _make_partition(
        self, host: HostDevice, placement: PartitionDevice, known: PreparedDevice | None
    ) -> Partition:
        """The claim's partition on ``host``: made, or found again where this claim's record says
        it was being made (a crash between the two); a partition of that placement nobody
        recorded is a leftover and is replaced, never handed to a new tenant."""
        profile, start = placement.profile, placement.start
        partitioner = self._partitioner(f"partition {placement.name}")
        ours = (
            known is not None and known.partition_profile == profile.name and known.partition_start == start
        )
        async with _locked(self._gpu_locks, host.sysfs_path):
            existing = await asyncio.to_thread(partitioner.existing, host)
            for found in existing:
                if not found.is_placement(profile.name, start):
                    continue
                if ours and found.uuid:
                    log.info("found this claim's partition again", gpu=placement.gpu, uuid=found.uuid)
                    return found
                log.warning(
                    "a partition nobody recorded holds the claim's placement; replaced",
                    gpu=placement.gpu,
                    profile=profile.name,
                    start=start,
                    uuid=found.uuid or None,
                )
                await asyncio.to_thread(partitioner.destroy, found)
            return await asyncio.to_thread(partitioner.create, host, profile, start)

    async def _destroy_partition(self, prepared: PreparedDevice, host: HostDevice) -> None:
        """The claim's partition gone: the recorded one, else the one at its placement it was
        making (never another placement: that is another claim's)."""
        partitioner = self._partitioner(f"partition {prepared.device}")
        async with _locked(self._gpu_locks, host.sysfs_path):
            if not self.scanner.present(host):
                return  # the GPU left this host, and its partitions with it
            targets: list[Partition] = []
            if prepared.partition is not None:
                targets.append(prepared.partition)
            elif prepared.partition_profile is not None and prepared.partition_start is not None:
                existing = await asyncio.to_thread(partitioner.existing, host)
                targets += [
                    p
                    for p in existing
                    if p.is_placement(prepared.partition_profile, prepared.partition_start)
                ]
            for partition in targets:
                with observe_phase("partition_destroy"):
                    await asyncio.to_thread(partitioner.destroy, partition)
        crash_point("plugin.unprepare.after-partition-destroy")

    # -- the reset between tenants --------------------------------------------------------------

    async def _reset(
        self,
        claim_uid: str,
        info: Device,
        host: HostDevice,
        notes: AttachNotes,
        pool: str | None,
        namespace: str | None,
        placement: PartitionDevice | None,
    ) -> tuple[Device, HostDevice]:
        """Reset the device another claim used before this one (the manager answered
        ``resetRequired``) and report it; after a failed reset the manager detached and attached it
        again for this claim (a slot power cycle): bind again and wait for it to be visible. A GPU
        that can be partitioned loses the last tenant's partitions first."""
        failure: str | None = None
        # a real GPU's partitions are NVML's to see only while the nvidia driver has it (not vfio)
        partitioned = not self.scanner.real_host or host.driver == "nvidia"
        if info.partition_table is not None and self.partitioner is not None and partitioned:
            users = notes.partition_users(host.sysfs_path) - {claim_uid}
            if users:
                # cannot happen while the manager keeps one GPU on one node: never take them away
                raise PartitionFailed(
                    f"GPU {info.name} is due a reset between tenants, but partitions of claims "
                    f"{', '.join(sorted(users))} are on it here; it was not reset"
                )
            async with _locked(self._gpu_locks, host.sysfs_path):
                try:
                    gone = await asyncio.to_thread(self.partitioner.reset, host)
                except PartitionFailed as err:
                    if not err.permanent:  # a partition still in use: not reset, never yanked
                        failure = str(err)
                    else:  # no NVML on this node: nothing can be listed; the device reset goes on
                        log.warning("the last tenant's partitions could not be listed", error=str(err))
                else:
                    if gone:
                        log.info("the last tenant's partitions removed", device=info.name, count=len(gone))
        with observe_phase("reset"):
            failure = failure or await asyncio.to_thread(self.scanner.reset, host)
        # A crash before the report leaves the manager's "pending": the retried prepare resets again.
        answer = await self.client.report_reset(
            info.name,
            self.node,
            claim_uid,
            ok=failure is None,
            message=failure or "",
            wait_seconds=MAX_WAIT_SECONDS,
        )
        if failure is None:
            log.info(
                "device reset before its claim uses it", claim=claim_uid, device=info.name, node=self.node
            )
            return info, host
        log.warning(
            "device could not be reset; the fabric power-cycles it for the claim",
            claim=claim_uid,
            device=info.name,
            node=self.node,
            error=failure,
        )
        asked = placement.name if placement is not None else info.name
        if answer.state is not AttachmentState.ATTACHED or answer.reset_required:
            answer = await self._bind(claim_uid, asked, pool, namespace)
        if answer.reset_required:  # cannot happen after a power cycle: never use it unreset
            raise FabricError(
                f"device {info.name} is still due a reset after its power cycle",
                device=info.name,
                node=self.node,
            )

        def exclude() -> Collection[str]:
            return notes.exclude(shared=placement is not None)

        return answer.device, await self._visible(answer.device, exclude)

    # -- release ---------------------------------------------------------------------------------

    async def release(
        self, claim_uid: str, prepared: PreparedDevice, *, within: float, last_on_gpu: bool = True
    ) -> None:
        deadline = time.monotonic() + within
        host = prepared.host
        if host is not None and prepared.parent is not None:
            await self._destroy_partition(prepared, host)
        if host is not None and prepared.share_id is not None:
            with observe_phase("memory_offline"):
                await self.shares.release(prepared, host, deadline)
        # A partition's GPU leaves the host only with its last partition (the manager unbinds it then).
        whole = (prepared.parent is None or last_on_gpu) and prepared.share_id is None
        if self.host_removal and whole and host is not None and self.scanner.present(host):
            with observe_phase("host_removal"):
                await asyncio.to_thread(self.scanner.remove, host)
        with observe_phase("detach"):
            while True:
                wait = max(0.0, min(MAX_WAIT_SECONDS, deadline - time.monotonic()))
                crash_point("plugin.unprepare.before-detach")
                try:
                    attachment = await self.client.detach(
                        prepared.device, self.node, claim_uid, wait_seconds=wait, share_id=prepared.share_id
                    )
                except DeviceNotFound:
                    log.warning(
                        "device is gone from the fabric; nothing to detach",
                        claim=claim_uid,
                        device=prepared.device,
                        node=self.node,
                    )
                    return
                if attachment.state is AttachmentState.DETACHED:
                    crash_point("plugin.unprepare.after-detach")
                    return
                if time.monotonic() >= deadline:
                    raise StillDetaching(
                        f"the fabric is still detaching device {prepared.device}; the kubelet will retry",
                        device=prepared.device,
                        node=self.node,
                    )

    @staticmethod
    def holds_here(device: Device, node: str) -> bool:
        """Whether the fabric has ``device`` (or a share of it) bound, or binding, to ``node``."""
        return (device.node == node and device.state in (BindingState.BOUND, BindingState.ATTACHING)) or (
            device.memory_pool is not None and any(s.node == node for s in device.memory_pool.shares)
        )

    async def bindings(self) -> list[Device] | None:
        inventory = await self.client.inventory()
        return [d for d in inventory.devices if self.holds_here(d, self.node)]

    def blind_pools(self) -> frozenset[str]:
        return frozenset()  # one manager: when it cannot be read, the whole view is unknown

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        latest = self.feed.latest
        if after is None or latest is None:
            await self.feed.read(0)  # a read sent now, whatever the version
        elif latest.version == after:
            await self.feed.read(wait_seconds)
        latest = self.feed.latest
        if latest is None:  # only while another read of this feed is resyncing
            raise FabricUnavailable("the fabric manager's inventory is being read again", node=self.node)
        return latest.version, self.feed.devices()

    async def aclose(self) -> None:
        await self.client.aclose()
        self.scanner.changes.stop()


class MemoryShares:
    """The shares of a memory pool on this host: bound with the allocation's share ID and size,
    the new region of that size found (and, in kmem mode, its memory onlined); on release, all of
    the region's blocks offline before the fabric takes it."""

    def __init__(
        self,
        bind: _Bind,
        scanner: HostScanner,
        memory: HostMemory,
        *,
        node: str,
        visible_timeout: float,
    ) -> None:
        self._bind = bind
        self.scanner = scanner
        self.memory = memory
        self.node = node
        self.visible_timeout = visible_timeout
        #: one share of a pool device and size at a time between its request and its region
        #: being taken: two new regions of one size could not be told apart
        self._share_locks: dict[tuple[str, int], asyncio.Lock] = {}

    async def attach(
        self,
        claim_uid: str,
        device: str,
        notes: AttachNotes,
        pool: str | None,
        namespace: str | None,
        share: ShareAsk,
    ) -> AttachedDevice:
        key = f"{device}-{share.share_id}"
        async with _locked(self._share_locks, (device, share.memory_bytes)):
            # the regions of this size already here are someone's: the share's is a new one
            before = {h.sysfs_path for h in self._regions(share.memory_bytes)}
            with observe_phase("attach"):
                attachment = await self._bind(claim_uid, device, pool, namespace, share, key)
            crash_point("plugin.prepare.after-attach")
            info = attachment.device
            size = attachment.share.memory_bytes if attachment.share is not None else share.memory_bytes
            host = await self._visible_share(info, size, notes, before)
            notes.reserve(host)
        attached = AttachedDevice(device=info, host=host, share_bytes=size)
        await notes.visible(attached)
        if share.mode is MemoryMode.KMEM:
            crash_point("plugin.prepare.before-memory-online")
            with observe_phase("memory_online"):
                record = await self._online(host, key)
            crash_point("plugin.prepare.after-memory-online")
        else:
            record = await self.memory.devdax(host, device=key)
        crash_point("plugin.prepare.after-visible")
        log.info(
            "memory share attached and visible",
            claim=claim_uid,
            device=device,
            share=share.share_id,
            node=self.node,
            region=host.region,
            mode=record.mode.value,
            numa_node=record.node,
        )
        return dataclasses.replace(attached, memory=record)

    def _regions(self, memory_bytes: int) -> list[HostDevice]:
        """Every region here of that size (what a new share's could be mistaken for)."""
        found: list[HostDevice] = []
        taken: set[str] = set()
        while True:
            identity = DeviceIdentity(name="", type=DeviceType.CXL_MEMORY.value, memory_bytes=memory_bytes)
            host = self.scanner.find(identity, taken)
            if host is None:
                return found
            found.append(host)
            taken.add(host.sysfs_path)

    async def _visible_share(
        self, info: Device, size: int, notes: AttachNotes, before: set[str]
    ) -> HostDevice:
        """The new region of the share: one that was not here before its request; after a short
        while also one that was (the same claim's request asked again after a crash)."""
        identity = identity_of(info, memory_bytes=size)
        started = time.monotonic()
        prefer_new_for = min(2.0, self.visible_timeout)
        with observe_phase("visible"):
            return await self.scanner.wait_visible(
                identity,
                within=self.visible_timeout,
                exclude=lambda: (
                    set(notes.exclude(shared=False))
                    | (before if time.monotonic() - started < prefer_new_for else set())
                ),
            )

    async def _online(self, host: HostDevice, key: str) -> MemoryRecord:
        try:
            return await self.memory.online(host, device=key)
        except MemoryFailed:
            # nothing half-made: blocks this call onlined go offline again before the error
            with contextlib.suppress(Exception):
                await self._offline_region(host, key, within=self.memory.answer_seconds)
            raise

    async def _offline_region(self, host: HostDevice, key: str, *, within: float) -> None:
        """Every block of the share's region offline, whatever the record says was onlined."""
        blocks = self.memory.region_blocks(host)
        if blocks:
            await self.memory.offline(
                MemoryRecord(mode=MemoryMode.KMEM, dax=host.dax, blocks=blocks), device=key, within=within
            )

    async def release(self, prepared: PreparedDevice, host: HostDevice, deadline: float) -> None:
        """The share's memory offline before the fabric takes it: all of its region's blocks
        (also those a crash left onlined before the record said so)."""
        if not self.scanner.present(host):
            return
        budget = max(0.0, deadline - time.monotonic() - 1.0)
        await self._offline_region(host, prepared.key, within=budget)
        crash_point("plugin.unprepare.after-memory-offline")


class NoopBackend:
    """Binds nothing, sees nothing: every device is 'attached' at once (benchmarks)."""

    name = "noop"

    def __init__(self, node: str) -> None:
        self.node = node

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        notes: AttachNotes,
        pool: str | None = None,
        namespace: str | None = None,
        share: ShareAsk | None = None,
        known: PreparedDevice | None = None,
    ) -> AttachedDevice:
        info = Device(
            name=device,
            pool="",
            fabric="noop",
            type=DeviceType.OTHER,
            state=BindingState.BOUND,
            node=self.node,
            claim_uid=claim_uid,
            binding_style="",
            redfish_uri="",
        )
        return AttachedDevice(device=info, host=None)

    async def release(
        self, claim_uid: str, prepared: PreparedDevice, *, within: float, last_on_gpu: bool = True
    ) -> None:
        return None

    async def bindings(self) -> list[Device] | None:
        return None

    def blind_pools(self) -> frozenset[str]:
        return frozenset()

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        return None

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        return None

    async def aclose(self) -> None:
        return None
