"""Attribution by claim labels (bounded values, the counter's series, the record) and the FOCUS export
(its columns against the FOCUS 1.0 column list, its types, its costs). With real processes across a
restart: tests/integration/fabric/test_attribution_restart.py."""

from __future__ import annotations

import csv
import io
import json
import logging
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import pytest

from fabric.bindings.attribution import (
    OTHER,
    Attribution,
    attributed_seconds,
    claim_labels,
    label_values,
    load_price_list,
    top_values,
)
from fabric.bindings.focus import COLUMNS, MANDATORY, ColumnType, focus_csv, focus_rows
from fabric.bindings.usage import UsageBook, UsageKey, UsageRecord
from fabric.commands.usage import parse_by
from fabric.errors import ConfigError
from manager_api import models as api
from plumbing.cli import CliError
from plumbing.kube.dra import ResourceClaim

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
KEYS = ("client", "tier")

#: FOCUS 1.0's Mandatory columns as the specification lists them (focus.finops.org, v1.0; the
#: FOCUS_Spec repository's specification/columns, "Feature level: Mandatory"), typed here again so
#: that a column dropped from the export's list fails
FOCUS_1_0_MANDATORY = {
    "BilledCost": "Decimal",
    "BillingAccountId": "String",
    "BillingAccountName": "String",
    "BillingCurrency": "String",
    "BillingPeriodEnd": "Date/Time",
    "BillingPeriodStart": "Date/Time",
    "ChargeCategory": "String",
    "ChargeClass": "String",
    "ChargeDescription": "String",
    "ChargePeriodEnd": "Date/Time",
    "ChargePeriodStart": "Date/Time",
    "ContractedCost": "Decimal",
    "EffectiveCost": "Decimal",
    "InvoiceIssuerName": "String",
    "ListCost": "Decimal",
    "PricingQuantity": "Decimal",
    "PricingUnit": "String",
    "ProviderName": "String",
    "PublisherName": "String",
    "ServiceCategory": "String",
    "ServiceName": "String",
}
_UTC_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
_DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")


def _labels(**values: str) -> str:
    return json.dumps(values, sort_keys=True, separators=(",", ":"))


def _claim(labels: dict[str, str]) -> ResourceClaim:
    claim = ResourceClaim.read({"metadata": {"name": "c", "namespace": "ns", "uid": "u", "labels": labels}})
    assert claim is not None
    return claim


def test_only_the_configured_keys_of_a_claims_labels_are_kept_canonically() -> None:
    claim = _claim({"tier": "gold", "client": "acme", "unrelated": "x"})
    assert claim_labels(claim, KEYS) == '{"client":"acme","tier":"gold"}'
    assert claim_labels(_claim({"unrelated": "x"}), KEYS) == ""
    assert label_values(claim_labels(claim, KEYS)) == {"client": "acme", "tier": "gold"}
    assert label_values("{broken") == {}


def test_the_top_values_by_seconds_are_kept_and_the_rest_is_other_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seconds = {f"client-{i:03d}": float(i) for i in range(120)} | {"": 1e9}
    assert top_values(seconds, 3) == {"client-119", "client-118", "client-117"}
    attribution = Attribution(keys=("client",), values_max=50)
    with caplog.at_level(logging.WARNING):
        named = attribution.cap("client", seconds)
        attribution.cap("client", seconds)
    kept = {v for v in named.values() if v not in (OTHER, "")}
    assert len(kept) == 50 and min(kept) == "client-070"
    assert sum(1 for v in named.values() if v == OTHER) == 70
    assert named[""] == ""  # no value is never capped
    warnings = [r for r in caplog.records if "capped" in r.getMessage()]
    assert len(warnings) == 1


def test_a_book_grouped_by_label_caps_its_values_and_sums_the_rest_as_other() -> None:
    book = UsageBook()
    for i in range(5):
        key = UsageKey("ns", "H100", f"Pod/p-{i}", "bound", _labels(client=f"c{i}"))
        book.add(key, T0, T0 + timedelta(seconds=100 * (i + 1)))
    book.add(UsageKey("", "H100", "", "warm"), T0, T0 + timedelta(seconds=7))
    groups = {
        g.name: g.total
        for g in book.groups(
            T0, api.UsageGrouping.LABEL, "client", Attribution(keys=("client",), values_max=2)
        )
    }
    assert groups == {"c4": 500.0, "c3": 400.0, OTHER: 600.0, "": 7.0}


