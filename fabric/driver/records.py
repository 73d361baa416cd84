"""What an operation leaves behind, written in one place: the ledger entry (the intent, durably,
before anything is sent to the fabric; the result after), the operation log, the inventory's view
of the device and the metrics. Nothing here talks to the fabric.

* **Intent before action.** An attach writes its ledger entry durably before the first Redfish
  request (:meth:`OperationRecords.start_attach`); a detach moves the entry to ``detaching``
  durably before unbinding (:meth:`OperationRecords.start_detach`). A write that fails puts the
  ledger back and fails the operation: nothing was done.
* **Hand-overs in one write.** A warm device given to a claim (:meth:`OperationRecords.take_warm`)
  and a released one kept warm (:meth:`OperationRecords.keep_warm`) change holder by one durable
  write of one entry, nothing sent to the fabric.
* **Nothing half-done.** An attach that fails for good turns into a rollback
  (:meth:`OperationRecords.attach_failed`: ``detaching`` with ``rollback``).

The caller holds the device's lock for an intent; a result takes it itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from fabric.driver.slots import DeviceSlots
from fabric.state.inventory import Inventory
from fabric.state.ledger import (
    WARM_HOLDER,
    Ledger,
    LedgerEntry,
    LedgerState,
    PartitionHold,
    ResetState,
    ShareRecord,
    share_key,
)
from fabric.state.metrics import ManagerMetrics
from fabric.state.model import DeviceRecord, HostRecord
from fabric.state.operation_log import OperationLog
from manager_api import models as api
from manager_api.errors import DeviceBusy, DeviceNotFound, FabricError
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["OperationRecords"]

log = get_logger(__name__)


def _rounded(seconds: float | None) -> float | None:
    """An operation's duration as its log line carries it: milliseconds are enough."""
    return None if seconds is None else round(seconds, 3)


