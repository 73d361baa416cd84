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

Where the failures come from depends on the flow. With binding conditions the controller attaches
itself and counts its own failures (:mod:`.binding_conditions`). In the plain flow the kubelet
plugin attaches at prepare time, after the pod is bound, so the controller never sees an attempt:
:class:`ManagerCounts` reads the manager's per-device count of attaches failed in a row
(``Device.attach_failures``) from the inventory feed instead. There a ``NoSchedule`` taint would
not move the allocation the pod is stuck with, so the publisher gives the taint the ``NoExecute``
effect: kube-controller-manager's device-taint eviction controller then deletes the pods using
the device, their claims are deallocated, and the scheduler allocates another device.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from dra_driver.controller.delta import device_delta
from dra_driver.controller.metrics import QUARANTINED_DEVICES, QUARANTINES
from manager_api.feed import InventorySource
from manager_api.models import Inventory
from plumbing.kube import ApiError, KubeClient
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.events import EventRecorder, ObjectRef
from plumbing.kube.resources import RESOURCE_CLAIMS
from plumbing.logs import get_logger

__all__ = [
    "NOT_THE_DEVICES_FAULT",
    "PERMANENT",
    "ManagerCounts",
    "Quarantine",
    "QuarantineEvents",
    "Quarantined",
]

log = get_logger(__name__)

#: failure reasons that say nothing about the device itself: never counted (BudgetExceeded: the
#: claim's tree holds what its DeviceBudget allows, whichever device was picked)
NOT_THE_DEVICES_FAULT = frozenset(
    {"DeviceBusy", "NoNode", "PermissionDenied", "NodeNotFound", "Unauthorized", "BudgetExceeded"}
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

    def note(self) -> str:
        """What an Event says about it."""
        return (
            f"device {self.pool}/{self.device} failed to attach {self.failures} time(s) in a row "
            f"(last: {self.reason}: {self.message}); taken out of allocation for "
            f"{max(0.0, self.until - time.monotonic()):.0f}s so the scheduler picks another device"
        )


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


class ManagerCounts:
    """The plain flow's source of failures: the manager's count per device, from the inventory.

    Each rise of ``attach_failures`` is that many failed attaches; a fall means an attach succeeded
    in between (the manager resets the count then). ``on_quarantine`` is awaited for each
    quarantine this starts (the Event)."""

    def __init__(
        self,
        feed: InventorySource,
        quarantine: Quarantine,
        on_quarantine: Callable[[Quarantined], Awaitable[None]] | None = None,
    ) -> None:
        self._feed = feed
        self._quarantine = quarantine
        self._on_quarantine = on_quarantine
        self._seen: dict[tuple[str, str], int] = {}
        #: the inventory last counted (the next one's changed devices are found against it)
        self._last: Inventory | None = None

    async def run(self) -> None:
        version: int | None = None
        while True:
            inventory = await self._feed.wait_newer(version)
            version = inventory.version
            for out in self.observe(inventory):
                if self._on_quarantine is not None:
                    await self._on_quarantine(out)

    def observe(self, inventory: Inventory) -> list[Quarantined]:
        """Count what changed since the last inventory; the quarantines that started. Only the
        devices the version changed are looked at (:mod:`.delta`): an unchanged device's count has
        not moved."""
        started: list[Quarantined] = []
        last, self._last = self._last, inventory
        gone: set[tuple[str, str]] = set()
        if last is None:
            devices, seen = inventory.devices, {}
        else:
            delta = device_delta(last, inventory)
            devices, seen = delta.new, self._seen
            gone = {(d.pool, d.name) for d in delta.old} - {(d.pool, d.name) for d in delta.new}
        for device in devices:
            key = (device.pool, device.name)
            now, before = device.attach_failures, self._seen.get(key, 0)
            seen[key] = now
            if now < before:
                self._quarantine.attach_succeeded(*key)
                before = 0
            reason = device.attach_error or "AttachFailed"
            message = f"the fabric manager counts {now} failed attach(es) in a row"
            for _ in range(now - before):
                out = self._quarantine.attach_failed(device.pool, device.name, reason, message)
                if out is not None:
                    started.append(out)
        for key in gone:
            seen.pop(key, None)
        self._seen = seen
        return started


class QuarantineEvents:
    """The plain flow's ``DeviceQuarantined`` Event, on each claim the device is allocated to (the
    claims whose pods it evicts); the controller watches no claims there, so they are listed."""

    def __init__(self, kube: KubeClient, events: EventRecorder, driver: str) -> None:
        self._kube = kube
        self._events = events
        self._driver = driver

    async def record(self, out: Quarantined) -> None:
        try:
            items, _ = await self._kube.list_all(RESOURCE_CLAIMS)
        except ApiError as err:
            log.warning("cannot list claims for the quarantine Event", device=out.device, error=str(err))
            return
        for obj in items:
            claim = ResourceClaim.read(obj)
            if claim is None or not any(
                r.pool == out.pool and r.device == out.device for r in claim.results_for(self._driver)
            ):
                continue
            meta = obj.get("metadata") or {}
            await self._events.record(
                ObjectRef(
                    "ResourceClaim",
                    str(meta.get("name")),
                    str(meta.get("namespace") or ""),
                    "resource.k8s.io/v1",
                    str(meta.get("uid") or ""),
                ),
                reason="DeviceQuarantined",
                action="Quarantine",
                note=out.note(),
                event_type="Warning",
            )
