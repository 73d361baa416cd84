"""The warm pool's rules in a discrete-event model: what hit rate and warm idle time a sizing can
reach on a workload, without the stack's noise (``python -m bench.warm_model``).

Modelled as fabric/warm.py does it: each node keeps its target (``node``: the Poisson quantile of
its own λ·T; ``group``: the quantile of the summed λ·T, placed one by one over the nodes); a claim
on a node with a warm device takes it (a hit), else waits for a hot-add; a released device stays
warm while its node is below target (or, pooled, while the group is); the pass attaches the
shortfall, never above the group's size. Arrivals are Poisson; a claim is pinned to a uniformly
drawn node (``pinned``) or placed on the node with the fewest claims, ties at random
(``fewest``: the default spreading and least-allocated scores). Hot-adds take U(2, 4) s (the
emulator's realistic 3 ± 1 s), sized with T = 3.9 s (about their p95); holds are exponential.
The figures are the model's, not a measurement: docs/manager.md ("Auto sizing") cites them.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from fabric.warm_policy import poisson_pool_size

__all__ = ["Outcome", "simulate"]


@dataclass(frozen=True)
class Outcome:
    scope: str
    placement: str
    size: int
    hit_rate_percent: float
    warm_per_claimed_percent: float


def simulate(
    scope: str,
    placement: str,
    *,
    nodes: int = 10,
    rate: float = 1.0,
    hold: float = 60.0,
    hot_add: tuple[float, float] = (2.0, 4.0),
    sized_hot_add: float = 3.9,
    epsilon: float = 0.01,
    seconds: float = 4000.0,
    warmup: float = 300.0,
    seed: int = 1,
) -> Outcome:
    rng = random.Random(seed)
    if scope == "node":
        target = [poisson_pool_size(rate / nodes * sized_hot_add, epsilon)] * nodes
    else:
        target = [0] * nodes
        order = rng.sample(range(nodes), nodes)
        for j in range(poisson_pool_size(rate * sized_hot_add, epsilon)):
            target[order[j % nodes]] += 1
    size = sum(target)
    warm, adding, claimed = list(target), [0] * nodes, [0] * nodes
    events: list[tuple[float, str, int]] = [(rng.expovariate(rate), "arrive", -1)]
    hits = colds = 0
    warm_seconds = claimed_seconds = 0.0
    last = 0.0

    def refill(node: int, now: float) -> None:
        short = target[node] - warm[node] - adding[node]
        if scope == "group":
            short = min(short, size - sum(warm) - sum(adding))
        for _ in range(max(0, short)):
            adding[node] += 1
            heapq.heappush(events, (now + rng.uniform(*hot_add), "added", node))

    while events:
        now, kind, node = heapq.heappop(events)
        if now > seconds:
            break
        if now > warmup:
            span = now - max(last, warmup)
            warm_seconds += sum(warm) * span
            claimed_seconds += sum(claimed) * span
        last = now
        if kind == "arrive":
            heapq.heappush(events, (now + rng.expovariate(rate), "arrive", -1))
            if placement == "pinned":
                node = rng.randrange(nodes)
            else:
                fewest = min(claimed)
                node = rng.choice([n for n in range(nodes) if claimed[n] == fewest])
            hit = warm[node] > 0
            warm[node] -= hit
            if now > warmup:
                hits, colds = hits + hit, colds + (not hit)
            claimed[node] += 1
            wait = 0.0 if hit else rng.uniform(*hot_add)
            heapq.heappush(events, (now + wait + rng.expovariate(1.0 / hold), "release", node))
        elif kind == "release":
            claimed[node] -= 1
            below = warm[node] + adding[node] < target[node]
            if below or (scope == "group" and sum(warm) + sum(adding) < size):
                warm[node] += 1
        else:
            adding[node] -= 1
            warm[node] += 1
        for each in range(nodes):
            refill(each, now)
    return Outcome(
        scope,
        placement,
        size,
        round(100 * hits / max(1, hits + colds), 1),
        round(100 * warm_seconds / max(1e-9, claimed_seconds), 1),
    )


if __name__ == "__main__":
    for scope in ("node", "group"):
        for placement in ("pinned", "fewest"):
            print(simulate(scope, placement))