def test_the_counter_keeps_a_series_once_given_so_none_goes_down() -> None:
    attribution = Attribution(keys=("client",), values_max=2)
    totals = {(_labels(client="a"), "H100", "bound"): 30.0, (_labels(client="b"), "H100", "bound"): 20.0}
    first = attributed_seconds(totals, attribution)
    assert first == {("client", "a", "H100", "bound"): 30.0, ("client", "b", "H100", "bound"): 20.0}
    # A third value with more seconds comes later: it is other, a and b keep their series.
    totals[(_labels(client="c"), "H100", "bound")] = 99.0
    second = attributed_seconds(totals, attribution)
    assert second[("client", OTHER, "H100", "bound")] == 99.0
    assert second[("client", "a", "H100", "bound")] == 30.0


def test_a_record_keeps_the_labels_and_reads_one_written_before_them() -> None:
    book = UsageBook(counted_until=T0 + timedelta(hours=1))
    labelled = UsageKey("ns", "H100", "Pod/p", "bound", _labels(client="acme"))
    plain = UsageKey("ns", "H100", "Pod/q", "bound")
    book.add(labelled, T0, T0 + timedelta(seconds=60))
    book.add(plain, T0, T0 + timedelta(seconds=30))
    record = book.to_record()
    assert sorted(len(k) for k in record.keys) == [4, 5]  # no labels: the earlier form
    again = UsageBook.from_record(UsageRecord.model_validate_json(record.model_dump_json(by_alias=True)))
    assert again == book
    assert again.label_totals == {(_labels(client="acme"), "H100", "bound"): 60.0}
    old = UsageRecord.model_validate(
        {"kind": "FabricDraUsage", "version": 1, "keys": [["ns", "H100", "Pod/q", "bound"]], "buckets": {}}
    )
    assert UsageBook.from_record(old).label_totals == {}


# -- the price list ----------------------------------------------------------------------------------


def test_a_price_list_reads_and_a_wrong_one_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text(
        "currency: EUR\nmodels:\n  H100: {perHour: 2.5}\n  CXL-256: {perHour: 0.01, currency: USD}\n"
    )
    prices = load_price_list(path)
    assert prices.price("H100") == (Decimal("2.5"), "EUR")
    assert prices.price("CXL-256") == (Decimal("0.01"), "USD")
    assert prices.price("L40S") == (None, "EUR")
    for text, word in [
        ("models:\n  H100: {perHour: -1}\n", "models.H100.perHour"),
        ("models:\n  H100: {perHour: 1, currency: euro}\n", "currency"),
        ("currency: [\n", "not YAML"),
        ("models: {H100: {price: 1}}\n", "H100"),
    ]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=re.escape(word)) as err:
            load_price_list(path)
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_price_list(tmp_path / "missing.yaml")


# -- FOCUS -------------------------------------------------------------------------------------------


def test_the_header_is_the_column_list_with_every_focus_1_0_mandatory_column() -> None:
    header = next(csv.reader(io.StringIO(focus_csv([]))))
    assert header == [name for name, _type in COLUMNS]
    assert len(set(header)) == len(header)
    types = dict(COLUMNS)
    assert set(FOCUS_1_0_MANDATORY) == MANDATORY
    for name, kind in FOCUS_1_0_MANDATORY.items():
        assert types[name] == kind, name
    assert all(re.fullmatch(r"[A-Z][A-Za-z]+", name) for name in header)  # no custom column unprefixed


def test_an_export_over_a_range_with_no_data_is_the_header_only() -> None:
    book = UsageBook()
    book.add(UsageKey("ns", "H100", "Pod/p", "bound"), T0, T0 + timedelta(hours=1))
    later = T0 + timedelta(days=2)
    text = focus_csv(focus_rows(book, later, later + timedelta(hours=3), Attribution()))
    assert text.count("\n") == 1 and text.startswith("BilledCost,")


def _export(book: UsageBook, attribution: Attribution) -> list[dict[str, str]]:
    text = focus_csv(focus_rows(book, T0, T0 + timedelta(hours=3), attribution))
    return list(csv.DictReader(io.StringIO(text)))


