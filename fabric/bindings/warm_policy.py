"""What the warm pool keeps: the policy's settings, which devices and nodes it covers, and how big
it should be — a fixed size, or sized from demand (``auto``).

**Fixed.** ``--warm-size N``: every node the policy covers keeps N matching devices warm.

**Auto.** The pool only has to cover the claims that arrive while the replacement of a taken warm
device is being hot-added. With arrivals Poisson at rate λ (claims per second, exponentially
weighted with half-life ``rate_half_life_seconds``) and a hot-add taking T seconds (the p95 of the
model's recent attaches), the claims arriving during one refill number N ~ Poisson(λ·T), and the
pool keeps the smallest k with P(N > k) ≤ ε (:func:`poisson_pool_size`). Two terms keep it from
forgetting what demand did within the idle TTL: the **hold** (λ is read as it was at the last
claim: while none comes, within the TTL, it does not decay, so an idle phase shorter than the TTL
does not shrink the pool) and the **burst cover** (k is at least the most arrivals seen in any
T-long window within the TTL when that many are more than the rate explains, so a correlated spike
seen once is covered when it comes again).
``min_per_model`` is an operator's floor for the first burst, which no history can foresee.

``scope`` says over which nodes λ is summed: ``group`` (the default) pools the nodes of one
reachability group (the nodes that reach the same devices of the model) and places the group's k
on its nodes by their share of its arrivals; ``node`` sizes every node from its own rate, for
workloads pinned to nodes, at the price of each node rounding up on its own. The hold and the
bursts are kept where the size is computed (per group, or per node). k is capped per model
(``max_per_model``, over all nodes) and by the free devices there are, and a node that has seen no
claim of the model for ``idle_ttl_seconds`` gets none (but for the floor). docs/manager.md
("Auto sizing") states the model's assumptions.

Pure: no I/O, no clock of its own (callers pass ``now``), so it is unit-tested directly.
"""

from __future__ import annotations

import bisect
import fnmatch
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fabric.state.model import DeviceRecord
from manager_api.devices import DeviceType, Health

__all__ = [
    "DemandTracker",
    "WarmSettings",
    "is_burst",
    "model_of",
    "most_within",
    "poisson_pool_size",
    "poisson_tail",
    "sized_as",
]


class WarmSettings(BaseModel):
    """The warm-pool policy (``--warm-*`` flags of ``fabric-dra manager serve``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["off", "fixed", "auto"] = Field(
        default="off",
        description="off; fixed: --warm-size devices per node; auto: sized from each node's claim rate",
    )
    size: int = Field(default=1, ge=0, le=64, description="devices kept warm per node (fixed)")
    device_type: DeviceType | None = Field(default=None, description="only devices of this type")
    model: str | None = Field(default=None, description="only devices of this model (as the inventory says)")
    nodes: list[str] = Field(
        default_factory=list, description="only nodes whose name matches one of these glob patterns"
    )
    interval_seconds: float = Field(default=2.0, gt=0, description="how often the pool is checked")
    epsilon: float = Field(default=0.01, gt=0, lt=1, description="cold-start probability allowed (auto)")
    max_per_model: int = Field(
        default=8, ge=0, description="warm devices of one model (or type, sized by type) at most (auto)"
    )
    min_per_model: int = Field(
        default=0,
        ge=0,
        description="warm devices of one model at least, spread over the nodes that reach it, with or "
        "without demand and as free devices allow (auto): what covers a first burst",
    )
    size_by: Literal["model", "type"] = Field(
        default="model",
        description="auto: size one pool per device model (claims ask for a model), or per device "
        "type (claims take any model of the type: one quantile instead of one per model)",
    )
    scope: Literal["group", "node"] = Field(
        default="group",
        description="auto: size each reachability group from its nodes' summed rate (group), or "
        "each node from its own (node)",
    )
    idle_ttl_seconds: float = Field(
        default=300.0, gt=0, description="a node's pool of a model empties after this long without a claim"
    )
    rate_half_life_seconds: float = Field(
        default=120.0, gt=0, description="half-life of the claim arrival rate's weighting (auto)"
    )
    default_attach_seconds: float = Field(
        default=3.0, gt=0, description="hot-add time assumed before any attach was measured (auto)"
    )

    @model_validator(mode="after")
    def _floor_under_cap(self) -> WarmSettings:
        if self.min_per_model > self.max_per_model:
            floor, cap = self.min_per_model, self.max_per_model
            raise ValueError(f"--warm-min-per-model {floor} is above --warm-max-per-model {cap}")
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    def covers_node(self, node: str) -> bool:
        return not self.nodes or any(fnmatch.fnmatchcase(node, pattern) for pattern in self.nodes)

    def matches_kind(self, record: DeviceRecord) -> bool:
        """The device is of the policy's type and model, fit or not."""
        a = record.attributes
        if self.device_type is not None and a.type is not self.device_type:
            return False
        return self.model is None or a.model == self.model

    def covers_device(self, record: DeviceRecord) -> bool:
        """The device is of the policy's kind and fit to serve (available, healthy)."""
        a = record.attributes
        return self.matches_kind(record) and a.available and a.health is not Health.CRITICAL

    def unknown_model(self, records: Iterable[DeviceRecord]) -> str | None:
        """Why the policy can never match (a model the fabric lacks), naming the models it has."""
        if self.model is None:
            return None
        models = sorted({r.attributes.model for r in records if r.attributes.model})
        if self.model in models:
            return None
        return f"--warm-model {self.model!r} is no model of the fabric; it has: {', '.join(models) or 'none'}"


