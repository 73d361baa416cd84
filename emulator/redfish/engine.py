"""The fabric's one state machine: binds, unbinds, tasks and faults, independent of HTTP.

The three Redfish binding styles (zones, composition, CXL connections) all become an
:class:`Operation` on the same bindings table, so every view agrees. Rules:

* A target (a PCIe device or a CXL memory chunk) is bound to at most one host. A bind of a
  target that is bound — to any host — or that has an operation in flight fails with Base
  ``ResourceInUse`` (409). The check and the reservation happen without an ``await`` in
  between on the single event loop, so concurrent requests cannot both win.
* With a task-based latency profile (or ``Prefer: respond-async``, or a ``HangTasks`` fault)
  the request reserves its targets, answers 202, and the binding changes only when the task
  completes — in one durable commit together with the task's final state. A crash before that
  leaves the target as it was and the task ``Interrupted`` (see :meth:`Engine.recover`).
* Every change is on disk before the response that reports it (:class:`StateStore`), and
  the emulated host views follow the durable state.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emulator.qemu.host import HostUnplugError, QemuHosts
from emulator.qemu.qmp import QmpError
from emulator.redfish import uris
from emulator.redfish.events import EventBus, FabricEvent
from emulator.redfish.faults import (
    DeviceHealth,
    DropConnections,
    ExpireSessions,
    FailOperations,
    FaultSpec,
    HangTasks,
    PortDown,
    SlowResponses,
    Unavailable,
    fault_adapter,
)
from emulator.redfish.hostview import HostEntry, HostView, allocate_address
from emulator.redfish.latency import LatencyProfile
from emulator.redfish.registries import RedfishError, error_body, message
from emulator.redfish.state import (
    BindingRecord,
    ConnectionRecord,
    FabricState,
    FaultRecord,
    OperationKind,
    StateStore,
    TaskRecord,
    TaskResult,
    ZoneRecord,
    utcnow,
)
from emulator.topology import FabricIndex, Target
from manager_api.devices import BindingStyle
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["Engine", "Operation", "Outcome", "Revision"]

log = get_logger(__name__)

#: HTTP status of a failure injected with a MessageId, when the fault names none.
_STATUS_OF_MESSAGE = {
    "ResourceInUse": 409,
    "ConditionInRelatedResource": 409,
    "PreconditionFailed": 412,
    "NoValidSession": 401,
    "InsufficientPrivilege": 403,
    "OperationNotAllowed": 405,
    "ResourceCannotBeDeleted": 405,
    "OperationTimeout": 504,
    "ServiceShuttingDown": 503,
    "InternalError": 500,
    "GeneralError": 500,
    "OperationFailed": 500,
}


class Revision:
    """A counter bumped by every change visible over Redfish; rendered payloads are cached per value."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def bump(self) -> None:
        self.value += 1


@dataclass
class Operation:
    """One bind or unbind request, whatever Redfish style it arrived in."""

    kind: OperationKind
    style: BindingStyle
    fabric: str
    host: str
    targets: list[str]
    method: str
    uri: str
    body: str = ""
    name: str | None = None
    description: str | None = None
    #: zone the targets join (bind) or leave; None for CXL connections
    zone: str | None = None
    connection: str | None = None
    access: list[str] = field(default_factory=list)
    create_zone: bool = False
    delete_zone: bool = False
    create_connection: bool = False
    delete_connection: bool = False
    #: final response: status, and the resource a 201 points at
    success_status: int = 204
    location: str | None = None


@dataclass
class Outcome:
    status: int
    location: str | None = None
    task: TaskRecord | None = None


def _fmt_targets(targets: list[str]) -> str:
    return ", ".join(targets)


