"""What a CustomResourceDefinition (``apiextensions.k8s.io/v1``) must be, and what the server makes
of it, as ``k8s.io/apiextensions-apiserver`` does:

* **defaults** (``pkg/apis/apiextensions/v1/defaults.go``): ``singular`` is the lower-case kind,
  ``listKind`` the kind + ``List``, ``conversion.strategy`` ``None``;
* **validation** (``pkg/apis/apiextensions/validation/validation.go``
  ``ValidateCustomResourceDefinition`` / ``…Update``): ``metadata.name`` is
  ``<plural>.<group>``, the group a DNS subdomain with a dot, names DNS-1035 labels, scope
  ``Cluster``/``Namespaced``, unique version names with exactly one storage version, a schema for
  every version, printer columns with a name, a known type and a JSONPath; group and plural never
  change, nor scope and kind once established;
* **the schema is structural** (``pkg/apiserver/schema/validation.go``
  ``ValidateStructural``, and the OpenAPI checks of ``validation.go``): see :func:`check_schema`;
* **status** (the naming and establishing controllers, ``pkg/controller/status``,
  ``pkg/controller/establish``): ``acceptedNames``, ``storedVersions`` and the conditions
  ``NamesAccepted`` and ``Established``, set at once here rather than a moment later.

Two CRDs claiming the same names is not detected (the real naming controller leaves the later one
``NamesAccepted=False``); docs/testing.md lists what else is not checked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kube_standin.apiserver.customresources.celrules import compile_rule
from kube_standin.apiserver.customresources.structural import compile_schema, validate
from kube_standin.apiserver.fielderrors import DNS1123_SUBDOMAIN, SUBDOMAIN_MSG, FieldErrors
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.status import Cause
from kube_standin.apiserver.storage import now_rfc3339

__all__ = ["crd_status", "default_crd", "validate_crd", "validate_crd_update"]

_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_DNS1035_MSG = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
    "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)
_COLUMN_TYPES = ("boolean", "date", "integer", "number", "string")
_REASONS = ["FieldValueDuplicate", "FieldValueForbidden", "FieldValueInvalid", "FieldValueRequired"]
_LIST_TYPES = ["atomic", "map", "set"]
#: JSON Schema keywords a CRD schema may not use (``ValidateCustomResourceDefinitionOpenAPISchema``).
_UNSUPPORTED = (
    "$ref",
    "additionalItems",
    "patternProperties",
    "dependencies",
    "definitions",
    "id",
    "$schema",
)
_NESTED_FORBIDDEN = (
    "type",
    "default",
    "nullable",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-map-type",
    "x-kubernetes-validations",
)


def _dns1035(errs: FieldErrors, path: str, value: str, prefix: str = "") -> None:
    if len(value) > 63:
        errs.invalid(path, value, prefix + "must be no more than 63 characters")
    elif not _DNS1035.fullmatch(value):
        errs.invalid(path, value, prefix + _DNS1035_MSG)


def default_crd(obj: Obj) -> None:
    """``SetDefaults_CustomResourceDefinition`` of v1, in place."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    names = spec.get("names")
    if isinstance(names, dict) and isinstance(names.get("kind"), str):
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", names["kind"] + "List")
    conversion = spec.setdefault("conversion", {"strategy": "None"})
    if isinstance(conversion, dict):
        conversion.setdefault("strategy", "None")


def validate_crd(obj: Obj) -> list[Cause]:
    """``ValidateCustomResourceDefinition`` (storage form, after defaults)."""
    errs = FieldErrors()
    spec = obj.get("spec") or {}
    names = spec.get("names") or {}
    name = (obj.get("metadata") or {}).get("name") or ""
    wanted = f"{names.get('plural') or ''}.{spec.get('group') or ''}"
    if name and name != wanted:
        errs.invalid("metadata.name", name, 'must be spec.names.plural+"."+spec.group')
    group = spec.get("group") or ""
    if not group:
        errs.required("spec.group")
    elif not DNS1123_SUBDOMAIN.fullmatch(group):
        errs.invalid("spec.group", group, SUBDOMAIN_MSG)
    elif "." not in group:
        errs.invalid("spec.group", group, "should be a domain with at least one dot")
    scope = spec.get("scope") or ""
    if not scope:
        errs.required("spec.scope")
    elif scope not in ("Cluster", "Namespaced"):
        errs.not_supported("spec.scope", scope, ["Cluster", "Namespaced"])
    _validate_versions(errs, spec)
    for key in ("plural", "singular", "kind", "listKind"):
        if not names.get(key):
            errs.required(f"spec.names.{key}")
    _validate_names(errs, names, "spec.names")
    conversion = spec.get("conversion") or {}
    if conversion.get("strategy") not in (None, "None"):
        # Webhook conversion needs a webhook this server cannot call: refuse rather than ignore.
        errs.not_supported("spec.conversion.strategy", conversion.get("strategy"), ["None"])
    return errs.causes