class OperationRecords:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        operations: OperationLog,
        slots: DeviceSlots,
        *,
        metrics: ManagerMetrics | None = None,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.operations = operations
        self.slots = slots
        self.metrics = metrics
        #: told of every attach that succeeded, with its duration (the warm pool's hot-add time)
        self.attach_observers: list[Callable[[DeviceRecord, float], None]] = []

    # -- intents (the caller holds the device's lock) --------------------------------------------

    async def start_attach(
        self,
        record: DeviceRecord,
        host: HostRecord,
        node: str,
        claim: str,
        *,
        namespace: str | None = None,
        partitions: list[PartitionHold] | None = None,
        share: ShareRecord | None = None,
    ) -> api.Operation:
        """Record the intent to bind ``record`` to ``host`` (``node``) for ``claim`` durably: the
        device whole, a GPU for its first partition holders (``partitions``), or a share of a
        memory pool (``share``: the entry's key is the share's)."""
        key = share_key(record.name, share.share_id) if share is not None else record.name
        op = self.operations.start(api.OperationKind.ATTACH, key, node, claim)
        entry = LedgerEntry(
            device=key,
            device_key=record.key,
            node=node,
            host=host.id,
            claim_uid=claim,
            state=LedgerState.ATTACHING,
            operation_id=op.id,
            namespace=namespace,
            partitions=list(partitions or ()),
            share=share,
        )
        self.ledger.put(entry)
        crash_point("manager.attach.before-intent")
        await self._commit_intent(op, undo=lambda: self.ledger.remove(key))
        crash_point("manager.attach.after-intent")
        log.info("attach started", device=key, node=node, claim=claim, operation=op.id)
        self._started(key, api.OperationKind.ATTACH)
        return op

    async def holders_changed(self, entry: LedgerEntry, partitions: list[PartitionHold]) -> None:
        """A GPU serving partitions on its node gets or loses a holder: one durable write of its
        entry, nothing sent to the fabric (the GPU stays bound). A failed write puts it back."""
        previous = list(entry.partitions)
        entry.partitions = partitions
        self.ledger.put(entry)
        try:
            await self.ledger.commit()
        except FabricError:
            entry.partitions = previous
            self.ledger.put(entry)
            raise
        crash_point("manager.partition.after-holder-recorded")
        self.inventory.changed(entry.device)
        log.info(
            "partition holders changed",
            device=entry.device,
            node=entry.node,
            partitions=[f"{h.partition}/{h.claim_uid}" for h in partitions],
        )

    async def share_step(self, entry: LedgerEntry, **changes: str | None) -> None:
        """What the fabric made for a share (its ``chunk``, its ``connection``), durably before
        the next step is sent."""
        if entry.share is None:
            return
        entry.share = entry.share.model_copy(update=changes)
        self.ledger.put(entry)
        await self.ledger.commit()
        self.inventory.changed(entry.device)

    async def start_detach(self, entry: LedgerEntry) -> None:
        """Record the intent to unbind (``entry`` moves to ``detaching``) durably."""
        op = self.operations.start(api.OperationKind.DETACH, entry.device, entry.node, entry.claim_uid)
        previous = entry.model_copy()
        entry.state = LedgerState.DETACHING
        entry.rollback = False
        entry.operation_id = op.id
        self.ledger.put(entry)
        crash_point("manager.detach.before-intent")
        await self._commit_intent(op, undo=lambda: self.ledger.put(previous))
        crash_point("manager.detach.after-intent")
        log.info(
            "detach started", device=entry.device, node=entry.node, claim=entry.claim_uid, operation=op.id
        )
        self._started(entry.device, api.OperationKind.DETACH)

    async def take_warm(
        self,
        entry: LedgerEntry,
        claim: str,
        *,
        namespace: str | None = None,
        node_reset: bool = False,
        partitions: list[PartitionHold] | None = None,
    ) -> api.Operation:
        """Give the warm device of ``entry`` to ``claim`` on the node it is warm on: one durable
        ledger write, nothing sent to the fabric (the binding is already there). Only a clean
        device (:attr:`LedgerEntry.clean`: reset since its last claim, or fresh from a hot-add) is
        given, whatever the claim's namespace — or, with ``node_reset`` (the device is reset by its
        node: :func:`fabric.driver.resets.reset_by_node`), one still ``reset: pending``, which the
        entry keeps: the attach answer tells the plugin to reset it before the claim may use it.

        Crash-safe because one device's entry is one key of one shard, written whole: a crash
        before the write leaves the device warm (the claim's retry takes it then), after it the
        device is the claim's. Never both, never neither."""
        if not entry.clean and not node_reset:
            raise DeviceBusy(
                f"device {entry.device} is being reset after its last claim",
                device=entry.device,
                node=entry.node,
                held_by=f"{entry.node}/",
                retry_after=1.0,
            )
        op = self.operations.start(api.OperationKind.ATTACH, entry.device, entry.node, claim)
        previous = entry.model_copy()
        last_namespace = entry.namespace
        entry.namespace = namespace
        entry.reset = None if entry.clean else ResetState.PENDING  # a node reset still due stays due
        entry.claim_uid = claim
        entry.partitions = list(partitions or ())
        entry.state = LedgerState.BOUND
        entry.operation_id = op.id
        entry.error = None
        self.ledger.put(entry)
        crash_point("manager.warm.before-transfer")
        await self._commit_intent(op, undo=lambda: self.ledger.put(previous))
        crash_point("manager.warm.after-transfer")
        finished = self.operations.finish(op.id, None)
        if finished is not None and finished.finished_at is not None:
            # A hit is an attach too: the histogram shows what the pod's start waited for.
            seconds = (finished.finished_at - finished.started_at).total_seconds()
            self._observe(api.OperationKind.ATTACH, self.inventory.device(entry.device), "success", seconds)
        self.inventory.changed(entry.device)
        log.info(
            "warm device given to a claim",
            device=entry.device,
            node=entry.node,
            claim=claim,
            namespace=namespace,
            last_namespace=last_namespace,
        )
        return op

    async def keep_warm(self, entry: LedgerEntry) -> None:
        """Take ``entry``'s device back from its claim into the warm pool of its node instead of
        unbinding it: one durable ledger write, nothing sent to the fabric. A crash before the
        write leaves it the claim's (the claim's retried detach decides again); after it, warm.

        The same write marks it ``reset: pending`` (its namespace kept as the last tenant's), for
        the driver to reset it: no claim gets it before, and a restart finds the reset still due."""
        op = self.operations.start(api.OperationKind.DETACH, entry.device, entry.node, entry.claim_uid)
        previous = entry.model_copy()
        claim = entry.claim_uid
        entry.claim_uid = WARM_HOLDER
        entry.state = LedgerState.WARM
        entry.reset = ResetState.PENDING
        entry.operation_id = op.id
        self.ledger.put(entry)
        await self._commit_intent(op, undo=lambda: self.ledger.put(previous))
        crash_point("manager.warm.after-return")
        self.operations.finish(op.id, None)
        self.inventory.changed(entry.device)
        log.info("device kept warm after its claim", device=entry.device, node=entry.node, claim=claim)

    async def node_reset_done(self, entry: LedgerEntry) -> None:
        """The node's plugin reset the device of ``entry`` (its claim's, ``reset: pending``): mark
        it ``done``, durably before the plugin is answered (its prepare returns only then)."""
        previous = entry.model_copy()
        entry.reset = ResetState.DONE
        self.ledger.put(entry)
        try:
            await self.ledger.commit()
        except FabricError:
            self.ledger.put(previous)  # still pending: the plugin's retried prepare resets again
            raise
        if self.metrics is not None:
            self.metrics.device_resets.labels("success").inc()
        log.info(
            "device reset by its node",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
            namespace=entry.namespace,
        )

    async def _commit_intent(self, op: api.Operation, *, undo: Callable[[], None]) -> None:
        """Write the intent durably before anything is sent to the fabric; when the write fails,
        ``undo`` puts the ledger back and the operation fails with it (nothing was done)."""
        try:
            await self.ledger.commit()
        except FabricError as err:
            undo()
            self.operations.finish(op.id, err)
            raise

    def _started(self, device: str, kind: api.OperationKind) -> None:
        self.slots(device).error = None
        if self.metrics:
            self.metrics.in_flight.labels(str(kind)).inc()
        self.inventory.changed(device)

    def adopt(self, entry: LedgerEntry) -> None:
        """Show the operation of an unfinished entry that an earlier run of the manager started
        (resumed from the ledger); a rollback is no operation of its own."""
        if self.operations.get(entry.operation_id) is None and not entry.rollback:
            kind = (
                api.OperationKind.ATTACH if entry.state is LedgerState.ATTACHING else api.OperationKind.DETACH
            )
            self.operations.adopt(entry.operation_id, kind, entry.device, entry.node, entry.claim_uid)
            if self.metrics:
                self.metrics.in_flight.labels(str(kind)).inc()
        self.operations.running(entry.operation_id)

    # -- results (each takes the device's lock) --------------------------------------------------

    async def attached(self, entry: LedgerEntry, record: DeviceRecord) -> None:
        slot = self.slots(entry.device)
        async with slot.lock:
            entry.task_monitor = None
            entry.error = None
            if entry.state is LedgerState.ATTACHING:
                # An attach for the warm pool ends warm: bound to the node, held for no claim,
                # clean (a hot-add brings the function up from a powered-off slot).
                entry.state = LedgerState.WARM if entry.warm_held else LedgerState.BOUND
                entry.reset = ResetState.DONE if entry.warm_held else None
            self.ledger.put(entry)
            self.inventory.note_binding(entry.device, (entry.host,))
            # Written, not waited for: the intent is durable, and a restart that finds "attaching"
            # marks it bound from the fabric's state. The caller's answer is one fsync sooner.
            self.ledger.commit_soon()
            crash_point("manager.attach.after-result")
        slot.error = None
        self.inventory.note_attach(entry.device, None)
        seconds = self._finish(entry, record, api.OperationKind.ATTACH, None)
        log.info(
            "attached", device=entry.device, node=entry.node, claim=entry.claim_uid, seconds=_rounded(seconds)
        )

    async def detached(self, entry: LedgerEntry, record: DeviceRecord) -> None:
        slot = self.slots(entry.device)
        async with slot.lock:
            self.ledger.remove(entry.device)
            self.inventory.note_binding(entry.device, ())
            self.ledger.commit_soon()  # a restart that finds "detaching" and no binding drops it
            if not entry.rollback:
                crash_point("manager.detach.after-result")
        if entry.rollback:
            log.info("failed attach rolled back", device=entry.device, node=entry.node, claim=entry.claim_uid)
            return
        slot.error = None
        seconds = self._finish(entry, record, api.OperationKind.DETACH, None)
        log.info(
            "detached", device=entry.device, node=entry.node, claim=entry.claim_uid, seconds=_rounded(seconds)
        )

    async def attach_failed(self, entry: LedgerEntry, record: DeviceRecord, err: FabricError) -> None:
        """The attach failed for good: the entry turns into a rollback (``detaching``)."""
        slot = self.slots(entry.device)
        err.device = err.device or entry.device
        err.node = err.node or entry.node
        async with slot.lock:
            entry.state = LedgerState.DETACHING
            entry.rollback = True
            entry.error = err.message
            self.ledger.put(entry)
            with contextlib.suppress(FabricError):
                await self.ledger.commit()
        slot.error = err
        if not isinstance(err, DeviceBusy):  # held by someone else: nothing wrong with the device
            self.inventory.note_attach(entry.device, err.code)
        seconds = self._finish(entry, record, api.OperationKind.ATTACH, err)
        log.warning(
            "attach failed, rolling back",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
            error=err.message,
            seconds=_rounded(seconds),
        )

    async def vanished(self, entry: LedgerEntry, device_gone: bool) -> None:
        """The device, or the host of its node, left the fabric: the entry is dropped."""
        what = f"device {entry.device}" if device_gone else f"host {entry.host} of node {entry.node}"
        err = DeviceNotFound(f"{what} is no longer on the fabric", device=entry.device, node=entry.node)
        slot = self.slots(entry.device)
        async with slot.lock:
            self.ledger.remove(entry.device)
            with contextlib.suppress(FabricError):
                await self.ledger.commit()
        slot.error = err
        kind = api.OperationKind.ATTACH if entry.state is LedgerState.ATTACHING else api.OperationKind.DETACH
        self._finish(entry, None, kind, None if kind is api.OperationKind.DETACH else err)
        log.warning("dropped ledger entry: " + err.message, device=entry.device, claim=entry.claim_uid)
        self.inventory.changed(entry.device)

    def _finish(
        self,
        entry: LedgerEntry,
        record: DeviceRecord | None,
        kind: api.OperationKind,
        error: FabricError | None,
    ) -> float | None:
        """Finish the entry's operation; its duration in seconds for the log line (None: not ours)."""
        op = self.operations.get(entry.operation_id)
        if op is None or op.finished_at is not None or op.kind is not kind:
            return None
        finished = self.operations.finish(op.id, error)
        if finished is None:
            return None
        seconds = (
            (finished.finished_at - finished.started_at).total_seconds() if finished.finished_at else 0.0
        )
        if kind is api.OperationKind.ATTACH and error is None and record is not None:
            for observer in self.attach_observers:
                observer(record, seconds)
        self._observe(kind, record, "success" if error is None else error.code, seconds)
        if self.metrics is not None:
            self.metrics.in_flight.labels(str(kind)).dec()
        return seconds

    def _observe(
        self, kind: api.OperationKind, record: DeviceRecord | None, outcome: str, seconds: float
    ) -> None:
        """An attach or detach took ``seconds`` and ended so (``outcome``): its histogram."""
        if self.metrics is None:
            return
        histogram = (
            self.metrics.attach_seconds if kind is api.OperationKind.ATTACH else self.metrics.detach_seconds
        )
        histogram.labels(str(record.attributes.type) if record else "unknown", outcome).observe(seconds)
