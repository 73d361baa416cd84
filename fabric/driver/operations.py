"""The operation driver: at most one operation at a time per device, from durable intent to result.

* **One operation at a time per device.** Each device has at most one *driver* task that moves its
  ledger entry to where it should be (``attaching`` → bound, ``detaching`` → gone). Requests
  (:mod:`fabric.bindings.attachments`) never touch the fabric themselves: they record intent here, start
  (or join) the driver, and wait for it.
* **Intent before action.** An attach writes its ledger entry durably before the first Redfish
  request; a detach moves the entry to ``detaching`` durably before unbinding.
* **Nothing half-done.** An attach that fails for good turns into a rollback (``detaching`` with
  ``rollback``): the driver makes sure the device is not bound, then drops the entry.
* **Held until the fabric lets go.** An unbind the fabric refuses keeps the device held and is
  tried again after growing pauses.
* **Leader only.** Every fabric mutation is fenced by the Lease (:class:`manager_api.errors.NotLeader`).
* **Reset between tenants.** A device a claim gives back to the warm pool is ``reset: pending``
  (durably, in the same write) until the driver has reset it through its Redfish ``Reset``
  action; until then no claim gets it (:meth:`OperationDriver.take_warm`). A reset that fails
  takes the device out of the pool (detached, with a Warning Event). A device the fabric offers no
  ``Reset`` action for is reset by the node's plugin instead (:func:`reset_by_node`): a claim on
  its node gets it still ``pending`` and the attach answer says so; the plugin's report settles it
  (:meth:`OperationDriver.node_reset_done`, :meth:`OperationDriver.node_reset_failed`).
  docs/manager.md "Hygiene between tenants".

What one operation does on the fabric, reading before every change, is
:class:`fabric.driver.attempts.FabricAttempts`; resuming what was left unfinished is
:mod:`fabric.bindings.reconcile`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fabric.backends.base import Backend, BindContext
from fabric.driver.attempts import FabricAttempts, TaskControl, Unresolved
from fabric.state.inventory import Inventory
from fabric.state.ledger import WARM_HOLDER, Ledger, LedgerEntry, LedgerState, ResetState
from fabric.state.metrics import ManagerMetrics
from fabric.state.model import DeviceRecord, HostRecord
from fabric.state.operation_log import OperationLog, OperationSettings
from manager_api import models as api
from manager_api.errors import DeviceBusy, DeviceNotFound, FabricError, NotLeader
from plumbing.backoff import Backoff
from plumbing.crashpoints import crash_point
from plumbing.kube.events import EventRecorder, ObjectRef
from plumbing.logs import get_logger

__all__ = ["DeviceSlot", "OperationDriver", "reset_by_node", "resettable"]

log = get_logger(__name__)


def reset_by_node(record: DeviceRecord) -> bool:
    """Whether ``record``'s device is reset between tenants by its node's plugin (a PCIe
    function-level reset through sysfs) rather than through the fabric: the fabric offers no
    Redfish ``Reset`` action for it, and it is a PCIe function (CXL memory has no PCIe function
    on the host for the plugin to reset)."""
    return record.attributes.reset_target is None and record.attributes.type is not api.DeviceType.CXL_MEMORY


def resettable(record: DeviceRecord) -> bool:
    """Whether ``record``'s device can be reset between tenants at all (fabric or node): only such
    a device may go back to the warm pool when its claim gives it back."""
    return record.attributes.reset_target is not None or reset_by_node(record)


def _rounded(seconds: float | None) -> float | None:
    """An operation's duration as its log line carries it: milliseconds are enough."""
    return None if seconds is None else round(seconds, 3)


@dataclass(slots=True)
class DeviceSlot:
    """One device's operation: its lock, its driver task, and how it went."""

    #: pauses before retrying an unbind the fabric refused; they grow while it keeps refusing
    refused: Backoff
    #: held while a request checks the device's entry and records an intent, and while the
    #: driver records a result
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: set (and replaced) whenever the operation moves on: requests wait on it
    event: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None
    #: the last error of the device's current or last operation
    error: FabricError | None = None
    #: ``time.monotonic()`` before which the reconciler does not resume this device
    retry_at: float = 0.0
    #: when its operation last paused (resumed at once when the fabric comes back after that)
    paused_at: float = 0.0

    @property
    def running(self) -> bool:
        return self.driver is not None

    def signal(self) -> None:
        self.event.set()
        self.event = asyncio.Event()


