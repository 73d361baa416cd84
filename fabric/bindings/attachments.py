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

Partitions of a GPU and shares of a memory pool are :mod:`fabric.bindings.sharing`; the answer, for
all of them, :mod:`fabric.bindings.answers`. How unfinished operations are resumed after a restart
is :mod:`fabric.bindings.reconcile`.
"""

from __future__ import annotations

import enum
import time

from fabric.bindings.answers import Answer, Answers
from fabric.bindings.budgets import BudgetGate, within_budget
from fabric.bindings.checks import busy, check_free, check_usable, claim_allows, reachable_target
from fabric.bindings.sharing import Sharing
from fabric.bindings.warm import COLD, HIT, MISS, WarmPool
from fabric.driver.operations import OperationDriver
from fabric.driver.resets import reset_by_node
from fabric.state.claims import ClaimView
from fabric.state.inventory import Inventory
from fabric.state.ledger import (
    Ledger,
    LedgerEntry,
    LedgerState,
    ResetState,
    share_key,
)
from fabric.state.model import DeviceRecord, HostRecord
from manager_api import models as api
from manager_api.errors import (
    AttachTimeout,
    DeviceBusy,
    DeviceNotFound,
    FabricUnavailable,
    NotLeader,
)
from plumbing.logs import get_logger

__all__ = ["Attachments"]

log = get_logger(__name__)


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
        budgets: BudgetGate | None = None,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.driver = driver
        self.records = driver.records
        self.warm = warm
        #: the cluster's ResourceClaims an attach must match; None without Kubernetes API access
        self.claims = claims
        #: the DeviceBudgets a claim's new hold must fit (docs/budgets.md); None without API access
        self.budgets = budgets
        self.is_leader = driver.is_leader
        #: device → the claim a warm device is moving to from another node: counted a miss once,
        #: its attach after the move is not counted again (one outcome, one arrival per claim)
        self._moving: dict[str, str] = {}
        self.answers = Answers(inventory, ledger, driver)
        #: partitions of GPUs and shares of memory pools
        self.sharing = Sharing(
            inventory,
            ledger,
            driver,
            self.answers,
            claimed=self._claimed,
            warm=warm,
            claims=claims,
            budgets=budgets,
        )

    def use_budgets(self, gate: BudgetGate) -> None:
        """Check every new hold against ``gate`` (built after this front: it asks
        :meth:`Sharing.partition <fabric.bindings.sharing.Sharing.partition>` which device a name is)."""
        self.budgets = self.sharing.budgets = gate

    def _require_leader(self) -> None:
        if not self.is_leader():
            raise NotLeader("this fabric manager replica is not the leader; ask the leader", retry_after=2.0)

    # -- attach ----------------------------------------------------------------------------------

    async def attach(self, request: api.AttachRequest, wait: float) -> Answer:
        """Bind ``request.device`` to ``request.node`` for the claim; (attachment, HTTP status).
        A partition device binds its GPU (:meth:`Sharing.attach_partition
        <fabric.bindings.sharing.Sharing.attach_partition>`), a memory pool makes a share
        (:meth:`~fabric.bindings.sharing.Sharing.attach_share`)."""
        self._require_leader()
        partition = self.sharing.partition(request.device)
        if partition is not None:
            return await self.sharing.attach_partition(request, partition, wait)
        request = await claim_allows(self.claims, self.inventory, request)
        record, host = reachable_target(self.inventory, request)
        if record.memory_domain is not None:
            return await self.sharing.attach_share(request, record, host, wait)
        if request.share_id is not None or request.memory_bytes is not None:
            # the claim's allocation names a share of a device this fabric offers whole only: as
            # for a device of another pool, this fabric has no such (shareable) device
            raise DeviceNotFound(
                f"device {request.device} is no memory pool: this fabric has no shares of it "
                "(an allocation with a shareID names a pool)",
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
        return await self.answers.answer(
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
            async with within_budget(self.budgets, claim, name):  # a new hold: the tree's budget
                self.ledger.admit(node, name)
                await self.records.start_attach(record, host, node, claim, namespace=request.namespace)
            self.driver.kick(name)
            if self._moving.pop(name, None) != claim:  # (a move's claim was counted a miss)
                self._claimed(record, node, COLD)
            return _Wait.OPERATION
        if entry.warm_held:
            return await self._from_warm(entry, record, request)
        if entry.claim_uid != claim or entry.node != node:
            raise busy(entry)
        if entry.state is LedgerState.BOUND:
            return self.answers.attachment(name, node, claim, api.AttachmentState.ATTACHED), 200
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
            async with within_budget(self.budgets, claim, name):
                await self.records.take_warm(entry, claim, namespace=request.namespace, node_reset=node_reset)
            self._claimed(record, node, HIT)
            return self.answers.attachment(name, node, claim, api.AttachmentState.ATTACHED), 200
        if entry.state is LedgerState.WARM and entry.node != node:
            # Warm on another node: moved (detached there, then attached here as usual once the
            # fabric let go), never refused and never bound twice.
            await self.records.start_detach(entry)
            self._claimed(record, node, MISS)
            self._moving[name] = claim
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
            return self.answers.attachment(name, node, claim, api.AttachmentState.ATTACHING), 202
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

    # -- detach ----------------------------------------------------------------------------------

    async def detach(
        self, device: str, claim: str, node: str, wait: float, *, share_id: str | None = None
    ) -> Answer:
        """Unbind ``device`` if ``claim`` holds it on ``node``; anything else is a no-op success.
        A partition device lets go of its placement; a memory pool's share is named by ``share_id``."""
        self._require_leader()
        if not self.inventory.loaded.is_set():
            # Before the first pass a bound device is not in the inventory yet, and its detach would
            # read as "no longer on the fabric": the entry dropped, the device left bound (found by
            # an orphan sweep started right after a restart). The REST routes refuse earlier.
            raise FabricUnavailable("the fabric inventory is not loaded yet", retry_after=2.0)
        partition = self.sharing.partition(device)
        if partition is not None:
            return await self.sharing.detach_partition(partition, claim, node, wait)
        record = self.inventory.device(device)
        if record is not None and record.memory_domain is not None:
            if share_id is None:
                return self.answers.attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            device = share_key(device, share_id)
        slot = self.driver.slot(device)
        async with slot.lock:
            entry = self.answers.known_entry(device)
            if entry is None or entry.claim_uid != claim or entry.node != node:
                return self.answers.attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            if entry.state is LedgerState.BOUND and self.warm is not None and self.warm.wants_back(entry):
                # kept bound, and reset before another claim gets it (the driver runs the reset)
                await self.records.keep_warm(entry)  # stays bound to the node: nothing to wait for
                self.driver.kick(device)
                return self.answers.attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            if entry.state is not LedgerState.DETACHING or entry.rollback:
                await self.records.start_detach(entry)
            operation = entry.operation_id
            self.driver.kick(device)
        return await self.answers.answer(
            device, node, claim, api.OperationKind.DETACH, wait, operation=operation
        )

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
            entry = self.answers.known_entry(device)
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
                return self.answers.attachment(device, node, claim, state), 200
            if report.outcome is api.ResetOutcome.OK:
                await self.records.node_reset_done(entry)
                return self.answers.attachment(device, node, claim, api.AttachmentState.ATTACHED), 200
            namespace, failed = entry.namespace, entry.model_copy()
            reason = f"the node could not reset it: {report.message}"
            # Not handed to the claim dirty: detached (intent before action), to be attached again
            # for the same claim, a slot power cycle (docs/manager.md "A detach and a re-attach
            # count as a reset").
            await self.records.start_detach(entry)
            entry.error = reason
            operation = entry.operation_id
            self.driver.kick(device)
        await self.driver.resets.node_reset_failed(failed, reason)  # its Event: not under the device's lock
        return await self._power_cycle(device, node, claim, namespace, operation, wait)

    async def _power_cycle(
        self, device: str, node: str, claim: str, namespace: str | None, operation: str, wait: float
    ) -> Answer:
        """Once the detach of a device its node could not reset is done, attach it again for the
        same claim; where that stands after ``wait`` seconds in all."""
        deadline = time.monotonic() + max(0.0, wait)
        # A detach that fails or does not finish in time fails the claim's prepare: the device
        # is out of the pool either way, never handed over unreset.
        _, status = await self.answers.answer(
            device, node, claim, api.OperationKind.DETACH, wait, operation=operation
        )
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
                return self.answers.attachment(device, node, claim, api.AttachmentState.ATTACHING), 202
        return await self.answers.answer(
            device, node, claim, api.OperationKind.ATTACH, max(0.0, deadline - time.monotonic())
        )
