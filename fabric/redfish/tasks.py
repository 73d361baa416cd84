"""Following Redfish tasks: task monitors, and the task events that wake their followers.

**Task monitors.** DSP0266 "Asynchronous operations": a service answers a long operation with 202
and the task monitor in ``Location`` (and maybe ``Retry-After``); GET on the monitor answers 202
while the task runs and the operation's own response once it is done. Some services answer the
Task resource instead; its ``TaskState``/``TaskStatus`` decide then. :class:`TaskMonitor` follows
one to its end, asks whether a recorded one still runs, and cancels one (DELETE on the monitor).

**Task events.** A client following a task (DSP0266 "Asynchronous operations") polls its monitor when the
service's ``Retry-After`` says — a second at a time, typically. A GPU hot-add of three seconds
would then be seen done up to a second late. The service also sends a ``TaskEvent`` on its event
stream when a task ends (``TaskCompletedOK``, ``TaskAborted``...) with the task as
``OriginOfCondition``: :class:`TaskWatch` lets the event stream wake the follower of that task so
it reads the monitor at once. Polling stays the fallback, so nothing depends on events arriving.

Once the stream has delivered an event about a task a follower was waiting for, the service is
known to send them: followers then poll only every :data:`EVENTED_POLL_SECONDS` (a lost event
costs at most that), instead of every ``Retry-After`` — a real BMC answers each monitor read
slowly, and a three-second hot-add would otherwise cost three reads that all say "running". The
stream going down or coming back up ends that (events may have been missed) and wakes every
follower to read its monitor at once. Events that do not end a task (``TaskStarted``,
``TaskProgressChanged``...) count as that evidence but wake nobody: a read would only say
"running".
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from fabric.redfish.error_mapping import OutcomeUnknown, error_for_response, error_for_task
from fabric.redfish.links import ForeignLink, same_service
from fabric.redfish.transport import RETRY_STATUSES, RedfishResponse, Transport, TransportError
from manager_api.errors import AttachTimeout, FabricError, FabricUnavailable
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = ["EVENTED_POLL_SECONDS", "FINAL_TASK_EVENTS", "TaskMonitor", "TaskWatch", "percent_complete"]

log = get_logger(__name__)

#: between polls of a task monitor while the service is known to send task events
EVENTED_POLL_SECONDS = 5.0

#: TaskEvent registry (TaskEvent.1.0) messages after which the task has ended
FINAL_TASK_EVENTS = frozenset(
    {"TaskAborted", "TaskCancelled", "TaskCompletedOK", "TaskCompletedWarning", "TaskRemoved"}
)

_TERMINAL_TASK_STATES = frozenset({"Completed", "Killed", "Exception", "Cancelled"})
_FAILED_TASK_STATES = frozenset({"Killed", "Exception", "Cancelled"})

#: how long a task change is remembered for a follower that starts waiting only after it
_REMEMBER_SECONDS = 30.0
_REMEMBER_MAX = 1024


def percent_complete(body: Mapping[str, Any]) -> int | None:
    """A Task's ``PercentComplete`` (DMTF Task schema: an integer, 0 to 100), or None when the body
    has none or one out of that range — a service's number is shown, never trusted to be sane."""
    value = body.get("PercentComplete")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value) if 0 <= value <= 100 else None


def _key(uri: str) -> str:
    return uri.split("?", 1)[0].rstrip("/")


