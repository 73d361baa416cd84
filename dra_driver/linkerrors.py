"""The one judgement of a PCIe link's error counters, with hysteresis, that the kubelet plugin
(a device's health) and the controller (a device taint) both make — each with its own thresholds.

The counters are those of the switch port to the device (Redfish ``PortMetrics.PCIeErrors``,
in the manager's inventory as ``pcie_errors``). A link corrects *correctable* errors by itself;
an *uncorrectable* one (fatal or non-fatal) lost data. So:

- a fatal or non-fatal error (its counter grown since the last reading) is a fault at once;
- correctable errors are a fault only when more than ``correctable_per_minute`` per minute came
  over the last ``window_seconds``, and that rate has held on every evaluation for
  ``sustain_seconds`` (0: at once) — one correctable error never is;
- each kind of fault ends ``recover_seconds`` after it was last seen. While several kinds are
  active, the most severe is the one reported (fatal, then non-fatal, then correctable).

The first reading is history, not news: what the counters held before it is never a fault.
Counters that go down were cleared; their readings start again from there. Replays, NAKs and
recoveries are not judged: they follow from the errors.

The plugin judges with a 30 s window, no sustain and a 120 s recovery (docs/plugin.md, "Link
health"); the controller, whose taint keeps new claims away, with a stricter one (a rate sustained
for minutes, a 10-minute hold-down; docs/controller.md, "Link errors").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from manager_api.devices import PCIeErrorCounts

__all__ = ["ErrorFault", "ErrorKind", "ErrorThresholds", "LinkErrors", "describe_counts"]


class ErrorKind(StrEnum):
    """A kind of link fault, most severe first; the value is the reason a taint or condition carries."""

    FATAL = "PCIeFatal"
    NON_FATAL = "PCIeNonFatal"
    CORRECTABLE = "PCIeCorrectable"


_SEVERITY = tuple(ErrorKind)


@dataclass(frozen=True, slots=True)
class ErrorThresholds:
    #: correctable errors per minute a link may have (more is a fault)
    correctable_per_minute: float = 10.0
    #: the window the correctable rate is measured over
    window_seconds: float = 30.0
    #: how long the rate must stay above the allowed one before it is a fault (0: at once)
    sustain_seconds: float = 0.0
    #: how long after the last fault of a kind the link is healthy again
    recover_seconds: float = 120.0

    @property
    def allowed_in_window(self) -> float:
        return self.correctable_per_minute * self.window_seconds / 60


@dataclass(frozen=True, slots=True)
class ErrorFault:
    kind: ErrorKind
    #: what was seen, in words ("1 new fatal error(s)")
    why: str
    #: the counters as last read
    counts: PCIeErrorCounts


def describe_counts(c: PCIeErrorCounts) -> str:
    return (
        f"fatal {c.fatal}, non-fatal {c.non_fatal}, correctable {c.correctable}, replays {c.replays}, "
        f"L0 to recovery {c.l0_to_recovery}, NAKs sent {c.nak_sent}, received {c.nak_received}"
    )


@dataclass(slots=True)
class LinkErrors:
    """One link's error counters and the faults they showed (the state of one judgement)."""

    thresholds: ErrorThresholds
    latest: PCIeErrorCounts
    #: (when, correctable) of the last reading before the window and every one since
    samples: list[tuple[float, int]]
    #: kind → (when last seen, why)
    seen: dict[ErrorKind, tuple[float, str]] = field(default_factory=dict)
    #: since when the correctable rate has been above the allowed one (None: it is not)
    over_since: float | None = None

    @classmethod
    def first(cls, thresholds: ErrorThresholds, counts: PCIeErrorCounts, now: float) -> LinkErrors:
        """The first reading: the baseline."""
        return cls(thresholds, counts, [(now, counts.correctable)])

    def read(self, counts: PCIeErrorCounts, now: float) -> None:
        """A new reading of the counters."""
        before = self.latest
        self.latest = counts
        if (
            counts.correctable < before.correctable
            or counts.fatal < before.fatal
            or counts.non_fatal < before.non_fatal
        ):
            self.samples = [(now, counts.correctable)]  # the counters were cleared
            self.over_since = None
            return
        for kind, grown in (
            (ErrorKind.FATAL, counts.fatal - before.fatal),
            (ErrorKind.NON_FATAL, counts.non_fatal - before.non_fatal),
        ):
            if grown > 0:
                word = "fatal" if kind is ErrorKind.FATAL else "non-fatal"
                self.seen[kind] = (now, f"{grown} new uncorrectable ({word}) error(s)")
        self.samples.append((now, counts.correctable))
        self.step(now)

    def step(self, now: float) -> None:
        """Move the correctable judgement on to ``now`` (also without a new reading)."""
        t = self.thresholds
        start = now - t.window_seconds
        while len(self.samples) > 1 and self.samples[1][0] <= start:
            self.samples.pop(0)
        came = self.samples[-1][1] - self.samples[0][1]
        if came <= t.allowed_in_window:
            self.over_since = None
            return
        if self.over_since is None:
            self.over_since = now
        if now - self.over_since >= t.sustain_seconds:
            sustained = f", sustained for {t.sustain_seconds:g} s" if t.sustain_seconds else ""
            self.seen[ErrorKind.CORRECTABLE] = (
                now,
                f"{came} correctable errors in the last {t.window_seconds:g} s "
                f"(more than {t.correctable_per_minute:g} per minute{sustained})",
            )

    def fault(self, now: float) -> ErrorFault | None:
        """The most severe fault still within its recovery time, or None."""
        if not self.seen and self.over_since is None and len(self.samples) == 1:
            return None  # a quiet link, the common case: nothing to move on (thousands a pass)
        self.step(now)
        for kind in [
            k for k, (when, _) in self.seen.items() if now - when >= self.thresholds.recover_seconds
        ]:
            del self.seen[kind]  # recovered
        for kind in _SEVERITY:
            seen = self.seen.get(kind)
            if seen is not None:
                return ErrorFault(kind, seen[1], self.latest)
        return None