def model_of(record: DeviceRecord) -> str:
    """The model a device is accounted by (its type when the fabric names no model)."""
    return record.attributes.model or str(record.attributes.type)


def sized_as(record: DeviceRecord, by: Literal["model", "type"]) -> str:
    """What the auto size pools a device's demand under: its model, or (``by`` ``type``) its type,
    when the claims take any model of the type: demand split over models the claims do not tell
    apart would be sized by one quantile per model, each rounding up on its own (the steady bench
    load over two GPU models kept about three devices more than one quantile of the type)."""
    return str(record.attributes.type) if by == "type" else model_of(record)


def _poisson_pmf(mean: float, k: int) -> float:
    """P(N = k) for N ~ Poisson(``mean`` > 0), computed in log space (e^-mean alone underflows past
    a mean of ~745); the terms far below the mean that underflow to zero weigh nothing."""
    return math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1))


def poisson_pool_size(mean: float, epsilon: float) -> int:
    """The smallest k with P(N > k) ≤ ``epsilon`` for N ~ Poisson(``mean``)."""
    if mean <= 0:
        return 0
    cdf = 0.0
    k = 0
    while True:
        cdf += _poisson_pmf(mean, k)
        if 1.0 - cdf <= epsilon or (k > mean and cdf >= 1.0):
            return k
        k += 1


def poisson_tail(mean: float, count: int) -> float:
    """P(N ≥ ``count``) for N ~ Poisson(``mean``)."""
    if count <= 0:
        return 1.0
    if mean <= 0:
        return 0.0
    below = math.fsum(_poisson_pmf(mean, k) for k in range(count))
    return max(0.0, 1.0 - below)


def is_burst(count: int, mean: float, windows: float, epsilon: float) -> bool:
    """``count`` arrivals in one window is more than Poisson arrivals of ``mean`` per window bring
    into the busiest of ``windows`` windows with probability ``epsilon``: a correlated burst, not
    the noise of the rate.

    The windows are taken as independent (the TTL cut into T-long pieces); the busiest of the
    overlapping windows the burst cover slides is larger than that, so some noise is taken for a
    burst (warm idle time), never a burst for noise."""
    alone = poisson_tail(mean, count)
    return -math.expm1(max(1.0, windows) * math.log1p(-min(alone, 1.0 - 1e-16))) <= epsilon


@dataclass
class _Rate:
    """An exponentially weighted event rate: each event adds 1/τ, and the sum decays as e^(-t/τ)."""

    value: float = 0.0
    at: float = 0.0
    last_event: float = 0.0

    def decayed(self, now: float, tau: float) -> float:
        return self.value * math.exp(-max(0.0, now - self.at) / tau)


#: a group of nodes that reach the same devices of one model: the warm devices of any of them
#: can serve a claim on it only by a move, but their arrivals are summed for the size
NodeGroup = Sequence[str]


def most_within(times: Sequence[float], window: float) -> int:
    """The most of the sorted ``times`` that fall in any half-open interval [t, t + ``window``):
    the claims that compete for a pool while one hot-add of ``window`` seconds is in flight."""
    most, first = 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - window:
            first += 1
        most = max(most, last - first + 1)
    return most


