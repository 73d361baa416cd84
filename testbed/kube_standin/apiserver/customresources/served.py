"""The custom resources the stored CRDs define: a :class:`~kube_standin.apiserver.registry.ResourceType`
for each established CRD, with its compiled schemas (:class:`CustomKind`), found by path and listed in
discovery next to the built-in table.

What a write of a custom resource goes through, as ``k8s.io/apiextensions-apiserver/pkg/apiserver``
(``customresource_handler.go``'s ``crdHandler``, ``pkg/registry/customresource``):

1. *decoding* (:meth:`CustomKind.decode`; ``unstructuredSchemaCoercer``): unknown fields are pruned,
   and ``fieldValidation`` says what that means (``Strict``: 400 ``strict decoding error: unknown
   field "spec.x"``; ``Warn``, the default: a ``Warning`` header per field; ``Ignore``: nothing);
   then the schema's defaults are applied;
2. *validation* (:meth:`CustomKind.validate`; ``strategy.go`` ``Validate``/``ValidateUpdate`` and
   ``status_strategy.go``): the OpenAPI schema, list-type invariants, then the CEL rules unless a
   blocking error was found; the status strategy validates the same way;
3. the store's generic semantics: with a status subresource, a write of the main resource keeps the
   stored status and ``/status`` keeps everything but the status; ``metadata.generation`` moves only
   when something outside metadata and status changes (the store's ``tracks_generation``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kube_standin.apiserver.customresources.celrules import check_rules
from kube_standin.apiserver.customresources.structural import (
    BLOCKING_REASONS,
    SchemaNode,
    apply_defaults,
    compile_schema,
    prune,
    validate,
)
from kube_standin.apiserver.fielderrors import FieldErrors
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.registry import ApiGroup, ResourceType, find_resource
from kube_standin.apiserver.status import Cause, StatusError, bad_request
from kube_standin.apiserver.store import Store

__all__ = ["CRDS", "FIELD_VALIDATION", "CustomKind", "CustomResources"]

_CRDS = find_resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
assert _CRDS is not None
CRDS: ResourceType = _CRDS
#: ``fieldValidation`` values (``metav1.FieldValidation*``); empty is Warn, as on a real server.
FIELD_VALIDATION = ("Ignore", "Warn", "Strict")
# field.Invalid(nil, nil, ...): a nil path prints as <nil>, a nil value as null (apimachinery 1.34).
_NOT_CHECKED = (
    "Invalid value: null: some validation rules were not checked because the object was invalid; "
    "correct the existing errors to complete validation"
)


@dataclass(frozen=True)
class CustomKind:
    """One CRD's kind: its compiled schema per served version."""

    crd_name: str
    kind: str
    schemas: Mapping[str, SchemaNode]
    #: the storage version's ``additionalPrinterColumns`` (Tables show them for every version).
    printer_columns: tuple[Mapping[str, Any], ...] = ()

    def decode(self, version: str, obj: Obj, directive: str) -> tuple[Obj, list[str]]:
        """``obj`` pruned of unknown fields and defaulted; the warnings to send. Raises 400 for
        unknown fields under ``Strict``."""
        if directive not in ("", *FIELD_VALIDATION):
            raise bad_request(
                f'fieldValidation must be one of "Ignore", "Warn" or "Strict", not "{directive}"'
            )
        unknown: list[str] = []
        pruned = prune(self.schemas[version], obj, "", unknown, root=True)
        if unknown and directive == "Strict":
            fields = ", ".join(f'unknown field "{path}"' for path in unknown)
            raise bad_request(
                f'{self.kind} in version "{version}" cannot be handled as a {self.kind}: '
                f"strict decoding error: {fields}"
            )
        warnings = [f'unknown field "{path}"' for path in unknown] if directive in ("", "Warn") else []
        return apply_defaults(self.schemas[version], pruned), warnings

    def validate(self, version: str, obj: Obj, old: Obj | None) -> list[Cause]:
        """The schema's errors, then (unless one of them blocks) its CEL rules' (``old``: the
        stored object on update, for transition rules)."""
        schema = self.schemas[version]
        errs = FieldErrors()
        validate(schema, obj, "", errs)
        if not _has_rules(schema):
            return errs.causes
        if any(c.reason in BLOCKING_REASONS for c in errs.causes):
            errs.causes.append(Cause("<nil>", "FieldValueInvalid", _NOT_CHECKED))
            return errs.causes
        check_rules(schema, obj, old, "", errs)
        return errs.causes


