"""Each device's turn: the lock its ledger entry changes under, the event its waiters wait on, the
task that drives its operation, and how the operation last went."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from manager_api.errors import FabricError
from plumbing.backoff import Backoff

__all__ = ["DeviceSlot", "DeviceSlots"]


@dataclass(slots=True)
class DeviceSlot:
    """One device's operation: its lock, its driver task, and how it went."""

    #: pauses before retrying an unbind the fabric refused; they grow while it keeps refusing
    refused: Backoff
    #: held while a request checks the device's entry and records an intent, and while the
    #: driver records a result
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: set (and replaced) whenever the operation moves on: requests wait on it
    event: asyncio.Event = field(default_factory=asyncio.Event)
    driver: asyncio.Task[None] | None = None
    #: the last error of the device's current or last operation
    error: FabricError | None = None
    #: ``time.monotonic()`` before which the reconciler does not resume this device
    retry_at: float = 0.0
    #: when its operation last paused (resumed at once when the fabric comes back after that)
    paused_at: float = 0.0

    @property
    def running(self) -> bool:
        return self.driver is not None

    def signal(self) -> None:
        self.event.set()
        self.event = asyncio.Event()

    async def moved_on(self, seconds: float, event: asyncio.Event | None = None) -> None:
        """Wait up to ``seconds`` for the operation to move on (``event``: one taken earlier, so a
        signal since then counts)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for((event or self.event).wait(), max(0.0, seconds))


class DeviceSlots:
    """The slot of every device that had an operation, made on first use."""

    def __init__(self, refused_pause: float) -> None:
        #: the first pause before an unbind the fabric refused is tried again
        self.refused_pause = refused_pause
        self._slots: dict[str, DeviceSlot] = {}

    def __call__(self, device: str) -> DeviceSlot:
        slot = self._slots.get(device)
        if slot is None:
            slot = self._slots[device] = DeviceSlot(refused=Backoff(self.refused_pause, 300.0))
        return slot

    def all(self) -> Iterable[DeviceSlot]:
        return self._slots.values()
