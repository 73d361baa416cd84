"""The binding-condition flow (KEP-5007; resource.k8s.io/v1 ``bindsToNode`` / ``bindingConditions``).

With ``--binding-conditions`` every published device carries ``bindsToNode: true``, the binding
condition ``<driver>/Attached`` and the failure condition ``<driver>/AttachFailed``. The
scheduler allocates such a device, records the chosen node in ``status.allocation.nodeSelector``
(one ``matchFields`` term on ``metadata.name``) and then waits in PreBind until every binding
condition of the claim's devices is True — or a failure condition is True, when it gives the
allocation up and schedules the pod again (kube-scheduler ``dynamicresources`` plugin,
``isClaimReadyForBinding``; the API server drops ``status.devices`` entries of deallocated
devices, ``dropDeallocatedStatusDevices``).

This controller is the other half: it watches ResourceClaims, and for each allocated device of
this driver that carries the binding condition it asks the fabric manager to attach the device
to the allocated node (idempotent per claim UID + device), then sets ``Attached=True`` in the
claim's ``status.devices`` — or ``AttachFailed=True`` with the manager's reason when the fabric
refuses, the device stays busy, or the attach does not finish within ``--bind-timeout``.

A GPU partition is attached by its partition device's name: the manager binds the GPU to the node
of its first partition and refuses (409 ``DeviceBusy``) a partition of it for another node while any
is held there — such a partition fails its binding condition at once, so the scheduler picks again
(docs/controller.md, "GPU partitions"). A share of a memory pool (an allocation with a ``shareID``)
is attached with that share ID and its ``consumedCapacity`` of memory; the manager carves a chunk of
exactly that size, or refuses when the pool has no room (the scheduler's view was stale), and the
binding condition fails.

When an allocation it attached for goes away (the scheduler gave up, the claim was deallocated
or deleted) it detaches again. A device that reached ``Attached=True`` may be in a pod's hands;
its release waits ``release_grace`` so the kubelet plugin's unprepare (host-side removal, then
detach) normally runs first — the detach here is then a no-op, as the manager only detaches for
the holder.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from dra_driver.controller.claimstatus import ConditionWriter, Target
from dra_driver.controller.devices import MEMORY_CAPACITY
from dra_driver.controller.metrics import BIND_SECONDS, BIND_TOTAL
from dra_driver.controller.quarantine import Quarantine
from dra_driver.controller.resourcenames import BindingConditionNames
from dra_driver.controller.workqueue import KeyedWork
from dra_driver.selection.quantity import QuantityError, parse_quantity
from manager_api.attaching import AttachPolicy, AttachProgress, attach_until_attached
from manager_api.client import ManagerClient
from manager_api.errors import AttachStillRunning, BudgetExceeded, DeviceBusy, FabricError
from manager_api.feed import InventorySource
from manager_api.models import MAX_WAIT_SECONDS, Attachment
from manager_api.partitions import PartitionTable, parse_partition
from plumbing.crashpoints import crash_point
from plumbing.kube import KubeClient
from plumbing.kube.dra import AllocatedDeviceStatus, ResourceClaim
from plumbing.kube.events import EventRecorder, ObjectRef
from plumbing.kube.informer import Change, Informer, Origin, object_uid
from plumbing.kube.resources import RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = ["ClaimBinder", "Target"]

log = get_logger(__name__)


def _parse_time(value: str | None) -> float | None:
    """A metav1.Time as a wall-clock timestamp."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


#: what the binder holds for a claim: (device, node, share ID or "")
_Key = tuple[str, str, str]


@dataclass
class _Held:
    """A device this controller attached (or tried to) for a claim."""

    attached: bool = False
    release_at: float | None = None


