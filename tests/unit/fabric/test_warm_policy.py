"""The warm pool's sizing rule and policy: Poisson quantiles against known values, the demand
tracker's rate, p95 and idle TTL, and which devices and nodes a policy covers."""

from __future__ import annotations

import math
from typing import Literal

import pytest
from pydantic import ValidationError

from dra_driver.controller.devices import PublishPolicy, to_dra_device
from fabric.bindings.warm_policy import (
    DemandTracker,
    WarmSettings,
    is_burst,
    most_within,
    poisson_pool_size,
    poisson_tail,
    sized_as,
)
from fabric.commands.cli import _settings
from fabric.service.config import manager_flags
from fabric.state.ledger import WARM_HOLDER, Ledger, LedgerEntry, LedgerState
from fabric.state.model import DeviceRecord, DiscoveredAttributes
from fabric_dra.cli import build_parser
from manager_api.devices import BindingStyle, DeviceType, Health
from manager_api.models import BindingState, Device
from tests.unit.fabric.test_ledger import RecordingStore


def _tail(mean: float, k: int) -> float:
    """P(N > k), N ~ Poisson(mean), summed independently of the code under test."""
    return 1.0 - sum(math.exp(-mean) * mean**i / math.factorial(i) for i in range(k + 1))


# (mean, ε, k): from published Poisson tables — e.g. P(N ≤ 4 | μ=1) = 0.99634 > 0.99 and
# P(N ≤ 3 | μ=1) = 0.98101 < 0.99; P(N ≤ 11 | μ=5) = 0.99455, P(N ≤ 10 | μ=5) = 0.98630.
KNOWN = [
    (0.0, 0.01, 0),
    (0.1, 0.01, 1),  # P(N ≤ 0) = 0.90484, P(N ≤ 1) = 0.99532
    (0.5, 0.01, 3),  # P(N ≤ 2) = 0.98561, P(N ≤ 3) = 0.99825
    (1.0, 0.01, 4),
    (1.0, 0.05, 3),  # P(N ≤ 2) = 0.91970, P(N ≤ 3) = 0.98101
    (5.0, 0.01, 11),
    (10.0, 0.01, 18),  # P(N ≤ 17) = 0.98572, P(N ≤ 18) = 0.99281
    (600.0, 0.01, 658),  # the seed's example: it guessed ~625, one standard deviation
    (2000.0, 0.01, 2105),  # e^-2000 underflows; the normal approximation says 2000 + 2.33·√2000 ≈ 2104
]


@pytest.mark.parametrize(("mean", "epsilon", "k"), KNOWN)
def test_the_pool_size_is_the_poisson_quantile(mean: float, epsilon: float, k: int) -> None:
    assert poisson_pool_size(mean, epsilon) == k
    if mean > 0 and mean < 100:  # the definition itself: k is enough, k - 1 is not
        assert _tail(mean, k) <= epsilon < _tail(mean, k - 1)


def _record(name: str, model: str = "L40S", health: Health = Health.OK) -> DeviceRecord:
    return DeviceRecord(
        key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{name}",
        resource_id=name,
        fabric="PCIe",
        style=BindingStyle.ZONE,
        attributes=DiscoveredAttributes(type=DeviceType.GPU, model=model, health=health),
        name=name,
    )


def test_the_policy_covers_its_model_nodes_and_healthy_devices_only() -> None:
    policy = WarmSettings(mode="fixed", model="L40S", nodes=["gpu-*"])
    assert policy.covers_node("gpu-7") and not policy.covers_node("cpu-1")
    assert policy.covers_device(_record("a"))
    assert not policy.covers_device(_record("b", model="H100"))
    assert not policy.covers_device(_record("c", health=Health.CRITICAL))
    assert WarmSettings(mode="fixed").covers_node("anything")


def test_a_model_the_fabric_lacks_is_refused_with_the_models_it_has() -> None:
    policy = WarmSettings(mode="fixed", model="A100")
    why = policy.unknown_model([_record("a", "L40S"), _record("b", "H100")])
    assert why is not None and "A100" in why and "H100, L40S" in why
    assert WarmSettings(mode="fixed", model="L40S").unknown_model([_record("a")]) is None


