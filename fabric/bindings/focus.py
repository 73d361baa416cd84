"""The usage record as a FOCUS cost and usage dataset: a CSV a FinOps tool loads (``GET
/api/v1/usage/focus``, ``fabric-dra usage --format focus``; docs/manager.md, "Accounting").

FOCUS is the FinOps Open Cost and Usage Specification, version 1.0
(https://focus.finops.org/focus-specification/v1-0/, columns in
github.com/FinOps-Open-Cost-and-Usage-Spec/FOCUS_Spec, ``specification/columns``). :data:`COLUMNS` is
the one list of what is written: every column 1.0 makes Mandatory (:data:`MANDATORY`), then the
Conditional and Recommended ones that apply here — consumed quantity and unit, unit prices, the
resource, the namespace as the sub-account, and ``Tags``.

One row per hour bucket x model x namespace x attribution labels x measure:

* ``device``: device-hours of claims (bound, attaching, detaching), the warm pool's devices (held for
  claims to come: no namespace, no tags — the pool's cost is nobody's yet), at the model's price per
  device-hour.
* ``partition``: GPU-hours of GPU partitions at their share of the GPU, at the GPU's price. A GPU
  serving partitions is charged through them; its own whole-device seconds (no namespace) are not
  exported, so no second is charged twice. Devices bound outside fabric-dra are not exported either.
* ``memory``: GiB-hours of memory shares at the pool model's price per GiB-hour.

Each label key keeps its top N values over the exported range (``other`` for the rest), as ``fabric-dra
usage --by label:KEY`` does. Costs are ``ListUnitPrice x PricingQuantity`` (no discounts: Billed,
Effective, Contracted and List cost agree); a model the price list does not name costs 0 and has no
unit price. Datetimes are ISO 8601 in UTC (``2026-12-01T09:00:00Z``), decimals plain (``0.750000``).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from enum import StrEnum

from fabric.bindings.attribution import OTHER, UNLABELLED, Attribution, PriceList, label_values
from fabric.bindings.usage import BUCKET, MEMORY_GIB, PARTITION, UsageBook, UsageKey, hour_of
from manager_api import models as api

__all__ = ["COLUMNS", "FOCUS_VERSION", "MANDATORY", "ColumnType", "FocusRow", "focus_csv", "focus_rows"]

#: the FOCUS version the export conforms to
FOCUS_VERSION = "1.0"


class ColumnType(StrEnum):
    STRING = "String"
    DECIMAL = "Decimal"
    DATETIME = "Date/Time"
    JSON = "JSON"


#: every column written, in order, with its FOCUS 1.0 data type
COLUMNS: tuple[tuple[str, ColumnType], ...] = (
    ("BilledCost", ColumnType.DECIMAL),
    ("BillingAccountId", ColumnType.STRING),
    ("BillingAccountName", ColumnType.STRING),
    ("BillingCurrency", ColumnType.STRING),
    ("BillingPeriodEnd", ColumnType.DATETIME),
    ("BillingPeriodStart", ColumnType.DATETIME),
    ("ChargeCategory", ColumnType.STRING),
    ("ChargeClass", ColumnType.STRING),
    ("ChargeDescription", ColumnType.STRING),
    ("ChargeFrequency", ColumnType.STRING),
    ("ChargePeriodEnd", ColumnType.DATETIME),
    ("ChargePeriodStart", ColumnType.DATETIME),
    ("ConsumedQuantity", ColumnType.DECIMAL),
    ("ConsumedUnit", ColumnType.STRING),
    ("ContractedCost", ColumnType.DECIMAL),
    ("ContractedUnitPrice", ColumnType.DECIMAL),
    ("EffectiveCost", ColumnType.DECIMAL),
    ("InvoiceIssuerName", ColumnType.STRING),
    ("ListCost", ColumnType.DECIMAL),
    ("ListUnitPrice", ColumnType.DECIMAL),
    ("PricingQuantity", ColumnType.DECIMAL),
    ("PricingUnit", ColumnType.STRING),
    ("ProviderName", ColumnType.STRING),
    ("PublisherName", ColumnType.STRING),
    ("ResourceId", ColumnType.STRING),
    ("ResourceName", ColumnType.STRING),
    ("ResourceType", ColumnType.STRING),
    ("ServiceCategory", ColumnType.STRING),
    ("ServiceName", ColumnType.STRING),
    ("SubAccountId", ColumnType.STRING),
    ("SubAccountName", ColumnType.STRING),
    ("Tags", ColumnType.JSON),
)
#: the columns FOCUS 1.0 makes Mandatory (Feature level: Mandatory), all in :data:`COLUMNS`
MANDATORY = frozenset(
    {
        "BilledCost",
        "BillingAccountId",
        "BillingAccountName",
        "BillingCurrency",
        "BillingPeriodEnd",
        "BillingPeriodStart",
        "ChargeCategory",
        "ChargeClass",
        "ChargeDescription",
        "ChargePeriodEnd",
        "ChargePeriodStart",
        "ContractedCost",
        "EffectiveCost",
        "InvoiceIssuerName",
        "ListCost",
        "PricingQuantity",
        "PricingUnit",
        "ProviderName",
        "PublisherName",
        "ServiceCategory",
        "ServiceName",
    }
)

_SERVICE = "fabric-dra"
_QUANTITY = Decimal("0.000001")
_HOUR = Decimal(3600)
#: device states charged as device-hours (outside fabric-dra: not ours to charge)
_DEVICE_STATES = frozenset({"bound", "attaching", "detaching", "warm"})


class _Measure(StrEnum):
    DEVICE = "device"
    PARTITION = "partition"
    MEMORY = "memory"


_UNITS = {_Measure.DEVICE: "Device-Hours", _Measure.PARTITION: "GPU-Hours", _Measure.MEMORY: "GiB-Hours"}
_RESOURCE_TYPES = {
    _Measure.DEVICE: "PCIe/CXL device",
    _Measure.PARTITION: "GPU partition",
    _Measure.MEMORY: "Memory share",
}


@dataclass(frozen=True)
class _Group:
    hour: datetime
    model: str
    namespace: str
    #: (key, value) of the attribution labels, capped
    tags: tuple[tuple[str, str], ...]
    measure: _Measure
    #: a warm device's (no claim)
    warm: bool


FocusRow = dict[str, str]


def _measure(key: UsageKey) -> _Measure | None:
    if key.state == PARTITION:
        return _Measure.PARTITION
    if key.state == MEMORY_GIB:
        return _Measure.MEMORY
    if key.state not in _DEVICE_STATES or (key.state != "warm" and not key.namespace):
        return None  # outside fabric-dra, or a GPU charged through its partitions
    return _Measure.DEVICE


def _in_range(
    book: UsageBook, since: datetime, until: datetime
) -> Iterable[tuple[datetime, UsageKey, float]]:
    start = hour_of(since)
    for hour, rows in sorted(book.hours.items()):
        if start <= hour < until:
            for key, seconds in rows.items():
                yield hour, key, seconds


def _capping(
    book: UsageBook, since: datetime, until: datetime, attribution: Attribution
) -> dict[str, dict[str, str]]:
    """key → value → the name it is exported under (top N by device-seconds over the range)."""
    seconds: dict[str, dict[str, float]] = {key: {} for key in attribution.keys}
    for _hour, key, s in _in_range(book, since, until):
        if key.state not in api.USAGE_STATES:
            continue
        for name, value in label_values(key.labels).items():
            if name in seconds:
                seconds[name][value] = seconds[name].get(value, 0.0) + s
    return {name: attribution.cap(name, values) for name, values in seconds.items()}


def focus_rows(book: UsageBook, since: datetime, until: datetime, attribution: Attribution) -> list[FocusRow]:
    """The rows of the hours from the one ``since`` falls in up to ``until`` (exclusive)."""
    capping = _capping(book, since, until, attribution)
    quantities: dict[_Group, float] = {}
    for hour, key, seconds in _in_range(book, since, until):
        measure = _measure(key)
        if measure is None:
            continue
        tags = tuple(
            sorted(
                (name, capping.get(name, {}).get(value, OTHER))
                for name, value in label_values(key.labels).items()
                if name in attribution.keys and value != UNLABELLED
            )
        )
        group = _Group(hour, key.model, key.namespace, tags, measure, key.state == "warm")
        quantities[group] = quantities.get(group, 0.0) + seconds
    prices = attribution.prices or PriceList()
    return [
        _row(group, quantity, prices)
        for group, quantity in sorted(quantities.items(), key=lambda item: _order(item[0]))
    ]


def _order(group: _Group) -> tuple[datetime, str, str, tuple[tuple[str, str], ...], str, bool]:
    return (group.hour, group.model, group.namespace, group.tags, str(group.measure), group.warm)


def _row(group: _Group, seconds: float, prices: PriceList) -> FocusRow:
    hours = (Decimal(repr(seconds)) / _HOUR).quantize(_QUANTITY, ROUND_HALF_EVEN)
    unit_price, currency = prices.price(group.model)
    cost = (unit_price or Decimal(0)) * hours
    cost_text = _decimal(cost)
    period_start = group.hour.replace(day=1, hour=0)
    period_end = (period_start + timedelta(days=32)).replace(day=1)
    unit = _UNITS[group.measure]
    what = "warm pool device (held for claims)" if group.warm else _RESOURCE_TYPES[group.measure]
    return {
        "BilledCost": cost_text,
        "BillingAccountId": prices.billing_account_id,
        "BillingAccountName": prices.billing_account_id,
        "BillingCurrency": currency,
        "BillingPeriodEnd": _when(period_end),
        "BillingPeriodStart": _when(period_start),
        "ChargeCategory": "Usage",
        "ChargeClass": "",
        "ChargeDescription": f"{group.model}: {what}, {unit}",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodEnd": _when(group.hour + BUCKET),
        "ChargePeriodStart": _when(group.hour),
        "ConsumedQuantity": _decimal(hours),
        "ConsumedUnit": unit,
        "ContractedCost": cost_text,
        "ContractedUnitPrice": _decimal(unit_price) if unit_price is not None else "",
        "EffectiveCost": cost_text,
        "InvoiceIssuerName": prices.provider_name,
        "ListCost": cost_text,
        "ListUnitPrice": _decimal(unit_price) if unit_price is not None else "",
        "PricingQuantity": _decimal(hours),
        "PricingUnit": unit,
        "ProviderName": prices.provider_name,
        "PublisherName": prices.provider_name,
        "ResourceId": f"{group.model}/{group.measure}",
        "ResourceName": group.model,
        "ResourceType": _RESOURCE_TYPES[group.measure],
        "ServiceCategory": "Compute",
        "ServiceName": _SERVICE,
        "SubAccountId": group.namespace,
        "SubAccountName": group.namespace,
        "Tags": json.dumps(dict(group.tags), sort_keys=True, separators=(",", ":")),
    }


def _when(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _decimal(value: Decimal) -> str:
    return format(value.quantize(_QUANTITY, ROUND_HALF_EVEN), "f")


def focus_csv(rows: list[FocusRow]) -> str:
    """``rows`` as CSV under the header of :data:`COLUMNS` (the header alone when there are none)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([name for name, _type in COLUMNS])
    for row in rows:
        writer.writerow([row[name] for name, _type in COLUMNS])
    return buffer.getvalue()
