"""The life of an attach and a detach, from the request to the answer: the rules that keep a device
from ever being bound to two nodes.

This is the one owner of ``POST /api/v1/attachments``, ``DELETE /api/v1/attachments/{device}`` and
``POST /api/v1/devices/{device}/reset``. Each goes the same way, and every step is a helper it calls
(none calls back):

1. **checks** (:mod:`fabric.bindings.checks`): the claim allows it, the device and node exist and
   reach each other, the device is free and usable;
2. **what the request means**, decided from the ledger under the device's lock (idempotent per claim
   UID + device);
3. **the durable intent** (:class:`fabric.driver.records.OperationRecords`), written before the
   fabric is touched;
4. **the attempts** on the fabric, run by the device's task (:meth:`OperationDriver.kick
   <fabric.driver.operations.OperationDriver.kick>`), which records the result;
5. **the answer**: attached (200), still attaching or detaching (202), or why not.

* **Idempotent per claim UID + device.** A repeated attach joins or returns the existing binding;
  a detach by anyone but the holder (claim UID *and* node) is a no-op success.
* **Exclusive.** A device held by another claim or node, bound outside fabric-dra, or still being
  detached is 409 DeviceBusy with who holds it; the new holder gets it only after the fabric
  confirmed the unbind.
* **Leader only.** A follower refuses every request (:class:`manager_api.errors.NotLeader`).
* **Warm devices** (:mod:`fabric.bindings.warm`). A device warm on the claim's node is the claim's after
  one ledger write (no Redfish request) once it was reset since its last claim; warm on another
  node, it is detached there and attached here; released while its node's pool is below target,
  it goes back to warm instead of unbinding, to be reset before another claim gets it. A device
  its node resets (no Redfish ``Reset`` action) is a hit still ``reset: pending``: the answer says
  ``resetRequired`` until the plugin reports the reset (:meth:`Attachments.report_reset`).

How unfinished operations are resumed after a restart is :mod:`fabric.bindings.reconcile`.
"""

from __future__ import annotations

import enum
import time

from fabric.bindings.checks import busy, check_free, check_usable, claim_allows, reachable_target
from fabric.bindings.warm import COLD, HIT, MISS, WarmPool
from fabric.driver.operations import OperationDriver
from fabric.driver.resets import reset_by_node
from fabric.state.claims import ClaimView
from fabric.state.inventory import Inventory
from fabric.state.ledger import (
    PARTITIONS_HOLDER,
    Ledger,
    LedgerEntry,
    LedgerState,
    PartitionHold,
    ResetState,
    ShareRecord,
    share_key,
)
from fabric.state.model import DeviceRecord, HostRecord
from manager_api import models as api
from manager_api.errors import (
    AttachTimeout,
    BindFailed,
    DeviceBusy,
    DeviceNotFound,
    FabricUnavailable,
    InvalidRequest,
    NotLeader,
)
from manager_api.partitions import PartitionDevice, conflict, parse_partition
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["Attachments"]

log = get_logger(__name__)

Answer = tuple[api.Attachment, int]


class _Wait(enum.Enum):
    """What an attach waits for when the ledger says the device is not the claim's yet."""

    #: the device's operation runs for this claim: its answer
    OPERATION = "operation"
    #: warming, cooling, moving here or being reset: it comes to this claim (202 when time is up)
    WARM = "warm"
    #: a failed attach of this claim rolls back: then an attach afresh (409 when time is up)
    ROLLBACK = "rollback"


