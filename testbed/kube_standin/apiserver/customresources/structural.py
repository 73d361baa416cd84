"""One version's schema (``openAPIV3Schema``) compiled into a tree of :class:`SchemaNode`, and what
the real server does with it to a custom resource on write:

* **pruning** (``k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning/algorithm.go``): a
  field the schema does not declare is dropped, unless ``x-kubernetes-preserve-unknown-fields``;
  the dropped paths are the "unknown fields" of ``fieldValidation`` (:func:`prune`);
* **defaulting** (``.../schema/defaulting/algorithm.go``; ``PruneNonNullableNullsWithoutDefaults``
  in ``prunenulls.go``): a missing field with a ``default`` gets it, a ``null`` in a field that is
  not ``nullable`` gets its default or is dropped (:func:`apply_defaults`);
* **validation** (``k8s.io/kube-openapi/pkg/validation/validate`` through
  ``.../pkg/apiserver/validation/validation.go`` ``kubeOpenAPIResultToFieldErrors``, and
  ``.../schema/listtype/validation.go``): type, required, enum, pattern, minimum/maximum (and
  exclusive), min/maxLength, min/maxItems, min/maxProperties, the ``duration``/``date-time``/
  ``int32``/``int64`` formats, unique keys of ``x-kubernetes-list-type: map`` and items of
  ``set`` (:func:`validate`). Messages are kube-openapi's: ``spec.x in body should be greater
  than or equal to 0``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kube_standin.apiserver.customresources.durations import parse_date_time, parse_duration_nanos
from kube_standin.apiserver.fielderrors import FieldErrors
from kube_standin.apiserver.jsonobj import clone
from kube_standin.apiserver.status import Cause

__all__ = [
    "BLOCKING_REASONS",
    "SchemaNode",
    "apply_defaults",
    "child_path",
    "compile_schema",
    "go_value",
    "index_path",
    "prune",
    "validate",
]

_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1)}
#: the ErrorTypes after which the real server skips the CEL rules (``hasBlockingErr`` in
#: ``pkg/registry/customresource/strategy.go``).
BLOCKING_REASONS = frozenset(
    {
        "FieldValueNotSupported",
        "FieldValueRequired",
        "FieldValueTooLong",
        "FieldValueTooMany",
        "FieldValueTypeInvalid",
    }
)


@dataclass
class SchemaNode:
    """One node of a structural schema (``pkg/apiserver/schema/structural.go``: Generic, Extensions,
    ValueValidation), with what this server needs of it."""

    raw: Mapping[str, Any]
    type: str = ""
    format: str = ""
    nullable: bool = False
    int_or_string: bool = False
    preserve_unknown: bool = False
    embedded: bool = False
    properties: dict[str, SchemaNode] = field(default_factory=dict)
    additional: SchemaNode | None = None
    items: SchemaNode | None = None
    list_type: str = ""
    list_keys: tuple[str, ...] = ()
    rules: tuple[Mapping[str, Any], ...] = ()
    pattern: re.Pattern[str] | None = None

    @property
    def has_default(self) -> bool:
        return "default" in self.raw

    def type_name(self) -> str:
        """The CEL validator's ``sts.Type`` (empty for int-or-string), shown in rule errors."""
        return self.type


def compile_schema(raw: Mapping[str, Any]) -> SchemaNode:
    """The node tree of a schema already checked by :mod:`.definitions` (anyOf/allOf are value
    validations only and do not add fields; their ``pattern``/enum are not modelled)."""
    node = SchemaNode(
        raw=raw,
        type=str(raw.get("type") or ""),
        format=str(raw.get("format") or ""),
        nullable=bool(raw.get("nullable")),
        int_or_string=bool(raw.get("x-kubernetes-int-or-string")),
        preserve_unknown=bool(raw.get("x-kubernetes-preserve-unknown-fields")),
        embedded=bool(raw.get("x-kubernetes-embedded-resource")),
        list_type=str(raw.get("x-kubernetes-list-type") or ""),
        list_keys=tuple(raw.get("x-kubernetes-list-map-keys") or ()),
        rules=tuple(r for r in raw.get("x-kubernetes-validations") or () if isinstance(r, Mapping)),
    )
    if isinstance(raw.get("pattern"), str):
        # Go's RE2 and Python agree on the patterns CRDs use; search, as go-openapi's MatchString.
        node.pattern = re.compile(raw["pattern"])
    for name, sub in (raw.get("properties") or {}).items():
        if isinstance(sub, Mapping):
            node.properties[name] = compile_schema(sub)
    additional = raw.get("additionalProperties")
    if isinstance(additional, Mapping):
        node.additional = compile_schema(additional)
    elif additional is True:
        node.additional = SchemaNode(raw={}, preserve_unknown=True)
    if isinstance(raw.get("items"), Mapping):
        node.items = compile_schema(raw["items"])
    return node


