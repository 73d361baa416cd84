"""The warm pool's rules in a discrete-event model: what hit rate and warm idle time a sizing can
reach on a workload, without the stack's noise (``python -m bench.warm_model``).

Sized by the manager's own code: every ``interval`` seconds a
:class:`fabric.bindings.warm_policy.DemandTracker` fed with the model's arrivals and hot-add
times gives the targets (``rule`` ``held``: with the
peak hold and the burst cover; ``rate``: the quantile of the current λ·T alone, the rule before
them), and the pass brings each node to its target as fabric/bindings/warm.py does: it attaches the
shortfall (pooled: never above the group's size) and detaches the extra (pooled: only what the
group holds above its size). A claim on a node with a warm device takes it (a hit), else waits for
a hot-add; a released device stays warm while its node is below target (or, pooled, while the
group is). Arrivals come from the bench's own generators (:func:`bench.warm_bench.steady`,
:func:`bench.warm_bench.bursty`); a claim is pinned to the node the generator drew (``pinned``),
placed on the node with the fewest claims, ties at random (``fewest``: the default spreading and
least-allocated scores), or on a node holding a warm device when one does, the fewest claims
first (``warm``: placement follows warmth, the case the issue's targets assume). Hot-adds take
U(2, 4) s (the emulator's realistic 3 ± 1 s); devices are never short. The figures are the
model's, not a measurement: docs/manager.md ("Auto sizing") cites them.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, replace
from typing import Literal

from bench.warm_bench import Workload, bursty, steady
from fabric.bindings.warm_policy import DemandTracker, WarmSettings

__all__ = ["Outcome", "bursty_load", "simulate", "steady_load"]

_MODEL = "gpu"
Placement = Literal["pinned", "fewest", "warm"]


@dataclass(frozen=True)
class Outcome:
    scope: str
    placement: str
    rule: str
    #: the pool's total target, time-weighted over the measured window
    size: float
    hit_rate_percent: float
    warm_per_claimed_percent: float


def steady_load(rate: float = 1.0, hold: float = 60.0, seconds: float = 4000.0, *, seed: int = 1) -> Workload:
    """Poisson at ``rate`` claims/s, exponential holds; the first 300 s are the warm-up."""
    return steady(rate, seconds, hold, 300.0, nodes=10, seed=seed)


def bursty_load(
    cycles: int = 50, *, measure_from: float = 0.0, start: float = 0.0, seed: int = 1
) -> Workload:
    """The bench's bursty pattern (20 s active at 1.5/s opened by a spike of 10 in one second,
    60 s idle, holds of mean 30 s) over ``cycles`` cycles, its first claim ``start`` seconds
    after the pool's (time for a floor to warm), measured from ``measure_from`` on."""
    load = bursty(cycles, 20.0, 60.0, 1.5, 10, 30.0, nodes=10, seed=seed)
    arrivals = [replace(a, at=a.at + start) for a in load.arrivals]
    return Workload(load.name, arrivals, measure_from + start, load.measure_to + start, load.describe)


def simulate(
    scope: Literal["node", "group"],
    placement: Placement,
    load: Workload | None = None,
    *,
    rule: Literal["held", "rate"] = "held",
    nodes: int = 10,
    hot_add: tuple[float, float] = (2.0, 4.0),
    interval: float = 0.5,
    settings: WarmSettings | None = None,
    seed: int = 1,
) -> Outcome:
    """Replay ``load`` (default: :func:`steady_load`) against the pool; the settings default to
    the bench's auto mode (ε 1 %, half-life 60 s, idle TTL 120 s, cap 32)."""
    load = load or steady_load()
    settings = (settings or _bench_settings()).model_copy(update={"scope": scope})
    simulation = _Simulation(
        scope, placement, load, DemandTracker(settings, hold=rule == "held"), nodes, hot_add, interval, seed
    )
    simulation.run()
    return simulation.outcome(rule)