def test_the_rate_is_exponentially_weighted_and_the_size_follows_it() -> None:
    settings = WarmSettings(mode="auto", rate_half_life_seconds=60.0, default_attach_seconds=3.0)
    demand = DemandTracker(settings)
    # One claim a second for ten minutes: λ converges to 1/s (ten half-lives).
    for second in range(600):
        demand.arrival("n1", "L40S", float(second))
    assert demand.rate("n1", "L40S", 600.0) == pytest.approx(1.0, rel=0.02)
    # One half-life later with no claim, half of it.
    assert demand.rate("n1", "L40S", 660.0) == pytest.approx(0.5, rel=0.02)
    # λ·T ≈ 3 claims per refill: the Poisson quantile at 1 % is 8.
    assert demand.targets(600.0) == {
        ("n1", "L40S"): poisson_pool_size(demand.rate("n1", "L40S", 600.0) * 3.0, 0.01)
    }
    assert demand.targets(600.0)[("n1", "L40S")] == 8


def test_the_hot_add_time_is_the_p95_of_recent_attaches() -> None:
    demand = DemandTracker(WarmSettings(mode="auto", default_attach_seconds=7.0))
    assert demand.hot_add_seconds("L40S") == 7.0  # nothing measured yet
    for seconds in range(1, 101):  # 1 … 100 s; the window keeps the last 50 (51 … 100)
        demand.attached("L40S", float(seconds))
    assert demand.hot_add_seconds("L40S") == 98.0  # nearest rank: the 48th of 50


def test_the_pool_empties_after_the_idle_ttl_and_is_capped_per_model() -> None:
    settings = WarmSettings(mode="auto", idle_ttl_seconds=100.0, max_per_model=5)
    demand = DemandTracker(settings)
    for second in range(0, 300, 1):
        demand.arrival("busy", "L40S", float(second))
        demand.arrival("calm", "L40S", float(second) + 0.5)
    targets = demand.targets(300.0)
    assert sum(targets.values()) == 5  # the cap, over both nodes
    demand.arrival("one-off", "H100", 300.0)
    assert demand.targets(300.0 + 99.0)[("one-off", "H100")] >= 0
    later = demand.targets(300.0 + 101.0)  # nobody claimed for longer than the TTL
    assert later == {}
    demand.forget_idle(300.0 + 101.0)
    assert demand.rate("busy", "L40S", 401.0) == 0.0


async def test_the_ledger_indexes_warm_entries_per_node_as_they_change() -> None:
    ledger = Ledger(RecordingStore())
    warm = LedgerEntry(
        device="gpu4",
        device_key="/k/gpu4",
        node="n1",
        host="h1",
        claim_uid=WARM_HOLDER,
        state=LedgerState.WARM,
        operation_id="op",
    )
    ledger.put(warm)
    assert [e.device for e in ledger.warm_held_on("n1")] == ["gpu4"] and ledger.warm_nodes() == ["n1"]
    warm.claim_uid, warm.state = "claim-1", LedgerState.BOUND  # taken by a claim, changed in place
    ledger.put(warm)
    assert ledger.warm_held_on("n1") == [] and ledger.warm_nodes() == []
    warm.claim_uid, warm.state = WARM_HOLDER, LedgerState.WARM
    ledger.put(warm)
    await ledger.commit()
    reloaded = Ledger(ledger.store)
    await reloaded.load()
    assert [e.device for e in reloaded.warm_held_on("n1")] == ["gpu4"]
    reloaded.remove("gpu4")
    assert reloaded.warm_nodes() == []


def test_a_warm_device_stays_allocatable_in_the_published_slices() -> None:
    """Warm is bound to a node for no claim: the scheduler may still allocate it (to any node the
    pool reaches; the manager moves it when that is not its node)."""
    warm = Device(
        name="gpu4",
        pool="fabric-pcie",
        fabric="PCIe",
        type=DeviceType.GPU,
        state=BindingState.WARM,
        node="n1",
        binding_style="zone",
        redfish_uri="/r",
    )
    policy = PublishPolicy("fabric-dra.io", device_taints=True, binding_conditions=False)
    published = to_dra_device(warm, policy)
    assert published.device is not None and published.withheld is None


