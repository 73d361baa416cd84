"""Attaching a claim's devices at prepare: every device not yet in place, concurrently and in the
background (an attach outlives the kubelet's call when the fabric is slow); what each attach ended
in, recorded in the claim's entry; the kubelet's error naming every device that is not done. When
the allocation cannot work on this node at all, what the claim holds here is released again.

Devices a claim has found on the host are reserved for it until its entry records them, so that
two claims preparing at once never take the same host device. A GPU that serves partitions is
shared: partition claims may find it while other claims' partitions are on it, a whole-device
claim never.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from dra_driver.plugin import prepare_errors
from dra_driver.plugin.backend import AttachedDevice, AttachNotes, DeviceBackend, ShareAsk
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimEntry, PreparedDevice
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.claimstatus import Reason
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.facts import DeviceFacts
from dra_driver.plugin.hostdev import DeviceNotVisible, HostDevice
from dra_driver.plugin.hostmemory import MemoryFailed
from dra_driver.plugin.metrics import observe_phase
from dra_driver.plugin.partitioner import PartitionFailed
from dra_driver.plugin.prepare_errors import PrepareFailed
from dra_driver.plugin.state import InflightWork
from manager_api.errors import FabricError
from manager_api.models import Device
from plumbing.logs import get_logger

__all__ = ["PARTITION_TYPE", "ClaimAttacher"]

#: the device type of a GPU partition (design 35-36, A3: ``DeviceType.GPU_PARTITION``), also the
#: kind of its CDI spec, ``k8s.<driver>/gpu-partition``
PARTITION_TYPE = "gpu-partition"

log = get_logger(__name__)


@dataclass
class _Outcome:
    """What the attaches of one kubelet call ended in."""

    #: device → its record, attached and (unless the backend has no host side) seen
    attached: dict[str, PreparedDevice] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    #: a failure says the allocation cannot work on this node, however often it is retried
    permanent: bool = False
    #: devices whose attach outlived the call
    still: list[str] = field(default_factory=list)
    #: devices the fabric bound that this node could not make usable (not seen, no partition)
    unusable: list[str] = field(default_factory=list)


class ClaimAttacher:
    def __init__(
        self,
        backend: DeviceBackend,
        store: CheckpointStore,
        *,
        node: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.store = store
        self.node = node
        self.inflight = InflightWork()
        self._clock = clock
        #: (sysfs path, claim UID) found for a claim but not yet in its checkpoint entry → whether
        #: the claim shares it (a GPU it makes a partition of)
        self._reserved: dict[tuple[str, str], bool] = {}
        #: (claim UID, device key) → the manager's answer and how long the attach took, for the
        #: claim's device status (kept until the claim's status is said: :meth:`take_attached`)
        self._attached: dict[tuple[str, str], tuple[Device, float]] = {}
        #: (claim UID, device key) → why the device is not ready (a ``Ready`` reason, the message)
        self.verdicts: dict[tuple[str, str], tuple[str, str]] = {}

    # -- host devices held by claims -----------------------------------------------------------

    def held_paths(self, except_uid: str, *, shared: bool = False) -> set[str]:
        """Host devices of other claims; ``shared``: for a partition claim, for which a GPU other
        claims only have partitions of is not taken."""
        held = {
            path
            for (path, uid), part in self._reserved.items()
            if uid != except_uid and not (shared and part)
        }
        for uid, entry in self.store.claims().items():
            if uid == except_uid:
                continue
            held.update(
                d.host.sysfs_path
                for d in entry.devices
                if d.host is not None and not (shared and d.parent is not None)
            )
        return held

    def partition_users(self, gpu_path: str, except_uid: str | None = None) -> set[str]:
        """Claims with partitions of the GPU at ``gpu_path`` (recorded, or being made)."""
        users = {uid for (path, uid), part in self._reserved.items() if part and path == gpu_path}
        for uid, entry in self.store.claims().items():
            if any(
                d.parent is not None and d.host is not None and d.host.sysfs_path == gpu_path
                for d in entry.devices
            ):
                users.add(uid)
        if except_uid is not None:
            users.discard(except_uid)
        return users

    def reserve(self, uid: str, host: HostDevice | None, *, shared: bool = False) -> None:
        if host is not None:
            self._reserved[(host.sysfs_path, uid)] = shared

    def drop_reservations(self, uid: str) -> None:
        for key in [k for k in self._reserved if k[1] == uid]:
            del self._reserved[key]

    def attached_facts(self, uid: str, key: str) -> tuple[Device | None, float | None]:
        """The manager's answer about the claim's device and how long its attach took, when this
        process attached it (a device prepared before a restart has neither)."""
        found = self._attached.get((uid, key))
        return (None, None) if found is None else found

    def forget(self, uid: str) -> None:
        """The claim's status is said (or the claim is gone): drop what was kept for it."""
        for table in (self._attached, self.verdicts):
            for key in [k for k in table if k[0] == uid]:
                del table[key]

    # -- attaching ------------------------------------------------------------------------------

    async def attach_all(self, ref: ClaimRef, entry: ClaimEntry, deadline: float) -> ClaimEntry:
        """Attach every device not yet in place; record progress; raise :class:`PrepareFailed`
        naming every device that is not done by ``deadline``."""
        todo = [d for d in entry.devices if not self.in_place(d)]
        if not todo:
            return entry
        tasks = {d.key: self.inflight.get_or_start((ref.uid, d.key), self._attach(ref, d)) for d in todo}
        done, _pending = await asyncio.wait(tasks.values(), timeout=max(0.0, deadline - self._clock()))
        outcome = self._outcome(ref, entry, tasks, done)
        # What the attaches recorded on the way (a partition being made) is in the store's entry.
        entry = self.store.get(ref.uid) or entry
        if outcome.attached:
            entry = entry.model_copy(
                update={"devices": [outcome.attached.get(d.key, d) for d in entry.devices]}
            )
            self.store.put(entry)
        if not outcome.failures and not outcome.still:
            return entry
        raise await self._failure(ref, entry, outcome, deadline)

    def _attach(self, ref: ClaimRef, device: PreparedDevice) -> Callable[[], Any]:
        """The attach of ``device`` for the claim, as a task the next kubelet call can pick up."""
        notes = _Notes(self, ref, device)
        share = None
        if device.share_id is not None:
            share = ShareAsk(
                share_id=device.share_id,
                memory_bytes=device.memory_bytes or 0,
                mode=device.memory_mode or MemoryMode.DEVDAX,
            )

        async def run() -> AttachedDevice:
            started = self._clock()
            attached = await self.backend.attach(
                ref.uid,
                device.device,
                notes=notes,
                pool=device.pool,
                namespace=ref.namespace,
                share=share,
                known=device,
            )
            # before any await: no other claim may take it
            self.reserve(ref.uid, attached.host, shared=attached.placement is not None)
            self._attached[(ref.uid, device.key)] = (attached.device, self._clock() - started)
            return attached

        return run

    def record(self, uid: str, attached: AttachedDevice, asked: PreparedDevice) -> PreparedDevice:
        """The claim's record of ``asked`` now that ``attached`` says where it is."""
        facts = DeviceFacts.of(attached.device)
        facts |= {"device": asked.device, "pool": asked.pool, "share_id": asked.share_id}
        update: dict[str, Any] = {}
        if attached.placement is not None:
            facts |= {"parent": attached.device.name, "type": PARTITION_TYPE}
            update |= {
                "partition_profile": attached.placement.profile.name,
                "partition_start": attached.placement.start,
                "partition": attached.partition,
            }
        if attached.share_bytes is not None:
            facts["memory_bytes"] = attached.share_bytes
            update |= {"memory_mode": asked.memory_mode, "memory": attached.memory}
        return PreparedDevice(
            **facts, request_names=asked.request_names, attached=True, host=attached.host, **update
        )

    def _outcome(
        self,
        ref: ClaimRef,
        entry: ClaimEntry,
        tasks: dict[str, asyncio.Task[Any]],
        done: set[asyncio.Task[Any]],
    ) -> _Outcome:
        outcome = _Outcome()
        for key, task in tasks.items():
            asked = next(d for d in entry.devices if d.key == key)
            if task not in done:
                outcome.still.append(key)
                self.verdicts[(ref.uid, key)] = (
                    Reason.ATTACHING,
                    prepare_errors.still_attaching(key, self.node, self.backend.pending_error(ref.uid, key)),
                )
                continue
            self.inflight.finished((ref.uid, key))
            try:
                attached = task.result()
            except (PartitionFailed, MemoryFailed) as err:
                # bound, but this node could not make it usable: the message says what and why
                outcome.unusable.append(key)
                outcome.failures.append(
                    f"device {asked.device} was bound to node {self.node} but could not be made usable "
                    f"there: {str(err).rstrip('. ')}"
                    + (
                        "; this cannot work on this node: delete the pod so the scheduler picks again"
                        if err.permanent
                        else ""
                    )
                )
                outcome.permanent = outcome.permanent or err.permanent
                reason = Reason.PARTITION_FAILED if isinstance(err, PartitionFailed) else Reason.MEMORY_FAILED
                self.verdicts[(ref.uid, key)] = (reason, outcome.failures[-1])
            except (FabricError, DeviceNotVisible) as err:
                if isinstance(err, DeviceNotVisible):
                    outcome.unusable.append(key)
                outcome.failures.append(prepare_errors.attach_failure(err, asked.device, self.node, ref.uid))
                outcome.permanent = outcome.permanent or prepare_errors.cannot_work_here(
                    err, ref.uid, self.node
                )
                reason = Reason.NOT_VISIBLE if isinstance(err, DeviceNotVisible) else Reason.ATTACH_FAILED
                self.verdicts[(ref.uid, key)] = (reason, outcome.failures[-1])
            except asyncio.CancelledError:
                outcome.failures.append(
                    f"attaching device {asked.device} to node {self.node} was cancelled; the kubelet retries"
                )
                self.verdicts[(ref.uid, key)] = (Reason.ATTACH_FAILED, outcome.failures[-1])
            else:
                outcome.attached[key] = self.record(ref.uid, attached, asked)
                self.verdicts.pop((ref.uid, key), None)
        return outcome

    async def _failure(
        self, ref: ClaimRef, entry: ClaimEntry, outcome: _Outcome, deadline: float
    ) -> PrepareFailed:
        """The kubelet's error for the claim; first, when the allocation cannot work here, give
        back what the claim holds on this node, and record what is attached now."""
        if outcome.permanent:
            # This allocation cannot work on this node: give back what the claim holds here, so no
            # device stays bound to a node whose pod has to be deleted.
            entry, note = await self._roll_back(ref, entry, [*outcome.still, *outcome.unusable], deadline)
            messages = [*outcome.failures, note]
        else:
            # Retriable: keep what did get attached for the kubelet's retry, and say so.
            kept = [d.device for d in entry.devices if d.attached]
            waiting = [
                prepare_errors.still_attaching(d, self.node, self.backend.pending_error(ref.uid, d))
                for d in sorted(outcome.still)
            ]
            messages = (
                outcome.failures + waiting + ([prepare_errors.kept_attached(kept, self.node)] if kept else [])
            )
        if outcome.attached or outcome.permanent:
            # The call ends here: record what is attached now (the completed record covers the rest).
            with observe_phase("checkpoint"):
                await self.store.commit()
        return PrepareFailed(f"claim {ref.namespace}/{ref.name}: " + " | ".join(messages))

    async def _roll_back(
        self, ref: ClaimRef, entry: ClaimEntry, still: list[str], deadline: float
    ) -> tuple[ClaimEntry, str]:
        """Detach every device the claim holds (or is still attaching, or has bound but could not
        use) on this node; the entry with what stays attached, and one line saying what was
        released and what was not."""
        await self.inflight.cancel_claim(ref.uid)  # the manager rolls back an attach it is still running
        held = [d for d in entry.devices if d.attached or d.key in still]
        budget = max(0.0, deadline - self._clock())
        results = await asyncio.gather(
            *(
                self.backend.release(ref.uid, d, within=budget, last_on_gpu=self.last_on_gpu(ref.uid, d))
                for d in held
            ),
            return_exceptions=True,
        )
        released: list[str] = []
        kept: list[tuple[str, BaseException]] = []
        gone: set[str] = set()
        for prepared, result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                kept.append((prepared.device, result))
            else:
                released.append(prepared.device)
                gone.add(prepared.key)
        cleared = {"attached": False, "host": None, "partition": None, "memory": None}
        entry = entry.model_copy(
            update={"devices": [d.model_copy(update=cleared) if d.key in gone else d for d in entry.devices]}
        )
        self.store.put(entry)
        if not kept:
            self.drop_reservations(ref.uid)
        log.warning(
            "claim cannot be prepared on this node; rolled back",
            claim=ref.uid,
            node=self.node,
            released=",".join(released) or None,
            kept=",".join(d for d, _ in kept) or None,
        )
        return entry, prepare_errors.rolled_back(released, kept, self.node)

    def in_place(self, device: PreparedDevice) -> bool:
        """Attached, (unless the backend has no host side) seen by the host, and made usable: a
        partition made, a share's memory handed over."""
        if self.backend.name == "noop":
            return device.attached
        if not device.attached or device.host is None:
            return False
        if device.parent is not None and device.partition is None:
            return False
        return device.share_id is None or device.memory is not None

    def last_on_gpu(self, uid: str, device: PreparedDevice) -> bool:
        """Whether no other claim has partitions of the GPU ``device`` is a partition of."""
        if device.parent is None or device.host is None:
            return True
        return not self.partition_users(device.host.sysfs_path, except_uid=uid)