def _has_rules(node: SchemaNode) -> bool:
    children = [*node.properties.values(), node.additional, node.items]
    return bool(node.rules) or any(_has_rules(c) for c in children if c is not None)


def _established(crd: Mapping[str, Any]) -> bool:
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(
        isinstance(c, dict) and c.get("type") == "Established" and c.get("status") == "True"
        for c in conditions
    )


def resource_of(crd: Mapping[str, Any]) -> ResourceType:
    """The resource an established CRD serves: its served versions, the storage version first."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    versions = [v for v in spec.get("versions") or [] if isinstance(v, dict)]
    storage = next(str(v["name"]) for v in versions if v.get("storage"))
    served = [str(v["name"]) for v in versions if v.get("served") and v.get("name") != storage]
    schemas = {
        str(v["name"]): compile_schema((v.get("schema") or {}).get("openAPIV3Schema") or {"type": "object"})
        for v in versions
    }
    status = any("status" in (v.get("subresources") or {}) for v in versions)
    return ResourceType(
        str(spec["group"]),
        str(names["plural"]),
        str(names.get("singular") or str(names["kind"]).lower()),
        str(names["kind"]),
        spec.get("scope") == "Namespaced",
        (storage, *served),
        short_names=tuple(names.get("shortNames") or ()),
        categories=tuple(names.get("categories") or ()),
        status_subresource=status,
        tracks_generation=True,
        custom=CustomKind(
            str(crd["metadata"]["name"]),
            str(names["kind"]),
            schemas,
            tuple(next(v for v in versions if v.get("storage")).get("additionalPrinterColumns") or ()),
        ),
    )


class CustomResources:
    """The resources of the established CRDs in ``store``, rebuilt when a CRD changes."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._signature: tuple[tuple[str, str], ...] = ()
        self._by_path: dict[tuple[str, str, str], ResourceType] = {}
        self._resources: list[ResourceType] = []

    def _refresh(self) -> None:
        crds = [
            c
            for c in self._store.objects(CRDS)
            if _established(c) and not c["metadata"].get("deletionTimestamp")
        ]
        signature = tuple(
            sorted((c["metadata"]["name"], str(c["metadata"].get("resourceVersion"))) for c in crds)
        )
        if signature == self._signature:
            return
        resources = [resource_of(c) for c in sorted(crds, key=lambda c: str(c["metadata"]["name"]))]
        self._resources = resources
        self._by_path = {(r.group, v, r.plural): r for r in resources for v in r.versions}
        self._signature = signature

    def find(self, group: str, version: str, plural: str) -> ResourceType | None:
        """A built-in resource first (a CRD cannot shadow one), else a custom one."""
        built_in = find_resource(group, version, plural)
        if built_in is not None:
            return built_in
        self._refresh()
        return self._by_path.get((group, version, plural))

    def resources(self) -> list[ResourceType]:
        self._refresh()
        return list(self._resources)

    def groups(self) -> list[ApiGroup]:
        """The API groups of the custom resources, each with its versions (storage version first)."""
        versions: dict[str, list[str]] = {}
        for res in self.resources():
            known = versions.setdefault(res.group, [])
            known.extend(v for v in res.versions if v not in known)
        return [ApiGroup(name, tuple(found)) for name, found in sorted(versions.items())]

    def purge(self, crd: Mapping[str, Any]) -> None:
        """Delete every object of a deleted CRD's kind (the ``customresourcecleanup`` finalizer's
        work, done at once)."""
        res = resource_of(crd)
        for obj in list(self._store.objects(res)):
            meta = obj["metadata"]
            try:
                self._store.delete(res, meta.get("namespace"), str(meta["name"]))
            except StatusError:
                continue  # gone meanwhile