def test_the_rate_is_right_from_the_first_claims_not_after_several_half_lives() -> None:
    """Observed for a short while, the weighted sum is divided by the share of the weights seen:
    one claim a second gives λ ≈ 1/s after 20 s with a 60 s half-life (the plain sum says 0.2)."""
    settings = WarmSettings(mode="auto", rate_half_life_seconds=60.0)
    demand = DemandTracker(settings)
    demand.observe_from(0.0)
    for second in range(1, 21):
        demand.arrival("n1", "L40S", float(second))
    assert demand.rate("n1", "L40S", 20.0) == pytest.approx(1.0, rel=0.1)
    # One claim just after the start says little: the age counts as τ/4 at least.
    early = DemandTracker(settings)
    early.observe_from(0.0)
    early.arrival("n1", "L40S", 0.5)
    tau = 60.0 / math.log(2)
    assert early.rate("n1", "L40S", 0.5) == pytest.approx((1 / tau) / -math.expm1(-0.25), rel=1e-9)


def test_an_older_arrival_seeded_after_live_ones_counts_with_its_own_decay() -> None:
    settings = WarmSettings(mode="auto", rate_half_life_seconds=60.0)
    in_order, seeded_late = DemandTracker(settings), DemandTracker(settings)
    for at in (10.0, 50.0, 100.0):
        in_order.arrival("n1", "L40S", at)
    seeded_late.arrival("n1", "L40S", 100.0)
    seeded_late.arrival("n1", "L40S", 10.0)
    seeded_late.arrival("n1", "L40S", 50.0)
    assert seeded_late.rate("n1", "L40S", 120.0) == pytest.approx(in_order.rate("n1", "L40S", 120.0))


def test_a_group_is_sized_from_its_summed_rate_and_placed_by_shares() -> None:
    """Ten nodes at 0.1 claim/s each, T = 3.9 s: alone each would keep the 1 % quantile of 0.39
    (2, 20 in all); pooled, the group keeps that of 3.9 (9), one on each of nine nodes."""
    settings = WarmSettings(mode="auto", rate_half_life_seconds=60.0, max_per_model=64)
    nodes = [f"n{i}" for i in range(10)]
    alone, pooled = DemandTracker(settings), DemandTracker(settings)
    per_node = DemandTracker(settings.model_copy(update={"scope": "node"}))
    for demand in (alone, pooled, per_node):
        demand.observe_from(0.0)
        demand.attached("L40S", 3.9)
        for ten in range(60):  # node i claims at 10·j + i: 0.1 claim/s each
            for i, node in enumerate(nodes):
                demand.arrival(node, "L40S", 10.0 * ten + i)
    assert poisson_pool_size(0.39, 0.01) == 2 and poisson_pool_size(3.9, 0.01) == 9
    assert sum(alone.targets(600.0).values()) == 20
    rates = {n: pooled.rate(n, "L40S", 600.0) for n in nodes}
    assert sum(rates.values()) == pytest.approx(1.0, rel=0.05)
    by_share = pooled.targets(600.0, {"L40S": [nodes]})
    assert sum(by_share.values()) == poisson_pool_size(sum(rates.values()) * 3.9, 0.01) == 9
    assert set(by_share.values()) == {0, 1}
    # The node without one is the one whose claims are the oldest (the lowest weighted rate).
    assert [n for n in nodes if by_share[(n, "L40S")] == 0] == ["n0"]
    # Scope node ignores the groups.
    assert sum(per_node.targets(600.0, {"L40S": [nodes]}).values()) == 20