class OperationDriver:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        backend_for: Callable[[DeviceRecord], Backend],
        tasks: TaskControl,
        *,
        operations: OperationLog | None = None,
        metrics: ManagerMetrics | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        settings: OperationSettings | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.inventory = inventory
        #: Kubernetes Events about devices (a failed reset), when the manager has API access
        self.events = events
        self.ledger = ledger
        self.backend_for = backend_for
        self.operations = operations or OperationLog()
        self.metrics = metrics
        self.is_leader = is_leader
        self.settings = settings or OperationSettings()
        self.attempts = FabricAttempts(
            ledger,
            self.operations,
            tasks,
            node_for_host=inventory.node_for_host,
            fence=self.fence,
            settings=self.settings,
        )
        self._slots: dict[str, DeviceSlot] = {}
        #: told of every attach that succeeded, with its duration (the warm pool's hot-add time)
        self.attach_observers: list[Callable[[DeviceRecord, float], None]] = []
        # The inventory shows each device's claim, node and operation state from the ledger, and
        # re-renders a device whenever its entry is put or removed.
        inventory.overlay = ledger.get
        ledger.listeners.append(inventory.changed)

    def fence(self) -> None:
        if not self.is_leader():
            raise NotLeader("this fabric manager replica lost its leadership", retry_after=2.0)

    async def read_binding(self, record: DeviceRecord, host_id: str) -> tuple[str, ...] | None:
        """The hosts the fabric binds ``record`` to, read now through its backend (asking
        ``host_id``'s side too where a style keeps the binding there); None when it cannot be read
        (the service failed, or no backend serves the device's fabric any more)."""
        try:
            host = self.inventory.host(host_id)
            return await self.backend_for(record).read_binding(record, (host,) if host else ())
        except (FabricError, KeyError):
            return None

    def slot(self, device: str) -> DeviceSlot:
        slot = self._slots.get(device)
        if slot is None:
            slot = self._slots[device] = DeviceSlot(refused=Backoff(self.settings.retry_seconds, 300.0))
        return slot

    # -- intents (the caller holds the device's lock) --------------------------------------------

    async def start_attach(
        self, record: DeviceRecord, host: HostRecord, node: str, claim: str, *, namespace: str | None = None
    ) -> None:
        """Record the intent to bind durably, then start the driver."""
        op = self.operations.start(api.OperationKind.ATTACH, record.name, node, claim)
        entry = LedgerEntry(
            device=record.name,
            device_key=record.key,
            node=node,
            host=host.id,
            claim_uid=claim,
            state=LedgerState.ATTACHING,
            operation_id=op.id,
            namespace=namespace,
        )
        self.ledger.put(entry)
        crash_point("manager.attach.before-intent")
        await self._commit_intent(op, undo=lambda: self.ledger.remove(record.name))
        crash_point("manager.attach.after-intent")
        log.info("attach started", device=record.name, node=node, claim=claim, operation=op.id)
        self._started(record.name, api.OperationKind.ATTACH)
        self.kick(record.name)

    async def start_detach(self, entry: LedgerEntry) -> None:
        """Record the intent to unbind (``entry`` moves to ``detaching``) durably; the caller kicks
        the driver."""
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

    async def _commit_intent(self, op: api.Operation, *, undo: Callable[[], None]) -> None:
        """Write the intent durably before anything is sent to the fabric; when the write fails,
        ``undo`` puts the ledger back and the operation fails with it (nothing was done)."""
        try:
            await self.ledger.commit()
        except FabricError as err:
            undo()
            self.operations.finish(op.id, err)
            raise

    async def take_warm(
        self, entry: LedgerEntry, claim: str, *, namespace: str | None = None, node_reset: bool = False
    ) -> api.Operation:
        """Give the warm device of ``entry`` to ``claim`` on the node it is warm on: one durable
        ledger write, nothing sent to the fabric (the binding is already there). The caller holds
        the device's lock. Only a clean device (:attr:`LedgerEntry.clean`: reset since its last
        claim, or fresh from a hot-add) is given, whatever the claim's namespace — or, with
        ``node_reset`` (the device is reset by its node: :func:`reset_by_node`), one still
        ``reset: pending``, which the entry keeps: the attach answer tells the plugin to reset it
        before the claim may use it.

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
        entry.state = LedgerState.BOUND
        entry.operation_id = op.id
        entry.error = None
        self.ledger.put(entry)
        crash_point("manager.warm.before-transfer")
        await self._commit_intent(op, undo=lambda: self.ledger.put(previous))
        crash_point("manager.warm.after-transfer")
        finished = self.operations.finish(op.id, None)
        if self.metrics is not None and finished is not None and finished.finished_at is not None:
            # A hit is an attach too: the histogram shows what the pod's start waited for.
            record = self.inventory.device(entry.device)
            self.metrics.attach_seconds.labels(
                str(record.attributes.type) if record else "unknown", "success"
            ).observe((finished.finished_at - finished.started_at).total_seconds())
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
        unbinding it: one durable ledger write, nothing sent to the fabric. The caller holds the
        device's lock. A crash before the write leaves it the claim's (the claim's retried detach
        decides again); after it, warm.

        The same write marks it ``reset: pending`` (its namespace kept as the last tenant's), and
        the driver resets it (:meth:`_reset`): no claim gets it before, and a restart finds the
        reset still due."""
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
        self.kick(entry.device)  # its reset

    def _started(self, device: str, kind: api.OperationKind) -> None:
        self.slot(device).error = None
        if self.metrics:
            self.metrics.in_flight.labels(str(kind)).inc()
        self.inventory.changed(device)

    # -- the driver ------------------------------------------------------------------------------

    def kick(self, device: str) -> None:
        slot = self.slot(device)
        if slot.driver is None or slot.driver.done():
            slot.driver = asyncio.create_task(self._drive(device), name=f"drive-{device}")

    def resume(self, device: str, *, now: float, fabric_back_at: float) -> None:
        """Start the driver of an unfinished entry once its pause is over, or at once when the
        fabric came back (``fabric_back_at``) after the operation paused."""
        slot = self.slot(device)
        if now >= slot.retry_at or fabric_back_at > slot.paused_at:
            self.kick(device)

    async def _drive(self, device: str) -> None:
        slot = self.slot(device)
        try:
            while True:
                entry = self.ledger.get(device)
                if (
                    entry is not None
                    and entry.state is LedgerState.WARM
                    and not entry.clean
                    and not self._node_resets(entry)  # the next claim's plugin resets it
                ):
                    if await self._reset(entry, slot):
                        continue  # cleaned, or taken out of the pool: see where it stands
                    return
                if entry is None or entry.state.settled:
                    return
                if self.operations.get(entry.operation_id) is None and not entry.rollback:
                    kind = (
                        api.OperationKind.ATTACH
                        if entry.state is LedgerState.ATTACHING
                        else api.OperationKind.DETACH
                    )
                    self.operations.adopt(entry.operation_id, kind, device, entry.node, entry.claim_uid)
                    if self.metrics:
                        self.metrics.in_flight.labels(str(kind)).inc()
                self.operations.running(entry.operation_id)
                record = self.inventory.device(device)
                host = self.inventory.host(entry.host)
                if record is None or host is None:
                    await self._vanished(entry, record is None)
                    return
                backend = self.backend_for(record)
                try:
                    if entry.state is LedgerState.ATTACHING:
                        await self.attempts.ensure(entry, record, host, backend, slot, bound=True)
                        await self._attached(entry, record)
                    else:
                        await self.attempts.ensure(entry, record, host, backend, slot, bound=False)
                        await self._detached(entry, record)
                        return
                except Unresolved as err:
                    slot.error = err.cause
                    slot.paused_at = time.monotonic()
                    slot.retry_at = slot.paused_at + self.settings.retry_seconds
                    self.operations.running(entry.operation_id, error=err.cause)
                    log.warning(
                        "operation paused, will resume",
                        device=device,
                        node=entry.node,
                        claim=entry.claim_uid,
                        state=str(entry.state),
                        error=err.cause.message,
                    )
                    return
                except FabricError as err:
                    if entry.state is LedgerState.ATTACHING:
                        await self._attach_failed(entry, record, err)
                        continue  # drive the rollback
                    # The device stays held (never lost, never given to another node) and the
                    # unbind is retried with growing pauses; the operation shows the error.
                    slot.error = err
                    pause = slot.refused.next()
                    slot.retry_at = time.monotonic() + pause
                    entry.error = err.message
                    self.operations.running(entry.operation_id, error=err)
                    log.error(
                        "unbind failed, will retry",
                        device=device,
                        node=entry.node,
                        claim=entry.claim_uid,
                        retry_in=round(pause, 1),
                        error=err.message,
                    )
                    return
                finally:
                    slot.signal()
        except Exception:
            log.exception("device driver crashed", device=device)
            slot.retry_at = time.monotonic() + self.settings.retry_seconds
        finally:
            slot.driver = None
            slot.signal()

    # -- resets between tenants ------------------------------------------------------------------

    async def _reset(self, entry: LedgerEntry, slot: DeviceSlot) -> bool:
        """Reset the warm device of ``entry`` (``reset: pending``) through its Redfish ``Reset``
        action and mark it clean; a reset that fails, or that the device does not offer, takes it
        out of the pool (detached, Warning Event, ``fabric_dra_device_resets_total{outcome}``).
        False when nothing changed (this replica is not the leader, or the ledger could not record
        the failure): the pool's loop starts it again."""
        device = entry.device
        record = self.inventory.device(device)
        try:
            self.fence()
            crash_point("manager.warm.before-reset")
            if record is None:
                raise DeviceNotFound(f"device {device} is no longer on the fabric", device=device)
            ctx = BindContext(
                deadline=time.monotonic() + self.settings.task_timeout,
                fence=self.fence,
                action=f"reset {device} on {entry.host}",
            )
            await self.backend_for(record).reset(record, ctx)
        except NotLeader:
            return False  # the next leader finds the reset still due
        except FabricError as err:
            return await self._reset_failed(entry, err)
        async with slot.lock:
            if self.ledger.get(device) is not entry or entry.state is not LedgerState.WARM:
                return True  # taken out of the pool meanwhile (a move, a cool-down): unbound anyway
            entry.reset = ResetState.DONE
            self.ledger.put(entry)
            # Not waited for: a restart that finds "pending" resets once more, never less.
            self.ledger.commit_soon()
        if self.metrics is not None:
            self.metrics.device_resets.labels("success").inc()
        log.info("warm device reset", device=device, node=entry.node, last_namespace=entry.namespace)
        return True

    async def _reset_failed(self, entry: LedgerEntry, err: FabricError) -> bool:
        """Detach the device whose reset failed; False when the ledger could not record it."""
        async with self.slot(entry.device).lock:
            if self.ledger.get(entry.device) is not entry or entry.state is not LedgerState.WARM:
                return True  # moved or cooled meanwhile: unbound anyway
            try:
                await self.start_detach(entry)
            except FabricError as failed:  # the ledger cannot be written: still pending, tried again
                log.error("cannot record a failed reset", device=entry.device, error=failed.message)
                return False
            entry.error = err.message
        await self._reset_failure(
            entry,
            err.message,
            "it is detached instead and the next claim gets it cold",
            "it leaves the warm pool",
        )
        return True

    async def _reset_failure(self, entry: LedgerEntry, reason: str, instead: str, outcome: str) -> None:
        """Count, log and record as a Warning Event on the node a reset that failed (by the fabric
        or by the node); ``instead`` says what happens to the device."""
        if self.metrics is not None:
            self.metrics.device_resets.labels("failure").inc()
        log.error(
            f"reset of a warm device failed; {outcome}", device=entry.device, node=entry.node, error=reason
        )
        if self.events is not None:
            await self.events.record(
                ObjectRef(kind="Node", name=entry.node),
                reason="DeviceResetFailed",
                action="Reset",
                event_type="Warning",
                note=(
                    f"device {entry.device} was given back to the warm pool of node {entry.node} and "
                    f"could not be reset before another claim ({reason}); {instead}"
                ),
            )

    def _node_resets(self, entry: LedgerEntry) -> bool:
        record = self.inventory.device(entry.device)
        return record is not None and reset_by_node(record)

    async def node_reset_done(self, entry: LedgerEntry) -> None:
        """The node's plugin reset the device of ``entry`` (its claim's, ``reset: pending``): mark
        it ``done``, durably before the plugin is answered (its prepare returns only then). The
        caller holds the device's lock."""
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

    async def node_reset_failed(self, entry: LedgerEntry, reason: str) -> None:
        """The node's plugin could not reset the device of ``entry`` (its claim's, ``reset:
        pending``): it is not handed to the claim dirty but detached (intent before action) to be
        attached again for the same claim, a slot power cycle (docs/manager.md "A detach and a
        re-attach count as a reset"). The caller holds the device's lock, attaches it again once
        the detach is done, and records the failure (:meth:`node_reset_failure`) once it let go of
        the lock."""
        await self.start_detach(entry)
        entry.error = reason
        self.kick(entry.device)

    async def node_reset_failure(self, entry: LedgerEntry, reason: str) -> None:
        """Count, log and record as a Warning Event the node's failed reset of ``entry``'s device
        (a copy taken before its power cycle)."""
        await self._reset_failure(
            entry,
            reason,
            f"it is detached and attached again (a slot power cycle) for claim {entry.claim_uid}",
            "it is power-cycled for its claim",
        )

    # -- results ---------------------------------------------------------------------------------

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
        if self.metrics is None:
            return seconds
        device_type = str(record.attributes.type) if record else "unknown"
        outcome = "success" if error is None else error.code
        histogram = (
            self.metrics.attach_seconds if kind is api.OperationKind.ATTACH else self.metrics.detach_seconds
        )
        histogram.labels(device_type, outcome).observe(seconds)
        self.metrics.in_flight.labels(str(kind)).dec()
        return seconds

    async def _attached(self, entry: LedgerEntry, record: DeviceRecord) -> None:
        slot = self.slot(entry.device)
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

    async def _detached(self, entry: LedgerEntry, record: DeviceRecord) -> None:
        slot = self.slot(entry.device)
        slot.refused.reset()
        async with slot.lock:
            self.ledger.remove(entry.device)
            self.inventory.note_binding(entry.device, ())
            self.ledger.commit_soon()  # a restart that finds "detaching" and no binding drops it
            if not entry.rollback:
                crash_point("manager.detach.after-result")
        if not entry.rollback:
            slot.error = None
            seconds = self._finish(entry, record, api.OperationKind.DETACH, None)
            log.info(
                "detached",
                device=entry.device,
                node=entry.node,
                claim=entry.claim_uid,
                seconds=_rounded(seconds),
            )
        else:
            log.info("failed attach rolled back", device=entry.device, node=entry.node, claim=entry.claim_uid)

    async def _attach_failed(self, entry: LedgerEntry, record: DeviceRecord, err: FabricError) -> None:
        slot = self.slot(entry.device)
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

    async def _vanished(self, entry: LedgerEntry, device_gone: bool) -> None:
        what = f"device {entry.device}" if device_gone else f"host {entry.host} of node {entry.node}"
        err = DeviceNotFound(f"{what} is no longer on the fabric", device=entry.device, node=entry.node)
        slot = self.slot(entry.device)
        async with slot.lock:
            self.ledger.remove(entry.device)
            with contextlib.suppress(FabricError):
                await self.ledger.commit()
        slot.error = err
        kind = api.OperationKind.ATTACH if entry.state is LedgerState.ATTACHING else api.OperationKind.DETACH
        self._finish(entry, None, kind, None if kind is api.OperationKind.DETACH else err)
        log.warning("dropped ledger entry: " + err.message, device=entry.device, claim=entry.claim_uid)
        self.inventory.changed(entry.device)
