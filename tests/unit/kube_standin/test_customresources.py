"""The pieces of the API test server's CRD support that need no server: duration and date-time
formats, printer-column JSONPaths, schema validation/pruning/defaults and the structural checks."""

from __future__ import annotations

from typing import Any

import pytest

from kube_standin.apiserver.customresources.definitions import check_schema
from kube_standin.apiserver.customresources.durations import parse_date_time, parse_duration_nanos
from kube_standin.apiserver.customresources.printcolumns import read_path
from kube_standin.apiserver.customresources.structural import apply_defaults, compile_schema, prune, validate
from kube_standin.apiserver.fielderrors import FieldErrors

HOUR = 3600 * 10**9


@pytest.mark.parametrize(
    ("text", "nanos"),
    [
        ("1h", HOUR),
        ("1h30m", HOUR + 30 * 60 * 10**9),
        ("1.5h", HOUR * 3 // 2),
        ("300ms", 300 * 10**6),
        ("-2s", -2 * 10**9),
        ("0", 0),
        ("7d", 7 * 24 * HOUR),  # strfmt's units, beyond Go's
        ("2w", 14 * 24 * HOUR),
        ("3 days", 3 * 24 * HOUR),
        ("744h", 744 * HOUR),
        ("1.5d", 5 * 24 * HOUR),  # strfmt finds "5d" in it: as lenient as the real server
    ],
)
def test_durations_parse_as_kube_openapi_strfmt(text: str, nanos: int) -> None:
    assert parse_duration_nanos(text) == nanos


@pytest.mark.parametrize("text", ["forever", "", "h", "1y", "10", "99999999999999999999h"])
def test_what_is_no_duration(text: str) -> None:
    assert parse_duration_nanos(text) is None


def test_date_times_are_rfc3339() -> None:
    assert parse_date_time("2026-12-06T10:00:00Z") is not None
    assert parse_date_time("2026-12-06T10:00:00.123456789+02:00") is not None
    assert parse_date_time("2026-12-06") is None
    assert parse_date_time("2026-13-06T10:00:00Z") is None


def test_printer_column_paths() -> None:
    obj = {
        "spec": {"tree": {"label": {"key": "k"}}},
        "status": {"conditions": [{"type": "Other", "status": "False"}, {"type": "Ready", "status": "True"}]},
    }
    assert read_path(obj, ".spec.tree.label.key") == "k"
    assert read_path(obj, ".spec.tree.owner.kind") is None
    assert read_path(obj, '.status.conditions[?(@.type=="Ready")].status') == "True"
    assert read_path(obj, ".status.conditions[0].type") == "Other"
    assert read_path(obj, ".status.conditions[5].type") is None


SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "properties": {
                "size": {"x-kubernetes-int-or-string": True},
                "ratio": {"type": "number", "maximum": 1, "exclusiveMaximum": True},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "mode": {"type": "string", "default": "fast"},
                "note": {"type": "string", "nullable": True},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "labels": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
            },
        }
    },
}


def _errors(value: Any) -> list[tuple[str, str, str]]:
    errs = FieldErrors()
    validate(compile_schema(SCHEMA), value, "", errs)
    return [(c.field, c.reason, c.message) for c in errs.causes]


def test_schema_validation_messages() -> None:
    assert _errors({"spec": {"size": 3}}) == []
    assert _errors({"spec": {"size": "3Gi", "note": None}}) == []
    assert _errors({"spec": {"size": True}}) == [
        (
            "spec.size",
            "FieldValueTypeInvalid",
            'Invalid value: "boolean": spec.size in body must be of type integer,string: "boolean"',
        )
    ]
    assert _errors({"spec": {"ratio": 1}}) == [
        ("spec.ratio", "FieldValueInvalid", "Invalid value: 1: spec.ratio in body should be less than 1")
    ]
    assert _errors({"spec": {"tags": ["a", "b", "a"]}}) == [
        ("spec.tags[2]", "FieldValueDuplicate", 'Duplicate value: "a"')
    ]
    assert _errors({"spec": {"labels": {"team": "long"}}}) == [
        ("spec.labels[team]", "FieldValueTooLong", "Too long: may not be more than 3 bytes")
    ]


def test_pruning_and_defaults() -> None:
    node = compile_schema(SCHEMA)
    unknown: list[str] = []
    obj = {
        "apiVersion": "x/v1",
        "kind": "X",
        "metadata": {"name": "a", "labels": {"k": "v"}},
        "spec": {"size": 1, "bogus": 1, "free": {"anything": [1]}, "mode": None, "note": None},
        "extra": True,
    }
    pruned = prune(node, obj, "", unknown, root=True)
    assert sorted(unknown) == ["extra", "spec.bogus"]
    assert pruned["metadata"] == {"name": "a", "labels": {"k": "v"}}
    assert pruned["spec"]["free"] == {"anything": [1]}
    defaulted = apply_defaults(node, pruned)
    assert defaulted["spec"]["mode"] == "fast"  # a null where the field is not nullable: the default
    assert defaulted["spec"]["note"] is None  # nullable: kept


@pytest.mark.parametrize(
    ("schema", "field", "message"),
    [
        (
            {"type": "object", "properties": {"n": {"type": "string", "x-kubernetes-int-or-string": True}}},
            "s.properties[n].type",
            "must be empty if x-kubernetes-int-or-string is true",
        ),
        (
            {"type": "object", "x-kubernetes-preserve-unknown-fields": False},
            "s.x-kubernetes-preserve-unknown-fields",
            "must be true or undefined",
        ),
        (
            {
                "type": "object",
                "properties": {"metadata": {"type": "object", "properties": {"labels": {"type": "object"}}}},
            },
            "s.properties[metadata]",
            "must not specify anything other than name and generateName",
        ),
        (
            {
                "type": "object",
                "properties": {
                    "l": {"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object"}}
                },
            },
            "s.properties[l].x-kubernetes-list-map-keys",
            "must not be empty if x-kubernetes-list-type is map",
        ),
        (
            {
                "type": "object",
                "properties": {"l": {"type": "array", "uniqueItems": True, "items": {"type": "string"}}},
            },
            "s.properties[l].uniqueItems",
            "uniqueItems cannot be set to true",
        ),
        (
            {"type": "object", "properties": {"l": {"type": "array"}}},
            "s.properties[l].items",
            "must be specified",
        ),
        (
            {"type": "object", "properties": {"n": {"type": "integer", "default": "x"}}},
            "s.properties[n].default",
            "must be of type integer",
        ),
        (
            {"type": "object", "anyOf": [{"type": "object"}]},
            "s.anyOf[0].type",
            "must be empty to be structural",
        ),
        (
            {"type": "object", "properties": {"r": {"$ref": "#/definitions/x"}}},
            "s.properties[r].$ref",
            "$ref is not supported",
        ),
    ],
    ids=[
        "int-or-string-typed",
        "preserve-false",
        "metadata",
        "map-without-keys",
        "unique-items",
        "array-without-items",
        "bad-default",
        "typed-anyOf",
        "ref",
    ],
)
def test_structural_schema_checks(schema: dict[str, Any], field: str, message: str) -> None:
    errs = FieldErrors()
    check_schema(errs, schema, "s", root=True)
    assert any(c.field == field and message in c.message for c in errs.causes), errs.causes


def test_a_structural_schema_passes() -> None:
    errs = FieldErrors()
    check_schema(errs, SCHEMA, "s", root=True)
    assert errs.causes == []