def test_a_group_share_follows_unequal_rates() -> None:
    settings = WarmSettings(mode="auto", rate_half_life_seconds=60.0, max_per_model=64)
    demand = DemandTracker(settings)
    demand.observe_from(0.0)
    demand.attached("L40S", 4.0)
    for tenth in range(6000):  # busy: 1/s; calm: 0.25/s
        at = tenth / 10
        if tenth % 10 == 0:
            demand.arrival("busy", "L40S", at)
        if tenth % 40 == 5:
            demand.arrival("calm", "L40S", at)
    summed = demand.rate("busy", "L40S", 600.0) + demand.rate("calm", "L40S", 600.0)
    k = poisson_pool_size(summed * 4.0, 0.01)
    targets = demand.targets(600.0, {"L40S": [["busy", "calm"]]})
    assert targets[("busy", "L40S")] + targets[("calm", "L40S")] == k
    assert targets[("busy", "L40S")] == round(k * 0.8) and targets[("calm", "L40S")] == k - round(k * 0.8)


def _tracker(**changes: object) -> DemandTracker:
    """Half-life 60 s, idle TTL 120 s, T = 3 s measured."""
    base = {"mode": "auto", "rate_half_life_seconds": 60.0, "idle_ttl_seconds": 120.0, "max_per_model": 32}
    demand = DemandTracker(WarmSettings.model_validate({**base, **changes}))
    demand.attached("L40S", 3.0)
    return demand


def _weighted(now: float, times: list[float], since: float) -> float:
    """λ by its definition, independently of the tracker: Σ e^(-(now-t)/τ)/τ over the share of the
    weights seen since ``since``."""
    tau = 60.0 / math.log(2)
    seen = sum(math.exp(-(now - t) / tau) / tau for t in times if t <= now)
    return seen / -math.expm1(-max(now - since, tau / 4) / tau)


def test_most_within_counts_the_arrivals_of_one_half_open_window() -> None:
    times = [0.0, 0.5, 1.0, 5.0, 5.1, 5.2, 5.3, 9.0]
    assert most_within(times, 1.0) == 4  # 5.0 … 5.3
    assert most_within(times, 5.0) == 6  # 0.5 … 5.3 within [0.5, 5.5)
    assert most_within([0.0, 1.0], 1.0) == 1  # the second arrives as the first's refill does
    assert most_within([], 3.0) == 0


def test_the_size_holds_through_an_idle_phase_shorter_than_the_ttl_then_empties() -> None:
    """One claim a second for 20 s, then nothing: λ·T falls from 2.78 (k = 7) to 0.36 (k = 2)
    80 s later, but the pool keeps the 7 it needed within the TTL; 122 s after the last claim
    (TTL 120 s) it keeps none."""
    times = [100.0 + i for i in range(20)]
    held, rate_only = _tracker(), _tracker()
    rate_only.hold = False
    for demand in (held, rate_only):
        demand.observe_from(100.0)
        for at in times:
            demand.arrival("n1", "L40S", at)
    assert poisson_pool_size(_weighted(120.0, times, 100.0) * 3.0, 0.01) == 7
    assert poisson_pool_size(_weighted(200.0, times, 100.0) * 3.0, 0.01) == 2
    assert held.targets(120.0) == rate_only.targets(120.0) == {("n1", "L40S"): 7}
    assert rate_only.targets(200.0) == {("n1", "L40S"): 2}  # the rule before the hold
    assert held.targets(200.0) == {("n1", "L40S"): 7}
    assert held.targets(241.0) == {}
    held.forget_idle(241.0)
    assert held._rates == {} and held._times == {}


def test_the_hold_ends_with_the_next_claim_and_keeps_no_peak_of_a_noisy_rate() -> None:
    """λ is held at the last claim only while none comes: one claim at 200 s, after 80 s without
    any, updates it to what the weighted rate says then (k = 2). The busiest T-window of the TTL
    holds 3 claims, which Poisson arrivals at that rate bring into one of its 40 windows with
    probability 0.2: noise, not a burst, so the size is the quantile's. The rule before held the
    largest quantile computed within the TTL (7, until 240 s) and covered any busiest window,
    which in steady demand sizes the pool from the highs of a noisy estimate."""
    times = [100.0 + i for i in range(20)]
    demand = _tracker()
    demand.observe_from(100.0)
    for at in times:
        demand.arrival("n1", "L40S", at)
    assert demand.targets(120.0) == {("n1", "L40S"): 7}
    assert demand.targets(199.0) == {("n1", "L40S"): 7}  # held: no claim since 119 s
    demand.arrival("n1", "L40S", 200.0)
    assert poisson_pool_size(_weighted(200.0, [*times, 200.0], 100.0) * 3.0, 0.01) == 2
    assert demand.burst(["n1"], "L40S", 200.0) == 3
    mean = _weighted(200.0, [*times, 200.0], 100.0) * 3.0
    assert not is_burst(3, mean, 120.0 / 3.0, 0.01)
    assert demand.targets(200.0) == {("n1", "L40S"): 2}
    # λ still held at 200 s; the claims of 100 to 119 s have left the TTL, and the burst with them
    assert demand.targets(245.0) == {("n1", "L40S"): 2}