def validate_crd_update(new: Obj, old: Obj) -> list[Cause]:
    """``ValidateCustomResourceDefinitionUpdate``: the rules of a new CRD, and the immutable fields."""
    causes = validate_crd(new)
    errs = FieldErrors()
    spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    names, old_names = spec.get("names") or {}, old_spec.get("names") or {}
    immutable: list[tuple[str, Any, Any]] = [
        ("spec.group", spec.get("group"), old_spec.get("group")),
        ("spec.names.plural", names.get("plural"), old_names.get("plural")),
    ]
    if _established(old):
        immutable += [
            ("spec.scope", spec.get("scope"), old_spec.get("scope")),
            ("spec.names.kind", names.get("kind"), old_names.get("kind")),
        ]
    for path, now, before in immutable:
        if now != before:
            errs.invalid(path, now, "field is immutable")
    stored = ((new.get("status") or {}).get("storedVersions")) or []
    served_names = {v.get("name") for v in spec.get("versions") or [] if isinstance(v, dict)}
    for index, version in enumerate(stored):
        if version not in served_names:
            errs.invalid(
                f"status.storedVersions[{index}]",
                version,
                f"missing from spec.versions; {version} was previously a storage version, and must remain "
                f"in spec.versions until a storage migration ensures no data remains persisted in {version} "
                f"and removes {version} from status.storedVersions",
            )
    return causes + errs.causes


def _established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def _validate_names(errs: FieldErrors, names: Mapping[str, Any], path: str) -> None:
    """``ValidateCustomResourceDefinitionNames``."""
    for key in ("plural", "singular"):
        if names.get(key):
            _dns1035(errs, f"{path}.{key}", str(names[key]))
    for key in ("kind", "listKind"):
        value = str(names.get(key) or "")
        if value and not _DNS1035.fullmatch(value.lower()):
            errs.invalid(
                f"{path}.{key}", value, "may have mixed case, but should otherwise match: " + _DNS1035_MSG
            )
    for index, short in enumerate(names.get("shortNames") or []):
        _dns1035(errs, f"{path}.shortNames[{index}]", str(short))
    if names.get("kind") and names.get("kind") == names.get("listKind"):
        errs.invalid(f"{path}.listKind", names["listKind"], "kind and listKind may not be the same")
    for index, category in enumerate(names.get("categories") or []):
        _dns1035(errs, f"{path}.categories[{index}]", str(category))


