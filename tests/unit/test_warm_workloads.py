"""The warm bench's workload generators and model: the steady load is Poisson over node-pinned
arrivals, the bursty one has no arrival in its idle phases and opens each active phase with its
spike; the model shows the trade-off docs/manager.md cites."""

from __future__ import annotations

import statistics

import pytest

from bench.warm_bench import bursty, steady
from bench.warm_model import simulate


def test_steady_arrivals_are_poisson_over_pinned_nodes() -> None:
    load = steady(2.0, 2000.0, 60.0, 100.0, nodes=10)
    gaps = [b.at - a.at for a, b in zip(load.arrivals, load.arrivals[1:], strict=False)]
    assert len(load.arrivals) == pytest.approx(4000, rel=0.05)
    # Exponential gaps: mean 1/λ and a standard deviation equal to the mean.
    assert statistics.fmean(gaps) == pytest.approx(0.5, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(0.5, rel=0.1)
    per_node = [sum(1 for a in load.arrivals if a.node == n) for n in range(10)]
    assert min(per_node) > 300 and max(per_node) < 500  # ~400 each
    assert statistics.fmean(a.hold for a in load.arrivals) == pytest.approx(60.0, rel=0.1)
    assert (load.measure_from, load.measure_to) == (100.0, 2000.0)
    assert "node-pinned" in load.describe


def test_bursty_arrivals_come_in_active_phases_opening_with_a_spike() -> None:
    load = bursty(5, 20.0, 60.0, 1.5, 10, 30.0, nodes=10)
    for arrival in load.arrivals:
        assert arrival.at % 80.0 < 20.0, "no claim in an idle phase"
    for cycle in range(5):
        first_second = [a for a in load.arrivals if cycle * 80.0 <= a.at < cycle * 80.0 + 1.0]
        assert len(first_second) >= 10  # the spike, plus what the Poisson phase adds
    assert [a.at for a in load.arrivals] == sorted(a.at for a in load.arrivals)
    assert load.measure_to == 4 * 80.0 + 20.0


def test_the_model_shows_the_trade_off_between_per_node_and_pooled_sizes() -> None:
    """The figures docs/manager.md cites: sized per node, pinned arrivals hit ≥ 95 % and pay more
    than twice the warm time of one pooled quantile, which misses far more."""
    per_node = simulate("node", "pinned")
    pooled = simulate("group", "pinned")
    assert (per_node.size, pooled.size) == (20, 9)  # 10 Q(0.39), Q(3.9) at ε = 1 %
    assert per_node.hit_rate_percent >= 95.0 > 80.0 > pooled.hit_rate_percent
    assert pooled.warm_per_claimed_percent < 15.0 < per_node.warm_per_claimed_percent
    # Longer holds dilute the same warm devices: per node under 15 % at 120 s.
    assert simulate("node", "pinned", hold=120.0).warm_per_claimed_percent < 15.0
