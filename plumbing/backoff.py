"""Exponential backoff with jitter, for loops that must keep going through API or fabric errors."""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    def __init__(self, initial: float = 0.2, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self.factor = factor
        self._next = initial

    def next(self) -> float:
        """The delay before the next attempt: grows each call, ±20% jitter so replicas desync."""
        delay = self._next
        self._next = min(self.maximum, self._next * self.factor)
        return delay * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not cryptography

    def reset(self) -> None:
        self._next = self.initial
