"""What the warm pool keeps: the policy's settings, which devices and nodes it covers, and how big
it should be — a fixed size, or sized from demand (``auto``).

**Fixed.** ``--warm-size N``: every node the policy covers keeps N matching devices warm.

**Auto.** For each node and model, the pool only has to cover the claims that arrive while the
replacement of a taken warm device is being hot-added. With arrivals Poisson at rate λ (claims per
second, exponentially weighted with half-life ``rate_half_life_seconds``) and a hot-add taking T
seconds (the p95 of the model's recent attaches), the claims arriving during one refill number
N ~ Poisson(λ·T), and the pool keeps the smallest k with P(N > k) ≤ ε (:func:`poisson_pool_size`).
It is capped per model (``max_per_model``, over all nodes) and by the free devices there are, and
falls to zero once a node has seen no claim of the model for ``idle_ttl_seconds``.
docs/manager.md ("Warm devices") states the model's assumptions.

Pure: no I/O, no clock of its own (callers pass ``now``), so it is unit-tested directly.
"""

from __future__ import annotations

import fnmatch
import math
from collections import deque
from collections.abc import Iterable
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

    def covers_device(self, record: DeviceRecord) -> bool:
        """The device is of the policy's kind and fit to serve (available, healthy)."""
        a = record.attributes
        if self.device_type is not None and a.type is not self.device_type:
            return False
        if self.model is not None and a.model != self.model:
            return False
        return a.available and a.health is not Health.CRITICAL

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


@dataclass
class DemandTracker:
    """Claim arrivals per (node, model) and hot-add times per model, for the ``auto`` size."""

    settings: WarmSettings
    #: attaches remembered per model for the p95
    window: int = 50
    _rates: dict[tuple[str, str], _Rate] = field(default_factory=dict)
    _attaches: dict[str, deque[float]] = field(default_factory=dict)

    @property
    def _tau(self) -> float:
        return self.settings.rate_half_life_seconds / math.log(2)

    def arrival(self, node: str, model: str, now: float) -> None:
        rate = self._rates.setdefault((node, model), _Rate(at=now))
        rate.value = rate.decayed(now, self._tau) + 1.0 / self._tau
        rate.at = rate.last_event = now

    def attached(self, model: str, seconds: float) -> None:
        self._attaches.setdefault(model, deque(maxlen=self.window)).append(seconds)

    def rate(self, node: str, model: str, now: float) -> float:
        """λ: claims per second of ``model`` on ``node``."""
        rate = self._rates.get((node, model))
        return 0.0 if rate is None else rate.decayed(now, self._tau)

    def hot_add_seconds(self, model: str) -> float:
        """T: the p95 of the model's recent attaches (nearest rank), or the configured guess."""
        seen = sorted(self._attaches.get(model, ()))
        if not seen:
            return self.settings.default_attach_seconds
        return seen[min(len(seen) - 1, math.ceil(0.95 * len(seen)) - 1)]

    def targets(self, now: float) -> dict[tuple[str, str], int]:
        """(node, model) → devices to keep warm: the Poisson size, zero after the idle TTL, and
        each model's total capped at ``max_per_model`` (the nodes with the most demand first)."""
        wanted: dict[tuple[str, str], int] = {}
        for (node, model), rate in self._rates.items():
            if now - rate.last_event > self.settings.idle_ttl_seconds:
                continue
            mean = self.rate(node, model, now) * self.hot_add_seconds(model)
            wanted[(node, model)] = poisson_pool_size(mean, self.settings.epsilon)
        budget: dict[str, int] = {}
        capped: dict[tuple[str, str], int] = {}
        for key in sorted(wanted, key=lambda k: (-self.rate(k[0], k[1], now), k)):
            left = self.settings.max_per_model - budget.get(key[1], 0)
            capped[key] = max(0, min(wanted[key], left))
            budget[key[1]] = budget.get(key[1], 0) + capped[key]
        return capped

    def forget_idle(self, now: float) -> None:
        """Drop what is older than the idle TTL (keeps the table to the nodes in use)."""
        for key in [k for k, r in self._rates.items() if now - r.last_event > self.settings.idle_ttl_seconds]:
            del self._rates[key]