def test_a_busiest_window_the_rate_explains_is_noise_and_a_spike_is_a_burst() -> None:
    """P(N ≥ c) against the Poisson table (λ = 3: P(N ≤ 8) = 0.99620, P(N ≤ 11) = 0.99993); at
    λ·T = 3 the quantile is 8, and over a TTL of 40 windows 9, 10 and 11 claims in the busiest
    one are what the rate brings with probability 14 %, 4.3 % and 1.2 % (noise), 12 with 0.29 %
    (a burst, above ε = 1 %). After the rate has decayed, ten claims at once are a burst."""
    assert poisson_tail(3.0, 9) == pytest.approx(1 - 0.99620, abs=1e-5)
    assert poisson_tail(3.0, 12) == pytest.approx(1 - 0.99993, abs=1e-5)
    assert poisson_tail(3.0, 0) == 1.0 and poisson_tail(0.0, 1) == 0.0
    assert poisson_pool_size(3.0, 0.01) == 8
    assert [is_burst(c, 3.0, 40.0, 0.01) for c in (9, 10, 11, 12)] == [False, False, False, True]
    assert is_burst(10, 0.02, 40.0, 0.01)
    assert is_burst(1, 0.0, 40.0, 0.01)  # no rate at all: anything is more than it explains


def test_a_spike_seen_once_is_covered_when_the_idle_phase_ends() -> None:
    """Ten claims within one second on ten nodes of one group: 80 s later λ·T (decayed) says 2
    and the spike says 10 — the group keeps 10, one per node; each node alone keeps the quantile
    of its one claim's rate, held since (2)."""
    nodes = [f"n{i}" for i in range(10)]
    group, alone = _tracker(), _tracker(scope="node")
    for demand in (group, alone):
        demand.observe_from(0.0)
        for i, node in enumerate(nodes):
            demand.arrival(node, "L40S", 0.1 * i)
    assert group.burst(nodes, "L40S", 80.0) == 10
    summed = sum(_weighted(80.0, [0.1 * i], 0.0) for i in range(10))
    assert poisson_pool_size(summed * 3.0, 0.01) == 2
    targets = group.targets(80.0, {"L40S": [nodes]})
    assert targets == {(n, "L40S"): 1 for n in nodes}
    # each node alone: its one claim's rate held (λ·T ≈ 0.16 with the start-up correction, Q = 2)
    assert alone.targets(80.0, {"L40S": [nodes]}) == {(n, "L40S"): 2 for n in nodes}
    assert alone.size("L40S", ["n1"], 80.0) == poisson_pool_size(_weighted(0.1, [0.1], 0.0) * 3.0, 0.01) == 2
    # A spike of ten on one node, pinned: that node keeps ten.
    pinned = _tracker(scope="node")
    for i in range(10):
        pinned.arrival("n1", "L40S", 0.1 * i)
    assert pinned.targets(80.0) == {("n1", "L40S"): 10}
    # Arrivals further apart than T are not one burst.
    spread = _tracker()
    for i in range(10):
        spread.arrival("n1", "L40S", 3.5 * i)
    assert spread.burst(["n1"], "L40S", 40.0) == 1


def test_the_cap_applies_after_the_hold_and_the_bursts() -> None:
    demand = _tracker(max_per_model=6)
    for i in range(10):
        demand.arrival("n1", "L40S", 0.1 * i)
    assert demand.size("L40S", ["n1"], 80.0) == 10  # what it needs
    assert demand.targets(80.0) == {("n1", "L40S"): 6}  # what it may keep


