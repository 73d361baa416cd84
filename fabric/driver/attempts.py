"""One operation's attempts on the fabric: bind or unbind one device, never blind.

Before every bind or unbind the binding is read from the fabric; a request whose outcome is unknown
(connection lost, task monitor gone, hung task) is never resent before a fresh read says it did not
happen. A Redfish task is followed to its end and its monitor recorded in the ledger entry, so that
a restart waits for it instead of sending the change again; a task that runs past its time is
cancelled and the next read decides. An unreachable fabric or a busy device is waited for with
growing pauses (:class:`plumbing.backoff.Backoff`) until the operation's time is up, then the
operation pauses (:class:`Unresolved`) and is resumed later.

The driver of each device (:mod:`fabric.driver.operations`) calls :meth:`FabricAttempts.ensure`;
the backend (:mod:`fabric.backends`) speaks Redfish, and :class:`TaskControl` (the Redfish client)
asks about and cancels the tasks recorded before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import Protocol

from fabric.backends.base import Backend, BindContext
from fabric.driver.settings import OperationSettings
from fabric.errors import ManagerError
from fabric.redfish.error_mapping import OutcomeUnknown
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState
from fabric.state.model import DeviceRecord, HostRecord
from fabric.state.operation_log import OperationLog
from manager_api.errors import (
    AttachTimeout,
    BindFailed,
    DeviceBusy,
    FabricError,
    FabricUnavailable,
    NotLeader,
)
from plumbing.backoff import Backoff
from plumbing.crashpoints import crash_point
from plumbing.logs import get_logger

__all__ = ["ErrorHolder", "FabricAttempts", "TaskControl", "Unresolved"]

log = get_logger(__name__)

#: reads after a change before it counts as not applied (``settle_seconds`` apart at most)
_CONFIRM_READS = 4


class Unresolved(ManagerError):
    """The driver cannot finish now (fabric unreachable, task still running, not the leader);
    the ledger entry stays and is resumed later."""

    def __init__(self, cause: FabricError) -> None:
        super().__init__(cause.message)
        self.cause = cause


class TaskControl(Protocol):
    """The Redfish tasks an operation recorded: whether one still runs, and stopping one."""

    async def task_running(self, monitor: str) -> bool: ...

    async def cancel_task(self, monitor: str) -> None: ...


class ErrorHolder(Protocol):
    """Where the latest error of a device's operation shows while it goes on: a request that stops
    waiting answers with it."""

    error: FabricError | None


@dataclass(slots=True)
class _Run:
    """One call of :meth:`FabricAttempts.ensure`: what it changes, and how far it got."""

    entry: LedgerEntry
    record: DeviceRecord
    host: HostRecord
    backend: Backend
    progress: ErrorHolder
    bound: bool
    timeout: InitVar[float]
    #: ``time.monotonic()`` when the operation's time is up
    deadline: float = 0.0
    #: changes sent (an unsent one, or one the fabric was busy for, does not count)
    attempts: int = 0
    last_error: FabricError | None = None
    backoff: Backoff = field(default_factory=lambda: Backoff(0.25, 5.0))

    def __post_init__(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout

    @property
    def verb(self) -> str:
        return "bind" if self.bound else "unbind"


class FabricAttempts:
    def __init__(
        self,
        ledger: Ledger,
        operations: OperationLog,
        tasks: TaskControl,
        *,
        node_for_host: Callable[[str], str | None],
        fence: Callable[[], None],
        settings: OperationSettings,
    ) -> None:
        self.ledger = ledger
        self.operations = operations
        self.tasks = tasks
        self.node_for_host = node_for_host
        self.fence = fence
        self.settings = settings

    async def ensure(
        self,
        entry: LedgerEntry,
        record: DeviceRecord,
        host: HostRecord,
        backend: Backend,
        progress: ErrorHolder,
        *,
        bound: bool,
    ) -> None:
        """Make the fabric bind (``bound``) or unbind ``record`` ↔ ``host``, reading before acting:
        read; done when the fabric already shows it; else send the change (at most
        ``max_attempts`` times) and confirm it by reading again."""
        run = _Run(entry, record, host, backend, progress, bound, self.settings.operation_timeout)
        # An attach stops when the claim asked for a detach meanwhile: the driver unbinds then.
        while not (bound and entry.state is not LedgerState.ATTACHING):
            current = await self._read(run)
            if current is None:
                continue  # the fabric was unreachable for a while: read again
            if self._in_place(run, current):
                return
            self._count_attempt(run)
            if await self._send(run):
                return

    async def _read(self, run: _Run) -> tuple[str, ...] | None:
        """The hosts the device is bound to now, read after any recorded task ended; None after a
        pause for an unreachable fabric (read again)."""
        try:
            self.fence()
            if run.entry.task_monitor:
                await self.settle_task(run.entry, run.deadline)
            if not run.bound:
                return await run.backend.read_binding(run.record, (run.host,))
            # What the bind will need (a zone's ETag...) is read alongside, not after.
            current, _ = await asyncio.gather(
                run.backend.read_binding(run.record, (run.host,)),
                run.backend.prepare_bind(run.record, run.host),
            )
            return current
        except NotLeader as err:
            raise Unresolved(err) from None
        except FabricUnavailable as err:
            run.progress.error = err
            if not await _pause(run.backoff, run.deadline):
                raise Unresolved(err) from None
            return None

    def _in_place(self, run: _Run, current: tuple[str, ...]) -> bool:
        """Whether the fabric shows the change already; DeviceBusy when another host holds the
        device (bound outside fabric-dra: never taken from it)."""
        if not run.bound:
            return run.host.id not in current
        if run.host.id in current:
            return True
        if current:
            node = self.node_for_host(current[0])
            held = f"{node or 'host ' + current[0]} (bound outside fabric-dra)"
            raise DeviceBusy(f"device {run.entry.device} is bound to {held}", held_by=held)
        return False

    def _count_attempt(self, run: _Run) -> None:
        """One more change to send; when the attempts are spent, the last refusal (a busy device)
        or BindFailed."""
        if run.attempts >= self.settings.max_attempts:
            if isinstance(run.last_error, DeviceBusy):
                raise run.last_error
            detail = f": {run.last_error.message}" if run.last_error else ""
            raise BindFailed(
                f"the fabric did not {run.verb} {run.entry.device} after {run.attempts} attempts{detail}"
            )
        run.attempts += 1

    async def _send(self, run: _Run) -> bool:
        """Send the bind or unbind once; True when the fabric took it and shows it, False when the
        next read decides (a task cancelled, a busy device, an answer lost, an unreachable fabric)."""
        entry = run.entry
        ctx = BindContext(
            deadline=min(run.deadline, time.monotonic() + self.settings.task_timeout),
            fence=self.fence,
            on_task=functools.partial(self.record_task, entry, run.bound),
            on_progress=functools.partial(self.operations.progress, entry.operation_id),
            action=f"{run.verb} {entry.device} {'to' if run.bound else 'from'} {run.host.id}",
        )
        try:
            if run.bound:
                await run.backend.bind(run.record, run.host, ctx)
            else:
                await run.backend.unbind(run.record, run.host, ctx)
        except NotLeader as err:
            raise Unresolved(err) from None
        except AttachTimeout as err:
            await self._task_timed_out(run, err)
            return False
        except DeviceBusy as err:
            # The read said "not bound" but the fabric is busy with the device (a task of an
            # earlier run of ours, a change in flight, or a PreconditionFailed: it changed since
            # the read): wait for it, do not burn attempts.
            run.progress.error = run.last_error = err
            run.attempts -= 1
            if not await _pause(run.backoff, run.deadline):
                raise
            return False
        except OutcomeUnknown as err:
            run.progress.error = run.last_error = err
            await asyncio.sleep(self.settings.settle_seconds)
            return False
        except FabricUnavailable as err:  # not sent: nothing happened
            run.progress.error = err
            run.attempts -= 1
            if not await _pause(run.backoff, run.deadline):
                raise Unresolved(err) from None
            return False
        crash_point("manager.attach.after-fabric-call" if run.bound else "manager.detach.after-fabric-call")
        entry.task_monitor = None
        await self._confirm(entry, run.record, run.host, run.backend, bound=run.bound)
        return True

    async def record_task(self, entry: LedgerEntry, bound: bool, monitor: str) -> None:
        """The fabric answered 202: its task monitor goes into the ledger entry, durably, before it
        is followed, so a restart waits for the task instead of sending the change again."""
        if bound:
            crash_point("manager.attach.task-accepted")
        entry.task_monitor = monitor
        self.ledger.put(entry)
        self.operations.running(entry.operation_id, redfish_task=monitor)
        await self.ledger.commit()
        crash_point("manager.attach.task-recorded" if bound else "manager.detach.task-recorded")

    async def _task_timed_out(self, run: _Run, err: AttachTimeout) -> None:
        """A task that did not finish in time: cancel it and let the next read decide; the
        operation pauses while the task still runs, and an attach whose binding is not there
        fails."""
        entry = run.entry
        run.progress.error = err
        if entry.task_monitor:
            await self.tasks.cancel_task(entry.task_monitor)
        log.warning("fabric task timed out, cancelled", device=entry.device, task=entry.task_monitor)
        with contextlib.suppress(Unresolved):
            await self.settle_task(entry, time.monotonic() + self.settings.task_timeout)
        if entry.task_monitor:
            raise Unresolved(err) from None
        if run.bound:
            after = await _read_or_none(run.backend, run.record, run.host)
            if after is not None and run.host.id not in after:
                raise err from None

    async def _confirm(
        self, entry: LedgerEntry, record: DeviceRecord, host: HostRecord, backend: Backend, *, bound: bool
    ) -> None:
        """A change is done only when the fabric's own record of bindings shows it, read after
        the change: a service may answer 200 to an action it did not apply (DMTF's mockup server
        applies none), or apply it a moment later. Never resent: the service took it once."""
        pauses = Backoff(self.settings.settle_seconds / 4, self.settings.settle_seconds)
        for _ in range(_CONFIRM_READS):
            try:
                done = await backend.confirmed(record, host, bound=bound)
            except NotLeader as err:
                raise Unresolved(err) from None
            except FabricUnavailable as err:
                raise Unresolved(err) from None  # not known either way: the resume reads again
            if done:
                return
            await asyncio.sleep(pauses.next())
        verb = "bind" if bound else "unbind"
        found = "the binding is not there" if bound else "the binding is still there"
        raise BindFailed(
            f"the Redfish service accepted the {verb} of {entry.device} {'to' if bound else 'from'} "
            f"{host.id} but did not apply it: read after the change, the fabric's {backend.authority} "
            f"say {found}; check the service (fabric-dra does not send the change again)"
        )

    async def settle_task(self, entry: LedgerEntry, deadline: float) -> None:
        """Wait for a recorded task (from before a crash, or a cancelled one) to end."""
        pauses = Backoff(0.2, 2.0)
        while entry.task_monitor:
            if not await self.tasks.task_running(entry.task_monitor):
                entry.task_monitor = None
                self.ledger.put(entry)
                return
            if not await _pause(pauses, deadline):
                raise Unresolved(
                    AttachTimeout(
                        f"fabric task {entry.task_monitor} for {entry.device} is still running",
                        retry_after=5.0,
                    )
                )


async def _pause(backoff: Backoff, deadline: float) -> bool:
    """Sleep the backoff's next pause; False, without sleeping, when it would end past ``deadline``."""
    pause = backoff.next()
    if time.monotonic() + pause > deadline:
        return False
    await asyncio.sleep(pause)
    return True


async def _read_or_none(backend: Backend, record: DeviceRecord, host: HostRecord) -> tuple[str, ...] | None:
    try:
        return await backend.read_binding(record, (host,))
    except FabricError:
        return None
