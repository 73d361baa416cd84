"""Attach and detach, safely: the rules that keep a device from ever being bound to two nodes.

* **One operation at a time per device.** Each device has at most one *driver* task that moves its
  ledger entry to where it should be (``attaching`` → bound, ``detaching`` → gone). Requests never
  touch the fabric themselves: they record intent, start (or join) the driver, and wait for it.
* **Intent before action.** An attach writes its ledger entry durably before the first Redfish
  request; a detach moves the entry to ``detaching`` durably before unbinding.
* **Idempotent per claim UID + device.** A repeated attach joins or returns the existing binding;
  a detach by anyone but the holder (claim UID *and* node) is a no-op success.
* **Exclusive.** A device held by another claim or node, bound outside fabric-dra, or still being
  detached is 409 DeviceBusy with who holds it; the new holder gets it only after the fabric
  confirmed the unbind.
* **Never blind.** Before every bind or unbind the driver reads the binding from the fabric; a
  request whose outcome is unknown (connection lost, task monitor gone, hung task) is never resent
  before a fresh read says it did not happen.
* **Nothing half-done.** An attach that fails for good turns into a rollback (``detaching`` with
  ``rollback``): the driver makes sure the device is not bound, then drops the entry.
* **Crash-safe.** At start-up (and after every discovery pass) :meth:`Binder.reconcile` resumes
  every unfinished entry from the fabric's state; bindings the fabric lost are dropped and logged.
* **Leader only.** Every fabric mutation is fenced by the Lease (:class:`manager_api.errors.NotLeader`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fabric.backends.base import Backend, BindContext
from fabric.backends.discovery import Discovery
from fabric.backends.model import DeviceRecord, HostRecord
from fabric.inventory import Inventory
from fabric.ledger import Ledger, LedgerEntry, LedgerState
from fabric.metrics import ManagerMetrics
from fabric.operations import OperationLog
from fabric.redfish.client import OutcomeUnknown
from fabric.redfish.error_mapping import PreconditionFailed
from manager_api import models as api
from manager_api.errors import (
    AttachTimeout,
    BindFailed,
    DeviceBusy,
    DeviceNotFound,
    DeviceUnhealthy,
    FabricError,
    FabricUnavailable,
    NodeNotFound,
    NotLeader,
)
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["Binder", "BinderSettings"]

log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class BinderSettings:
    #: how long one operation keeps trying while the fabric is unreachable or a task runs
    operation_timeout: float = 120.0
    #: how long one Redfish task may run before it is cancelled and the operation rolled back
    task_timeout: float = 60.0
    #: binds (or unbinds) sent for one operation at most, each after a read showed it not done
    max_attempts: int = 3
    #: pause before re-reading after a request whose outcome is unknown
    settle_seconds: float = 0.5
    #: how often unfinished ledger entries are resumed
    retry_seconds: float = 5.0


class _Unresolved(Exception):
    """The driver cannot finish now (fabric unreachable, task still running, not the leader);
    the ledger entry stays and is resumed later."""

    def __init__(self, cause: FabricError) -> None:
        super().__init__(cause.message)
        self.cause = cause


@dataclass(slots=True)
class _Slot:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    event: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None
    #: the last error of the device's current or last operation
    error: FabricError | None = None
    #: ``time.monotonic()`` before which the reconciler does not resume this device
    retry_at: float = 0.0
    #: when its operation last paused (resumed at once when the fabric comes back after that)
    paused_at: float = 0.0
    #: unbinds the fabric refused in a row (the pause before the next try doubles)
    failures: int = 0

    def signal(self) -> None:
        self.event.set()
        self.event = asyncio.Event()


class Binder:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        discovery: Discovery,
        *,
        operations: OperationLog | None = None,
        metrics: ManagerMetrics | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        settings: BinderSettings | None = None,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.discovery = discovery
        self.operations = operations or OperationLog()
        self.metrics = metrics
        self.is_leader = is_leader
        self.settings = settings or BinderSettings()
        self._slots: dict[str, _Slot] = {}
        inventory.overlay = ledger.get
        inventory.after_refresh.append(self.reconcile)

    # -- requests ----------------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if not self.is_leader():
            raise NotLeader("this fabric manager replica is not the leader; ask the leader", retry_after=2.0)

    def _fence(self) -> None:
        if not self.is_leader():
            raise NotLeader("this fabric manager replica lost its leadership", retry_after=2.0)

    def _slot(self, device: str) -> _Slot:
        slot = self._slots.get(device)
        if slot is None:
            slot = self._slots[device] = _Slot()
        return slot

    def _attachment(
        self, device: str, node: str, claim_uid: str, state: api.AttachmentState
    ) -> api.Attachment:
        record = self.inventory.device(device)
        entry = self.ledger.get(device)
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
        return api.Attachment(
            device=rendered,
            node=node,
            claim_uid=claim_uid,
            state=state,
            operation_id=entry.operation_id if entry and entry.claim_uid == claim_uid else None,
        )

    async def attach(self, request: api.AttachRequest, wait: float) -> tuple[api.Attachment, int]:
        """Bind ``request.device`` to ``request.node`` for the claim; (attachment, HTTP status)."""
        self._require_leader()
        name, node, claim = request.device, request.node, request.claim_uid
        record = self.inventory.device(name)
        if record is None:
            raise DeviceNotFound(f"device {name} is not in the fabric inventory", device=name)
        host = self.inventory.host_for_node(node)
        if host is None:
            raise NodeNotFound(f"node {node} is not a host of any fabric this manager knows", node=node)
        if host.id not in record.reachable_hosts:
            raise NodeNotFound(
                f"node {node} (host {host.id}) has no port on fabric {record.fabric} of device {name}",
                node=node,
                device=name,
            )
        slot = self._slot(name)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            async with slot.lock:
                entry = self.ledger.get(name)
                if entry is None:
                    await self._start_attach(record, host, node, claim)
                    break
                if entry.claim_uid != claim or entry.node != node:
                    raise self._busy(entry)
                if entry.state is LedgerState.BOUND:
                    return self._attachment(name, node, claim, api.AttachmentState.ATTACHED), 200
                if entry.state is LedgerState.ATTACHING:
                    self._kick(name)
                    break
                if not entry.rollback:
                    raise DeviceBusy(
                        f"device {name} is being detached for claim {claim}; attach it again once detached",
                        device=name,
                        node=node,
                        held_by=f"{entry.node}/{entry.claim_uid}",
                        retry_after=1.0,
                    )
                self._kick(name)
                event = slot.event
            # A retry of a failed attach: let its rollback finish, then attach afresh.
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeviceBusy(
                    f"device {name} is rolling back a failed attach for claim {claim}; ask again",
                    device=name,
                    node=node,
                    held_by=f"{node}/{claim}",
                    retry_after=1.0,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
        return await self._await(
            name, node, claim, api.OperationKind.ATTACH, max(0.0, deadline - time.monotonic())
        )

    async def _start_attach(self, record: DeviceRecord, host: HostRecord, node: str, claim: str) -> None:
        """Record the intent durably, then start the driver. The caller holds the device's lock."""
        name = record.name
        self._check_free(record)
        op = self.operations.start(api.OperationKind.ATTACH, name, node, claim)
        entry = LedgerEntry(
            device=name,
            device_key=record.key,
            node=node,
            host=host.id,
            claim_uid=claim,
            state=LedgerState.ATTACHING,
            operation_id=op.id,
        )
        self.ledger.put(entry)
        crash_point("manager.attach.before-intent")
        try:
            await self.ledger.commit()
        except FabricError as err:
            self.ledger.remove(name)
            self.operations.finish(op.id, err)
            raise
        crash_point("manager.attach.after-intent")
        log.info("attach started", device=name, node=node, claim=claim, operation=op.id)
        slot = self._slot(name)
        slot.error = None
        if self.metrics:
            self.metrics.in_flight.labels("attach").inc()
        self.inventory.changed()
        self._kick(name)

    @staticmethod
    def _busy(entry: LedgerEntry) -> DeviceBusy:
        doing = {
            LedgerState.ATTACHING: "being attached to",
            LedgerState.BOUND: "bound to",
            LedgerState.DETACHING: "being detached from",
        }[entry.state]
        return DeviceBusy(
            f"device {entry.device} is {doing} node {entry.node} for claim {entry.claim_uid}",
            device=entry.device,
            held_by=f"{entry.node}/{entry.claim_uid}",
            retry_after=2.0,
        )

    def _check_free(self, record: DeviceRecord) -> None:
        if record.bound_hosts:
            host = record.bound_hosts[0]
            node = self.inventory.node_for_host(host)
            held = f"{node or 'host ' + host} (bound outside fabric-dra)"
            raise DeviceBusy(
                f"device {record.name} is bound to {held}; fabric-dra never touches bindings it did not make",
                device=record.name,
                held_by=held,
            )
        if not record.attributes.available:
            raise DeviceUnhealthy(
                f"device {record.name} is not available: the fabric reports it absent, disabled or unusable",
                device=record.name,
            )
        if record.attributes.health is api.Health.CRITICAL:
            raise DeviceUnhealthy(
                f"device {record.name} is unhealthy: the fabric reports it Critical", device=record.name
            )

    async def detach(self, device: str, claim: str, node: str, wait: float) -> tuple[api.Attachment, int]:
        """Unbind ``device`` if ``claim`` holds it on ``node``; anything else is a no-op success."""
        self._require_leader()
        slot = self._slot(device)
        async with slot.lock:
            entry = self.ledger.get(device)
            if entry is None and self.inventory.device(device) is None:
                raise DeviceNotFound(f"device {device} is not in the fabric inventory", device=device)
            if entry is None or entry.claim_uid != claim or entry.node != node:
                return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            if entry.state is not LedgerState.DETACHING or entry.rollback:
                op = self.operations.start(api.OperationKind.DETACH, device, node, claim)
                previous = entry.model_copy()
                entry.state = LedgerState.DETACHING
                entry.rollback = False
                entry.operation_id = op.id
                self.ledger.put(entry)
                crash_point("manager.detach.before-intent")
                try:
                    await self.ledger.commit()
                except FabricError as err:
                    self.ledger.put(previous)
                    self.operations.finish(op.id, err)
                    raise
                crash_point("manager.detach.after-intent")
                log.info("detach started", device=device, node=node, claim=claim, operation=op.id)
                slot.error = None
                if self.metrics:
                    self.metrics.in_flight.labels("detach").inc()
                self.inventory.changed()
            self._kick(device)
        return await self._await(device, node, claim, api.OperationKind.DETACH, wait)

    async def _await(
        self, device: str, node: str, claim: str, kind: api.OperationKind, wait: float
    ) -> tuple[api.Attachment, int]:
        slot = self._slot(device)
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
            if slot.driver is None and slot.error is not None:
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
            event = slot.event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)

    # -- the driver -------------------------------------------------------------------------------

    def _kick(self, device: str) -> None:
        slot = self._slot(device)
        if slot.driver is None or slot.driver.done():
            slot.driver = asyncio.create_task(self._drive(device), name=f"drive-{device}")

    async def _drive(self, device: str) -> None:
        slot = self._slot(device)
        try:
            while True:
                entry = self.ledger.get(device)
                if entry is None or entry.state is LedgerState.BOUND:
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
                backend = self.discovery.backend_for(record)
                try:
                    if entry.state is LedgerState.ATTACHING:
                        await self._ensure(entry, record, host, backend, bound=True)
                        await self._attached(entry, record)
                    else:
                        await self._ensure(entry, record, host, backend, bound=False)
                        await self._detached(entry, record)
                        return
                except _Unresolved as err:
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
                    slot.failures += 1
                    pause = min(self.settings.retry_seconds * 2 ** (slot.failures - 1), 300.0)
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

    def _finish(
        self,
        entry: LedgerEntry,
        record: DeviceRecord | None,
        kind: api.OperationKind,
        error: FabricError | None,
    ) -> None:
        op = self.operations.get(entry.operation_id)
        if op is None or op.finished_at is not None or op.kind is not kind:
            return
        finished = self.operations.finish(op.id, error)
        if self.metrics is None or finished is None:
            return
        seconds = (
            (finished.finished_at - finished.started_at).total_seconds() if finished.finished_at else 0.0
        )
        device_type = str(record.attributes.type) if record else "unknown"
        outcome = "success" if error is None else error.code
        histogram = (
            self.metrics.attach_seconds if kind is api.OperationKind.ATTACH else self.metrics.detach_seconds
        )
        histogram.labels(device_type, outcome).observe(seconds)
        self.metrics.in_flight.labels(str(kind)).dec()

    async def _attached(self, entry: LedgerEntry, record: DeviceRecord) -> None:
        slot = self._slot(entry.device)
        async with slot.lock:
            entry.task_monitor = None
            entry.error = None
            if entry.state is LedgerState.ATTACHING:
                entry.state = LedgerState.BOUND
            self.ledger.put(entry)
            self.inventory.note_binding(entry.device, (entry.host,))
            # Written, not waited for: the intent is durable, and a restart that finds "attaching"
            # marks it bound from the fabric's state. The caller's answer is one fsync sooner.
            self.ledger.commit_soon()
            crash_point("manager.attach.after-result")
        slot.error = None
        self._finish(entry, record, api.OperationKind.ATTACH, None)
        log.info("attached", device=entry.device, node=entry.node, claim=entry.claim_uid)

    async def _detached(self, entry: LedgerEntry, record: DeviceRecord) -> None:
        slot = self._slot(entry.device)
        slot.failures = 0
        async with slot.lock:
            self.ledger.remove(entry.device)
            self.inventory.note_binding(entry.device, ())
            self.ledger.commit_soon()  # a restart that finds "detaching" and no binding drops it
            if not entry.rollback:
                crash_point("manager.detach.after-result")
        if not entry.rollback:
            slot.error = None
            self._finish(entry, record, api.OperationKind.DETACH, None)
            log.info("detached", device=entry.device, node=entry.node, claim=entry.claim_uid)
        else:
            log.info("failed attach rolled back", device=entry.device, node=entry.node, claim=entry.claim_uid)

    async def _attach_failed(self, entry: LedgerEntry, record: DeviceRecord, err: FabricError) -> None:
        slot = self._slot(entry.device)
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
        self._finish(entry, record, api.OperationKind.ATTACH, err)
        log.warning(
            "attach failed, rolling back",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
            error=err.message,
        )

    async def _vanished(self, entry: LedgerEntry, device_gone: bool) -> None:
        what = f"device {entry.device}" if device_gone else f"host {entry.host} of node {entry.node}"
        err = DeviceNotFound(f"{what} is no longer on the fabric", device=entry.device, node=entry.node)
        slot = self._slot(entry.device)
        async with slot.lock:
            self.ledger.remove(entry.device)
            with contextlib.suppress(FabricError):
                await self.ledger.commit()
        slot.error = err
        kind = api.OperationKind.ATTACH if entry.state is LedgerState.ATTACHING else api.OperationKind.DETACH
        self._finish(entry, None, kind, None if kind is api.OperationKind.DETACH else err)
        log.warning("dropped ledger entry: " + err.message, device=entry.device, claim=entry.claim_uid)
        self.inventory.changed()

    async def _ensure(
        self, entry: LedgerEntry, record: DeviceRecord, host: HostRecord, backend: Backend, *, bound: bool
    ) -> None:
        """Make the fabric bind (``bound``) or unbind ``record`` ↔ ``host``, reading before acting."""
        slot = self._slot(entry.device)
        deadline = time.monotonic() + self.settings.operation_timeout
        attempts = 0
        backoff = 0.25
        verb = "bind" if bound else "unbind"

        async def record_task(monitor: str) -> None:
            if bound:
                crash_point("manager.attach.task-accepted")
            entry.task_monitor = monitor
            self.ledger.put(entry)
            self.operations.running(entry.operation_id, redfish_task=monitor)
            await self.ledger.commit()
            crash_point("manager.attach.task-recorded" if bound else "manager.detach.task-recorded")

        last_error: FabricError | None = None
        while True:
            if bound and entry.state is not LedgerState.ATTACHING:
                return  # the claim asked for a detach meanwhile: do not bind, let the driver unbind
            try:
                self._fence()
                if entry.task_monitor:
                    await self._settle_task(entry, deadline)
                if bound:
                    # What the bind will need (a zone's ETag...) is read alongside, not after.
                    current, _ = await asyncio.gather(
                        backend.read_binding(record), backend.prepare_bind(record, host)
                    )
                else:
                    current = await backend.read_binding(record)
            except NotLeader as err:
                raise _Unresolved(err) from None
            except FabricUnavailable as err:
                slot.error = err
                if time.monotonic() + backoff > deadline:
                    raise _Unresolved(err) from None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if bound:
                if host.id in current:
                    return
                if current:
                    node = self.inventory.node_for_host(current[0])
                    held = f"{node or 'host ' + current[0]} (bound outside fabric-dra)"
                    raise DeviceBusy(f"device {entry.device} is bound to {held}", held_by=held)
            elif host.id not in current:
                return
            if attempts >= self.settings.max_attempts:
                if isinstance(last_error, DeviceBusy):
                    raise last_error
                detail = f": {last_error.message}" if last_error else ""
                raise BindFailed(
                    f"the fabric did not {verb} {entry.device} after {attempts} attempts{detail}"
                )
            attempts += 1
            ctx = BindContext(
                deadline=min(deadline, time.monotonic() + self.settings.task_timeout),
                fence=self._fence,
                on_task=record_task,
                action=f"{verb} {entry.device} {'to' if bound else 'from'} {host.id}",
            )
            try:
                if bound:
                    await backend.bind(record, host, ctx)
                else:
                    await backend.unbind(record, host, ctx)
            except NotLeader as err:
                raise _Unresolved(err) from None
            except AttachTimeout as err:
                # A task that did not finish in time: cancel it and let the next read decide.
                slot.error = err
                if entry.task_monitor:
                    await self.discovery.client.cancel_task(entry.task_monitor)
                log.warning("fabric task timed out, cancelled", device=entry.device, task=entry.task_monitor)
                with contextlib.suppress(_Unresolved):
                    await self._settle_task(entry, time.monotonic() + self.settings.task_timeout)
                if entry.task_monitor:
                    raise _Unresolved(err) from None
                if bound:
                    after = await _read_or_none(backend, record)
                    if after is not None and host.id not in after:
                        raise err from None
                continue
            except DeviceBusy as err:
                # The read said "not bound" but the fabric is busy with the device (a task of an
                # earlier run of ours, or a change in flight): wait for it, do not burn attempts.
                slot.error = last_error = err
                attempts -= 1
                if time.monotonic() + backoff > deadline:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except (OutcomeUnknown, PreconditionFailed) as err:
                slot.error = last_error = err
                await asyncio.sleep(self.settings.settle_seconds)
                continue
            except FabricUnavailable as err:  # not sent: nothing happened
                slot.error = err
                attempts -= 1
                if time.monotonic() + backoff > deadline:
                    raise _Unresolved(err) from None
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            crash_point("manager.attach.after-fabric-call" if bound else "manager.detach.after-fabric-call")
            entry.task_monitor = None
            return

    async def _settle_task(self, entry: LedgerEntry, deadline: float) -> None:
        """Wait for a recorded task (from before a crash, or a cancelled one) to end."""
        pause = 0.2
        while entry.task_monitor:
            if not await self.discovery.client.task_running(entry.task_monitor):
                entry.task_monitor = None
                self.ledger.put(entry)
                return
            if time.monotonic() + pause > deadline:
                raise _Unresolved(
                    AttachTimeout(
                        f"fabric task {entry.task_monitor} for {entry.device} is still running",
                        retry_after=5.0,
                    )
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    # -- reconciliation -----------------------------------------------------------------------------

    async def reconcile(self) -> None:
        """Resume unfinished entries; drop bound entries whose binding the fabric no longer has."""
        if not self.is_leader():
            return
        now = time.monotonic()
        for entry in self.ledger.entries():
            slot = self._slot(entry.device)
            if slot.driver is not None:
                continue
            if entry.state is not LedgerState.BOUND:
                if now >= slot.retry_at or self.inventory.recovered_at > slot.paused_at:
                    self._kick(entry.device)
                continue
            record = self.inventory.device(entry.device)
            if record is not None and entry.host in record.bound_hosts:
                continue
            await self._verify_bound(entry, record)

    async def _verify_bound(self, entry: LedgerEntry, record: DeviceRecord | None) -> None:
        if record is not None:
            try:
                current = await self.discovery.backend_for(record).read_binding(record)
            except (FabricError, KeyError):
                return
            if entry.host in current:
                self.inventory.note_binding(entry.device, current)
                return
        slot = self._slot(entry.device)
        async with slot.lock:
            if self.ledger.get(entry.device) is not entry or entry.state is not LedgerState.BOUND:
                return
            self.ledger.remove(entry.device)
            with contextlib.suppress(FabricError):
                await self.ledger.commit()
        log.warning(
            "binding removed outside fabric-dra; forgetting it",
            device=entry.device,
            node=entry.node,
            claim=entry.claim_uid,
        )
        self.inventory.changed()

    async def run(self) -> None:
        """Resume paused operations every ``retry_seconds`` until cancelled."""
        while True:
            await asyncio.sleep(self.settings.retry_seconds)
            with contextlib.suppress(FabricError):
                await self.reconcile()

    def in_flight(self) -> list[api.Operation]:
        return self.operations.in_flight()


async def _read_or_none(backend: Backend, record: DeviceRecord) -> tuple[str, ...] | None:
    try:
        return await backend.read_binding(record)
    except FabricError:
        return None