def child_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def index_path(path: str, index: int | str) -> str:
    return f"{path}[{index}]"


# -- pruning and defaults ------------------------------------------------------------------------


def prune(node: SchemaNode, value: Any, path: str, unknown: list[str], *, root: bool = False) -> Any:
    """``value`` without the fields ``node`` does not declare (their paths added to ``unknown``).
    The root keeps ``apiVersion``, ``kind`` and ``metadata`` whatever the schema says; an embedded
    resource keeps them too."""
    if isinstance(value, dict):
        if node.preserve_unknown and not node.properties and node.additional is None:
            return value
        kept: dict[str, Any] = {}
        for key, item in value.items():
            sub = node.properties.get(key) or node.additional
            if (root or node.embedded) and key in ("apiVersion", "kind", "metadata"):
                kept[key] = item  # ObjectMeta is the generic registry's, not the schema's
            elif sub is not None:
                kept[key] = prune(sub, item, child_path(path, key), unknown)
            elif node.preserve_unknown:
                kept[key] = item
            else:
                unknown.append(child_path(path, key))
        return kept
    if isinstance(value, list) and node.items is not None:
        return [prune(node.items, item, index_path(path, i), unknown) for i, item in enumerate(value)]
    return value


def apply_defaults(node: SchemaNode, value: Any) -> Any:
    """``value`` with the schema's defaults filled in and non-nullable nulls without one dropped."""
    if isinstance(value, dict):
        for key, sub in node.properties.items():
            if key not in value and sub.has_default:
                value[key] = clone(sub.raw["default"])
            elif key in value and value[key] is None and not sub.nullable:
                if sub.has_default:
                    value[key] = clone(sub.raw["default"])
                else:
                    del value[key]
        for key, item in list(value.items()):
            sub_node = node.properties.get(key) or node.additional
            if sub_node is not None and item is not None:
                value[key] = apply_defaults(sub_node, item)
        return value
    if isinstance(value, list) and node.items is not None:
        return [apply_defaults(node.items, item) for item in value]
    return value


# -- validation ------------------------------------------------------------------------------------


def go_value(value: Any) -> str:
    """A value as ``field.Error`` prints it: strings quoted, numbers bare, a map as Go's ``%#v``."""
    if isinstance(value, dict):
        return "map[string]interface {}" + json.dumps(value, separators=(",", ":"))
    return json.dumps(value, separators=(",", ":"))


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _type_ok(node: SchemaNode, value: Any) -> bool:
    actual = _json_type(value)
    if node.int_or_string:
        return actual in ("integer", "string")
    if not node.type:
        return True
    return actual == node.type or (node.type == "number" and actual == "integer")


def validate(node: SchemaNode, value: Any, path: str, errs: FieldErrors) -> None:
    """Every violation of ``node`` by ``value`` (not null: a null reaches here only where the
    schema is ``nullable``)."""
    if value is None:
        if not node.nullable and (node.type or node.int_or_string):
            _type_invalid(errs, path, node, "null")
        return
    if not _type_ok(node, value):
        _type_invalid(errs, path, node, _json_type(value))
        return
    raw = node.raw
    if "enum" in raw and value not in raw["enum"]:
        allowed = [e if isinstance(e, str) else json.dumps(e) for e in raw["enum"]]
        errs.not_supported(path, value, allowed)
    if isinstance(value, str):
        _validate_string(node, value, path, errs)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        _validate_number(node, value, path, errs)
    elif isinstance(value, list):
        _validate_array(node, value, path, errs)
    elif isinstance(value, dict):
        _validate_object(node, value, path, errs)


