"""Devices whose attach keeps failing are taken out of allocation for a while.

The scheduler remembers nothing about a failed binding: after ``AttachFailed`` it gives the
allocation up (Unreserve, then PostFilter deallocates) and its allocator's first fit picks the
*same* device again, for ever (``dynamicresources`` plugin; ``allocateOne`` in
``structured/internal/*/allocator_*.go`` walks pools, slices and devices in the same order every
time). KEP-5007 leaves it to the driver: after a failure it "should also ensure that the device
is not picked again" — by a taint or by taking it out of the slice.

So after ``threshold`` consecutive attach failures of one device, or one failure that retrying
cannot cure, the device is quarantined: the publisher gives it a ``NoSchedule`` taint
``<driver>/attach-failed`` (where the API server keeps taints) or withholds it from its slice,
which the allocator honours (``taintPreventsAllocation``). A quarantine lasts ``initial`` seconds,
doubling for a device quarantined again (up to ``maximum``); a successful attach of the device
ends it and clears its count. Failures that say nothing about the device (busy with another
claim, no node, no permission) are not counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from dra_driver.controller.metrics import QUARANTINED_DEVICES, QUARANTINES
from plumbing.logs import get_logger

__all__ = ["NOT_THE_DEVICES_FAULT", "PERMANENT", "Quarantine", "Quarantined"]

log = get_logger(__name__)

#: failure reasons that say nothing about the device itself: never counted
NOT_THE_DEVICES_FAULT = frozenset(
    {"DeviceBusy", "NoNode", "PermissionDenied", "NodeNotFound", "Unauthorized"}
)
#: failure reasons retrying the same device cannot cure: one is enough
PERMANENT = frozenset({"DeviceUnhealthy", "DeviceNotFound", "DeviceUnavailable"})


@dataclass(frozen=True, slots=True)
class Quarantined:
    pool: str
    device: str
    reason: str
    message: str
    failures: int
    #: monotonic time the device is published again
    until: float


@dataclass
class _Record:
    failures: int = 0
    quarantines: int = 0
    active: Quarantined | None = None
    timer: asyncio.TimerHandle | None = None


class Quarantine:
    def __init__(
        self,
        *,
        threshold: int = 3,
        initial: float = 60.0,
        maximum: float = 3600.0,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = max(1, threshold)
        self.initial = initial
        self.maximum = maximum
        self.on_change = on_change
        self._clock = clock
        self._records: dict[tuple[str, str], _Record] = {}
        #: bumped on every change of the quarantined set, so cached slice plans are redone
        self.version = 0

    def attach_failed(self, pool: str, device: str, reason: str, message: str) -> Quarantined | None:
        """Count a failed attach; the new quarantine when this one starts it, else None."""
        if reason in NOT_THE_DEVICES_FAULT:
            return None
        record = self._records.setdefault((pool, device), _Record())
        if record.active is not None:
            if record.active.until > self._clock():
                return None
            record.active = None  # over, though its timer has not fired yet: the clock decides
        record.failures += 1
        if record.failures < self.threshold and reason not in PERMANENT:
            return None
        duration = min(self.maximum, self.initial * 2**record.quarantines)
        record.quarantines += 1
        record.active = Quarantined(pool, device, reason, message, record.failures, self._clock() + duration)
        record.failures = 0
        self._schedule_release(pool, device, record, duration)
        QUARANTINES.labels(reason=reason).inc()
        self._changed()
        log.warning(
            "device taken out of allocation after failed attaches",
            pool=pool,
            device=device,
            reason=reason,
            failures=record.active.failures,
            seconds=round(duration, 1),
        )
        return record.active

    def attach_succeeded(self, pool: str, device: str) -> None:
        record = self._records.pop((pool, device), None)
        if record is not None and record.timer is not None:
            record.timer.cancel()
        if record is not None and record.active is not None:
            self._changed()

    def active(self) -> dict[tuple[str, str], Quarantined]:
        """Devices out of allocation now."""
        now = self._clock()
        return {
            key: record.active
            for key, record in self._records.items()
            if record.active is not None and record.active.until > now
        }

    def _schedule_release(self, pool: str, device: str, record: _Record, duration: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (unit tests): active() looks at the clock
        if record.timer is not None:
            record.timer.cancel()
        record.timer = loop.call_later(duration, self._release, pool, device)

    def _release(self, pool: str, device: str) -> None:
        record = self._records.get((pool, device))
        if record is None or record.active is None:
            return
        record.active = None
        record.timer = None
        log.info("device back in allocation after its quarantine", pool=pool, device=device)
        self._changed()

    def _changed(self) -> None:
        self.version += 1
        counts: dict[str, int] = {}
        for pool, _ in self.active():
            counts[pool] = counts.get(pool, 0) + 1
        for pool in {p for p, _ in self._records}:
            QUARANTINED_DEVICES.labels(pool=pool).set(counts.get(pool, 0))
        if self.on_change is not None:
            self.on_change()
