"""One read of the fabric at a time, shared by every caller that asked for it before it was sent.

A read that starts after a caller asks is as fresh, for that caller, as one it would have sent
itself: it sees every change the service made before the caller asked (a bind's confirmation asks
after the service answered the bind). So callers that ask while a read is under way do not each
send their own: they wait for it to end and share the one read sent after it. Under load (32
claims at once, each reading the fabric's zones three or four times) that turns one read per caller
into at most two reads in flight per wave of callers, whatever their number.

The read runs as its own task: a caller that is cancelled leaves it to the others, and a read that
fails fails for every caller that shared it (each decides, as it would for its own read).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["SharedRead"]

T = TypeVar("T")


@dataclass(slots=True)
class _Flights(Generic[T]):
    """The reads of one event loop: the one sent, and the one callers wait on that is not sent yet."""

    loop: asyncio.AbstractEventLoop
    running: asyncio.Task[T] | None = None
    waiting: asyncio.Task[T] | None = None


class SharedRead(Generic[T]):
    """``read()`` shared: ``await shared()`` answers with a read sent after the call began."""

    def __init__(self, read: Callable[[], Awaitable[T]]) -> None:
        self._read = read
        self._flights: _Flights[T] | None = None
        #: reads sent, and calls answered (what the sharing saves)
        self.sent = 0
        self.answered = 0

    async def __call__(self) -> T:
        loop = asyncio.get_running_loop()
        flights = self._flights
        if flights is None or flights.loop is not loop:
            flights = self._flights = _Flights(loop)
        if flights.waiting is None:
            flights.waiting = loop.create_task(self._after(flights, flights.running))
            flights.waiting.add_done_callback(_consume)
        self.answered += 1
        return await asyncio.shield(flights.waiting)

    async def _after(self, flights: _Flights[T], before: asyncio.Task[T] | None) -> T:
        if before is not None:
            await asyncio.wait([before])  # its outcome is its callers'; this read is sent after it
        # From here on a new caller may have asked after this read was sent: it waits for the next.
        this = asyncio.current_task()  # never None: this coroutine runs as its own task
        flights.waiting, flights.running = None, this
        self.sent += 1
        try:
            return await self._read()
        finally:
            if flights.running is this:
                flights.running = None


def _consume(task: asyncio.Task[object]) -> None:
    """Every caller of a read may be gone (cancelled) when it fails: its error is theirs, not the
    loop's to report as never retrieved."""
    if not task.cancelled():
        task.exception()
