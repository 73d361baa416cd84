"""Devices whose PCIe link keeps erring get a taint, so new claims keep away from them.

The manager's inventory carries each device's switch-port error counters (``pcie_errors``,
Redfish ``PortMetrics.PCIeErrors``). They are judged here by the one judgement the kubelet plugin
makes too (:mod:`dra_driver.linkerrors`), with thresholds of the controller's own, stricter than
the plugin's health verdict: a taint reaches every scheduler decision, so one correctable error
must never make one. By default a fatal or non-fatal error taints at once; correctable errors taint
once more than 10 a minute have come over every one-minute window for 5 minutes; a taint is lifted
after 10 minutes without a fault (hold-down), so a link that errs in bursts does not flap.

The taint is ``<driver>/link-errors`` with the fault as its value (``PCIeFatal``, ``PCIeNonFatal``,
``PCIeCorrectable``) and the effect ``--link-taint-effect`` (``NoSchedule``; ``NoExecute`` evicts
the pods using the device and is never the default: a counter alone should not end a workload;
``None`` only shows it). Where the API server drops taints the device is withheld instead, as an
unhealthy one is. The inventory says nothing of the link a device negotiated (only the link it runs
at now), so a link trained down is not judged here: the plugin, which saw the attach, judges it.

State is in memory: a restarted controller takes the counters it first reads as its baseline and
judges from there (a device tainted before the restart is published without the taint until its
link errs again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from dra_driver.controller.delta import device_delta
from dra_driver.controller.metrics import LINK_TAINTED_DEVICES
from dra_driver.linkerrors import ErrorFault, ErrorKind, ErrorThresholds, LinkErrors
from manager_api.feed import InventorySource
from manager_api.models import Device, Inventory
from plumbing.logs import get_logger

__all__ = ["LinkTaints"]

log = get_logger(__name__)

#: (pool, device)
Key = tuple[str, str]


class LinkTaints:
    """The devices whose link errors are past the thresholds now, and why."""

    def __init__(
        self,
        thresholds: ErrorThresholds,
        *,
        on_change: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.thresholds = thresholds
        self.on_change = on_change
        self._clock = clock
        self._links: dict[Key, LinkErrors] = {}
        self._faults: dict[Key, ErrorFault] = {}
        #: the inventory last read (the next one's changed devices are found against it)
        self._last: Inventory | None = None
        #: bumped on every change of the tainted set, so cached slice plans are redone
        self.version = 0
        for kind in ErrorKind:  # 0, not absent, until a link errs
            LINK_TAINTED_DEVICES.labels(reason=kind.value).set(0)

    def active(self) -> dict[Key, str]:
        """(pool, device) → the taint's value, for every device past the thresholds now."""
        return {key: fault.kind.value for key, fault in self._faults.items()}

    def observe(self, inventory: Inventory) -> None:
        """Read the counters of the devices ``inventory`` changed (:mod:`.delta`; every device the
        first time), then judge: an unchanged device's counters have not moved."""
        now = self._clock()
        last, self._last = self._last, inventory
        devices: Sequence[Device] = inventory.devices
        seen: set[Key] | None = set()
        if last is not None:
            delta = device_delta(last, inventory)
            devices, seen = delta.new, None
            for key in {(d.pool, d.name) for d in delta.old} - {(d.pool, d.name) for d in delta.new}:
                self._links.pop(key, None)  # removed
        for device in devices:
            if device.pcie_errors is None:
                self._links.pop((device.pool, device.name), None)
                continue
            key = (device.pool, device.name)
            if seen is not None:
                seen.add(key)
            link = self._links.get(key)
            if link is None:
                self._links[key] = LinkErrors.first(self.thresholds, device.pcie_errors, now)
            else:
                # Only the judged counters move the judgement; comparing three ints, not the models,
                # keeps a pass over ten thousand devices cheap on the event loop.
                now_c, was = device.pcie_errors, link.latest
                if (now_c.correctable, now_c.non_fatal, now_c.fatal) != (
                    was.correctable,
                    was.non_fatal,
                    was.fatal,
                ):
                    link.read(now_c, now)
                else:
                    link.latest = now_c
        if seen is not None:
            for gone in [k for k in self._links if k not in seen]:
                del self._links[gone]
        self.judge()

    def judge(self) -> bool:
        """Judge every link at this moment; True when the tainted set changed."""
        now = self._clock()
        faults = {key: fault for key, link in self._links.items() if (fault := link.fault(now)) is not None}
        before = {k: f.kind for k, f in self._faults.items()}
        after = {k: f.kind for k, f in faults.items()}
        self._faults = faults
        if before == after:
            return False
        for key in sorted(set(before) | set(after)):
            if key not in after:
                log.info(
                    "device's PCIe link quiet past the hold-down; link-errors taint lifted",
                    pool=key[0],
                    device=key[1],
                    seconds=self.thresholds.recover_seconds,
                )
            elif before.get(key) != after[key]:
                log.warning(
                    "device's PCIe link errors past the threshold; tainting it",
                    pool=key[0],
                    device=key[1],
                    reason=after[key].value,
                    why=faults[key].why,
                )
        self.version += 1
        for kind in ErrorKind:
            LINK_TAINTED_DEVICES.labels(reason=kind.value).set(sum(1 for k in after.values() if k is kind))
        if self.on_change is not None:
            self.on_change()
        return True

    @property
    def period(self) -> float:
        """How often the links are judged without a new inventory: a sustained rate and the
        hold-down end on the clock, not on a reading."""
        t = self.thresholds
        shortest = min(x for x in (t.window_seconds, t.sustain_seconds, t.recover_seconds) if x > 0)
        return max(0.2, min(10.0, shortest / 4))

    async def run(self, feed: InventorySource) -> None:
        """Judge every inventory the feed brings, and every :attr:`period` between them."""
        version: int | None = None
        while True:
            inventory: Inventory | None = None
            with contextlib.suppress(TimeoutError):
                inventory = await asyncio.wait_for(feed.wait_newer(version), self.period)
            if inventory is None:
                self.judge()
                continue
            version = inventory.version
            self.observe(inventory)
