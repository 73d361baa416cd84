"""What the warm pool keeps: the policy's settings, which devices and nodes it covers, and how big
it should be — a fixed size, or sized from demand (``auto``).

**Fixed.** ``--warm-size N``: every node the policy covers keeps N matching devices warm.

**Auto.** The pool only has to cover the claims that arrive while the replacement of a taken warm
device is being hot-added. With arrivals Poisson at rate λ (claims per second, exponentially
weighted with half-life ``rate_half_life_seconds``) and a hot-add taking T seconds (the p95 of the
model's recent attaches), the claims arriving during one refill number N ~ Poisson(λ·T), and the
pool keeps the smallest k with P(N > k) ≤ ε (:func:`poisson_pool_size`).

``scope`` says over which nodes λ is summed: ``group`` (the default) pools the nodes of one
reachability group (the nodes that reach the same devices of the model) and places the group's k
on its nodes by their share of its arrivals; ``node`` sizes every node from its own rate, for
workloads pinned to nodes, at the price of each node rounding up on its own. k is capped per model
(``max_per_model``, over all nodes) and by the free devices there are, and a node that has seen no
claim of the model for ``idle_ttl_seconds`` gets none. docs/manager.md ("Warm devices") states the
model's assumptions.

Pure: no I/O, no clock of its own (callers pass ``now``), so it is unit-tested directly.
"""

from __future__ import annotations

import fnmatch
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fabric.backends.model import DeviceRecord
from manager_api.devices import DeviceType, Health

__all__ = ["DemandTracker", "WarmSettings", "model_of", "poisson_pool_size"]


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
    max_per_model: int = Field(default=8, ge=0, description="warm devices of one model at most (auto)")
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
    """The model a device is sized and accounted by (its type when the fabric names no model)."""
    return record.attributes.model or str(record.attributes.type)


def poisson_pool_size(mean: float, epsilon: float) -> int:
    """The smallest k with P(N > k) ≤ ``epsilon`` for N ~ Poisson(``mean``).

    Each term is computed in log space (e^-mean alone underflows past a mean of ~745); the terms
    far below the mean that underflow to zero weigh nothing."""
    if mean <= 0:
        return 0
    log_mean = math.log(mean)
    cdf = 0.0
    k = 0
    while True:
        cdf += math.exp(-mean + k * log_mean - math.lgamma(k + 1))
        if 1.0 - cdf <= epsilon or (k > mean and cdf >= 1.0):
            return k
        k += 1


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


@dataclass
class DemandTracker:
    """Claim arrivals per (node, model) and hot-add times per model, for the ``auto`` size."""

    settings: WarmSettings
    #: attaches remembered per model for the p95
    window: int = 50
    _rates: dict[tuple[str, str], _Rate] = field(default_factory=dict)
    _attaches: dict[str, deque[float]] = field(default_factory=dict)
    #: since when arrivals are observed (the first one seen, seeded or live, or :meth:`observe_from`)
    _since: float | None = None

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

    def targets(
        self, now: float, groups: Mapping[str, Sequence[NodeGroup]] | None = None
    ) -> dict[tuple[str, str], int]:
        """(node, model) → devices to keep warm there.

        Scope ``node``, or a model ``groups`` does not name: each node with recent claims is its
        own group. Scope ``group``: ``groups[model]`` lists the model's reachability groups; a
        group's λ is its nodes' sum, its size the Poisson quantile of λ·T, placed on its nodes in
        proportion to their rates (largest remainders; equal ones to the node that claimed last).
        Nodes without a claim for the idle TTL get none. Each model's total is capped at
        ``max_per_model``, the groups with the most demand served first."""
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
            rates = [{n: self.rate(n, model, now) for n in g} for g in lists]
            budget = self.settings.max_per_model
            for shares in sorted(rates, key=lambda r: (-sum(r.values()), sorted(r))):
                total = sum(shares.values())
                k = min(budget, poisson_pool_size(total * self.hot_add_seconds(model), self.settings.epsilon))
                budget -= k
                for node, count in self._apportion(k, shares, model).items():
                    capped[(node, model)] = count
        return capped

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
        """Drop what is older than the idle TTL (keeps the table to the nodes in use)."""
        for key in [k for k, r in self._rates.items() if now - r.last_event > self.settings.idle_ttl_seconds]:
            del self._rates[key]
