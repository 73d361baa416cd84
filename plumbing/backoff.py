"""Exponential backoff, for every loop that must keep going through API or fabric errors — and for
local polls that wait for something to appear.

One class serves both: a retry against a shared service keeps the default ±20% jitter (so
replicas that failed together do not retry together); a tight local poll passes ``jitter=0``.
"""

from __future__ import annotations

import asyncio
import random

__all__ = ["Backoff"]


class Backoff:
    """Delays ``initial``, ``initial·factor``, … capped at ``maximum``; :meth:`reset` after a success."""

    def __init__(
        self, initial: float = 0.2, maximum: float = 30.0, factor: float = 2.0, *, jitter: float = 0.2
    ) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self.jitter = jitter
        self._next = initial

    def next(self) -> float:
        """The delay before the next attempt: grows each call, ±``jitter`` so replicas desync."""
        delay = min(self._next, self.maximum)
        self._next = min(self.maximum, self._next * self.factor)
        if not self.jitter:
            return delay
        return delay * random.uniform(1.0 - self.jitter, 1.0 + self.jitter)  # noqa: S311 - not cryptography

    def peek(self) -> float:
        """The delay :meth:`next` would return, without jitter and without growing it."""
        return min(self._next, self.maximum)

    def reset(self) -> None:
        self._next = self.initial

    async def sleep(self, *, at_most: float | None = None) -> float:
        """Sleep for :meth:`next` (cut to ``at_most``, e.g. the time left before a deadline) and
        return how long that was."""
        delay = self.next()
        if at_most is not None:
            delay = max(0.0, min(delay, at_most))
        await asyncio.sleep(delay)
        return delay
