"""Attribution: device-seconds by the claims' labels, with the values of each label key bounded, and the
price list that turns them into cost (docs/manager.md, "Accounting").

* **Which labels.** The keys an operator names (``--attribution-label KEY``, repeatable) are read from
  the ResourceClaim's ``metadata.labels`` as the manager's informer of claims sees it. A claim made
  from a pod's ``resourceClaimTemplate`` carries the template's labels (Kubernetes copies them into
  the claim). The pod's own labels are not read: the manager has no ``get`` on pods, and reading one
  per claim would cost a request per attach (as the owner chain would; :mod:`fabric.bindings.usage`).
* **Kept with the seconds.** A claim's values of those keys are one string, canonical JSON
  (:func:`claim_labels`), a field of the usage key: the durable record keeps them beside namespace
  and workload, so a report by label reads the same after a restart.
* **Bounded.** Each key keeps its top :attr:`Attribution.values_max` values by device-seconds over what
  is reported; the rest are summed as ``other`` (:data:`OTHER`), and the first time a key is capped the
  manager logs a warning once (:meth:`Attribution.cap`). The Prometheus counter keeps the first
  ``values_max`` values it exported per key and sums every later one under ``other``, so each series
  only grows (:meth:`Attribution.counter_value`).
* **Priced.** ``--price-list FILE`` (:class:`PriceList`): per model a price per hour — per device-hour,
  for a GPU partition at its share of the GPU, for a memory pool per GiB-hour — and its currency.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from decimal import Decimal
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fabric.errors import ConfigError
from plumbing.kube.dra import ResourceClaim
from plumbing.logs import get_logger
from plumbing.names import is_qualified_name

__all__ = [
    "OTHER",
    "UNLABELLED",
    "Attribution",
    "ModelPrice",
    "PriceList",
    "attributed_seconds",
    "claim_labels",
    "label_values",
    "load_price_list",
    "top_values",
]

log = get_logger(__name__)

#: the value every value beyond a key's top N is summed under
OTHER = "other"
#: the group of seconds with no value for a key (warm devices, claims without the label)
UNLABELLED = ""
#: ``--attribution-values-max``' default: values kept per key
DEFAULT_VALUES_MAX = 50
#: a label key: ``[prefix/]name`` (Kubernetes' qualified name; the prefix a DNS subdomain)
LABEL_KEY_MAX_LENGTH = 317


def check_label_key(key: str) -> str:
    """``key`` when it is a Kubernetes label key; ValueError (one line) when not."""
    if not is_qualified_name(key):
        raise ValueError(
            f"'{key[:80]}' is no Kubernetes label key ([prefix/]name, e.g. team or example.com/tier)"
        )
    return key


def claim_labels(claim: ResourceClaim, keys: tuple[str, ...]) -> str:
    """The values of ``keys`` on ``claim``, as canonical JSON (sorted, compact); "" when it has none."""
    found = {key: claim.metadata.labels[key] for key in keys if key in claim.metadata.labels}
    return json.dumps(found, sort_keys=True, separators=(",", ":")) if found else ""


@lru_cache(maxsize=4096)
def _parsed(text: str) -> tuple[tuple[str, str], ...]:
    try:
        loaded = json.loads(text) if text else {}
    except ValueError:
        return ()
    if not isinstance(loaded, dict):
        return ()
    return tuple((str(k), str(v)) for k, v in sorted(loaded.items()))


def label_values(text: str) -> dict[str, str]:
    """The labels :func:`claim_labels` wrote (an unreadable string: none)."""
    return dict(_parsed(text))


def top_values(seconds: dict[str, float], limit: int) -> set[str]:
    """The ``limit`` values with the most seconds (ties: by name); :data:`UNLABELLED` is no value and
    is never counted against the limit."""
    ranked = sorted((v for v in seconds if v != UNLABELLED), key=lambda v: (-seconds[v], v))
    return set(ranked[:limit])


@dataclass
class Attribution:
    """The label keys seconds are attributed to, and how many values of each are kept."""

    keys: tuple[str, ...] = ()
    values_max: int = DEFAULT_VALUES_MAX
    prices: PriceList | None = None
    #: keys already warned about being capped (once each per process)
    _warned: set[str] = field(default_factory=set)
    #: key → the values the Prometheus counter gives a series of their own
    _exported: dict[str, set[str]] = field(default_factory=dict)

    def cap(self, key: str, seconds: dict[str, float]) -> dict[str, str]:
        """value → the name it is reported under: itself when among the top :attr:`values_max` by
        ``seconds``, else :data:`OTHER` (logged once per key)."""
        kept = top_values(seconds, self.values_max)
        named = {v: (v if v in kept or v == UNLABELLED else OTHER) for v in seconds}
        capped = sum(1 for v in named.values() if v == OTHER)
        if capped and key not in self._warned:
            self._warned.add(key)
            log.warning(
                "attribution label capped: its further values are reported as other",
                key=key,
                values=len(seconds),
                kept=self.values_max,
                other=capped,
            )
        return named

    def counter_value(self, key: str, value: str) -> str:
        """The counter's label for ``value`` of ``key``: its own while fewer than :attr:`values_max`
        values have one, else :data:`OTHER` — a value once given a series keeps it, so no series
        ever goes down."""
        if value == UNLABELLED:
            return value
        exported = self._exported.setdefault(key, set())
        if value in exported:
            return value
        if len(exported) < self.values_max:
            exported.add(value)
            return value
        if key not in self._warned:
            self._warned.add(key)
            log.warning(
                "attribution label capped: its further values are counted as other",
                key=key,
                kept=self.values_max,
            )
        return OTHER


def attributed_seconds(
    label_totals: dict[tuple[str, str, str], float], attribution: Attribution
) -> dict[tuple[str, str, str, str], float]:
    """Lifetime seconds by (label key, value, model, state) — the counter's series — from the usage
    record's totals by (labels, model, state); each key's values beyond the first N exported as
    :data:`OTHER`. Values are taken in the order of most seconds, so a restart's first scrape keeps
    the top N."""
    found: dict[tuple[str, str, str, str], float] = {}
    for labels, model, state, seconds in sorted(
        ((*k, s) for k, s in label_totals.items()), key=lambda row: (-row[3], row[:3])
    ):
        for key, value in label_values(labels).items():
            if key in attribution.keys:
                series = (key, attribution.counter_value(key, value), model, state)
                found[series] = found.get(series, 0.0) + seconds
    return found


# -- the price list ----------------------------------------------------------------------------------


class ModelPrice(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    #: per device-hour; a GPU's partitions at their share of it; a memory pool's per GiB-hour
    per_hour: Decimal = Field(alias="perHour", ge=0, max_digits=20, decimal_places=10)
    #: ISO 4217 (FOCUS BillingCurrency); the list's ``currency`` when not given
    currency: str | None = Field(default=None, pattern=r"^[A-Z]{3}$")


class PriceList(BaseModel):
    """``--price-list FILE``: ``{currency: USD, models: {<model>: {perHour: 2.5}}}``, and optionally
    ``billingAccountId`` and ``providerName`` for the FOCUS export."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")
    billing_account_id: str = Field(
        default="fabric-dra", alias="billingAccountId", min_length=1, max_length=253
    )
    provider_name: str = Field(default="fabric-dra", alias="providerName", min_length=1, max_length=253)
    models: dict[str, ModelPrice] = Field(default_factory=dict)

    def price(self, model: str) -> tuple[Decimal | None, str]:
        """(price per hour or None when the list has none, currency) of ``model``."""
        found = self.models.get(model)
        if found is None:
            return None, self.currency
        return found.per_hour, found.currency or self.currency


def load_price_list(path: Path) -> PriceList:
    """The price list in ``path``; :class:`ConfigError` (one line) when it cannot be read or is wrong."""
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"--price-list {path}: cannot read it: {err.strerror}") from None
    except yaml.YAMLError:
        raise ConfigError(f"--price-list {path}: not YAML/JSON") from None
    try:
        return PriceList.model_validate(raw if raw is not None else {})
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top)"
        raise ConfigError(f"--price-list {path}: {where}: {first['msg']}") from None
