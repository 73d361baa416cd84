"""Waking task followers when the service says a task changed.

A client following a task (DSP0266 "Asynchronous operations") polls its monitor when the
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
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable

__all__ = ["EVENTED_POLL_SECONDS", "FINAL_TASK_EVENTS", "TaskWatch"]

#: between polls of a task monitor while the service is known to send task events
EVENTED_POLL_SECONDS = 5.0

#: TaskEvent registry (TaskEvent.1.0) messages after which the task has ended
FINAL_TASK_EVENTS = frozenset(
    {"TaskAborted", "TaskCancelled", "TaskCompletedOK", "TaskCompletedWarning", "TaskRemoved"}
)

#: how long a task change is remembered for a follower that starts waiting only after it
_REMEMBER_SECONDS = 30.0
_REMEMBER_MAX = 1024


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