class Engine:
    def __init__(
        self,
        index: FabricIndex,
        store: StateStore,
        hostview: HostView,
        events: EventBus,
        latency: LatencyProfile,
        revision: Revision,
        rng: random.Random | None = None,
    ) -> None:
        self.index = index
        self.store = store
        self.hostview = hostview
        self.events = events
        self.latency = latency
        self.revision = revision
        #: zone → its targets, as of revision :attr:`_zones_at` (:meth:`zone_targets`)
        self._by_zone: dict[str, tuple[str, ...]] = {}
        self._zones_at: tuple[int, int, int] | None = None
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not security
        #: target Id → Id of the task that holds it
        self.inflight: dict[str, str] = {}
        self.faults: dict[str, FaultSpec] = {}
        #: renders a resource URI for a task's final response (set by the service)
        self.render: Callable[[str], dict[str, Any] | None] = lambda _uri: None
        #: called for an ExpireSessions fault (set by the service)
        self.expire_sessions: Callable[[], int] = lambda: 0
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._unhang = asyncio.Event()
        #: Ids of tasks held by a HangTasks fault
        self.hung: set[str] = set()
        #: hosts of ``kind: qemu``: their binds and unbinds change a guest (set by the service)
        self.qemu: QemuHosts | None = None

    @property
    def state(self) -> FabricState:
        return self.store.state

    # --- queries for the views -------------------------------------------------------------

    def binding(self, target: str) -> BindingRecord | None:
        return self.state.bindings.get(target)

    def host_bindings(self, host: str) -> list[BindingRecord]:
        return [b for b in self.state.bindings.values() if b.host == host]

    def zone_targets(self, zone_id: str) -> tuple[str, ...]:
        """The targets bound through zone ``zone_id``, in binding order. From an index built once
        per revision: a zone's read does not scan every binding of the fabric, and the
        expanded Zones collection does not scan them once per zone."""
        at = self._zones_key()
        if self._zones_at != at:
            by_zone: dict[str, list[str]] = {}
            for binding in self.state.bindings.values():
                if binding.zone is not None:
                    by_zone.setdefault(binding.zone, []).append(binding.target)
            self._by_zone = {z: tuple(t) for z, t in by_zone.items()}
            self._zones_at = at
        return self._by_zone.get(zone_id, ())

    def _zones_key(self) -> tuple[int, int, int]:
        """What :attr:`_by_zone` is valid for: the revision is bumped right after each change of
        the bindings; the table's identity and size guard one that was not."""
        bindings = self.state.bindings
        return (self.revision.value, id(bindings), len(bindings))

    def _index_change(self, before: dict[str, BindingRecord | None]) -> None:
        """Bring :attr:`_by_zone` from ``before`` (the records of an operation's targets before it
        ran) to the bindings now, touching only the zones concerned (a rebuild reads every
        binding: 13 ms at 10,000 on this machine, after every bind)."""
        for target, old in before.items():
            new = self.state.bindings.get(target)
            if old is new:
                continue
            if old is not None and old.zone is not None:
                self._by_zone[old.zone] = tuple(t for t in self._by_zone.get(old.zone, ()) if t != target)
            if new is not None and new.zone is not None:
                self._by_zone[new.zone] = (*self._by_zone.get(new.zone, ()), target)
        self._zones_at = self._zones_key()

    def health(self, device: str) -> str:
        worst = "OK"
        for fault in self.faults.values():
            if (
                isinstance(fault, DeviceHealth)
                and fault.Device == device
                and (fault.Health == "Critical" or (fault.Health == "Warning" and worst == "OK"))
            ):
                worst = fault.Health
        return worst

    def port_up(self, switch: str, host: str) -> bool:
        return not any(
            isinstance(f, PortDown) and f.Host == host and f.Switch in (None, switch)
            for f in self.faults.values()
        )

    def fault_of(self, kind: type[Any]) -> Any | None:
        return next((f for f in self.faults.values() if isinstance(f, kind)), None)

    def slow_seconds(self) -> float:
        slow = self.fault_of(SlowResponses)
        return float(slow.Seconds) if slow else 0.0

    def unavailable(self) -> Unavailable | None:
        fault = self.fault_of(Unavailable)
        return fault if isinstance(fault, Unavailable) else None

    def take_drop(self) -> bool:
        """Whether this request's connection is to be dropped (consumes a counted fault)."""
        for fault_id, fault in list(self.faults.items()):
            if isinstance(fault, DropConnections):
                if fault.Count is None:
                    return True
                remaining = fault.Count - 1
                if remaining:
                    self._replace_fault(fault_id, fault.model_copy(update={"Count": remaining}))
                else:
                    self._drop_fault_record(fault_id)
                # counted drops are best-effort durable: persisted with the next commit
                return True
        return False

    # --- start-up --------------------------------------------------------------------------

    def recover(self) -> None:
        """Make the loaded state consistent before serving; rebuild every host view from it."""
        state = self.state
        now = utcnow()
        for task in state.tasks.values():
            if task.finished:
                continue
            held = [t for t in task.targets if t in state.bindings]
            if task.kind == OperationKind.BIND:
                outcome = f"{_fmt_targets(task.targets)} was not bound to {task.host}"
            else:
                outcome = (
                    f"{_fmt_targets(held)} is still bound to {task.host}" if held else "nothing was unbound"
                )
            detail = f"Task {task.id} was interrupted by a restart of the fabric service; {outcome}."
            task.state = "Interrupted"
            task.status = "Critical"
            task.end = now
            error = RedfishError.of(503, "ServiceShuttingDown", detail=detail)
            task.messages = [message("TaskAborted", task.id, prefix="TaskEvent"), *error.messages]
            task.result = TaskResult(status=error.status, body=error_body(error))
            log.warning(
                "task interrupted by a restart",
                task=task.id,
                node=task.host,
                device=_fmt_targets(task.targets),
            )
        for target, binding in list(state.bindings.items()):
            if target not in self.index.targets or binding.host not in self.index.hosts:
                log.warning("dropping a binding the topology no longer has", device=target, node=binding.host)
                del state.bindings[target]
        for zone_id, zone in list(state.zones.items()):
            if zone.host not in self.index.hosts:
                del state.zones[zone_id]
        for conn_id, conn in list(state.connections.items()):
            if conn.host not in self.index.hosts or not any(c in state.bindings for c in conn.chunks):
                del state.connections[conn_id]
        for fault_id, record in list(state.faults.items()):
            try:
                self.faults[fault_id] = fault_adapter.validate_python(record.spec)
            except ValueError:
                log.warning("dropping a stored fault this version does not understand", fault=fault_id)
                del state.faults[fault_id]
        state.prune_tasks()
        state.version += 1
        self.store.write_now()
        self.hostview.reset({h.name: str(h.uuid) for h in self.index.hosts.values()})
        for binding in state.bindings.values():
            if self._visible(binding):
                self.hostview.add(self._entry(binding))
        self.revision.bump()

    def close(self) -> None:
        """Stop running tasks without touching their state: the next start marks them Interrupted."""
        for runner in self._runners.values():
            runner.cancel()
        self._runners.clear()

    # --- operations ------------------------------------------------------------------------

    async def execute(self, op: Operation, *, force_task: bool = False) -> Outcome:
        """Run ``op``: complete it now, or start a task for it; raises :class:`RedfishError`."""
        if op.kind == OperationKind.BIND:
            self._check_bind(op)
        else:
            self._check_unbind(op)
        failure = self._take_failure(op)
        hang = self._take_hang(op)
        # A QEMU host's change waits on its guest (device_del until DEVICE_DELETED): always a task,
        # so the request is not held open and the targets stay reserved meanwhile.
        force_task = force_task or (self.qemu is not None and op.host in self.qemu)
        if not (self.latency.tasks or force_task or hang):
            if failure is not None:
                await self._commit([], [])  # the fault's count went down
                raise failure
            bind = op.kind == OperationKind.BIND
            crash_point("emulator.bind.before-commit" if bind else "emulator.unbind.before-commit")
            effects, events = self._apply(op)
            await self._commit(effects, events)
            crash_point("emulator.bind.after-commit" if bind else "emulator.unbind.after-commit")
            return Outcome(op.success_status, op.location)
        task = self._start_task(op)
        # A hung task waits on the gate of the moment it started: a reset that comes before the
        # runner first runs still releases it.
        gate = None
        if hang:
            gate = self._unhang
            self.hung.add(task.id)
            log.warning("task hangs (injected fault)", task=task.id, device=_fmt_targets(op.targets))
        await self._commit(
            [], [self.events.make("TaskStarted", task.id, prefix="TaskEvent", origin=uris.task(task.id))]
        )
        self._runners[task.id] = asyncio.get_running_loop().create_task(
            self._run_task(task, op, failure, gate)
        )
        return Outcome(202, uris.task_monitor(task.id), task)

    def _target(self, target_id: str) -> Target:
        return self.index.targets[target_id]

    def _check_bind(self, op: Operation) -> None:
        for t in op.targets:
            bound = self.state.bindings.get(t)
            if bound is not None:
                raise RedfishError.of(
                    409, "ResourceInUse", detail=f"{t} is bound to {bound.host}; unbind it there first."
                )
            task_id = self.inflight.get(t)
            if task_id is not None:
                raise RedfishError.of(
                    409, "ResourceInUse", detail=f"{t} has an operation in progress (task {task_id})."
                )
        self._check_ports(op)

    def _check_unbind(self, op: Operation) -> None:
        if op.delete_zone and op.zone is not None:
            busy = sorted(
                t for t, task_id in self.inflight.items() if self.state.tasks[task_id].zone == op.zone
            )
            if busy:
                raise RedfishError.of(
                    409,
                    "ResourceInUse",
                    detail=f"Zone {op.zone} has operations in progress ({_fmt_targets(busy)}); "
                    "retry when they end.",
                )
        for t in op.targets:
            task_id = self.inflight.get(t)
            if task_id is not None:
                raise RedfishError.of(
                    409, "ResourceInUse", detail=f"{t} has an operation in progress (task {task_id})."
                )

    def _check_ports(self, op: Operation) -> None:
        for t in op.targets:
            switch = self._target(t).device.switch
            if not self.port_up(switch, op.host):
                port = self.index.switches[switch].upstream_ports.get(op.host, "?")
                raise RedfishError.of(
                    409,
                    "ConditionInRelatedResource",
                    detail=f"The host port {port} of {switch} to {op.host} is down; "
                    f"{t} cannot be bound to it.",
                )

    def _fault_matches(self, fault_target: str | None, op: Operation) -> bool:
        return self._fault_names(fault_target, op.targets)

    def _fault_names(self, fault_target: str | None, targets: list[str]) -> bool:
        if fault_target is None:
            return True
        return any(fault_target in (t, self._target(t).device.id) for t in targets)

    def _take_failure(self, op: Operation) -> RedfishError | None:
        return self._take_failure_of(op.kind.value, op.targets)

    def _take_failure_of(self, kind: str, targets: list[str]) -> RedfishError | None:
        """The first FailOperations fault for ``kind`` (bind, unbind, reset) of ``targets``, used."""
        for fault_id, fault in list(self.faults.items()):
            if not isinstance(fault, FailOperations):
                continue
            # "any" is any binding change; a reset fails only when a fault names it
            wanted = (kind,) if kind == "reset" else ("any", kind)
            if fault.Operation not in wanted or not self._fault_names(fault.Target, targets):
                continue
            self._consume(fault_id, fault)
            status = fault.HttpStatus or _STATUS_OF_MESSAGE.get(fault.MessageId, 400)
            return RedfishError.of(
                status,
                fault.MessageId,
                detail=f"The fabric refused to {kind} {_fmt_targets(targets)} (injected fault {fault_id}).",
            )
        return None

    async def reset_device(self, device_id: str, reset_type: str | None) -> list[BindingRecord]:
        """Reset the device ``device_id`` (``#Processor.Reset``, ``#Drive.Reset``): done at once,
        as a function-level reset is (PCIe Base 6.0 §6.6.2: within 100 ms), and counted on its
        bindings (``Resets``, ``LastReset`` in the Bindings table: the host's side of the reset).
        A device with an operation in flight is 409; a ``FailOperations`` fault with
        ``Operation: reset`` fails it. Returns the bindings it was counted on."""
        targets = sorted(t for t, target in self.index.targets.items() if target.device.id == device_id)
        for t in targets:
            task_id = self.inflight.get(t)
            if task_id is not None:
                raise RedfishError.of(
                    409, "ResourceInUse", detail=f"{t} has an operation in progress (task {task_id})."
                )
        failure = self._take_failure_of("reset", targets)
        if failure is not None:
            await self._commit([], [])  # the fault's count went down
            raise failure
        now = utcnow()
        counted = [b for t in targets if (b := self.state.bindings.get(t)) is not None]
        for binding in counted:
            binding.resets += 1
            binding.last_reset = now
        self.revision.bump()
        log.info(
            "device reset",
            device=device_id,
            node=",".join(b.host for b in counted) or None,
            reset_type=reset_type or "default",
        )
        await self._commit([], [])
        return counted

    def _take_hang(self, op: Operation) -> bool:
        for fault_id, fault in list(self.faults.items()):
            if isinstance(fault, HangTasks) and self._fault_matches(fault.Target, op):
                self._consume(fault_id, fault)
                return True
        return False

    def _consume(self, fault_id: str, fault: FailOperations | HangTasks) -> None:
        if fault.Count > 1:
            self._replace_fault(fault_id, fault.model_copy(update={"Count": fault.Count - 1}))
        else:
            self._drop_fault_record(fault_id)

    def _replace_fault(self, fault_id: str, fault: FaultSpec) -> None:
        self.faults[fault_id] = fault
        self.state.faults[fault_id].spec = fault.model_dump()
        self.revision.bump()

    def _drop_fault_record(self, fault_id: str) -> None:
        self.faults.pop(fault_id, None)
        self.state.faults.pop(fault_id, None)
        self.revision.bump()

    def _start_task(self, op: Operation) -> TaskRecord:
        task = TaskRecord(
            id=self.state.allocate_id(),
            kind=op.kind,
            style=op.style,
            host=op.host,
            targets=list(op.targets),
            zone=op.zone,
            connection=op.connection,
            state="Running",
            start=utcnow(),
            method=op.method,
            uri=op.uri,
            body=op.body,
            messages=[],
        )
        task.messages.append(message("TaskStarted", task.id, prefix="TaskEvent"))
        self.state.tasks[task.id] = task
        for t in op.targets:
            self.inflight[t] = task.id
        self.revision.bump()
        log.info(
            "task started",
            task=task.id,
            operation=op.kind.value,
            device=_fmt_targets(op.targets),
            node=op.host,
            style=op.style.value,
        )
        return task

    async def _run_task(
        self, task: TaskRecord, op: Operation, failure: RedfishError | None, gate: asyncio.Event | None
    ) -> None:
        try:
            if gate is not None:
                try:
                    await gate.wait()
                finally:
                    self.hung.discard(task.id)
            types = [self._target(t).device.type for t in op.targets]
            seconds = self.latency.operation_seconds(op.kind == OperationKind.BIND, types, self.rng)
            await asyncio.sleep(seconds / 2)
            if seconds:
                task.percent = 50
                self.revision.bump()
                self.events.publish(
                    [
                        self.events.make(
                            "TaskProgressChanged", task.id, 50, prefix="TaskEvent", origin=uris.task(task.id)
                        )
                    ]
                )
            await asyncio.sleep(seconds / 2)
            if failure is None:
                failure = await self._guest_change(op)
        except asyncio.CancelledError:
            return
        self._runners.pop(task.id, None)
        crash_point("emulator.task.before-complete")
        effects, events = self._finish_task(task, op, failure)
        with contextlib.suppress(Exception):
            # a failed write was logged by the store; the task's state is retried with the next commit
            await self._commit(effects, events)
        crash_point("emulator.task.after-complete")

    async def _guest_change(self, op: Operation) -> RedfishError | None:
        """Plug or unplug the targets of ``op`` in a QEMU host's guest; the failure, if any."""
        if self.qemu is None or op.host not in self.qemu:
            return None
        host = self.qemu[op.host]
        done: list[str] = []
        try:
            for t in op.targets:
                if self._target(t).chunk is not None:
                    continue
                if op.kind == OperationKind.BIND:
                    await host.plug(t)
                elif t in self.state.bindings:
                    await host.unplug(t)
                done.append(t)
        except HostUnplugError as err:
            return RedfishError.of(504, "OperationTimeout", detail=str(err))
        except (QmpError, OSError) as err:
            if op.kind == OperationKind.BIND:
                for t in done:  # all or nothing: a failed bind leaves the guest as it was
                    with contextlib.suppress(HostUnplugError, QmpError, OSError):
                        await host.unplug(t)
            return RedfishError.of(
                500,
                "OperationFailed",
                detail=f"QEMU host {op.host} could not {op.kind.value} {_fmt_targets(op.targets)}: {err}",
            )
        return None

    def _finish_task(
        self, task: TaskRecord, op: Operation, failure: RedfishError | None
    ) -> tuple[list[Callable[[], None]], list[FabricEvent]]:
        for t in op.targets:
            self.inflight.pop(t, None)
        if failure is None and op.kind == OperationKind.BIND:
            try:
                self._check_ports(op)
            except RedfishError as err:
                failure = err
        task.end = utcnow()
        task.percent = 100
        origin = uris.task(task.id)
        if failure is not None:
            task.state = "Exception"
            task.status = "Critical"
            task.messages.extend([message("TaskAborted", task.id, prefix="TaskEvent"), *failure.messages])
            task.result = TaskResult(status=failure.status, body=error_body(failure))
            log.warning(
                "task failed",
                task=task.id,
                device=_fmt_targets(op.targets),
                node=op.host,
                error=failure.summary,
            )
            self.revision.bump()
            return [], [self.events.make("TaskAborted", task.id, prefix="TaskEvent", origin=origin)]
        effects, events = self._apply(op)
        task.state = "Completed"
        task.messages.append(message("TaskCompletedOK", task.id, prefix="TaskEvent"))
        body = self.render(op.location) if op.location else None
        task.result = TaskResult(status=op.success_status, location=op.location, body=body)
        self.state.prune_tasks()
        events.append(self.events.make("TaskCompletedOK", task.id, prefix="TaskEvent", origin=origin))
        return effects, events

    async def cancel_task(self, task_id: str) -> TaskRecord:
        task = self.state.tasks[task_id]
        if task.finished:
            raise RedfishError.of(
                409,
                "ResourceInUse",
                detail=f"Task {task_id} already ended ({task.state}); it cannot be cancelled.",
            )
        runner = self._runners.pop(task_id, None)
        if runner is not None:
            runner.cancel()
        for t in task.targets:
            self.inflight.pop(t, None)
        task.state = "Cancelled"
        task.status = "Warning"
        task.end = utcnow()
        cancelled = message("TaskCancelled", task.id, prefix="TaskEvent")
        task.messages.append(cancelled)
        task.result = TaskResult(status=409, body=error_body(RedfishError(409, [cancelled])))
        self.revision.bump()
        log.info("task cancelled", task=task.id, device=_fmt_targets(task.targets), node=task.host)
        await self._commit(
            [], [self.events.make("TaskCancelled", task.id, prefix="TaskEvent", origin=uris.task(task.id))]
        )
        return task

    def _apply(self, op: Operation) -> tuple[list[Callable[[], None]], list[FabricEvent]]:
        """Change the bindings (synchronously); returns host-view effects and events to send."""
        indexed = self._zones_at == self._zones_key()
        before = {t: self.state.bindings.get(t) for t in op.targets}
        outcome = self._change(op)
        if indexed:
            self._index_change(before)
        return outcome

    def _change(self, op: Operation) -> tuple[list[Callable[[], None]], list[FabricEvent]]:
        state = self.state
        effects: list[Callable[[], None]] = []
        events: list[FabricEvent] = []
        now = utcnow()
        fabric = op.fabric
        if op.kind == OperationKind.BIND:
            for t in op.targets:
                target = self._target(t)
                others = [(b, self._target(b.target).device.id) for b in self.host_bindings(op.host)]
                binding = BindingRecord(
                    target=t,
                    host=op.host,
                    style=op.style,
                    zone=op.zone,
                    connection=op.connection,
                    since=now,
                    address=allocate_address(others, target.device.type, target.device.id),
                )
                state.bindings[t] = binding
                if self._visible(binding):
                    effects.append(functools.partial(self.hostview.add, self._entry(binding)))
                events.extend(self._target_events(target, op.host))
            if op.create_zone and op.zone:
                state.zones[op.zone] = ZoneRecord(
                    id=op.zone,
                    fabric=fabric,
                    host=op.host,
                    name=op.name,
                    description=op.description,
                    created=now,
                )
                events.append(
                    self.events.make(
                        "ZoneCreated", op.zone, fabric, prefix="Fabric", origin=uris.zone(fabric, op.zone)
                    )
                )
            elif op.zone:
                events.append(
                    self.events.make(
                        "ZoneModified", op.zone, fabric, prefix="Fabric", origin=uris.zone(fabric, op.zone)
                    )
                )
            if op.create_connection and op.connection:
                state.connections[op.connection] = ConnectionRecord(
                    id=op.connection,
                    fabric=fabric,
                    host=op.host,
                    chunks=list(op.targets),
                    access=op.access,
                    name=op.name,
                    description=op.description,
                    created=now,
                )
                events.append(
                    self.events.make(
                        "ConnectionCreated",
                        op.connection,
                        fabric,
                        prefix="Fabric",
                        origin=uris.connection(fabric, op.connection),
                    )
                )
        else:
            for t in op.targets:
                removed = state.bindings.pop(t, None)
                if removed is None:
                    continue
                if self._visible(removed):
                    effects.append(functools.partial(self.hostview.remove, self._entry(removed)))
                events.extend(self._target_events(self._target(t), op.host))
            if op.delete_zone and op.zone:
                state.zones.pop(op.zone, None)
                events.append(
                    self.events.make(
                        "ZoneRemoved", op.zone, fabric, prefix="Fabric", origin=uris.zone(fabric, op.zone)
                    )
                )
            elif op.zone:
                events.append(
                    self.events.make(
                        "ZoneModified", op.zone, fabric, prefix="Fabric", origin=uris.zone(fabric, op.zone)
                    )
                )
            if op.delete_connection and op.connection:
                state.connections.pop(op.connection, None)
                events.append(
                    self.events.make(
                        "ConnectionRemoved",
                        op.connection,
                        fabric,
                        prefix="Fabric",
                        origin=uris.connection(fabric, op.connection),
                    )
                )
        events.append(
            self.events.make("ResourceChanged", prefix="ResourceEvent", origin=uris.system(op.host))
        )
        self.revision.bump()
        log.info(
            "bound" if op.kind == OperationKind.BIND else "unbound",
            device=_fmt_targets(op.targets),
            node=op.host,
            style=op.style.value,
        )
        return effects, events

    def _target_events(self, target: Target, host: str) -> list[FabricEvent]:
        dev = target.device
        if target.chunk is not None:
            origin = uris.chunk(dev.id, target.chunk.index)
            return [self.events.make("ResourceChanged", prefix="ResourceEvent", origin=origin)]
        return [
            self.events.make(
                "ResourceChanged", prefix="ResourceEvent", origin=uris.endpoint(dev.fabric, dev.id)
            ),
            self.events.make(
                "ResourceBlockCompositionStateChanged",
                dev.id,
                prefix="Composition",
                origin=uris.resource_block(dev.id),
            ),
        ]

    async def _commit(self, effects: list[Callable[[], None]], events: list[FabricEvent]) -> None:
        self.state.event_seq = self.events.seq
        await self.store.commit(effects)
        self.events.publish(events)

    # --- host views ------------------------------------------------------------------------

    def _visible(self, binding: BindingRecord) -> bool:
        return self.port_up(self._target(binding.target).device.switch, binding.host)

    def _entry(self, binding: BindingRecord) -> HostEntry:
        target = self._target(binding.target)
        dev = target.device
        model = dev.model
        return HostEntry(
            host=binding.host,
            target=binding.target,
            type=dev.type,
            address=binding.address.model_copy(),
            vendor_id=model.vendor_id,
            device_id=model.device_id,
            class_code=model.class_code,
            revision_id=model.revision_id,
            subsystem_vendor_id=dev.subsystem_vendor_id,
            subsystem_id=model.subsystem_id,
            pcie_generation=model.pcie_generation,
            pcie_width=model.pcie_width,
            serial=dev.serial,
            model=model.model,
            numa_node=self.index.hosts[binding.host].numa_node,
            size_bytes=target.chunk.size_bytes if target.chunk else int(model.memory or 0),
            device_size_bytes=int(model.memory or 0),
        )

    # --- faults ----------------------------------------------------------------------------

    async def add_fault(self, fault: FaultSpec) -> tuple[str | None, str]:
        """Inject ``fault``; returns its Id (None when it acted once) and what it did."""
        if isinstance(fault, ExpireSessions):
            count = self.expire_sessions()
            log.warning("all sessions expired (injected fault)", sessions=count)
            return None, f"expired {count} session(s)"
        self._validate_fault(fault)
        before, health_before, ports_before = self._snapshot_conditions()
        fault_id = self.state.allocate_id()
        self.faults[fault_id] = fault
        self.state.faults[fault_id] = FaultRecord(id=fault_id, spec=fault.model_dump(), created=utcnow())
        effects, events = self._fault_effects(before, health_before, ports_before)
        self.revision.bump()
        log.warning("fault injected", fault=fault_id, kind=fault.Kind, spec=json.dumps(fault.model_dump()))
        await self._commit(effects, events)
        return fault_id, "active"

    async def remove_faults(self, fault_id: str | None = None) -> tuple[int, int]:
        """Remove one fault, or all (``None``); hung tasks resume. Returns (faults removed, tasks resumed)."""
        ids = [fault_id] if fault_id is not None else list(self.faults)
        resumed = 0
        before, health_before, ports_before = self._snapshot_conditions()
        for ident in ids:
            self.faults.pop(ident, None)
            self.state.faults.pop(ident, None)
        if fault_id is None or not any(isinstance(f, HangTasks) for f in self.faults.values()):
            resumed = len(self.hung)
            self._unhang.set()
            self._unhang = asyncio.Event()
        effects, events = self._fault_effects(before, health_before, ports_before)
        self.revision.bump()
        log.warning("faults removed", count=len(ids), resumed_tasks=resumed)
        await self._commit(effects, events)
        return len(ids), resumed

    def _validate_fault(self, fault: FaultSpec) -> None:
        def unknown(kind: str, name: str, prop: str) -> RedfishError:
            return RedfishError.of(
                400, "PropertyValueNotInList", name, prop, detail=f"There is no {kind} named {name!r}."
            )

        if (
            isinstance(fault, FailOperations | HangTasks)
            and fault.Target is not None
            and fault.Target not in self.index.targets
            and fault.Target not in self.index.devices
        ):
            raise unknown("device or memory chunk", fault.Target, "Target")
        if isinstance(fault, DeviceHealth) and fault.Device not in self.index.devices:
            raise unknown("device", fault.Device, "Device")
        if isinstance(fault, PortDown):
            if fault.Host not in self.index.hosts:
                raise unknown("host", fault.Host, "Host")
            if fault.Switch is not None and fault.Switch not in self.index.switches:
                raise unknown("switch", fault.Switch, "Switch")

    def _snapshot_conditions(self) -> tuple[dict[str, bool], dict[str, str], set[tuple[str, str]]]:
        """What faults change, before a change: host-view visibility, device health, ports down."""
        visible = {t: self._visible(b) for t, b in self.state.bindings.items()}
        return visible, {d: self.health(d) for d in self.index.devices}, self._ports_down()

    def _fault_effects(
        self, before: dict[str, bool], health_before: dict[str, str], ports_before: set[tuple[str, str]]
    ) -> tuple[list[Callable[[], None]], list[FabricEvent]]:
        effects: list[Callable[[], None]] = []
        events: list[FabricEvent] = []
        for t, binding in self.state.bindings.items():
            now_visible = self._visible(binding)
            if now_visible != before.get(t, now_visible):
                action = self.hostview.add if now_visible else self.hostview.remove
                effects.append(functools.partial(action, self._entry(binding)))
        events.extend(self._port_events(ports_before))
        for device_id, was in health_before.items():
            now = self.health(device_id)
            if now != was:
                dev = self.index.devices[device_id]
                key = {"OK": "ResourceStatusChangedOK", "Warning": "ResourceStatusChangedWarning"}.get(
                    now, "ResourceStatusChangedCritical"
                )
                events.append(
                    self.events.make(
                        key,
                        device_id,
                        now,
                        prefix="ResourceEvent",
                        origin=uris.pcie_device(dev),
                    )
                )
        return effects, events

    def _port_events(self, down_before: set[tuple[str, str]]) -> list[FabricEvent]:
        events = []
        for sw in self.index.switches.values():
            for host, port in sw.upstream_ports.items():
                is_down = not self.port_up(sw.id, host)
                was_down = (sw.id, host) in down_before
                if is_down != was_down:
                    key = "UpstreamLinkDropped" if is_down else "UpstreamLinkEstablished"
                    events.append(
                        self.events.make(
                            key, sw.id, port, prefix="Fabric", origin=uris.port(sw.fabric, sw.id, port)
                        )
                    )
        return events

    def _ports_down(self) -> set[tuple[str, str]]:
        return {
            (sw.id, host)
            for sw in self.index.switches.values()
            for host in sw.upstream_ports
            if not self.port_up(sw.id, host)
        }
