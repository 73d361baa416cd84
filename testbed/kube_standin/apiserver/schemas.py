"""Strict validation against the official Kubernetes JSON schemas shipped in ``kubernetes-validate``.

The schemas (one directory per Kubernetes version, ``v1.NN.0-local-strict``) use a small
subset of JSON Schema 2020-12: ``type``, ``properties``, ``additionalProperties``,
``required``, ``items``, ``enum``, ``oneOf``, ``$ref`` and ``format``. Rather than
interpreting them for every object, each definition is compiled once into a Python closure
and cached, so a 128-device ResourceSlice validates in about a millisecond. Versions whose
schemas for a kind are identical (descriptions aside) share one compiled validator.

Beyond JSON Schema's defaults, ``format`` ``int32``/``int64`` ranges and ``byte`` (base64)
are asserted, as the API server's decoder rejects such values too.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import importlib.resources
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.status import Cause, invalid
from kube_standin.errors import ConfigError

__all__ = [
    "DEFAULT_VERSIONS",
    "FieldError",
    "KindSchema",
    "SchemaCatalog",
    "SchemaSet",
    "SchemasUnavailable",
    "check_written",
    "format_path",
    "shared_catalog",
]

DEFAULT_VERSIONS: tuple[str, ...] = ("1.34", "1.35", "1.36", "1.37")

# A field path as a linked list of segments: cheap to extend while walking, rendered only on error.
Path_ = tuple[Any, str] | None
Check = Callable[[Any, Path_, list["FieldError"]], None]


class SchemasUnavailable(ConfigError, RuntimeError):
    """The schema files for a requested Kubernetes version are not installed."""


@dataclass(frozen=True, slots=True)
class FieldError:
    """One violation, with the Kubernetes field path (``spec.devices[3].attributes[x]``)."""

    path: str
    reason: str  # FieldValueInvalid, FieldValueRequired, FieldValueNotSupported, FieldValueTypeInvalid
    detail: str

    def __str__(self) -> str:
        return f"{self.path or '<root>'}: {self.detail}"


def format_path(path: Path_) -> str:
    parts: list[str] = []
    while path is not None:
        path, segment = path
        parts.append(segment)
    out = ""
    for segment in reversed(parts):
        out += segment if segment.startswith("[") or not out else "." + segment
    return out


_INT32 = (-(2**31), 2**31 - 1)
_INT64 = (-(2**63), 2**63 - 1)
_PY_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
    "integer": (int, float),
    "number": (int, float),
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _type_gate(node: Mapping[str, Any], natural: str) -> tuple[bool, Check]:
    """Whether null is accepted, and the error to report for a value of the wrong JSON type."""
    declared = node.get("type")
    types = declared if isinstance(declared, list) else [declared] if declared else [natural, "null"]
    wanted = " or ".join(t for t in types if t != "null") or natural

    def type_error(value: Any, path: Path_, errors: list[FieldError]) -> None:
        errors.append(
            FieldError(
                format_path(path),
                "FieldValueTypeInvalid",
                f"Invalid value: {_type_name(value)}: must be {wanted}",
            )
        )

    return "null" in types, type_error


def _plain_types(node: Mapping[str, Any]) -> frozenset[type] | None:
    """The Python types that certainly satisfy ``node`` when it is nothing but a type check."""
    if set(node) - {"type", "description", "format"} or node.get("format") not in (None, "double"):
        return None
    declared = node.get("type")
    if not declared:
        return None
    names = declared if isinstance(declared, list) else [declared]
    # Only exact matches: a float for an integer field goes through the full check.
    exact = {"string": str, "boolean": bool, "null": type(None), "integer": int, "number": float}
    if any(name not in exact for name in names):
        return None
    types = {exact[name] for name in names}
    if "number" in names:
        types.add(int)
    return frozenset(types)


def _is_base64(value: str) -> bool:
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


def _strip_docs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _strip_docs(v) for k, v in node.items() if k != "description"}
    if isinstance(node, list):
        return [_strip_docs(v) for v in node]
    return node


def _ref_name(ref: str) -> str:
    _, _, pointer = ref.partition("#")
    prefix = "/$defs/"
    if not pointer.startswith(prefix):
        raise ValueError(f"unsupported $ref {ref!r}")
    return pointer[len(prefix) :]


class SchemaSet:
    """The schemas of one Kubernetes version, compiled on demand."""

    def __init__(self, version: str, directory: Path) -> None:
        self.version = version
        self.directory = directory
        self._compiled: dict[str, Check] = {}
        self._kinds: dict[tuple[str, str], KindSchema | None] = {}

    @cached_property
    def _defs(self) -> dict[str, Any]:
        with open(self.directory / "_definitions.json", "rb") as handle:
            defs: dict[str, Any] = json.load(handle)["$defs"]
        return defs

    def kind(self, api_version: str, kind: str) -> KindSchema | None:
        """The schema of ``kind`` in ``api_version``, or None when this version does not serve it."""
        key = (api_version, kind)
        if key not in self._kinds:
            self._kinds[key] = self._load_kind(api_version, kind)
        return self._kinds[key]

    def _load_kind(self, api_version: str, kind: str) -> KindSchema | None:
        # kubernetes-validate's file naming: rbac.authorization.k8s.io/v1 -> rbac-v1.
        short = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        path = self.directory / f"{kind.lower()}-{short}.json"
        if not path.is_file():
            return None
        with open(path, "rb") as handle:
            top = json.load(handle)
        return KindSchema(self, api_version, kind, top)

    def definition(self, name: str) -> Any:
        return self._defs[name]

    def resolve(self, node: Mapping[str, Any]) -> Mapping[str, Any]:
        """``node`` with its ``$ref`` chain followed."""
        for _ in range(32):
            ref = node.get("$ref")
            if not isinstance(ref, str):
                break
            node = self._defs[_ref_name(ref)]
        return node

    def compiled(self, name: str) -> Check:
        check = self._compiled.get(name)
        if check is None:
            # Placeholder first: definitions may be recursive (JSONSchemaProps).
            slot: list[Check] = []
            self._compiled[name] = lambda v, p, e: slot[0](v, p, e)
            real = self.compile(self._defs[name])
            slot.append(real)
            self._compiled[name] = real
            check = real
        return check

    # -- compiler -----------------------------------------------------------------------------

    def compile(self, node: Mapping[str, Any]) -> Check:
        """One closure per schema node; hot paths (objects, scalars) do a single call per value."""
        if "$ref" in node:
            return self._compile_ref(_ref_name(node["$ref"]))
        if "oneOf" in node:
            return self._compile_one_of(node)
        if "properties" in node or "additionalProperties" in node or "required" in node:
            return self._compile_object(node)
        if "items" in node:
            return self._compile_array(node)
        return self._compile_scalar(node)

    def _compile_ref(self, name: str) -> Check:
        # Resolved now, so validation calls the definition directly; a definition that is still
        # being compiled (a recursive one) comes back as its forwarding placeholder.
        return self.compiled(name)

    def _compile_one_of(self, node: Mapping[str, Any]) -> Check:
        options = [self.compile(s) for s in node["oneOf"]]
        # Quantity is oneOf [string, number]: decided by the value's type alone, without
        # building the failing option's error.
        plain = [_plain_types(s) for s in node["oneOf"]]

        def check(value: Any, path: Path_, errors: list[FieldError]) -> None:
            matches = 0
            kind = type(value)
            for option, types in zip(options, plain, strict=True):
                if types is not None:
                    # A plain option is a type check and nothing else (a whole float is an integer).
                    if kind in types or (kind is float and int in types and value.is_integer()):
                        matches += 1
                    continue
                scratch: list[FieldError] = []
                option(value, path, scratch)
                if not scratch:
                    matches += 1
            if matches != 1:
                errors.append(
                    FieldError(
                        format_path(path),
                        "FieldValueInvalid",
                        f"Invalid value: {json.dumps(value)}: must match exactly one allowed form",
                    )
                )

        return check

    def _compile_object(self, node: Mapping[str, Any]) -> Check:
        accepts_null, type_error = _type_gate(node, "object")
        props_src: Mapping[str, Any] = node.get("properties") or {}
        props: dict[str, Check] = {name: self.compile(sub) for name, sub in props_src.items()}
        # Plain scalar fields are checked inline: most fields of an object are, and a function
        # call per field is what validation time is made of. Anything unusual takes the full check.
        plain: dict[str, frozenset[type]] = {}
        for name, sub in props_src.items():
            types = _plain_types(sub)
            if types is not None:
                plain[name] = types
        extra = node.get("additionalProperties", True)
        extra_check: Check | None = self.compile(extra) if isinstance(extra, dict) else None
        extra_plain = _plain_types(extra) if isinstance(extra, dict) else None
        closed = extra is False
        required = tuple(node.get("required") or ())

        def check(value: Any, path: Path_, errors: list[FieldError]) -> None:
            if type(value) is not dict:
                if value is None and accepts_null:
                    return
                type_error(value, path, errors)
                return
            for key in required:
                if key not in value:
                    errors.append(
                        FieldError(format_path((path, key)), "FieldValueRequired", "Required value")
                    )
            for key, item in value.items():
                fast = plain.get(key)
                if fast is not None and type(item) in fast:
                    continue
                sub = props.get(key)
                if sub is not None:
                    sub(item, (path, key), errors)
                elif extra_check is not None:
                    if extra_plain is not None and type(item) in extra_plain:
                        continue
                    extra_check(item, (path, f"[{key}]"), errors)
                elif closed:
                    errors.append(
                        FieldError(format_path((path, key)), "FieldValueNotSupported", "unknown field")
                    )

        return check

    def _compile_array(self, node: Mapping[str, Any]) -> Check:
        accepts_null, type_error = _type_gate(node, "array")
        item_check = self.compile(node["items"])

        def check(value: Any, path: Path_, errors: list[FieldError]) -> None:
            if type(value) is not list:
                if value is None and accepts_null:
                    return
                type_error(value, path, errors)
                return
            for index, item in enumerate(value):
                item_check(item, (path, f"[{index}]"), errors)

        return check

    def _compile_scalar(self, node: Mapping[str, Any]) -> Check:
        declared = node.get("type")
        types = frozenset(declared if isinstance(declared, list) else [declared] if declared else [])
        allowed: frozenset[type] = frozenset(t for name in types for t in _PY_TYPES[name])
        integer_only = "integer" in types and "number" not in types
        wanted = " or ".join(sorted(t for t in types if t != "null")) or "null"
        enum = list(node["enum"]) if "enum" in node else None
        shown = ", ".join(json.dumps(v) for v in enum or ())
        fmt = node.get("format")
        low, high = _INT32 if fmt == "int32" else _INT64
        ranged = fmt in ("int32", "int64")
        byte = fmt == "byte"

        def check(value: Any, path: Path_, errors: list[FieldError]) -> None:
            kind = type(value)
            if allowed and (
                kind not in allowed or (integer_only and kind is float and not value.is_integer())
            ):
                errors.append(
                    FieldError(
                        format_path(path),
                        "FieldValueTypeInvalid",
                        f"Invalid value: {_type_name(value)}: must be {wanted}",
                    )
                )
                return
            if enum is not None and value not in enum:
                errors.append(
                    FieldError(
                        format_path(path),
                        "FieldValueNotSupported",
                        f"Unsupported value: {json.dumps(value)}: supported values: {shown}",
                    )
                )
            elif ranged and kind is int and not low <= value <= high:
                errors.append(
                    FieldError(
                        format_path(path), "FieldValueInvalid", f"Invalid value: {value}: not an {fmt}"
                    )
                )
            elif byte and kind is str and not _is_base64(value):
                errors.append(
                    FieldError(
                        format_path(path), "FieldValueInvalid", "Invalid value: not base64-encoded data"
                    )
                )

        return check

    # -- fingerprints --------------------------------------------------------------------------

    def closure_fingerprint(self, top: Mapping[str, Any]) -> str:
        """A hash of everything that decides validity of ``top`` (descriptions excluded)."""
        seen: dict[str, Any] = {}
        pending = [top]
        while pending:
            node = pending.pop()
            for ref in _refs(node):
                name = _ref_name(ref)
                if name not in seen:
                    seen[name] = self._defs[name]
                    pending.append(self._defs[name])
        payload = json.dumps([_strip_docs(top), sorted((k, _strip_docs(v)) for k, v in seen.items())])
        return hashlib.sha256(payload.encode()).hexdigest()


def _refs(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


class KindSchema:
    """The compiled schema of one kind in one apiVersion, for one Kubernetes version."""

    def __init__(self, owner: SchemaSet, api_version: str, kind: str, top: Mapping[str, Any]) -> None:
        self.owner = owner
        self.api_version = api_version
        self.kind = kind
        self.top = top

    @cached_property
    def check(self) -> Check:
        return self.owner.compile(self.top)

    @cached_property
    def fingerprint(self) -> str:
        return self.owner.closure_fingerprint(self.top)

    def errors(self, obj: Any) -> list[FieldError]:
        errors: list[FieldError] = []
        self.check(obj, None, errors)
        return errors


def schema_root() -> Path:
    """Where ``kubernetes-validate`` keeps its per-version schema directories."""
    try:
        root = importlib.resources.files("kubernetes_validate") / "kubernetes-json-schema"
    except ModuleNotFoundError as err:
        raise SchemasUnavailable(
            "the kubernetes-validate package is not installed: pip install -e '.[test]' "
            "(or run the API server with --validate-versions none)"
        ) from err
    return Path(str(root))


@functools.cache
def shared_catalog(versions: tuple[str, ...]) -> SchemaCatalog:
    """One catalog per set of versions in this process. What it compiles is derived from read-only
    schema files, so every API server of the process shares it, and so does every process forked
    from one that warmed it (``fabric_dra_testbed.stack.ROLE_MODULES``: compiling all served kinds costs
    ~0.2 s of CPU per start otherwise)."""
    return SchemaCatalog(versions)


class SchemaCatalog:
    """The strict schemas of several Kubernetes versions; validates an object against each."""

    def __init__(self, versions: Iterable[str] = DEFAULT_VERSIONS, root: Path | None = None) -> None:
        self.versions = tuple(versions)
        base = root or (schema_root() if self.versions else Path())
        self.sets: list[SchemaSet] = []
        for version in self.versions:
            if not re.fullmatch(r"1\.\d+", version):
                raise SchemasUnavailable(f"Kubernetes version {version!r} is not of the form 1.NN")
            directory = base / f"v{version}.0-local-strict"
            if not (directory / "_definitions.json").is_file():
                have = sorted(
                    (p.name.split("-")[0][1:].rsplit(".", 1)[0] for p in base.glob("v*-local-strict")),
                    key=lambda v: tuple(int(x) for x in v.split(".")),
                )
                raise SchemasUnavailable(
                    f"kubernetes-validate has no strict schemas for Kubernetes {version}; choose from "
                    f"{', '.join(have)} or install a newer kubernetes-validate"
                )
            self.sets.append(SchemaSet(version, directory))
        # (apiVersion, kind) -> [(versions sharing the schema, schema)]
        self._plans: dict[tuple[str, str], list[tuple[list[str], KindSchema]]] = {}

    def plan(self, api_version: str, kind: str) -> list[tuple[list[str], KindSchema]]:
        key = (api_version, kind)
        plan = self._plans.get(key)
        if plan is None:
            by_fingerprint: dict[str, tuple[list[str], KindSchema]] = {}
            for schema_set in self.sets:
                schema = schema_set.kind(api_version, kind)
                if schema is None:
                    continue
                entry = by_fingerprint.setdefault(schema.fingerprint, ([], schema))
                entry[0].append(schema_set.version)
            plan = list(by_fingerprint.values())
            self._plans[key] = plan
        return plan

    def served_by(self, api_version: str, kind: str) -> list[str]:
        """The configured Kubernetes versions that serve ``kind`` in ``api_version``."""
        return [v for versions, _ in self.plan(api_version, kind) for v in versions]

    def validate(self, obj: Mapping[str, Any]) -> list[tuple[list[str], FieldError]]:
        """Every violation of ``obj`` with the Kubernetes versions whose schema it breaks."""
        found: dict[tuple[str, str], tuple[list[str], FieldError]] = {}
        for versions, schema in self.plan(str(obj.get("apiVersion")), str(obj.get("kind"))):
            for error in schema.errors(obj):
                entry = found.setdefault((error.path, error.detail), ([], error))
                entry[0].extend(versions)
        return list(found.values())

    def warm(self, kinds: Iterable[tuple[str, str]]) -> None:
        """Compile the validators of ``kinds`` now rather than on the first write."""
        for api_version, kind in kinds:
            for _, schema in self.plan(api_version, kind):
                _ = schema.check


def check_written(catalog: SchemaCatalog, res: ResourceType, obj: Mapping[str, Any], name: str) -> None:
    """422 unless a written ``obj`` satisfies the schemas of every configured Kubernetes version
    that serves its kind (none configured: no check); a cause names the versions that reject it
    when not all of them do."""
    api_version = str(obj.get("apiVersion"))
    kind = str(obj.get("kind"))
    if not catalog.versions:
        return
    if not catalog.plan(api_version, kind):
        served = ", ".join(catalog.versions)
        why = f"{kind} {api_version} is not served by Kubernetes {served}"
        raise invalid(res, name, [Cause("apiVersion", "FieldValueNotSupported", why)])
    problems = catalog.validate(obj)
    if problems:
        all_versions = set(catalog.served_by(api_version, kind))
        causes = []
        for versions, error in problems[:50]:
            rejecting = set(versions)
            where = "" if rejecting == all_versions else f" (Kubernetes {', '.join(sorted(rejecting))})"
            causes.append(Cause(error.path, error.reason, error.detail + where))
        raise invalid(res, name, causes)