@dataclass
class DemandTracker:
    """Claim arrivals per (node, model) and hot-add times per model, for the ``auto`` size.

    ``hold`` False sizes from the current rate alone (no hold, no burst cover): the rule before
    them, kept so that bench/warm_model.py can compare the two."""

    settings: WarmSettings
    #: attaches remembered per model for the p95
    window: int = 50
    hold: bool = True
    _rates: dict[tuple[str, str], _Rate] = field(default_factory=dict)
    _attaches: dict[str, deque[float]] = field(default_factory=dict)
    #: since when arrivals are observed (the first one seen, seeded or live, or :meth:`observe_from`)
    _since: float | None = None
    #: (node, model) → its arrival times within the idle TTL, sorted (the burst cover)
    _times: dict[tuple[str, str], list[float]] = field(default_factory=dict)

    @property
    def _tau(self) -> float:
        return self.settings.rate_half_life_seconds / math.log(2)

    def observe_from(self, now: float) -> None:
        """Arrivals are counted from ``now`` on (or from an earlier arrival already counted)."""
        self._since = now if self._since is None else min(self._since, now)

    def arrival(self, node: str, model: str, now: float) -> None:
        """A claim of ``model`` on ``node`` at ``now``; an arrival older than the last one counted
        (seeded from the ledger after live ones) is added with its own decay."""
        self.observe_from(now)
        rate = self._rates.setdefault((node, model), _Rate(at=now, last_event=now))
        if now >= rate.at:
            rate.value = rate.decayed(now, self._tau) + 1.0 / self._tau
            rate.at = now
        else:
            rate.value += math.exp(-(rate.at - now) / self._tau) / self._tau
        rate.last_event = max(rate.last_event, now)
        bisect.insort(self._times.setdefault((node, model), []), now)

    def attached(self, model: str, seconds: float) -> None:
        self._attaches.setdefault(model, deque(maxlen=self.window)).append(seconds)

    def rate(self, node: str, model: str, now: float) -> float:
        """λ: claims per second of ``model`` on ``node``.

        The weighted sum assumes an infinite past; observed for only ``age`` seconds it sees a
        fraction 1 - e^(-age/τ) of the weights, so it is divided by that (the usual start-up
        correction of an exponential average): at a steady rate r the estimate is r from the first
        claims on, not r·(1 - e^(-t/τ)) creeping up over several half-lives. Below a quarter of τ
        the age is taken as τ/4: fewer seconds than that say too little to trust a rate."""
        rate = self._rates.get((node, model))
        if rate is None or self._since is None:
            return 0.0
        age = max(now - self._since, self._tau / 4)
        return rate.decayed(now, self._tau) / -math.expm1(-age / self._tau)

    def hot_add_seconds(self, model: str) -> float:
        """T: the p95 of the model's recent attaches (nearest rank), or the configured guess."""
        seen = sorted(self._attaches.get(model, ()))
        if not seen:
            return self.settings.default_attach_seconds
        return seen[min(len(seen) - 1, math.ceil(0.95 * len(seen)) - 1)]

    def _active(self, node: str, model: str, now: float) -> bool:
        rate = self._rates.get((node, model))
        return rate is not None and now - rate.last_event <= self.settings.idle_ttl_seconds

    def burst(self, nodes: Iterable[str], model: str, now: float) -> int:
        """The most claims of ``model`` on ``nodes`` that arrived within one hot-add time T of each
        other, over the idle TTL up to ``now``."""
        since = now - self.settings.idle_ttl_seconds
        times = sorted(t for n in nodes for t in self._times.get((n, model), ()) if since <= t <= now)
        return most_within(times, self.hot_add_seconds(model))

    def size(self, model: str, nodes: Sequence[str], now: float) -> int:
        """The size ``nodes`` (the members of a reachability group with recent claims, or one
        node) need together for ``model``, before the cap and the floor.

        k = the Poisson quantile of their summed λ·T, raised to B, the most arrivals within one T
        there over the TTL, when B is a **burst**: more than Poisson arrivals at that rate would
        bring into any of the TTL's T-windows with probability ε (:func:`is_burst`; a busiest
        window the rate explains is noise the quantile already covers at ε). λ is read at their
        last claim (the hold): while no claim comes, the weighted rate would decay by half every
        half-life, and an idle phase shorter than the TTL is taken for a pause of the same
        workload, which comes back at the rate it had. A claim after the pause updates λ as usual.

        The rule before held the largest quantile computed within the TTL and raised k to B
        whatever B was: under steady demand, the quantile of the highs of a noisy estimate and the
        busiest window of a Poisson stream, about one device above what the rate needs
        (bench/warm_model.py, steady load: warm idle 12.8 → 11.1 % at 99.8 % hits; every bursty
        figure within a claim of what it was). With ``hold`` False, the quantile of λ at ``now``
        alone."""
        at = now
        if self.hold:
            last = [r.last_event for n in nodes if (r := self._rates.get((n, model))) is not None]
            at = min(now, max(last, default=now))
        window = self.hot_add_seconds(model)
        mean = sum(self.rate(n, model, at) for n in nodes) * window
        k = poisson_pool_size(mean, self.settings.epsilon)
        if not self.hold:
            return k
        most = self.burst(nodes, model, now)
        windows = self.settings.idle_ttl_seconds / window
        return most if most > k and is_burst(most, mean, windows, self.settings.epsilon) else k

    def targets(
        self, now: float, groups: Mapping[str, Sequence[NodeGroup]] | None = None
    ) -> dict[tuple[str, str], int]:
        """(node, model) → devices to keep warm there.

        Scope ``node``, or a model ``groups`` does not name: each node with recent claims is its
        own group. Scope ``group``: ``groups[model]`` lists the model's reachability groups; a
        group is sized from its nodes together (:meth:`size`, the hold and the bursts kept per
        reachability group), placed on its nodes with recent claims in proportion to their rates
        (largest remainders; equal ones to the node that claimed last). Nodes without a claim for
        the idle TTL get none. Each model's total is capped at ``max_per_model``, the groups with
        the most demand served first, then raised to ``min_per_model`` over the nodes ``groups``
        names for it (whatever the scope) and those with claims, the fewest first."""
        by_model: dict[str, list[list[str]]] = {}
        for node, model in self._rates:
            if self._active(node, model, now):
                by_model.setdefault(model, [])
        for model, lists in by_model.items():
            named = (groups or {}).get(model) if self.settings.scope == "group" else None
            placed: set[str] = set()
            for group in named or ():
                members = [n for n in group if self._active(n, model, now)]
                if members:
                    lists.append(members)
                    placed.update(members)
            alone = [n for (n, m) in sorted(self._rates) if m == model and self._active(n, m, now)]
            lists.extend([n] for n in alone if n not in placed)
        capped: dict[tuple[str, str], int] = {}
        for model, lists in sorted(by_model.items()):
            rated = [{n: self.rate(n, model, now) for n in members} for members in lists]
            budget = self.settings.max_per_model
            for shares in sorted(rated, key=lambda g: (-sum(g.values()), sorted(g))):
                k = min(budget, self.size(model, list(shares), now))
                budget -= k
                for node, count in self._apportion(k, shares, model).items():
                    capped[(node, model)] = count
        if self.settings.min_per_model > 0:
            self._raise_to_floor(capped, groups or {})
        return capped

    def _raise_to_floor(
        self, capped: dict[tuple[str, str], int], groups: Mapping[str, Sequence[NodeGroup]]
    ) -> None:
        """Raise each model's total to ``min_per_model``: one device at a time to the node with the
        fewest (the one that claimed last, then by name), over the nodes that reach the model."""
        floor = self.settings.min_per_model
        models = set(groups) | {m for (_, m) in capped}
        for model in sorted(models):
            nodes = {n for group in groups.get(model, ()) for n in group}
            nodes.update(n for (n, m) in capped if m == model)
            if not nodes:
                continue
            for node in nodes:
                capped.setdefault((node, model), 0)
            last = {n: r.last_event for (n, m), r in self._rates.items() if m == model}
            for _ in range(floor - sum(capped[(n, model)] for n in nodes)):
                node = min(nodes, key=lambda n: (capped[(n, model)], -last.get(n, -math.inf), n))
                capped[(node, model)] += 1

    def _apportion(self, k: int, shares: Mapping[str, float], model: str) -> dict[str, int]:
        """``k`` devices over the nodes in proportion to ``shares`` (Hamilton's largest remainders)."""
        total = sum(shares.values())
        if total <= 0:
            return dict.fromkeys(shares, 0)
        exact = {n: k * r / total for n, r in shares.items()}
        counts = {n: math.floor(x) for n, x in exact.items()}
        rest = k - sum(counts.values())
        last = {n: self._rates[(n, model)].last_event for n in shares}
        order = sorted(shares, key=lambda n: (-(exact[n] - counts[n]), -last[n], n))
        for node in order[:rest]:
            counts[node] += 1
        return counts

    def forget_idle(self, now: float) -> None:
        """Drop what is older than the idle TTL (keeps the tables to the nodes in use)."""
        since = now - self.settings.idle_ttl_seconds
        for key in [k for k, r in self._rates.items() if r.last_event < since]:
            del self._rates[key]
        for key, times in list(self._times.items()):
            del times[: bisect.bisect_left(times, since)]
            if not times:
                del self._times[key]