class _Notes(AttachNotes):
    """The plugin's side of one device's attach (:class:`AttachNotes`)."""

    def __init__(self, attacher: ClaimAttacher, ref: ClaimRef, device: PreparedDevice) -> None:
        self._attacher, self._ref, self._device = attacher, ref, device

    def exclude(self, *, shared: bool) -> Collection[str]:
        held = self._attacher.held_paths(self._ref.uid, shared=shared)
        # and what the claim's own other devices hold (two shares of one pool and size), but never
        # a GPU the claim's other partitions share
        entry = self._attacher.store.get(self._ref.uid)
        for d in entry.devices if entry is not None else ():
            if d.key != self._device.key and d.host is not None and d.parent is None:
                held.add(d.host.sysfs_path)
        return held

    def reserve(self, host: HostDevice) -> None:
        # asked for a partition's GPU (shared with other partitions) or a share's region (its own)
        self._attacher.reserve(self._ref.uid, host, shared=self._device.share_id is None)

    def partition_users(self, gpu_path: str) -> set[str]:
        return self._attacher.partition_users(gpu_path, except_uid=self._ref.uid)

    async def visible(self, attached: AttachedDevice) -> None:
        """Record, before the partition is made or the memory onlined, that this claim is doing
        it and where: a crash in between finds it again as this claim's, and an unprepare undoes it."""
        store = self._attacher.store
        entry = store.get(self._ref.uid)
        if entry is None:
            return
        made = self._attacher.record(self._ref.uid, attached, self._device)
        devices = [made if d.key == self._device.key else d for d in entry.devices]
        store.put(entry.model_copy(update={"devices": devices}))
        # Guards against a crash of this process: after a power loss the node has neither.
        await store.commit(durable=False)