def _type_invalid(errs: FieldErrors, path: str, node: SchemaNode, actual: str) -> None:
    wanted = "integer,string" if node.int_or_string else node.type
    errs.causes.append(
        Cause(
            path,
            "FieldValueTypeInvalid",
            f'Invalid value: "{actual}": {path} in body must be of type {wanted}: "{actual}"',
        )
    )


def _validate_string(node: SchemaNode, value: str, path: str, errs: FieldErrors) -> None:
    raw = node.raw
    if "maxLength" in raw and len(value) > int(raw["maxLength"]):
        errs.too_long(path, int(raw["maxLength"]))
    if "minLength" in raw and len(value) < int(raw["minLength"]):
        errs.invalid(path, value, f"{path} in body should be at least {raw['minLength']} chars long")
    if node.pattern is not None and not node.pattern.search(value):
        errs.invalid(path, value, f"{path} in body should match '{node.pattern.pattern}'")
    bad_format = (node.format == "duration" and parse_duration_nanos(value) is None) or (
        node.format == "date-time" and parse_date_time(value) is None
    )
    if bad_format:
        errs.causes.append(
            Cause(
                path,
                "FieldValueTypeInvalid",
                f"Invalid value: {json.dumps(value)}: "
                f"{path} in body must be of type {node.format}: {json.dumps(value)}",
            )
        )


def _number_text(value: Any) -> str:
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def _validate_number(node: SchemaNode, value: float, path: str, errs: FieldErrors) -> None:
    raw = node.raw
    if "minimum" in raw:
        low = raw["minimum"]
        if raw.get("exclusiveMinimum") and not value > low:
            errs.invalid(path, value, f"{path} in body should be greater than {_number_text(low)}")
        elif value < low:
            errs.invalid(
                path, value, f"{path} in body should be greater than or equal to {_number_text(low)}"
            )
    if "maximum" in raw:
        high = raw["maximum"]
        if raw.get("exclusiveMaximum") and not value < high:
            errs.invalid(path, value, f"{path} in body should be less than {_number_text(high)}")
        elif value > high:
            errs.invalid(path, value, f"{path} in body should be less than or equal to {_number_text(high)}")
    bounds = _INT_RANGES.get(node.format)
    if bounds is not None and not bounds[0] <= value <= bounds[1]:
        errs.invalid(path, value, f"{path} in body must be of type {node.format}: {json.dumps(value)}")


def _validate_array(node: SchemaNode, value: list[Any], path: str, errs: FieldErrors) -> None:
    raw = node.raw
    if "maxItems" in raw and len(value) > int(raw["maxItems"]):
        errs.too_many(path, len(value), int(raw["maxItems"]))
    if "minItems" in raw and len(value) < int(raw["minItems"]):
        errs.invalid(path, len(value), f"{path} in body should have at least {raw['minItems']} items")
    if node.items is not None:
        for index, item in enumerate(value):
            validate(node.items, item, index_path(path, index), errs)
    if node.list_type == "map" and node.list_keys:
        seen: set[str] = set()
        for index, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            keys = {k: item.get(k) for k in node.list_keys if k in item}
            marker = json.dumps(keys, sort_keys=True)
            if marker in seen:
                errs.duplicate_shown(index_path(path, index), go_value(keys))
            seen.add(marker)
    elif node.list_type == "set":
        seen_items: set[str] = set()
        for index, item in enumerate(value):
            marker = json.dumps(item, sort_keys=True)
            if marker in seen_items:
                errs.duplicate_shown(index_path(path, index), go_value(item))
            seen_items.add(marker)


def _validate_object(node: SchemaNode, value: dict[str, Any], path: str, errs: FieldErrors) -> None:
    raw = node.raw
    for name in raw.get("required") or ():
        if name not in value:
            errs.required(child_path(path, name))
    if "maxProperties" in raw and len(value) > int(raw["maxProperties"]):
        errs.too_many(path, len(value), int(raw["maxProperties"]))
    if "minProperties" in raw and len(value) < int(raw["minProperties"]):
        errs.invalid(
            path, len(value), f"{path} in body should have at least {raw['minProperties']} properties"
        )
    for key, item in value.items():
        sub = node.properties.get(key) or node.additional
        if sub is None:
            continue
        sub_path = child_path(path, key) if key in node.properties else index_path(path, key)
        validate(sub, item, sub_path, errs)
