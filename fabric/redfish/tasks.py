"""Waking task followers when the service says a task changed.

A client following a task (DSP0266 "Asynchronous operations") polls its monitor when the
service's ``Retry-After`` says — a second at a time, typically. A GPU hot-add of three seconds
would then be seen done up to a second late. The service also sends a ``TaskEvent`` on its event
stream when a task ends (``TaskCompletedOK``, ``TaskAborted``...) with the task as
``OriginOfCondition``: :class:`TaskWatch` lets the event stream wake the follower of that task so
it reads the monitor at once. Polling stays the fallback, so nothing depends on events arriving.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterable

__all__ = ["TaskWatch"]

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

    def changed(self, uri: str | None) -> None:
        """The service said the task at ``uri`` changed; None: some task changed (wake everyone)."""
        if uri is None:
            for events in self._waiters.values():
                for event in events:
                    event.set()
            return
        key = _key(uri)
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