def test_the_floor_is_spread_over_the_nodes_that_reach_the_model_with_or_without_demand() -> None:
    nodes = ["a", "b", "c"]
    quiet = _tracker(min_per_model=4)
    # No claim ever: the floor alone, one at a time to the node with the fewest (by name).
    assert quiet.targets(0.0, {"L40S": [nodes]}) == {("a", "L40S"): 2, ("b", "L40S"): 1, ("c", "L40S"): 1}
    assert quiet.targets(0.0) == {}  # no node known to reach the model: nowhere to put it
    # c claimed once: its own size is 2 (λ·T = 0.157 from one claim, P(N > 1) = 1.1 %), and the
    # floor adds one each to a and b.
    busy = _tracker(min_per_model=4)
    busy.arrival("c", "L40S", 10.0)
    assert busy.targets(10.0, {"L40S": [nodes]}) == {("a", "L40S"): 1, ("b", "L40S"): 1, ("c", "L40S"): 2}
    # The TTL does not take the floor away (ties to c, which claimed last); a size above the
    # floor is not lowered by it.
    assert busy.targets(500.0, {"L40S": [nodes]}) == {("a", "L40S"): 1, ("b", "L40S"): 1, ("c", "L40S"): 2}
    for i in range(10):
        busy.arrival("c", "L40S", 600.0 + 0.1 * i)
    assert busy.targets(601.0, {"L40S": [nodes]})[("c", "L40S")] == 10
    # Scope node sizes each node alone, and the groups still say where the floor goes.
    per_node = _tracker(min_per_model=2, scope="node")
    assert per_node.targets(0.0, {"L40S": [nodes]}) == {("a", "L40S"): 1, ("b", "L40S"): 1, ("c", "L40S"): 0}


def test_the_floor_may_not_exceed_the_cap_and_is_a_flag() -> None:
    with pytest.raises(ValidationError, match="--warm-min-per-model 9 is above --warm-max-per-model 8"):
        WarmSettings(mode="auto", min_per_model=9)
    options = [f.option for f in manager_flags()]
    assert options.count("--warm-min-per-model") == 1
    args = build_parser().parse_args(
        [
            *("manager", "serve", "--redfish-url", "http://127.0.0.1:1", "--redfish-auth", "none"),
            *("--insecure-no-auth", "--state-dir", ".", "--warm-mode", "auto", "--warm-min-per-model", "3"),
        ]
    )
    assert _settings(args).warm.min_per_model == 3


def test_sized_by_type_one_quantile_covers_the_models_the_claims_do_not_tell_apart() -> None:
    """Claims for any GPU, alternating between two models, one a second for ten minutes (T = 3 s):
    sized per model, each model's λ·T ≈ 1.5 gives Q = 5, 10 in all; sized by type, λ·T ≈ 3 gives
    8 — the same cold-start bound for the claims, two devices fewer kept warm."""
    records = [_record("a", model="L40S"), _record("b", model="H100")]
    assert [sized_as(r, "model") for r in records] == ["L40S", "H100"]
    assert [sized_as(r, "type") for r in records] == ["gpu", "gpu"]
    sizes: dict[str, dict[tuple[str, str], int]] = {}
    by: Literal["model", "type"]
    for by in ("model", "type"):
        settings = WarmSettings(mode="auto", size_by=by, rate_half_life_seconds=60.0)
        demand = DemandTracker(settings)
        for record in records:
            demand.attached(sized_as(record, by), 3.0)
        for second in range(600):
            demand.arrival("n1", sized_as(records[second % 2], by), float(second))
        sizes[by] = demand.targets(600.0)
    assert sizes["model"] == {("n1", "L40S"): 5, ("n1", "H100"): 5}
    assert sizes["type"] == {("n1", "gpu"): 8}
    args = build_parser().parse_args(
        [
            *("manager", "serve", "--redfish-url", "http://127.0.0.1:1", "--redfish-auth", "none"),
            *("--insecure-no-auth", "--state-dir", ".", "--warm-mode", "auto", "--warm-size-by", "type"),
        ]
    )
    assert _settings(args).warm.size_by == "type"
