"""Operations that run as Redfish tasks: the targets are reserved when the task starts, the
bindings change only when it completes — in one durable commit with the task's final state —
and a cancel, a failure or a hang ends it without touching them.

A task waits out the latency profile's time (reporting 50 % half way), then, on a QEMU host,
the guest's own plug or unplug; a HangTasks fault holds it until the faults are reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emulator.errors import FabricError, GuestFailed, GuestTimedOut, PortIsDown, TaskFinished
from emulator.qemu.host import HostUnplugError, QemuHosts
from emulator.qemu.qmp import QmpError
from emulator.redfish.engine.binder import Binder
from emulator.redfish.engine.bindings import BindingTable
from emulator.redfish.engine.carving import Carver
from emulator.redfish.engine.conditions import Conditions
from emulator.redfish.engine.events import EventBus, FabricEvent
from emulator.redfish.engine.journal import Change, Journal
from emulator.redfish.engine.operation import Operation, fmt_targets
from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError, error_body, redfish_error
from emulator.redfish.model.latency import LatencyProfile
from emulator.redfish.model.registries import message
from emulator.redfish.model.state import FabricState, OperationKind, TaskRecord, TaskResult, utcnow
from emulator.topology import FabricIndex
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["TaskRunner"]

log = get_logger(__name__)


@dataclass(eq=False)
class TaskRunner:
    index: FabricIndex
    table: BindingTable
    conditions: Conditions
    binder: Binder
    events: EventBus
    journal: Journal
    latency: LatencyProfile
    rng: random.Random
    #: hosts of ``kind: qemu``: a task waits on the guest's own plug or unplug
    qemu: QemuHosts | None
    #: renders a resource URI for a task's final response
    render: Callable[[str], dict[str, Any] | None]
    #: deletes carved memory chunks (a task for their sanitize time)
    carver: Carver
    _runners: dict[str, asyncio.Task[None]] = field(default_factory=dict, init=False)

    @property
    def state(self) -> FabricState:
        return self.table.state

    async def start(self, op: Operation, failure: FabricError | None, *, hang: bool) -> TaskRecord:
        """Reserve ``op``'s targets in a new running task, durably, and run it in the background;
        ``failure`` ends it so, ``hang`` (a HangTasks fault) holds it until the faults are reset."""
        task = self._new_task(op)
        gate = None
        if hang:
            gate = self.conditions.hang(task.id)
            log.warning("task hangs (injected fault)", task=task.id, device=fmt_targets(op.targets))
        await self.journal.commit(
            [], [self.events.make("TaskStarted", task.id, prefix="TaskEvent", origin=uris.task(task.id))]
        )
        self._runners[task.id] = asyncio.get_running_loop().create_task(self._run(task, op, failure, gate))
        return task

    def _new_task(self, op: Operation) -> TaskRecord:
        task = TaskRecord(
            id=self.state.allocate_id(),
            kind=op.kind,
            style=op.style,
            host=op.host or None,
            targets=list(op.targets),
            zone=op.zone,
            connection=op.connection,
            state="Running",
            start=utcnow(),
            method=op.method,
            uri=op.uri,
            body=op.body,
        )
        task.messages = (message("TaskStarted", task.id, prefix="TaskEvent"),)
        self.state.tasks[task.id] = task
        for t in op.targets:
            self.table.inflight[t] = task.id
        self.table.revision.bump()
        log.info(
            "task started",
            task=task.id,
            operation=op.kind.value,
            device=fmt_targets(op.targets),
            node=op.host or None,
            style=op.style.value,
        )
        return task

    async def _run(
        self, task: TaskRecord, op: Operation, failure: FabricError | None, gate: asyncio.Event | None
    ) -> None:
        try:
            if gate is not None:
                try:
                    await gate.wait()
                finally:
                    self.conditions.hung.discard(task.id)
            await self._take_time(task, op)
            if failure is None:
                failure = await self._guest_change(op)
        except asyncio.CancelledError:
            return
        self._runners.pop(task.id, None)
        crash_point("emulator.task.before-complete")
        effects, events = self._finish(task, op, failure)
        with contextlib.suppress(Exception):
            # a failed write was logged by the store; the task's state is retried with the next commit
            await self.journal.commit(effects, events)
        crash_point("emulator.task.after-complete")

    async def _take_time(self, task: TaskRecord, op: Operation) -> None:
        """The latency profile's time for ``op``, reporting 50 % half way."""
        if op.kind == OperationKind.RELEASE:
            seconds = self.latency.sanitize_seconds(self.rng)
        else:
            types = [self.index.targets[t].device.type for t in op.targets]
            seconds = self.latency.operation_seconds(op.binds, types, self.rng)
        await asyncio.sleep(seconds / 2)
        if seconds:
            task.percent = 50
            self.table.revision.bump()
            self.events.publish(
                [
                    self.events.make(
                        "TaskProgressChanged", task.id, 50, prefix="TaskEvent", origin=uris.task(task.id)
                    )
                ]
            )
        await asyncio.sleep(seconds / 2)

    async def _guest_change(self, op: Operation) -> FabricError | None:
        """Plug or unplug the targets of ``op`` in a QEMU host's guest; the failure, if any."""
        if self.qemu is None or op.host not in self.qemu:
            return None
        host = self.qemu[op.host]
        done: list[str] = []
        try:
            for t in op.targets:
                if self.index.targets[t].chunk is not None:
                    continue
                if op.binds:
                    await host.plug(t)
                elif t in self.state.bindings:
                    await host.unplug(t)
                done.append(t)
        except HostUnplugError as err:
            return GuestTimedOut(str(err))
        except (QmpError, OSError) as err:
            if op.binds:
                for t in done:  # all or nothing: a failed bind leaves the guest as it was
                    with contextlib.suppress(HostUnplugError, QmpError, OSError):
                        await host.unplug(t)
            return GuestFailed(
                f"QEMU host {op.host} could not {op.kind.value} {fmt_targets(op.targets)}: {err}"
            )
        return None

    def _finish(self, task: TaskRecord, op: Operation, failure: FabricError | None) -> Change:
        for t in op.targets:
            self.table.inflight.pop(t, None)
        if failure is None and op.binds:
            try:
                self.binder.check_ports(op)
            except PortIsDown as err:
                failure = err
        task.end = utcnow()
        task.percent = 100
        if failure is not None:
            return self._fail(task, op, failure)
        releases = op.kind == OperationKind.RELEASE
        effects, events = self.carver.release(op) if releases else self.binder.apply(op)
        task.state = "Completed"
        task.messages = (*task.messages, message("TaskCompletedOK", task.id, prefix="TaskEvent"))
        body = self.render(op.location) if op.location else None
        task.result = TaskResult(status=op.success_status, location=op.location, body=body)
        self.state.prune_tasks()
        events.append(
            self.events.make("TaskCompletedOK", task.id, prefix="TaskEvent", origin=uris.task(task.id))
        )
        return effects, events

    def _fail(self, task: TaskRecord, op: Operation, failure: FabricError) -> Change:
        error = redfish_error(failure)
        task.state = "Exception"
        task.status = "Critical"
        task.messages = (*task.messages, message("TaskAborted", task.id, prefix="TaskEvent"), *error.messages)
        task.result = TaskResult(status=error.status, body=error_body(error))
        self.state.prune_tasks()
        log.warning(
            "task failed",
            task=task.id,
            device=fmt_targets(op.targets),
            node=op.host or None,
            error=error.summary,
        )
        self.table.revision.bump()
        return [], [self.events.make("TaskAborted", task.id, prefix="TaskEvent", origin=uris.task(task.id))]

    async def cancel(self, task_id: str) -> TaskRecord:
        """Cancel a running task (DELETE on its monitor): its targets are free again, unchanged."""
        task = self.state.tasks[task_id]
        if task.finished:
            raise TaskFinished(f"Task {task_id} already ended ({task.state}); it cannot be cancelled.")
        runner = self._runners.pop(task_id, None)
        if runner is not None:
            runner.cancel()
        for t in task.targets:
            self.table.inflight.pop(t, None)
        task.state = "Cancelled"
        task.status = "Warning"
        task.end = utcnow()
        cancelled = message("TaskCancelled", task.id, prefix="TaskEvent")
        task.messages = (*task.messages, cancelled)
        task.result = TaskResult(status=409, body=error_body(RedfishError(409, [cancelled])))
        self.state.prune_tasks()
        self.table.revision.bump()
        log.info("task cancelled", task=task.id, device=fmt_targets(task.targets), node=task.host)
        events: list[FabricEvent] = [
            self.events.make("TaskCancelled", task.id, prefix="TaskEvent", origin=uris.task(task.id))
        ]
        await self.journal.commit([], events)
        return task

    def close(self) -> None:
        """Stop running tasks without touching their state: the next start marks them Interrupted."""
        for runner in self._runners.values():
            runner.cancel()
        self._runners.clear()