class _Simulation:
    """One replay: the pool's state on each node, the event queue, and what the measured window
    counted. Each event kind is a method; :meth:`run` takes them in time order."""

    def __init__(
        self,
        scope: Literal["node", "group"],
        placement: Placement,
        load: Workload,
        demand: DemandTracker,
        nodes: int,
        hot_add: tuple[float, float],
        interval: float,
        seed: int,
    ) -> None:
        self.scope, self.placement, self.load, self.demand = scope, placement, load, demand
        self.nodes, self.hot_add, self.interval = nodes, hot_add, interval
        self.rng = random.Random(seed)
        demand.observe_from(0.0)
        self.names = [f"n{i}" for i in range(nodes)]
        self.groups = {_MODEL: [self.names]}
        self.target = [0] * nodes
        self.warm, self.adding, self.claimed = [0] * nodes, [0] * nodes, [0] * nodes
        # (when, order, kind, node or arrival index, seconds of a hot-add); order keeps ties stable
        self.events: list[tuple[float, int, str, int, float]] = [
            (a.at, i, "arrive", i, 0.0) for i, a in enumerate(load.arrivals)
        ]
        self.events.append((0.0, -1, "pass", -1, 0.0))
        heapq.heapify(self.events)
        self.order = len(load.arrivals)
        self.hits = self.colds = 0
        self.warm_seconds = self.claimed_seconds = self.size_seconds = 0.0
        self.last = load.measure_from

    def push(self, at: float, kind: str, node: int, seconds: float = 0.0) -> None:
        self.order += 1
        heapq.heappush(self.events, (at, self.order, kind, node, seconds))

    def slack(self) -> int | None:
        """The group's target minus its holdings (pooled), or None (each node alone)."""
        return sum(self.target) - sum(self.warm) - sum(self.adding) if self.scope == "group" else None

    def balance(self, now: float) -> None:
        for node in range(self.nodes):
            held = self.warm[node] + self.adding[node]
            pooled = self.slack()
            if held > self.target[node]:
                extra = held - self.target[node] if pooled is None else min(held - self.target[node], -pooled)
                self.warm[node] -= min(self.warm[node], max(0, extra))
                continue
            missing = self.target[node] - held if pooled is None else min(self.target[node] - held, pooled)
            for _ in range(max(0, missing)):
                self.adding[node] += 1
                seconds = self.rng.uniform(*self.hot_add)
                self.push(now + seconds, "added", node, seconds)

    def run(self) -> None:
        load = self.load
        while self.events:
            now, _, kind, index, seconds = heapq.heappop(self.events)
            if now > load.measure_to:
                break
            if now > load.measure_from:
                self.account(now)
            if kind == "pass":
                self.on_pass(now)
            elif kind == "arrive":
                self.on_arrival(now, index)
            elif kind == "release":
                self.on_release(index)
            else:  # a warming hot-add completed
                self.on_added(index, seconds)

    def account(self, now: float) -> None:
        """The device-seconds since the last event, inside the measured window."""
        span = now - max(self.last, self.load.measure_from)
        self.warm_seconds += sum(self.warm) * span
        self.claimed_seconds += sum(self.claimed) * span
        self.size_seconds += sum(self.target) * span
        self.last = now

    def on_pass(self, now: float) -> None:
        found = self.demand.targets(now, self.groups)
        self.target = [found.get((n, _MODEL), 0) for n in self.names]
        self.demand.forget_idle(now)
        self.balance(now)
        self.push(now + self.interval, "pass", -1)

    def on_arrival(self, now: float, index: int) -> None:
        arrival = self.load.arrivals[index]
        node = _place(self.placement, arrival.node, self.warm, self.claimed, self.rng)
        self.demand.arrival(self.names[node], _MODEL, now)
        hit = self.warm[node] > 0
        self.warm[node] -= hit
        if now >= self.load.measure_from:
            self.hits, self.colds = self.hits + hit, self.colds + (not hit)
        self.claimed[node] += 1
        wait = 0.0
        if not hit:
            wait = self.rng.uniform(*self.hot_add)
            self.demand.attached(_MODEL, wait)
        self.push(now + wait + arrival.hold, "release", node)

    def on_release(self, node: int) -> None:
        self.claimed[node] -= 1
        pooled = self.slack()
        below = self.warm[node] + self.adding[node] < self.target[node]
        if below or (self.target[node] > 0 and pooled is not None and pooled > 0):
            self.warm[node] += 1

    def on_added(self, node: int, seconds: float) -> None:
        self.adding[node] -= 1
        self.warm[node] += 1
        self.demand.attached(_MODEL, seconds)

    def outcome(self, rule: Literal["held", "rate"]) -> Outcome:
        window = max(1e-9, self.load.measure_to - self.load.measure_from)
        return Outcome(
            self.scope,
            self.placement,
            rule,
            round(self.size_seconds / window, 1),
            round(100 * self.hits / max(1, self.hits + self.colds), 1),
            round(100 * self.warm_seconds / max(1e-9, self.claimed_seconds), 1),
        )


def _place(placement: Placement, pinned: int, warm: list[int], claimed: list[int], rng: random.Random) -> int:
    if placement == "pinned":
        return pinned
    candidates = [n for n in range(len(claimed)) if warm[n] > 0 or placement != "warm"]
    candidates = candidates or list(range(len(claimed)))
    fewest = min(claimed[n] for n in candidates)
    return rng.choice([n for n in candidates if claimed[n] == fewest])


def _bench_settings() -> WarmSettings:
    """bench/warm_bench.py's auto mode."""
    return WarmSettings(
        mode="auto", rate_half_life_seconds=60.0, idle_ttl_seconds=120.0, max_per_model=32, epsilon=0.01
    )


def _table() -> None:
    """The before/after table docs/manager.md ("Auto sizing") cites, in Markdown."""
    loads = {
        "steady (1/s, 60 s)": steady_load(),
        "bursty, all 50 cycles": bursty_load(),
        "bursty, after the first cycle": bursty_load(measure_from=80.0),
        "bursty, the bench's: 3 cycles, from the second": bursty_load(3, measure_from=80.0, seed=21),
    }
    scopes: tuple[Literal["node", "group"], ...] = ("group", "node")
    placements: tuple[Placement, ...] = ("warm", "pinned", "fewest")
    # each cell: the pool's mean size, the hit rate, warm ÷ claimed device-seconds
    print("| load | scope | placement | before (`rate`) | after (`held`) |")
    print("|---|---|---|---|---|")
    for name, load in loads.items():
        for scope in scopes:
            for placement in placements:
                cells = [
                    f"{o.size:g}, {o.hit_rate_percent:g} %, {o.warm_per_claimed_percent:g} %"
                    for o in (simulate(scope, placement, load, rule=rule) for rule in ("rate", "held"))
                ]
                print(f"| {name} | {scope} | {placement} | {cells[0]} | {cells[1]} |", flush=True)
    # The first burst with an operator's floor of one spike, warm before the first claim.
    floor = _bench_settings().model_copy(update={"min_per_model": 10})
    for placement in ("warm", "pinned"):
        for settings in (_bench_settings(), floor):
            found = simulate("group", placement, bursty_load(2, start=10.0), settings=settings)
            print(f"floor {settings.min_per_model}, 2 bursty cycles 10 s after the start: {found}")


if __name__ == "__main__":
    _table()
