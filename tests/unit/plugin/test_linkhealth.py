"""The link judge's hysteresis: a link that trains down for a moment changes nothing; one that
stays down past the hold is degraded; it is healthy again only after the recovery time."""

from __future__ import annotations

from dra_driver.plugin.linkhealth import LINKS_DEGRADED, Link, LinkJudge

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