class TaskWatch:
    """Followers wait here between polls; :meth:`changed` wakes the ones of a task."""

    def __init__(self) -> None:
        self._waiters: dict[str, set[asyncio.Event]] = {}
        #: task URIs that changed recently: a follower registering after the event still sees it
        self._recent: OrderedDict[str, float] = OrderedDict()
        self._evented = False
        #: tasks (and monitors) some follower follows, from the 202 to its end: an event about one
        #: of them shows the service sends events for the tasks fabric-dra waits for
        self._followed: Counter[str] = Counter()

    def follow(self, uris: Iterable[str]) -> None:
        """A follower starts following a task (its monitor and task URIs)."""
        self._followed.update({_key(u) for u in uris if u})

    def unfollow(self, uris: Iterable[str]) -> None:
        """The follower is done with it."""
        self._followed.subtract({_key(u) for u in uris if u})
        self._followed += Counter()  # drop the keys at zero

    @property
    def evented(self) -> bool:
        """The event stream is up and has told of a task a follower was following."""
        return self._evented

    def stream_changed(self) -> None:
        """The event stream connected or dropped: events may have been missed, and whether this
        connection carries task events is not known yet. Every follower reads its monitor now."""
        self._evented = False
        self.changed(None)

    def changed(self, uri: str | None, *, final: bool = True) -> None:
        """The service said the task at ``uri`` changed; None: some task changed (wake everyone).
        ``final=False`` (the task goes on: started, progress) wakes nobody."""
        if uri is None:
            if not final:
                return
            for events in self._waiters.values():
                for event in events:
                    event.set()
            return
        key = _key(uri)
        if self._followed[key] > 0:
            self._evented = True
        if not final:
            return
        now = time.monotonic()
        self._recent[key] = now
        self._recent.move_to_end(key)
        while self._recent and (
            len(self._recent) > _REMEMBER_MAX or next(iter(self._recent.values())) < now - _REMEMBER_SECONDS
        ):
            self._recent.popitem(last=False)
        for event in self._waiters.get(key, ()):
            event.set()

    async def pause(self, uris: Iterable[str], seconds: float, *, since: float) -> None:
        """Sleep up to ``seconds``, less if any of ``uris`` (a task and its monitor) changes, or
        changed after ``since`` (``time.monotonic()``) before this call."""
        keys = {_key(u) for u in uris if u}
        if any(self._recent.get(k, -1.0) > since for k in keys):
            return
        event = asyncio.Event()
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), max(0.0, seconds))
        finally:
            for key in keys:
                waiting = self._waiters.get(key)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiters[key]


