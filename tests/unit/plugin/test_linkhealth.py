"""The link judge's hysteresis: a link that trains down for a moment changes nothing; one that
stays down past the hold is degraded; it is healthy again only after the recovery time."""

from __future__ import annotations

from dra_driver.plugin.linkhealth import (
    DEGRADED,
    ERRORS,
    HEALTHY,
    LINKS_DEGRADED,
    Link,
    LinkJudge,
    LinkVerdict,
)
from manager_api.devices import PCIeErrorCounts

X16 = Link(5, 16)
X8 = Link(5, 8)
GEN4 = Link(4, 16)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _judge(clock: Clock) -> LinkJudge:
    judge = LinkJudge(hold_seconds=30, recover_seconds=120, clock=clock)
    judge.negotiated("c1", "gpu0", X16)
    return judge


def _degraded(judge: LinkJudge) -> bool:
    verdict = judge.verdict("c1", "gpu0")
    assert verdict is not None
    return verdict.degraded


def test_a_blip_moves_nothing() -> None:
    clock = Clock()
    judge = _judge(clock)
    judge.observe("c1", "gpu0", X8)
    clock.now += 29
    assert not _degraded(judge)
    judge.observe("c1", "gpu0", X16)  # retrained before the hold ran out
    clock.now += 60
    judge.observe("c1", "gpu0", X8)
    clock.now += 10
    assert not _degraded(judge), "the hold starts again from the new reading"


def test_down_past_the_hold_is_degraded_and_recovery_takes_its_own_time() -> None:
    clock = Clock()
    judge = _judge(clock)
    judge.observe("c1", "gpu0", X8)
    assert not _degraded(judge)
    clock.now += 30
    assert _degraded(judge)
    verdict = judge.verdict("c1", "gpu0")
    assert verdict is not None and "Gen5 x8, below the Gen5 x16 it negotiated" in verdict.message
    assert LINKS_DEGRADED._value.get() == 1
    judge.observe("c1", "gpu0", X16)
    clock.now += 119
    assert _degraded(judge)
    judge.observe("c1", "gpu0", X8)  # a relapse restarts recovery
    clock.now += 5
    judge.observe("c1", "gpu0", X16)
    clock.now += 100
    assert _degraded(judge)
    clock.now += 20
    assert not _degraded(judge)
    assert LINKS_DEGRADED._value.get() == 0


def test_a_lower_generation_counts_and_a_faster_link_does_not() -> None:
    clock = Clock()
    judge = _judge(clock)
    judge.observe("c1", "gpu0", GEN4)
    clock.now += 31
    assert _degraded(judge)
    wider = LinkJudge(hold_seconds=0, clock=clock)
    wider.negotiated("c2", "nic0", X8)
    wider.observe("c2", "nic0", X16)
    verdict = wider.verdict("c2", "nic0")
    assert verdict is not None and not verdict.degraded


def test_a_device_without_an_attach_reading_takes_its_first_reading_as_negotiated() -> None:
    clock = Clock()
    judge = LinkJudge(hold_seconds=0, clock=clock)
    assert judge.verdict("c1", "gpu0") is None
    judge.observe("c1", "gpu0", X8)
    verdict = judge.verdict("c1", "gpu0")
    assert verdict is not None and not verdict.degraded
    judge.keep([])
    assert judge.verdict("c1", "gpu0") is None


# -- error counters -------------------------------------------------------------------------------


def _errors_judge(clock: Clock) -> LinkJudge:
    """Hold 30 s, recover 120 s, 10 correctable errors a minute allowed (5 in a hold)."""
    judge = LinkJudge(hold_seconds=30, recover_seconds=120, correctable_per_minute=10, clock=clock)
    judge.negotiated("c1", "gpu0", X16)
    judge.observe("c1", "gpu0", X16, PCIeErrorCounts(correctable=40, fatal=2))  # history: no news
    return judge


def _verdict(judge: LinkJudge) -> LinkVerdict:
    verdict = judge.verdict("c1", "gpu0")
    assert verdict is not None
    return verdict


def test_one_correctable_error_moves_nothing() -> None:
    clock = Clock()
    judge = _errors_judge(clock)
    assert not _verdict(judge).degraded, "the counts before the first reading are history"
    clock.now += 1
    judge.observe("c1", "gpu0", X16, PCIeErrorCounts(correctable=41, fatal=2))
    assert not _verdict(judge).degraded
    clock.now += 200
    assert _verdict(judge).reason == HEALTHY


def test_correctable_errors_above_the_rate_over_the_hold_are_unhealthy_until_recovery() -> None:
    clock = Clock()
    judge = _errors_judge(clock)
    for n in range(1, 6):  # 5 in 25 s: at the limit, not above it
        clock.now += 5
        judge.observe("c1", "gpu0", X16, PCIeErrorCounts(correctable=40 + n, fatal=2))
        assert not _verdict(judge).degraded
    clock.now += 30  # the window moves on: those 5 age out
    judge.observe("c1", "gpu0", X16, PCIeErrorCounts(correctable=47, fatal=2))
    assert not _verdict(judge).degraded, "2 in the last 30 s"
    clock.now += 10
    judge.observe("c1", "gpu0", X16, PCIeErrorCounts(correctable=51, fatal=2))
    verdict = _verdict(judge)
    assert (verdict.degraded, verdict.reason) == (True, ERRORS), "6 in the last 30 s: 12 a minute"
    assert "6 correctable errors in the last 30 s (more than 10 per minute)" in verdict.message
    assert "correctable 51" in verdict.message
    clock.now += 119
    assert _verdict(judge).degraded
    clock.now += 1
    assert _verdict(judge).reason == HEALTHY, "120 s without more"


def test_a_fatal_or_non_fatal_error_is_unhealthy_at_once() -> None:
    fatal = PCIeErrorCounts(correctable=40, fatal=3)
    non_fatal = PCIeErrorCounts(correctable=40, fatal=2, non_fatal=1)
    for counts in (fatal, non_fatal):
        clock = Clock()
        judge = _errors_judge(clock)
        clock.now += 1
        judge.observe("c1", "gpu0", X16, counts)
        verdict = _verdict(judge)
        assert (verdict.degraded, verdict.reason) == (True, ERRORS)
        assert "1 new uncorrectable" in verdict.message
        clock.now += 60
        judge.observe("c1", "gpu0", X16, counts.model_copy(update={"non_fatal": counts.non_fatal + 1}))
        clock.now += 119
        assert _verdict(judge).degraded, "recovery counts from the last error"
        clock.now += 1
        assert not _verdict(judge).degraded


def test_cleared_counters_start_again_and_a_degraded_link_is_said_first() -> None:
    clock = Clock()
    judge = _errors_judge(clock)
    clock.now += 1
    judge.observe("c1", "gpu0", X16, PCIeErrorCounts())  # cleared: no news
    assert not _verdict(judge).degraded
    clock.now += 1
    judge.observe("c1", "gpu0", X8, PCIeErrorCounts(fatal=1))
    assert _verdict(judge).reason == ERRORS
    clock.now += 30
    assert _verdict(judge).reason == DEGRADED
