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
from typing import Protocol

from fabric.backends.base import Backend, BindContext
from fabric.errors import ManagerError
from fabric.redfish.error_mapping import OutcomeUnknown, PreconditionFailed
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState
from fabric.state.model import DeviceRecord, HostRecord
from fabric.state.operation_log import OperationLog, OperationSettings
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
        """Make the fabric bind (``bound``) or unbind ``record`` ↔ ``host``, reading before acting."""
        deadline = time.monotonic() + self.settings.operation_timeout
        attempts = 0
        backoff = Backoff(0.25, 5.0)
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
                self.fence()
                if entry.task_monitor:
                    await self.settle_task(entry, deadline)
                if bound:
                    # What the bind will need (a zone's ETag...) is read alongside, not after.
                    current, _ = await asyncio.gather(
                        backend.read_binding(record, (host,)), backend.prepare_bind(record, host)
                    )
                else:
                    current = await backend.read_binding(record, (host,))
            except NotLeader as err:
                raise Unresolved(err) from None
            except FabricUnavailable as err:
                progress.error = err
                if not await _pause(backoff, deadline):
                    raise Unresolved(err) from None
                continue
            if bound:
                if host.id in current:
                    return
                if current:
                    node = self.node_for_host(current[0])
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
                fence=self.fence,
                on_task=record_task,
                on_progress=functools.partial(self.operations.progress, entry.operation_id),
                action=f"{verb} {entry.device} {'to' if bound else 'from'} {host.id}",
            )
            try:
                if bound:
                    await backend.bind(record, host, ctx)
                else:
                    await backend.unbind(record, host, ctx)
            except NotLeader as err:
                raise Unresolved(err) from None
            except AttachTimeout as err:
                # A task that did not finish in time: cancel it and let the next read decide.
                progress.error = err
                if entry.task_monitor:
                    await self.tasks.cancel_task(entry.task_monitor)
                log.warning("fabric task timed out, cancelled", device=entry.device, task=entry.task_monitor)
                with contextlib.suppress(Unresolved):
                    await self.settle_task(entry, time.monotonic() + self.settings.task_timeout)
                if entry.task_monitor:
                    raise Unresolved(err) from None
                if bound:
                    after = await _read_or_none(backend, record, host)
                    if after is not None and host.id not in after:
                        raise err from None
                continue
            except DeviceBusy as err:
                # The read said "not bound" but the fabric is busy with the device (a task of an
                # earlier run of ours, or a change in flight): wait for it, do not burn attempts.
                progress.error = last_error = err
                attempts -= 1
                if not await _pause(backoff, deadline):
                    raise
                continue
            except (OutcomeUnknown, PreconditionFailed) as err:
                progress.error = last_error = err
                await asyncio.sleep(self.settings.settle_seconds)
                continue
            except FabricUnavailable as err:  # not sent: nothing happened
                progress.error = err
                attempts -= 1
                if not await _pause(backoff, deadline):
                    raise Unresolved(err) from None
                continue
            crash_point("manager.attach.after-fabric-call" if bound else "manager.detach.after-fabric-call")
            entry.task_monitor = None
            await self._confirm(entry, record, host, backend, bound=bound)
            return

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