def test_rows_per_hour_model_group_and_measure_with_types_costs_and_tags(tmp_path: Path) -> None:
    path = tmp_path / "prices.yaml"
    path.write_text("currency: USD\nmodels:\n  H100: {perHour: 4}\n  CXL-256: {perHour: 0.5}\n")
    attribution = Attribution(keys=("client", "tier"), values_max=1, prices=load_price_list(path))
    book = UsageBook()
    acme = _labels(client="acme", tier="gold")
    # 90 minutes bound from 10:30: 30 min in the 10:00 hour, 60 in the 11:00 hour.
    book.add(
        UsageKey("team-a", "H100", "Pod/p", "bound", acme),
        T0 + timedelta(minutes=30),
        T0 + timedelta(hours=2),
    )
    book.add(
        UsageKey("team-b", "H100", "Pod/q", "bound", _labels(client="small")), T0, T0 + timedelta(minutes=6)
    )
    book.add(UsageKey("", "H100", "", "warm"), T0, T0 + timedelta(minutes=15))
    book.add(UsageKey("", "H100", "", "outside"), T0, T0 + timedelta(hours=1))  # not ours to charge
    book.add(UsageKey("", "H100", "", "bound"), T0, T0 + timedelta(hours=1))  # a GPU hosting partitions
    book.add(UsageKey("team-a", "H100", "Pod/r", "partition", acme), T0, T0 + timedelta(hours=1), 0.125)
    book.add(UsageKey("team-a", "CXL-256", "Pod/m", "memory-gib", acme), T0, T0 + timedelta(hours=1), 16)
    rows = _export(book, attribution)
    types = dict(COLUMNS)
    for row in rows:
        for name, value in row.items():
            if types[name] is ColumnType.DATETIME:
                assert _UTC_DATETIME.match(value), (name, value)
            elif types[name] is ColumnType.DECIMAL and value:
                assert _DECIMAL.match(value), (name, value)
            elif types[name] is ColumnType.JSON:
                assert isinstance(json.loads(value), dict)
        assert row["ChargeCategory"] == "Usage" and row["ChargeClass"] == ""
        assert row["BillingPeriodStart"] == "2026-03-01T00:00:00Z"
        assert row["BillingPeriodEnd"] == "2026-04-01T00:00:00Z"
        assert row["BilledCost"] == row["EffectiveCost"] == row["ListCost"] == row["ContractedCost"]
        assert Decimal(row["ListCost"]) == Decimal(row["ListUnitPrice"]) * Decimal(row["PricingQuantity"])
    seen = {
        (r["ChargePeriodStart"][11:16], r["ResourceName"], r["SubAccountId"], r["ConsumedUnit"], r["Tags"]): (
            r["ConsumedQuantity"],
            r["BilledCost"],
        )
        for r in rows
    }
    gold = '{"client":"acme","tier":"gold"}'
    assert seen == {
        ("10:00", "H100", "team-a", "Device-Hours", gold): ("0.500000", "2.000000"),
        ("11:00", "H100", "team-a", "Device-Hours", gold): ("1.000000", "4.000000"),
        # values_max 1: acme has the most seconds, small is other
        ("10:00", "H100", "team-b", "Device-Hours", '{"client":"other"}'): ("0.100000", "0.400000"),
        ("10:00", "H100", "", "Device-Hours", "{}"): ("0.250000", "1.000000"),
        ("10:00", "H100", "team-a", "GPU-Hours", gold): ("0.125000", "0.500000"),
        ("10:00", "CXL-256", "team-a", "GiB-Hours", gold): ("16.000000", "8.000000"),
    }
    assert {r["ChargePeriodEnd"][11:16] for r in rows if r["ChargePeriodStart"][11:16] == "10:00"} == {
        "11:00"
    }


def test_a_model_without_a_price_costs_nothing_and_has_no_unit_price() -> None:
    book = UsageBook()
    book.add(UsageKey("ns", "L40S", "Pod/p", "bound"), T0, T0 + timedelta(hours=1))
    (row,) = _export(book, Attribution())
    assert (row["BilledCost"], row["ListUnitPrice"], row["BillingCurrency"]) == ("0.000000", "", "USD")
    assert row["ConsumedQuantity"] == "1.000000"


def test_the_command_line_reads_by_label_key() -> None:
    assert parse_by("label:client") == (api.UsageGrouping.LABEL, "client")
    assert parse_by("label:example.com/tier") == (api.UsageGrouping.LABEL, "example.com/tier")
    assert parse_by("model") == (api.UsageGrouping.MODEL, None)
    for wrong in ["label:", "label", "label:bad key", "models", "model:x"]:
        with pytest.raises(CliError):
            parse_by(wrong)


def test_a_label_key_that_is_no_kubernetes_label_key_is_refused_from_any_source() -> None:
    from pydantic import ValidationError

    from fabric.service.config import ManagerSettings

    redfish = {"base_url": "https://127.0.0.1:8443"}
    good = ManagerSettings.model_validate(
        {"redfish": redfish, "attribution_labels": ["client", "example.com/tier"]}
    )
    assert good.attribution_labels == ["client", "example.com/tier"]
    with pytest.raises(ValidationError, match="is no Kubernetes label key"):
        ManagerSettings.model_validate({"redfish": redfish, "attribution_labels": ["bad key"]})
