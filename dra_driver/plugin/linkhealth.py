"""Link health: whether a prepared device's PCIe link still runs as it was negotiated at attach.

The fabric manager's inventory carries each device's link as the fabric reports it now (Redfish
``PCIeInterface``: ``LanesInUse`` → ``pcie_width``, ``PCIeType`` → ``pcie_generation``). The
link *negotiated at attach* is the manager's answer to the attach (or, for a device prepared
before this process started, the first inventory read that confirms the claim). A link that
trains down — fewer lanes, a lower generation — still works, at a fraction of its bandwidth: the
workload is slower, not broken, and a link that retrains for a moment is no reason to act.

Hysteresis, so that a blip moves nothing: a device is *degraded* only once every reading for
``hold_seconds`` (30 s) has been below the negotiated link, and healthy again only once every
reading for ``recover_seconds`` (120 s) has been back at it. A degraded device is reported
UNHEALTHY on the kubelet's health stream and gets ``LinkHealthy: False`` in its claim's
``status.devices`` (``True`` again on recovery); ``fabric_dra_plugin_links_degraded`` counts them.

The link's error counters, where the fabric offers them (Redfish ``PortMetrics.PCIeErrors`` of the
switch port to the device, in the inventory as ``pcie_errors``), feed the same verdict:

- an *uncorrectable* error (``FatalErrorCount`` or ``NonFatalErrorCount`` grown since the last
  reading) makes the device unhealthy at once: data on the link was lost;
- *correctable* errors (``CorrectableErrorCount``) are what a PCIe link corrects by itself: the
  device is unhealthy only when more than ``correctable_per_minute`` (10) per minute came over the
  last ``hold_seconds`` (more than 5 in 30 s), so one correctable error moves nothing;
- it is healthy again once ``recover_seconds`` (120 s) have passed with neither. Counters that
  go down were cleared: their readings start again from there.

Such a device is reported as a degraded one is, with the reason ``PCIeErrors`` and the counts in
the message. Replays, NAKs and recoveries are shown, not judged: they follow from the errors. The
counting and hysteresis are :mod:`dra_driver.linkerrors`, the judgement the controller makes too
(with stricter thresholds, for a taint).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import Gauge

from dra_driver.linkerrors import ErrorThresholds, LinkErrors, describe_counts
from dra_driver.plugin.metrics import REGISTRY
from manager_api.devices import PCIeErrorCounts

__all__ = ["DEGRADED", "ERRORS", "HEALTHY", "Link", "LinkJudge", "LinkVerdict"]

LINKS_DEGRADED = Gauge(
    "fabric_dra_plugin_links_degraded",
    "Prepared devices on this node whose PCIe link runs below what it negotiated at attach",
    registry=REGISTRY,
)


@dataclass(frozen=True, slots=True)
class Link:
    """A PCIe link: generation and lane count (None where the fabric does not say)."""

    generation: int | None
    width: int | None

    def __str__(self) -> str:
        gen = f"Gen{self.generation}" if self.generation is not None else "Gen?"
        return f"{gen} x{self.width}" if self.width is not None else gen

    def below(self, negotiated: Link) -> bool:
        """Whether this link runs slower than ``negotiated`` (fewer lanes or a lower generation)."""
        return any(
            now is not None and was is not None and now < was
            for now, was in ((self.width, negotiated.width), (self.generation, negotiated.generation))
        )


#: the reasons of a verdict, as the claim's ``LinkHealthy`` condition says them
DEGRADED, ERRORS, HEALTHY = "LinkDegraded", "PCIeErrors", "LinkRecovered"


@dataclass(frozen=True, slots=True)
class LinkVerdict:
    degraded: bool
    message: str
    #: :data:`DEGRADED` (trained below the link negotiated), :data:`ERRORS` or :data:`HEALTHY`
    reason: str = HEALTHY


@dataclass(slots=True)
class _Watched:
    negotiated: Link
    current: Link
    degraded: bool = False
    #: since when the readings have disagreed with ``degraded`` (None: they agree)
    turning_since: float | None = None
    #: its link's error counters (None: the fabric offers none)
    errors: LinkErrors | None = None


#: (claim UID, device key)
Watched = tuple[str, str]


class LinkJudge:
    def __init__(
        self,
        *,
        hold_seconds: float = 30.0,
        recover_seconds: float = 120.0,
        correctable_per_minute: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hold_seconds = hold_seconds
        self.recover_seconds = recover_seconds
        self.correctable_per_minute = correctable_per_minute
        # The error counters are judged as the controller judges them, with the plugin's thresholds:
        # the rate over the hold, at once, healthy again after the recovery.
        self._thresholds = ErrorThresholds(
            correctable_per_minute=correctable_per_minute,
            window_seconds=hold_seconds,
            recover_seconds=recover_seconds,
        )
        self._clock = clock
        self._links: dict[Watched, _Watched] = {}

    def negotiated(self, uid: str, key: str, link: Link, errors: PCIeErrorCounts | None = None) -> None:
        """The link the device trained at when it was attached for the claim, and its error
        counters then (errors counted before the attach are not the claim's news)."""
        if link.generation is None and link.width is None and errors is None:
            return
        watched = self._links[(uid, key)] = _Watched(negotiated=link, current=link)
        if errors is not None:
            self._read_errors(watched, errors)

    def observe(self, uid: str, key: str, link: Link, errors: PCIeErrorCounts | None = None) -> None:
        """The link (and its error counters) as the fabric reports it now; the first reading of a
        device whose attach this process did not see stands for what it negotiated."""
        watched = self._links.get((uid, key))
        if watched is None:
            watched = self._links[(uid, key)] = _Watched(negotiated=link, current=link)
        else:
            watched.current = link
            self._step(watched)
        if errors is not None:
            self._read_errors(watched, errors)

    def _read_errors(self, watched: _Watched, counts: PCIeErrorCounts) -> None:
        now = self._clock()
        if watched.errors is None:  # the first reading: what came before it is history, not news
            watched.errors = LinkErrors.first(self._thresholds, counts, now)
        else:
            watched.errors.read(counts, now)

    def _step(self, watched: _Watched) -> None:
        """Move the device's state on: every reading that agrees with it resets the clock of a turn."""
        now = self._clock()
        below = watched.current.below(watched.negotiated)
        if below == watched.degraded:
            watched.turning_since = None
            return
        if watched.turning_since is None:
            watched.turning_since = now
        needed = self.hold_seconds if below else self.recover_seconds
        if now - watched.turning_since >= needed:
            watched.degraded, watched.turning_since = below, None

    def verdict(self, uid: str, key: str) -> LinkVerdict | None:
        """Whether the device is degraded now (None: its link is not known), after hysteresis."""
        watched = self._links.get((uid, key))
        if watched is None:
            return None
        self._step(watched)
        errors = watched.errors.fault(self._clock()) if watched.errors is not None else None
        self._count()
        if watched.degraded:
            return LinkVerdict(
                True,
                f"{key}'s PCIe link runs at {watched.current}, below the {watched.negotiated} it negotiated "
                f"at attach (for more than {self.hold_seconds:g} s): the device works at reduced bandwidth; "
                "check the slot, cable and switch port",
                DEGRADED,
            )
        if errors is not None:
            return LinkVerdict(
                True,
                f"{key}'s PCIe link reports errors: {errors.why}; counters {describe_counts(errors.counts)}; "
                f"healthy again after {self.recover_seconds:g} s without more; check the slot, cable and "
                "switch port",
                ERRORS,
            )
        return LinkVerdict(False, f"{key}'s PCIe link runs at {watched.current}, as negotiated at attach")

    def keep(self, watched: Iterable[Watched]) -> None:
        """Forget every device not in ``watched`` (claims unprepared)."""
        wanted = set(watched)
        for gone in [k for k in self._links if k not in wanted]:
            del self._links[gone]
        self._count()

    def _count(self) -> None:
        LINKS_DEGRADED.set(sum(1 for w in self._links.values() if w.degraded))