def _validate_versions(errs: FieldErrors, spec: Mapping[str, Any]) -> None:
    versions = [v for v in spec.get("versions") or [] if isinstance(v, dict)]
    seen: set[str] = set()
    unique = True
    for index, version in enumerate(versions):
        path = f"spec.versions[{index}]"
        name = str(version.get("name") or "")
        unique = unique and name not in seen
        seen.add(name)
        _dns1035(errs, f"{path}.name", name)
        schema = (version.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(schema, dict):
            errs.required(f"{path}.schema.openAPIV3Schema", "schemas are required")
        else:
            check_schema(errs, schema, f"{path}.schema.openAPIV3Schema", root=True)
        for col_index, column in enumerate(version.get("additionalPrinterColumns") or []):
            _validate_column(errs, column, f"{path}.additionalPrinterColumns[{col_index}]")
        status = (version.get("subresources") or {}).get("status")
        if status is not None and not isinstance(status, dict):
            errs.invalid(f"{path}.subresources.status", status, "must be an object")
    shown = "[]apiextensions.CustomResourceDefinitionVersion{...}"
    if not unique:
        errs.invalid_shown("spec.versions", shown, "must contain unique version names")
    if sum(1 for v in versions if v.get("storage")) != 1:
        errs.invalid_shown("spec.versions", shown, "must have exactly one version marked as storage version")


def _validate_column(errs: FieldErrors, column: Mapping[str, Any], path: str) -> None:
    """``ValidateCustomResourceColumnDefinition``."""
    if not column.get("name"):
        errs.required(f"{path}.name")
    kinds = ",".join(_COLUMN_TYPES)
    if not column.get("type"):
        errs.required(f"{path}.type", f"must be one of {kinds}")
    elif column["type"] not in _COLUMN_TYPES:
        errs.invalid(f"{path}.type", column["type"], f"must be one of {kinds}")
    if not column.get("jsonPath"):
        errs.required(f"{path}.JSONPath")


# -- structural schemas ------------------------------------------------------------------------------


def check_schema(errs: FieldErrors, raw: Mapping[str, Any], path: str, *, root: bool = False) -> None:
    """A structural schema (``ValidateStructural`` and ``validateStructuralInvariants``): every
    specified field has a type (unless ``x-kubernetes-int-or-string`` or
    ``x-kubernetes-preserve-unknown-fields``), the root is an object whose ``metadata`` says no more
    than ``name``/``generateName``, ``properties`` and ``additionalProperties`` exclude each other,
    arrays have ``items``, list types are known and map lists have keys, ``anyOf``/``allOf``/
    ``oneOf``/``not`` only validate values, defaults satisfy their schema and every CEL rule parses."""
    node_type = raw.get("type")
    int_or_string = bool(raw.get("x-kubernetes-int-or-string"))
    if root:
        if not node_type:
            errs.required(f"{path}.type", "must not be empty at the root")
        elif node_type != "object":
            errs.invalid(f"{path}.type", node_type, "must be object")
        _check_metadata(errs, raw, path)
    if int_or_string and node_type:
        errs.invalid(f"{path}.type", node_type, "must be empty if x-kubernetes-int-or-string is true")
    if raw.get("x-kubernetes-preserve-unknown-fields") is False:
        errs.invalid(f"{path}.x-kubernetes-preserve-unknown-fields", False, "must be true or undefined")
    for keyword in _UNSUPPORTED:
        if keyword in raw:
            errs.forbidden(f"{path}.{keyword}", f"{keyword} is not supported")
    if raw.get("uniqueItems") is True:
        errs.forbidden(
            f"{path}.uniqueItems",
            "uniqueItems cannot be set to true since the runtime complexity becomes quadratic",
        )
    properties = raw.get("properties") or {}
    additional = raw.get("additionalProperties")
    if properties and additional is not None:
        errs.forbidden(
            f"{path}.additionalProperties", "additionalProperties and properties are mutual exclusive"
        )
    for name, sub in properties.items():
        sub_path = f"{path}.properties[{name}]"
        _check_typed(errs, sub, sub_path, "must not be empty for specified object fields")
        if isinstance(sub, dict):
            check_schema(errs, sub, sub_path)
    if isinstance(additional, dict):
        _check_typed(
            errs, additional, f"{path}.additionalProperties", "must not be empty for specified object fields"
        )
        check_schema(errs, additional, f"{path}.additionalProperties")
    _check_array(errs, raw, path)
    _check_nested(errs, raw, path, int_or_string)
    _check_default(errs, raw, path)
    _check_rules(errs, raw, path)


def _check_typed(errs: FieldErrors, sub: Any, path: str, why: str) -> None:
    if not isinstance(sub, dict):
        errs.invalid(path, sub, "must be a schema object")
        return
    untyped_ok = sub.get("x-kubernetes-int-or-string") or sub.get("x-kubernetes-preserve-unknown-fields")
    if not sub.get("type") and not untyped_ok:
        errs.required(f"{path}.type", why)


def _check_metadata(errs: FieldErrors, raw: Mapping[str, Any], path: str) -> None:
    metadata = (raw.get("properties") or {}).get("metadata")
    if not isinstance(metadata, dict):
        return
    extra = set(metadata) - {"type", "description", "properties"}
    extra_props = set(metadata.get("properties") or {}) - {"name", "generateName"}
    if extra or extra_props or metadata.get("type") not in (None, "object"):
        errs.forbidden(
            f"{path}.properties[metadata]",
            "must not specify anything other than name and generateName, "
            "but metadata is implicitly specified",
        )


def _check_array(errs: FieldErrors, raw: Mapping[str, Any], path: str) -> None:
    node_type = raw.get("type")
    items = raw.get("items")
    if node_type == "array" and items is None:
        errs.required(f"{path}.items", "must be specified")
    if isinstance(items, dict):
        _check_typed(errs, items, f"{path}.items", "must not be empty for specified array items")
        check_schema(errs, items, f"{path}.items")
    elif items is not None:
        errs.forbidden(f"{path}.items", "items must be a schema object and not an array")
    list_type = raw.get("x-kubernetes-list-type")
    if list_type is None:
        return
    if list_type not in _LIST_TYPES:
        errs.not_supported(f"{path}.x-kubernetes-list-type", list_type, _LIST_TYPES)
    elif node_type != "array":
        errs.invalid(f"{path}.x-kubernetes-list-type", list_type, "must only be used on type array")
    keys = raw.get("x-kubernetes-list-map-keys") or []
    if list_type == "map" and not keys:
        errs.required(
            f"{path}.x-kubernetes-list-map-keys", "must not be empty if x-kubernetes-list-type is map"
        )
    if list_type == "map" and isinstance(items, dict):
        item_props = items.get("properties") or {}
        required = set(items.get("required") or [])
        for key in keys:
            prop = item_props.get(key)
            if not isinstance(prop, dict):
                errs.required(f"{path}.items.properties[{key}]", "entries for all map keys must be specified")
            elif key not in required and "default" not in prop:
                errs.required(
                    f"{path}.items.properties[{key}]", "all map keys must be required or have a default value"
                )


def _check_nested(errs: FieldErrors, raw: Mapping[str, Any], path: str, int_or_string: bool) -> None:
    """anyOf/allOf/oneOf/not are value validations: no types or structure of their own, except the
    ``anyOf: [{type: integer}, {type: string}]`` an int-or-string field may carry."""
    for keyword in ("anyOf", "allOf", "oneOf"):
        for index, sub in enumerate(raw.get(keyword) or []):
            if not isinstance(sub, dict):
                continue
            allowed_type = int_or_string and keyword == "anyOf" and sub.get("type") in ("integer", "string")
            for forbidden in _NESTED_FORBIDDEN:
                if forbidden in sub and not (forbidden == "type" and allowed_type):
                    errs.forbidden(f"{path}.{keyword}[{index}].{forbidden}", "must be empty to be structural")
    negated = raw.get("not")
    if isinstance(negated, dict):
        for forbidden in _NESTED_FORBIDDEN:
            if forbidden in negated:
                errs.forbidden(f"{path}.not.{forbidden}", "must be empty to be structural")


def _check_default(errs: FieldErrors, raw: Mapping[str, Any], path: str) -> None:
    if "default" not in raw:
        return
    found = FieldErrors()
    validate(compile_schema(raw), raw["default"], "", found)
    for cause in found.causes:
        where = f"{path}.default" + (f".{cause.field}" if cause.field else "")
        errs.causes.append(Cause(where, cause.reason, cause.message))


def _check_rules(errs: FieldErrors, raw: Mapping[str, Any], path: str) -> None:
    for index, rule in enumerate(raw.get("x-kubernetes-validations") or []):
        rule_path = f"{path}.x-kubernetes-validations[{index}]"
        if not isinstance(rule, dict) or not str(rule.get("rule") or "").strip():
            errs.required(f"{rule_path}.rule")
            continue
        for key in ("rule", "messageExpression"):
            expression = rule.get(key)
            if not expression:
                continue
            try:
                compile_rule(str(expression))
            except Exception as err:  # CelCompileError: the parser's message, on one line
                errs.invalid(f"{rule_path}.{key}", expression, f"compilation failed: {err}")
        message = str(rule.get("message") or "")
        if "\n" in message:
            errs.invalid(f"{rule_path}.message", message, "message must not contain line breaks")
        if rule.get("reason") is not None and rule["reason"] not in _REASONS:
            errs.not_supported(f"{rule_path}.reason", rule["reason"], _REASONS)


# -- status --------------------------------------------------------------------------------------------


def crd_status(obj: Obj, old_status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The status the naming and establishing controllers give an accepted CRD: its names accepted,
    every storage version recorded, ``NamesAccepted`` and ``Established`` true (kept with their
    transition times when they were true already)."""
    spec = obj.get("spec") or {}
    old = dict(old_status or {})
    stored = list(old.get("storedVersions") or [])
    for version in spec.get("versions") or []:
        if isinstance(version, dict) and version.get("storage") and version.get("name") not in stored:
            stored.append(version["name"])
    previous = {c.get("type"): c for c in old.get("conditions") or [] if isinstance(c, dict)}
    conditions = []
    for kind, reason, message in (
        ("NamesAccepted", "NoConflicts", "no conflicts found"),
        ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
    ):
        before = previous.get(kind)
        if before is not None and before.get("status") == "True":
            conditions.append(before)
        else:
            conditions.append(
                {
                    "type": kind,
                    "status": "True",
                    "lastTransitionTime": now_rfc3339(),
                    "reason": reason,
                    "message": message,
                }
            )
    return {
        "acceptedNames": dict(spec.get("names") or {}),
        "storedVersions": stored,
        "conditions": conditions,
    }