class TaskMonitor:
    """Follows the tasks of one service through its :class:`Transport`; ``watch`` is woken by the
    service's task events (:meth:`TaskWatch.changed`)."""

    def __init__(self, transport: Transport, watch: TaskWatch) -> None:
        self.transport = transport
        self.watch = watch

    async def follow(
        self,
        response: RedfishResponse,
        *,
        action: str,
        deadline: float,
        on_task: Callable[[str], Awaitable[None] | None] | None = None,
        on_progress: Callable[[int], None] | None = None,
        poll_initial: float = 0.1,
        poll_max: float = 2.0,
    ) -> RedfishResponse:
        """Wait for the operation behind a 202 to end and return its final response.

        ``deadline`` is a ``time.monotonic()`` value: past it, :class:`AttachTimeout` is raised and
        the task keeps running on the fabric. ``on_task`` hears the monitor's URI before the wait;
        ``on_progress`` the task's ``PercentComplete`` each time a read of the task carries one.
        """
        if response.status != 202:
            return response
        monitor = self._monitor_of(response, action)
        # The service's task events wake the wait below (TaskWatch); polls stay the fallback.
        since = time.monotonic()
        watched = [monitor]
        if response.is_task and response.body.get("@odata.id"):
            watched.append(str(response.body["@odata.id"]))
        if on_task is not None:
            result = on_task(monitor)
            if result is not None:
                await result
        report = on_progress or (lambda _percent: None)
        first = percent_complete(response.body)
        if first is not None:
            report(first)
        self.watch.follow(watched)
        try:
            return await self._poll(
                response,
                monitor,
                watched,
                action=action,
                deadline=deadline,
                since=since,
                polls=Backoff(poll_initial, poll_max),
                report=report,
            )
        finally:
            self.watch.unfollow(watched)

    def _monitor_of(self, response: RedfishResponse, action: str) -> str:
        """The task monitor of a 202, resolved on this service. One on another origin fails the
        operation naming the link; the service may have acted, so the outcome is unknown."""
        for link, value in (
            ("Location", response.location),
            ("TaskMonitor", response.body.get("TaskMonitor")),
            ("@odata.id", response.body.get("@odata.id")),
        ):
            try:
                monitor = same_service(self.transport.base_url, value, link=f"{link} of a 202")
            except ForeignLink as err:
                raise OutcomeUnknown(f"Redfish {action}: {err.message}") from None
            if monitor is not None:
                return monitor
        raise OutcomeUnknown(f"Redfish {action}: 202 Accepted without a task monitor")

    async def _poll(
        self,
        response: RedfishResponse,
        monitor: str,
        watched: list[str],
        *,
        action: str,
        deadline: float,
        since: float,
        polls: Backoff,
        report: Callable[[int], None],
    ) -> RedfishResponse:
        """The polling loop of :meth:`follow`; ``report`` hears each ``PercentComplete`` read."""
        wait = response.retry_after
        unreachable = 0
        refusals = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AttachTimeout(
                    f"the fabric did not finish {action} in time; its task {monitor} is still running",
                    retry_after=1.0,
                )
            # Poll when the service says (Retry-After), but once more right at the deadline, and at
            # once when the service sends an event about the task. While its task events are known
            # to arrive, the poll only covers a lost event: every EVENTED_POLL_SECONDS.
            delay = polls.next()
            if self.watch.evented:
                interval = EVENTED_POLL_SECONDS
            else:
                interval = min(wait if wait is not None else delay, polls.maximum)
            await self.watch.pause(watched, min(interval, remaining), since=since)
            since = time.monotonic()
            try:
                polled = await self.transport.fetch(monitor)
            except TransportError as err:
                unreachable += 1
                if unreachable == 1:
                    log.warning("task monitor unreachable, still waiting", task=monitor, error=str(err))
                wait = None
                continue
            unreachable = 0
            wait = polled.retry_after
            if polled.status == 202:
                refusals = 0
                percent = percent_complete(polled.body)  # a monitor's 202 may carry the Task
                if percent is not None:
                    report(percent)
                continue
            if polled.status in (404, 410):
                raise OutcomeUnknown(f"Redfish task monitor {monitor} for {action} disappeared")
            if 300 <= polled.status < 400:
                raise OutcomeUnknown(
                    f"Redfish task monitor {monitor} for {action} answered {polled.status}, a redirect, "
                    "which fabric-dra does not follow"
                )
            if polled.status in RETRY_STATUSES:
                # Busy now (it says when to come back), or the task's own final answer (a task cut
                # short by a restart of the service ends 503): whether it acted is unknown — read.
                refusals += 1
                if polled.retry_after is not None and refusals < 3:
                    continue
                cause = error_for_response(polled.status, polled.body, method="GET", uri=monitor)
                raise OutcomeUnknown(f"Redfish task {monitor} for {action} ended unclear: {cause.message}")
            if polled.status >= 400:
                raise error_for_response(polled.status, polled.body, method=response.method, uri=response.uri)
            if polled.is_task:
                state = str(polled.body.get("TaskState") or "")
                if state not in _TERMINAL_TASK_STATES:
                    percent = percent_complete(polled.body)
                    if percent is not None:
                        report(percent)
                    continue
                if state in _FAILED_TASK_STATES or polled.body.get("TaskStatus") == "Critical":
                    raise error_for_task(polled.body, uri=monitor, action=action)
            return polled

    async def running(self, monitor: str) -> bool:
        """Whether the task behind ``monitor`` still runs; False once it ended or is gone."""
        try:
            polled = await self.transport.fetch(monitor)
        except TransportError as err:
            where = self.transport.base_url
            raise FabricUnavailable(f"Redfish service at {where} unreachable: {err}") from None
        if polled.status == 202:
            return True
        if polled.status in RETRY_STATUSES and polled.retry_after is not None:
            raise error_for_response(polled.status, polled.body, method="GET", uri=monitor)
        if polled.status >= 400:
            return False  # gone (404), or ended with the operation's own error response
        return polled.is_task and str(polled.body.get("TaskState") or "") not in _TERMINAL_TASK_STATES

    async def cancel(self, monitor: str) -> None:
        """Ask the service to stop a task (DELETE on its monitor, DSP0266); best effort."""
        with contextlib.suppress(FabricError):
            await self.transport.request("DELETE", monitor)