class Attachments:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        driver: OperationDriver,
        *,
        warm: WarmPool | None = None,
        claims: ClaimView | None = None,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.driver = driver
        self.records = driver.records
        self.warm = warm
        #: the cluster's ResourceClaims an attach must match; None without Kubernetes API access
        self.claims = claims
        self.is_leader = driver.is_leader

    def _require_leader(self) -> None:
        if not self.is_leader():
            raise NotLeader("this fabric manager replica is not the leader; ask the leader", retry_after=2.0)

    # -- attach ----------------------------------------------------------------------------------

    async def attach(self, request: api.AttachRequest, wait: float) -> Answer:
        """Bind ``request.device`` to ``request.node`` for the claim; (attachment, HTTP status).
        A partition device binds its GPU (:meth:`_attach_partition`), a memory pool makes a share
        (:meth:`_attach_share`)."""
        self._require_leader()
        partition = self._partition(request.device)
        if partition is not None:
            return await self._attach_partition(request, partition, wait)
        request = await claim_allows(self.claims, self.inventory, request)
        record, host = reachable_target(self.inventory, request)
        if record.memory_domain is not None:
            return await self._attach_share(request, record, host, wait)
        if request.share_id is not None or request.memory_bytes is not None:
            raise InvalidRequest(
                f"device {request.device} is no memory pool: it has no shares (no shareId, memoryBytes)",
                device=request.device,
            )
        slot = self.driver.slot(request.device)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            async with slot.lock:
                # a move changed its binding meanwhile
                record = self.inventory.device(request.device) or record
                step = await self._claim(record, host, request)
                event = slot.event
            if step is _Wait.OPERATION:
                break
            if not isinstance(step, _Wait):
                return step
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._still_waiting(step, request)
            await slot.moved_on(remaining, event)
        return await self._answer(
            request.device,
            request.node,
            request.claim_uid,
            api.OperationKind.ATTACH,
            max(0.0, deadline - time.monotonic()),
        )

    async def _claim(
        self, record: DeviceRecord, host: HostRecord, request: api.AttachRequest
    ) -> Answer | _Wait:
        """What the attach means, from the device's ledger entry (the caller holds its lock): the
        answer now, or what to wait for; an intent to bind is recorded here."""
        name, node, claim = request.device, request.node, request.claim_uid
        entry = self.ledger.get(name)
        if entry is None:
            check_free(self.inventory, record)
            self.ledger.admit(node, name)
            await self.records.start_attach(record, host, node, claim, namespace=request.namespace)
            self.driver.kick(name)
            self._claimed(record, node, COLD)
            return _Wait.OPERATION
        if entry.warm_held:
            return await self._from_warm(entry, record, request)
        if entry.claim_uid != claim or entry.node != node:
            raise busy(entry)
        if entry.state is LedgerState.BOUND:
            return self._attachment(name, node, claim, api.AttachmentState.ATTACHED), 200
        if entry.state is LedgerState.ATTACHING:
            self.driver.kick(name)
            return _Wait.OPERATION
        if not entry.rollback:
            raise DeviceBusy(
                f"device {name} is being detached for claim {claim}; attach it again once detached",
                device=name,
                node=node,
                held_by=f"{entry.node}/{entry.claim_uid}",
                retry_after=1.0,
            )
        # A retry of a failed attach: let its rollback finish, then attach afresh.
        self.driver.kick(name)
        return _Wait.ROLLBACK

    async def _from_warm(
        self, entry: LedgerEntry, record: DeviceRecord, request: api.AttachRequest
    ) -> Answer | _Wait:
        """The attach of a device the warm pool holds: a hit on the claim's node (one ledger write),
        a move from another node, or a wait while it warms, cools or is reset."""
        name, node, claim = request.device, request.node, request.claim_uid
        node_reset = reset_by_node(record)  # its plugin resets it before the claim uses it
        if entry.state is LedgerState.WARM and entry.node == node and (entry.clean or node_reset):
            check_usable(record)
            await self.records.take_warm(entry, claim, namespace=request.namespace, node_reset=node_reset)
            self._claimed(record, node, HIT)
            return self._attachment(name, node, claim, api.AttachmentState.ATTACHED), 200
        if entry.state is LedgerState.WARM and entry.node != node:
            # Warm on another node: moved (detached there, then attached here as usual once the
            # fabric let go), never refused and never bound twice.
            await self.records.start_detach(entry)
            self._claimed(record, node, MISS)
            log.info("warm device moves to another node", device=name, node=node, claim=claim)
        # Warming, cooling, or reset after its last claim (a reset that fails takes it out of the
        # pool: this claim then gets it cold): wait for that to finish.
        self.driver.kick(name)
        return _Wait.WARM

    def _still_waiting(self, step: _Wait, request: api.AttachRequest) -> Answer:
        """The attach's time is up while the device is not the claim's yet."""
        name, node, claim = request.device, request.node, request.claim_uid
        if step is _Wait.WARM:
            # Not busy: it comes to this claim. The plugin asks again (a long poll).
            return self._attachment(name, node, claim, api.AttachmentState.ATTACHING), 202
        raise DeviceBusy(
            f"device {name} is rolling back a failed attach for claim {claim}; ask again",
            device=name,
            node=node,
            held_by=f"{node}/{claim}",
            retry_after=1.0,
        )

    def _claimed(self, record: DeviceRecord, node: str, outcome: str) -> None:
        if self.warm is not None:
            self.warm.claimed(record, node, outcome)

    # -- partitions (design 35-36 A4) ------------------------------------------------------------

    def _partition(self, name: str) -> PartitionDevice | None:
        """The partition device ``name`` names, of a GPU in the inventory; None for any other name."""
        if self.inventory.device(name) is not None:
            return None
        tables = {
            r.name: r.attributes.partition_table
            for r in self.inventory.devices()
            if r.attributes.partition_table is not None
        }
        return parse_partition(name, tables) if tables else None

    async def _attach_partition(
        self, request: api.AttachRequest, partition: PartitionDevice, wait: float
    ) -> Answer:
        """A partition of a GPU for the claim: the GPU bound to the node of its first partition
        (the normal confirmed bind, held by :data:`PARTITIONS_HOLDER`), each placement held by one
        claim, none overlapping another; the GPU held whole, or for another node, is busy."""
        if request.share_id is not None or request.memory_bytes is not None:
            raise InvalidRequest(
                f"device {request.device} is a GPU partition, no memory pool: it has no shares",
                device=request.device,
            )
        gpu = partition.gpu
        request = await claim_allows(self.claims, self.inventory, request, gpu=gpu)
        record, host = reachable_target(self.inventory, request.model_copy(update={"device": gpu}))
        node, hold = request.node, PartitionHold(partition=partition.name, claim_uid=request.claim_uid)
        async with self.driver.slot(gpu).lock:
            record = self.inventory.device(gpu) or record
            entry = self.ledger.get(gpu)
            if entry is None:
                check_free(self.inventory, record)
                self.ledger.admit(node, gpu)
                await self.records.start_attach(
                    record, host, node, PARTITIONS_HOLDER, namespace=request.namespace, partitions=[hold]
                )
                crash_point("manager.partition.after-holder-recorded")
                self.driver.kick(gpu)
                self._claimed(record, node, COLD)
            elif entry.warm_held and entry.state is LedgerState.WARM and entry.node == node:
                node_reset = reset_by_node(record)
                if not (entry.clean or node_reset):
                    raise DeviceBusy(
                        f"GPU {gpu} of partition {partition.name} is being reset after its last claim",
                        device=partition.name, held_by=f"{node}/", retry_after=1.0,
                    )  # fmt: skip
                check_usable(record)
                await self.records.take_warm(
                    entry,
                    PARTITIONS_HOLDER,
                    namespace=request.namespace,
                    node_reset=node_reset,
                    partitions=[hold],
                )
                crash_point("manager.partition.after-holder-recorded")
                self._claimed(record, node, HIT)
            elif not entry.partition_held or entry.node != node:
                err = busy(entry)
                err.message = f"GPU {gpu} of partition {partition.name}: {err.message}"
                err.device = partition.name
                raise err
            elif hold not in entry.partitions:
                if entry.state is LedgerState.DETACHING:
                    raise DeviceBusy(
                        f"GPU {gpu} is being released from node {node}; ask again once it is",
                        device=partition.name, held_by=f"{node}/partitions", retry_after=1.0,
                    )  # fmt: skip
                held = [p for h in entry.partitions if (p := self._partition(h.partition)) is not None]
                why = conflict(partition, held)
                if why is not None:
                    holders = ", ".join(f"{node}/{h.claim_uid}" for h in entry.partitions)
                    raise DeviceBusy(why, device=partition.name, node=node, held_by=holders)
                await self.records.holders_changed(entry, [*entry.partitions, hold])
            elif entry.state is LedgerState.ATTACHING:
                self.driver.kick(gpu)
        attachment, status = await self._answer(
            gpu, node, PARTITIONS_HOLDER, api.OperationKind.ATTACH, max(0.0, wait)
        )
        return attachment.model_copy(
            update={"claim_uid": request.claim_uid, "partition": partition.name}
        ), status

    async def _detach_partition(
        self, partition: PartitionDevice, claim: str, node: str, wait: float
    ) -> Answer:
        """The holder goes (one durable write); the GPU is unbound (confirmed) only with its last,
        or kept warm on its node when the warm pool wants it back."""
        gpu = partition.gpu
        hold = PartitionHold(partition=partition.name, claim_uid=claim)
        async with self.driver.slot(gpu).lock:
            entry = self.ledger.get(gpu)
            if (
                entry is None
                or not entry.partition_held
                or entry.node != node
                or hold not in entry.partitions
            ):
                answer = self._attachment(gpu, node, claim, api.AttachmentState.DETACHED)
                return answer.model_copy(update={"partition": partition.name}), 200
            left = [h for h in entry.partitions if h != hold]
            if left:
                await self.records.holders_changed(entry, left)
                answer = self._attachment(gpu, node, claim, api.AttachmentState.DETACHED)
                return answer.model_copy(update={"partition": partition.name}), 200
            entry.partitions = []
            if entry.state is LedgerState.BOUND and self.warm is not None and self.warm.wants_back(entry):
                await self.records.keep_warm(entry)
                self.driver.kick(gpu)
                answer = self._attachment(gpu, node, claim, api.AttachmentState.DETACHED)
                return answer.model_copy(update={"partition": partition.name}), 200
            if entry.state is not LedgerState.DETACHING or entry.rollback:
                await self.records.start_detach(entry)  # the last holder and the intent: one write
            self.driver.kick(gpu)
        attachment, status = await self._answer(gpu, node, PARTITIONS_HOLDER, api.OperationKind.DETACH, wait)
        return attachment.model_copy(update={"claim_uid": claim, "partition": partition.name}), status

    # -- shares of a memory pool (design 35-36 B4) -------------------------------------------------

    async def _attach_share(
        self, request: api.AttachRequest, pool: DeviceRecord, host: HostRecord, wait: float
    ) -> Answer:
        """A chunk of the share's size carved from the pool and connected to the node, for the
        claim's allocation (shareID); never more than the pool holds, whatever the scheduler saw."""
        domain = pool.memory_domain
        if domain is None or request.share_id is None or request.memory_bytes is None:
            raise InvalidRequest(
                f"device {request.device} is a memory pool: ask for a share (shareId, memoryBytes)",
                device=request.device,
            )
        node, claim = request.node, request.claim_uid
        key = share_key(pool.name, request.share_id)
        # The pool's lock: shares are admitted one at a time against what the pool holds.
        async with self.driver.slot(pool.name).lock:
            entry = self.ledger.get(key)
            if entry is None:
                check_usable(pool)
                chunk_bytes = domain.chunk_bytes(request.memory_bytes)
                used = domain.outside_bytes + sum(
                    e.share.chunk_mib << 20 for e in self.ledger.shares_of(pool.name) if e.share is not None
                )
                if used + chunk_bytes > domain.size_bytes:
                    raise DeviceBusy(
                        f"{pool.name}: {_gib(used)} of {_gib(domain.size_bytes)} in use; "
                        f"{_gib(chunk_bytes)} asked",
                        device=pool.name, node=node, held_by=f"{pool.name}/shares",
                    )  # fmt: skip
                self.ledger.admit(node, key)
                share = ShareRecord(
                    pool=pool.name,
                    share_id=request.share_id,
                    memory_bytes=request.memory_bytes,
                    chunk_mib=domain.chunk_mib(request.memory_bytes),
                )
                await self.records.start_attach(
                    pool, host, node, claim, namespace=request.namespace, share=share
                )
                self.driver.kick(key)
            elif entry.share is None or (entry.claim_uid, entry.node, entry.share.memory_bytes) != (
                claim,
                node,
                request.memory_bytes,
            ):
                raise DeviceBusy(
                    f"share {request.share_id} of {pool.name} is another allocation's",
                    device=pool.name, held_by=f"{entry.node}/{entry.claim_uid}",
                )  # fmt: skip
            elif entry.state is LedgerState.DETACHING and not entry.rollback:
                raise DeviceBusy(
                    f"share {request.share_id} of {pool.name} is being released; ask again once it is",
                    device=pool.name, held_by=f"{entry.node}/{entry.claim_uid}", retry_after=1.0,
                )  # fmt: skip
            elif entry.state is LedgerState.ATTACHING:
                self.driver.kick(key)
        return await self._answer(key, node, claim, api.OperationKind.ATTACH, max(0.0, wait))

    # -- detach ----------------------------------------------------------------------------------

    async def detach(
        self, device: str, claim: str, node: str, wait: float, *, share_id: str | None = None
    ) -> Answer:
        """Unbind ``device`` if ``claim`` holds it on ``node``; anything else is a no-op success.
        A partition device lets go of its placement; a memory pool's share is named by ``share_id``."""
        self._require_leader()
        partition = self._partition(device)
        if partition is not None:
            return await self._detach_partition(partition, claim, node, wait)
        record = self.inventory.device(device)
        if record is not None and record.memory_domain is not None:
            if share_id is None:
                return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            device = share_key(device, share_id)
        slot = self.driver.slot(device)
        async with slot.lock:
            entry = self._known_entry(device)
            if entry is None or entry.claim_uid != claim or entry.node != node:
                return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            if entry.state is LedgerState.BOUND and self.warm is not None and self.warm.wants_back(entry):
                # kept bound, and reset before another claim gets it (the driver runs the reset)
                await self.records.keep_warm(entry)  # stays bound to the node: nothing to wait for
                self.driver.kick(device)
                return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            if entry.state is not LedgerState.DETACHING or entry.rollback:
                await self.records.start_detach(entry)
            self.driver.kick(device)
        return await self._answer(device, node, claim, api.OperationKind.DETACH, wait)

    # -- a node's reset of a device it got reset: pending ---------------------------------------

    async def report_reset(self, device: str, report: api.ResetReport, wait: float) -> Answer:
        """The plugin of ``report.node`` reset (or could not reset) ``device``, which its claim got
        from the warm pool still ``reset: pending``. ``ok``: the entry is ``done`` (durably) and the
        answer ``attached``. ``failed``: the device is detached and attached again for the same
        claim (a slot power cycle); the answer is where that stands (``attaching``: the plugin
        asks again with an attach, then waits for the device to be visible again). A report for a
        device the claim holds clean is an idempotent success."""
        self._require_leader()
        node, claim = report.node, report.claim_uid
        async with self.driver.slot(device).lock:
            entry = self._known_entry(device)
            if entry is None or entry.claim_uid != claim or entry.node != node:
                raise DeviceBusy(
                    f"device {device} is not held by claim {claim} on node {node}; only its holder "
                    "reports its reset",
                    device=device,
                    node=node,
                    held_by=f"{entry.node}/{entry.claim_uid}" if entry else "",
                )
            if entry.state is not LedgerState.BOUND or entry.reset is not ResetState.PENDING:
                # reported twice, or power-cycled already: where it stands answers the plugin
                bound = entry.state is LedgerState.BOUND
                state = api.AttachmentState.ATTACHED if bound else api.AttachmentState.ATTACHING
                return self._attachment(device, node, claim, state), 200
            if report.outcome is api.ResetOutcome.OK:
                await self.records.node_reset_done(entry)
                return self._attachment(device, node, claim, api.AttachmentState.ATTACHED), 200
            namespace, failed = entry.namespace, entry.model_copy()
            reason = f"the node could not reset it: {report.message}"
            # Not handed to the claim dirty: detached (intent before action), to be attached again
            # for the same claim, a slot power cycle (docs/manager.md "A detach and a re-attach
            # count as a reset").
            await self.records.start_detach(entry)
            entry.error = reason
            self.driver.kick(device)
        await self.driver.resets.node_reset_failed(failed, reason)  # its Event: not under the device's lock
        return await self._power_cycle(device, node, claim, namespace, wait)

    async def _power_cycle(
        self, device: str, node: str, claim: str, namespace: str | None, wait: float
    ) -> Answer:
        """Once the detach of a device its node could not reset is done, attach it again for the
        same claim; where that stands after ``wait`` seconds in all."""
        deadline = time.monotonic() + max(0.0, wait)
        # A detach that fails or does not finish in time fails the claim's prepare: the device
        # is out of the pool either way, never handed over unreset.
        _, status = await self._answer(device, node, claim, api.OperationKind.DETACH, wait)
        if status != 200:
            raise AttachTimeout(
                f"device {device} could not be reset by node {node} and is still being power-cycled "
                "(detached); the claim's prepare is retried",
                device=device,
                node=node,
            )
        record = self.inventory.device(device)
        host = self.inventory.host_for_node(node)
        if record is None or host is None:
            raise DeviceNotFound(f"device {device} is no longer on the fabric", device=device)
        async with self.driver.slot(device).lock:
            entry = self.ledger.get(device)
            if entry is None:
                self.ledger.admit(node, device)
                await self.records.start_attach(record, host, node, claim, namespace=namespace)
                self.driver.kick(device)
            elif entry.claim_uid != claim:
                # Taken meanwhile (the pool warmed it up again by a hot-add: clean): the plugin's
                # attach finds where it stands.
                return self._attachment(device, node, claim, api.AttachmentState.ATTACHING), 202
        return await self._answer(
            device, node, claim, api.OperationKind.ATTACH, max(0.0, deadline - time.monotonic())
        )

    # -- the answer ------------------------------------------------------------------------------

    def _known_entry(self, device: str) -> LedgerEntry | None:
        """``device``'s ledger entry (None: free); DeviceNotFound when the fabric does not know it
        either (a share's key names its pool)."""
        entry = self.ledger.get(device)
        if entry is None and self.inventory.device(device.split("/", 1)[0]) is None:
            raise DeviceNotFound(f"device {device} is not in the fabric inventory", device=device)
        return entry

    def _attachment(
        self, device: str, node: str, claim_uid: str, state: api.AttachmentState
    ) -> api.Attachment:
        """The answer about ``device`` (a share's key answers with its pool and the share)."""
        entry = self.ledger.get(device)
        record = self.inventory.device(device.split("/", 1)[0])
        share = None
        if entry is not None and entry.share is not None and entry.claim_uid == claim_uid:
            share = api.MemoryShare(
                share_id=entry.share.share_id,
                claim_uid=entry.claim_uid,
                node=entry.node,
                memory_bytes=entry.share.memory_bytes,
                state=api.BindingState.BOUND
                if entry.state is LedgerState.BOUND
                else api.BindingState(str(entry.state)),
                chunk=entry.share.chunk,
                connection=entry.share.connection,
            )
        if record is not None:
            rendered = self.inventory.render_device(record)
        else:  # the device left the fabric; describe what is known
            rendered = api.Device(
                name=device,
                pool="",
                fabric="",
                type=api.DeviceType.OTHER,
                state=api.BindingState.UNAVAILABLE,
                binding_style="",
                redfish_uri=entry.device_key if entry else "",
            )
        mine = entry is not None and entry.claim_uid == claim_uid and entry.node == node
        return api.Attachment(
            share=share,
            device=rendered,
            node=node,
            claim_uid=claim_uid,
            state=state,
            operation_id=entry.operation_id if entry and entry.claim_uid == claim_uid else None,
            # asked again while pending (a retried prepare): reset again, never less
            reset_required=mine
            and entry is not None
            and entry.state is LedgerState.BOUND
            and state is api.AttachmentState.ATTACHED
            and entry.reset is ResetState.PENDING,
        )

    async def _answer(
        self, device: str, node: str, claim: str, kind: api.OperationKind, wait: float
    ) -> Answer:
        """Wait up to ``wait`` seconds for the device's operation, then say where it stands."""
        slot = self.driver.slot(device)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            entry = self.ledger.get(device)
            mine = entry is not None and entry.claim_uid == claim and entry.node == node
            if kind is api.OperationKind.ATTACH:
                if mine and entry is not None and entry.state is LedgerState.BOUND:
                    return self._attachment(device, node, claim, api.AttachmentState.ATTACHED), 200
                if not mine or (entry is not None and entry.rollback):
                    raise slot.error or BindFailed(
                        f"attaching {device} to {node} failed", device=device, node=node
                    )
            else:
                if not mine:
                    return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
                if entry is not None and entry.state is not LedgerState.DETACHING:
                    raise slot.error or BindFailed(f"detaching {device} from {node} failed", device=device)
            if not slot.running and slot.error is not None:
                raise slot.error  # the operation paused (fabric unreachable, task still running) or failed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if isinstance(slot.error, FabricUnavailable | AttachTimeout):
                    raise slot.error
                state = (
                    api.AttachmentState.ATTACHING
                    if kind is api.OperationKind.ATTACH
                    else api.AttachmentState.DETACHING
                )
                return self._attachment(device, node, claim, state), 202
            await slot.moved_on(remaining)


def _gib(n: int) -> str:
    """Bytes as GiB for a refusal: ``180 GiB``, ``1.5 GiB``."""
    return f"{n / (1 << 30):.2f}".rstrip("0").rstrip(".") + " GiB"