class _ConditionProgress(AttachProgress):
    """What the claim hears while its device is attached: a device still held for an allocation
    that is gone is released sooner, and ``Attached=False`` says ``Attaching`` once."""

    def __init__(self, binder: ClaimBinder, uid: str, target: Target) -> None:
        self._binder, self._uid, self._target = binder, uid, target
        self._said_attaching = False

    def before_request(self) -> None:
        crash_point("controller.attach.before-request")

    def busy(self, err: DeviceBusy) -> None:
        if self._binder.elsewhere(self._target, err):
            # The GPU serves partitions on another node: nothing here will free it soon, and the
            # scheduler, told at once, picks again from a publication that no longer offers the
            # GPU's placements here.
            raise err
        self._binder.expedite(self._target.device, claim=self._uid)

    async def attaching(self, attachment: Attachment, waited: float) -> None:
        if self._said_attaching:
            return
        self._said_attaching = True
        binder = self._binder
        await binder.set_conditions(
            self._uid,
            self._target,
            {
                binder.names.attached: (
                    "False",
                    "Attaching",
                    f"the fabric is attaching the device to {self._target.node}",
                )
            },
        )


class ClaimBinder:
    def __init__(
        self,
        kube: KubeClient,
        manager: ManagerClient,
        feed: InventorySource,
        *,
        driver: str,
        bind_timeout: float = 300.0,
        busy_timeout: float = 30.0,
        release_grace: float = 30.0,
        attach_wait: float = 20.0,
        concurrency: int = 32,
        quarantine: Quarantine | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self._kube = kube
        self.quarantine = quarantine
        self._events = events
        self._manager = manager
        self._feed = feed
        self.driver = driver
        self.names = BindingConditionNames(driver)
        self.bind_timeout = bind_timeout
        self.busy_timeout = busy_timeout
        self.release_grace = release_grace
        self.attach_wait = min(attach_wait, MAX_WAIT_SECONDS)
        self._sem = asyncio.Semaphore(concurrency)
        #: claim UID → latest object seen (raw JSON)
        self._claims: dict[str, dict[str, Any]] = {}
        self._work = KeyedWork(
            lambda uid: self.reconcile(uid, self._claims.get(uid)), what="binding-condition work"
        )
        self._conditions = ConditionWriter(kube, driver, self._claims, self._allocates)
        #: claim UID → (device, node, share) → what we did for it
        self._held: dict[str, dict[_Key, _Held]] = {}
        self._first_seen: dict[tuple[str, str, str], float] = {}
        #: claims with a device reported AttachFailed: the pod cannot bind with that allocation,
        #: so what was attached for it is released without the grace period
        self._doomed: set[str] = set()
        #: the partition tables of the inventory's GPUs, by inventory version (``_gpu_of``)
        self._tables: tuple[int | None, dict[str, PartitionTable]] = (None, {})
        #: Event writes, which must outlive the claim's worker (its allocation changing cancels it)
        self._side_tasks: set[asyncio.Task[bool]] = set()

    # -- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        await self._feed.wait_newer(None)  # pools are needed to know which results are ours
        try:
            await Informer(self._kube, RESOURCE_CLAIMS, on_changes=self._on_changes).run()
        finally:
            self._work.stop()
            for task in self._side_tasks:
                task.cancel()

    def _on_changes(self, changes: Sequence[Change], origin: Origin) -> None:
        for change in changes:
            uid = self._uid(change.object)
            if change.type == "DELETED":
                self._forget(uid)
            else:
                self._observe(uid, change.object)

    @staticmethod
    def _uid(obj: dict[str, Any]) -> str:
        return object_uid(obj)

    def _observe(self, uid: str, obj: dict[str, Any]) -> None:
        previous = self._claims.get(uid)
        self._claims[uid] = obj
        targets = self.targets(obj)
        if not targets and uid not in self._held:
            return
        if previous is not None and self._wanted(previous) != self._wanted(obj):
            self._work.cancel(uid)  # an attach for an allocation that changed must not go on
        self._work.schedule(uid)

    def _forget(self, uid: str) -> None:
        self._claims.pop(uid, None)
        if uid in self._held:
            self._work.cancel(uid)
            self._work.schedule(uid)

    def _wanted(self, obj: dict[str, Any]) -> set[tuple[str, str | None, str | None]]:
        return {(t.device, t.node, t.share_id) for t in self.targets(obj)}

    # -- one claim ----------------------------------------------------------------------------

    def targets(self, obj: dict[str, Any] | None) -> list[Target]:
        """The allocated devices of ``obj`` that wait for this driver's binding condition."""
        claim = ResourceClaim.read(obj) if obj is not None else None
        if claim is None or claim.status.allocation is None:
            return []
        pools = {p.pool for p in self._feed.latest.pools} if self._feed.latest is not None else set()
        node = claim.status.allocation.node
        return [
            Target(r.pool, r.device, node, r.share_id or None, self._share_bytes(r.consumed_capacity))
            for r in claim.results_for(self.driver)
            if self.names.attached in r.binding_conditions and r.pool in pools
        ]

    def _share_bytes(self, consumed: dict[str, str] | None) -> int | None:
        """A share's ``consumedCapacity`` of this driver's ``memory``, in whole bytes, or None."""
        text = (consumed or {}).get(f"{self.driver}/{MEMORY_CAPACITY}")
        if text is None:
            return None
        try:
            value = parse_quantity(str(text)).value
        except QuantityError:
            return None
        return int(value) if value == int(value) and value > 0 else None

    def _gpu_of(self, device: str) -> str:
        """The GPU a partition device is carved from (``manager_api.partitions.parse_partition``
        over the inventory's tables); any other device is its own."""
        inventory = self._feed.latest
        if inventory is None:
            return device
        if self._tables[0] != inventory.version:
            tables = {d.name: d.partition_table for d in inventory.devices if d.partition_table is not None}
            self._tables = (inventory.version, tables)
        tables = self._tables[1]
        found = parse_partition(device, tables) if tables else None
        return found.gpu if found is not None else device

    def elsewhere(self, target: Target, err: DeviceBusy) -> bool:
        """Whether ``err`` refuses a partition because its GPU is held on another node (``held_by``:
        ``node/claim``, comma-separated)."""
        if self._gpu_of(target.device) == target.device or not err.held_by:
            return False
        nodes = {holder.strip().split("/", 1)[0] for holder in err.held_by.split(",")}
        return bool(nodes - {target.node})

    async def reconcile(self, uid: str, obj: dict[str, Any] | None) -> None:
        targets = self.targets(obj)
        wanted = {(t.device, t.node, t.share_id or "") for t in targets if t.node is not None}
        await self._release(uid, wanted)
        claim = ResourceClaim.read(obj) if obj is not None else None
        if claim is None or not targets:
            return
        if claim.metadata.deletion_timestamp:
            return  # being deleted: attach nothing new
        statuses = {
            (d.pool, d.device, d.share_id or None): d for d in claim.status.devices if d.driver == self.driver
        }
        await asyncio.gather(
            *(self._bind(uid, claim, t, statuses.get((t.pool, t.device, t.share_id))) for t in targets)
        )

    async def _release(self, uid: str, wanted: set[_Key]) -> None:
        held = self._held.get(uid, {})
        now = time.monotonic()
        moving = {(device, share) for device, _, share in wanted}
        for key, state in list(held.items()):
            if key in wanted:
                state.release_at = None
                continue
            device, node, share = key
            # No grace when the pod cannot have used it (a failed allocation) or when this same
            # claim now wants the device on another node.
            if state.attached and uid not in self._doomed and (device, share) not in moving:
                if state.release_at is None:
                    state.release_at = now + self.release_grace
                if now < state.release_at:
                    self._work.schedule_later(uid, state.release_at - now)
                    continue
            crash_point("controller.release.before-detach")
            await self._manager.detach(
                device, node, uid, wait_seconds=self.attach_wait, share_id=share or None
            )
            crash_point("controller.release.after-detach")
            del held[key]
            self._first_seen.pop((uid, device, share), None)
            BIND_TOTAL.labels(result="detached", reason="deallocated").inc()
            log.info("device released: its allocation is gone", claim=uid, device=device, node=node)
        if not held:
            self._held.pop(uid, None)
            self._doomed.discard(uid)

    def expedite(self, device: str, *, claim: str) -> None:
        """``device`` is allocated anew (to ``claim``) but still held for an allocation that is gone:
        cut that release's grace short — the scheduler has given the device to someone else. For a
        partition, any partition of its GPU held so counts (an overlapping placement)."""
        now = time.monotonic()
        gpu = self._gpu_of(device)
        for uid, held in self._held.items():
            for (held_device, _, _), state in held.items():
                if uid == claim or state.release_at is None:
                    continue
                if held_device == device or self._gpu_of(held_device) == gpu:
                    state.release_at = now
                    self._work.schedule(uid)

    async def _bind(
        self, uid: str, claim: ResourceClaim, target: Target, status: AllocatedDeviceStatus | None
    ) -> None:
        """Attach ``target``'s device for the claim and say so in its binding conditions, unless
        they already tell the outcome."""
        attached = status is not None and status.is_true(self.names.attached)
        failed = status is not None and status.is_true(self.names.failed)
        share = target.share_id or ""
        if attached and target.node:
            self._held.setdefault(uid, {}).setdefault(
                (target.device, target.node, share), _Held()
            ).attached = True
        if attached or failed:
            return
        if target.share_id and target.memory_bytes is None:
            await self._fail(
                uid,
                target,
                "NoShareSize",
                f"the allocation's share {target.share_id} of {target.device} has no consumedCapacity "
                f"{self.driver}/{MEMORY_CAPACITY} in whole bytes, so no chunk of the pool can be made for it",
            )
            return
        if target.node is None:
            await self._fail(
                uid,
                target,
                "NoNode",
                "the allocation does not name exactly one node (nodeSelector with one matchFields "
                "term on metadata.name), so there is no node to attach the device to",
            )
            return
        node = target.node
        started = self._first_seen.setdefault((uid, target.device, share), time.monotonic())
        # Recorded before the call: an attach interrupted here may still complete in the manager.
        held = self._held.setdefault(uid, {}).setdefault((target.device, node, share), _Held())
        log.info("attaching for binding condition", claim=uid, device=target.label, node=node)
        try:
            await attach_until_attached(
                self._manager,
                target.device,
                node,
                uid,
                self._policy(claim, started),
                progress=_ConditionProgress(self, uid, target),
                limit=self._sem,
                share_id=target.share_id,
                memory_bytes=target.memory_bytes,
            )
        except FabricError as err:
            await self._fail(uid, target, *self._failure(err), started=started)
            return
        held.attached = True
        held.release_at = None
        crash_point("controller.attach.after-request")
        await self.set_conditions(
            uid,
            target,
            {
                self.names.attached: ("True", "Attached", f"attached to node {node} by the fabric"),
                self.names.failed: ("False", "Attached", ""),
            },
        )
        crash_point("controller.attach.after-status")
        if self.quarantine is not None:
            self.quarantine.attach_succeeded(target.pool, self._gpu_of(target.device))
        BIND_TOTAL.labels(result="attached", reason="").inc()
        BIND_SECONDS.labels(result="attached").observe(time.monotonic() - started)
        log.info("device attached; binding condition set", claim=uid, device=target.label, node=node)

    def _policy(self, claim: ResourceClaim, started: float) -> AttachPolicy:
        """``--bind-timeout`` from when this controller first saw the device, or from the
        allocation's timestamp when that is sooner; ``--busy-timeout`` for a device held elsewhere."""
        allocation = claim.status.allocation
        allocated_at = _parse_time(allocation.allocation_timestamp if allocation is not None else None)
        deadline = started + self.bind_timeout
        if allocated_at is not None:
            deadline = min(deadline, time.monotonic() + (allocated_at + self.bind_timeout - time.time()))
        return AttachPolicy(
            wait_seconds=self.attach_wait,
            retry_until=deadline,
            attaching_until=deadline,
            busy_for=self.busy_timeout,
            backoff_initial=0.5,
            backoff_maximum=5.0,
        )

    def _failure(self, err: FabricError) -> tuple[str, str]:
        """The AttachFailed reason and message for an attach that ended in ``err``."""
        if isinstance(err, DeviceBusy):
            return "DeviceBusy", err.message
        if isinstance(err, BudgetExceeded):
            # At once, not at the deadline: the tree may hold its devices for hours. The scheduler
            # gives the allocation up and tries the pod again; it stays Pending until the tree
            # releases enough (docs/budgets.md, "Enforcement").
            return "BudgetExceeded", err.message
        if isinstance(err, AttachStillRunning):
            return "Timeout", f"the fabric did not finish attaching within {self.bind_timeout:.0f}s"
        if err.retriable:  # asked again until the deadline
            return "Timeout", f"the attach did not finish within {self.bind_timeout:.0f}s: {err.message}"
        return err.code, err.message

    async def _fail(
        self, uid: str, target: Target, reason: str, message: str, *, started: float | None = None
    ) -> None:
        reason = reason if reason.replace("_", "").isalnum() and reason[:1].isalpha() else "AttachFailed"
        self._doomed.add(uid)
        # Counted before any await: the status write below makes the scheduler deallocate, and
        # that change of allocation cancels this worker (_observe) — the count must stand.
        self._count_failure(uid, target, reason, message)
        await self.set_conditions(
            uid,
            target,
            {
                self.names.failed: ("True", reason, message),
                self.names.attached: ("False", reason, message),
            },
        )
        BIND_TOTAL.labels(result="failed", reason=reason).inc()
        if started is not None:
            BIND_SECONDS.labels(result="failed").observe(time.monotonic() - started)
        log.warning(
            "binding failed; the scheduler will pick again",
            claim=uid,
            device=target.label,
            node=target.node,
            reason=reason,
            error=message,
        )

    def _count_failure(self, uid: str, target: Target, reason: str, message: str) -> None:
        """Count a failed attach of ``target``'s device; the Event when that quarantines it is
        written by a task of its own, so that cancelling the claim's worker does not lose it."""
        if self.quarantine is None:
            return
        # A partition's failure is its GPU's: the fabric binds the GPU, and every partition of it
        # goes out of allocation with it.
        out = self.quarantine.attach_failed(target.pool, self._gpu_of(target.device), reason, message)
        obj = self._claims.get(uid)
        if out is None or self._events is None or obj is None:
            return
        meta = obj.get("metadata") or {}
        record = self._events.record(
            ObjectRef(
                "ResourceClaim",
                str(meta.get("name")),
                str(meta.get("namespace") or ""),
                "resource.k8s.io/v1",
                uid,
            ),
            reason="DeviceQuarantined",
            action="Quarantine",
            note=out.note(),
            event_type="Warning",
        )
        task = asyncio.create_task(record)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # -- status -------------------------------------------------------------------------------

    async def set_conditions(
        self, uid: str, target: Target, changes: dict[str, tuple[str, str, str]]
    ) -> bool:
        """Merge conditions into the claim's entry of ``target`` (:class:`.claimstatus.ConditionWriter`)."""
        return await self._conditions.set(uid, target, changes)

    def _allocates(self, obj: dict[str, Any], target: Target) -> bool:
        return any(
            (t.pool, t.device, t.share_id) == (target.pool, target.device, target.share_id)
            for t in self.targets(obj)
        )

    # -- test / status hooks --------------------------------------------------------------------

    def held(self) -> dict[str, set[tuple[str, str]]]:
        """Claim UID → the (device, node) it holds here; a share as ``device/shareID``."""
        return {
            uid: {(f"{d}/{share}" if share else d, node) for d, node, share in held}
            for uid, held in self._held.items()
        }

    async def drain(self) -> None:
        """Wait until no claim work is queued or running (for tests and shutdown)."""
        await self._work.drain()
