"""Validation the real API server does beyond what the JSON schemas can express.

The schemas check shapes (types, unknown fields, required fields). The API server also
checks names, label syntax, limits, mutually exclusive fields and immutability; the subset
here is what fabric-dra's objects exercise, taken from Kubernetes ``pkg/apis/core/validation``
(object metadata), ``pkg/apis/resource/validation`` (ResourceSlice: :mod:`.slice_rules`;
ResourceClaim and ResourceClaimTemplate: :mod:`.claim_rules`; DeviceClass), CustomResourceDefinitions
(:mod:`.customresources.definitions`) — of the release the
server reports, where the rules changed between releases — and the length limits of
``pkg/apis/core/validation/events.go`` (Events). Every rule runs on the storage version
(``resource.k8s.io/v1``, core ``v1`` Events), so field paths are storage paths whatever version
the client wrote, as the real server reports them.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Callable, Mapping
from typing import Any

from kube_standin.apiserver.claim_rules import selectors, validate_claim_spec, validate_claim_status
from kube_standin.apiserver.customresources.definitions import validate_crd, validate_crd_update
from kube_standin.apiserver.features import NEWEST_DEFAULTS, FeatureGates
from kube_standin.apiserver.fielderrors import FieldErrors as _Errors
from kube_standin.apiserver.fielderrors import dns_label, dns_subdomain, qualified_key
from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.slice_rules import validate_resource_slice
from kube_standin.apiserver.status import Cause

__all__ = ["validate_object", "validate_update"]

Obj = Mapping[str, Any]

_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")

_STANDARD_FINALIZERS = {"kubernetes", "orphan", "foregroundDeletion"}
_ANNOTATIONS_MAX_BYTES = 256 * 1024

# k8s.io/kubernetes/pkg/apis/core/types.go MaxSecretSize: what a ConfigMap's data + binaryData
# (ValidateConfigMap) and a Secret's data (ValidateSecret) may hold together, in bytes.
MAX_DATA_BYTES = 1024 * 1024


# -- object metadata ----------------------------------------------------------------------------


def _validate_metadata(errs: _Errors, res: ResourceType, meta: Obj) -> None:
    name = meta.get("name")
    if name:
        if res.name_is_path_segment:
            if name in (".", "..") or "/" in name or "%" in name:
                errs.invalid("metadata.name", name, "may not be '.' or '..' and may not contain '/' or '%'")
        elif res.name_is_label:
            dns_label(errs, "metadata.name", name)
        else:
            dns_subdomain(errs, "metadata.name", name)
    elif not meta.get("generateName"):
        errs.required("metadata.name", "name or generateName is required")
    for key, value in (meta.get("labels") or {}).items():
        qualified_key(errs, f"metadata.labels[{key}]", key)
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            errs.invalid(
                f"metadata.labels[{key}]",
                value,
                "a valid label must be an empty string or consist of alphanumeric characters, "
                "'-', '_' or '.', and must start and end with an alphanumeric character "
                "(at most 63 characters)",
            )
    annotations = meta.get("annotations") or {}
    size = 0
    for key, value in annotations.items():
        qualified_key(errs, f"metadata.annotations[{key}]", key)
        size += len(key) + len(value or "")
    if size > _ANNOTATIONS_MAX_BYTES:
        errs.too_long("metadata.annotations", _ANNOTATIONS_MAX_BYTES)
    for index, finalizer in enumerate(meta.get("finalizers") or ()):
        if finalizer in _STANDARD_FINALIZERS:
            continue
        qualified_key(errs, f"metadata.finalizers[{index}]", str(finalizer))


# k8s.io/kubernetes/pkg/apis/core/validation/events.go. Go's len() of a string counts bytes, so
# the limits are UTF-8 bytes even though the messages say "characters".
EVENT_REPORTING_INSTANCE_LIMIT = 128
EVENT_ACTION_LIMIT = 128
EVENT_REASON_LIMIT = 128
EVENT_NOTE_LIMIT = 1024


def _validate_event(errs: _Errors, obj: Obj) -> None:
    """legacyValidateEvent's length limits, which hold for every Event that has an eventTime
    (every events.k8s.io/v1 Event; core Events written by old clients have none and are exempt).
    The object is in storage form (core v1), so the note is ``message``, as the server names it."""
    if not obj.get("eventTime"):
        return
    limits = (
        ("reportingInstance", EVENT_REPORTING_INSTANCE_LIMIT),
        ("action", EVENT_ACTION_LIMIT),
        ("reason", EVENT_REASON_LIMIT),
        ("message", EVENT_NOTE_LIMIT),
    )
    for field_name, limit in limits:
        value = obj.get(field_name)
        if isinstance(value, str) and len(value.encode()) > limit:
            errs.invalid(field_name, "", f"can have at most {limit} characters")


def _validate_device_class(errs: _Errors, obj: Obj, gates: FeatureGates) -> None:
    spec = obj.get("spec") or {}
    selectors(errs, "spec.selectors", spec.get("selectors"))


def _decoded_length(value: Any) -> int:
    try:
        return len(base64.b64decode(str(value), validate=True))
    except (binascii.Error, ValueError):
        return len(str(value))


def _validate_data_size(errs: _Errors, res: ResourceType, obj: Obj) -> None:
    """``ValidateConfigMap`` / ``ValidateSecret``: the data (decoded bytes) is at most 1 MiB."""
    data = obj.get("data") or {}
    if res.kind == "ConfigMap":
        total = sum(len(str(v).encode()) for v in data.values())
        total += sum(_decoded_length(v) for v in (obj.get("binaryData") or {}).values())
        if total > MAX_DATA_BYTES:
            errs.too_long("", MAX_DATA_BYTES)
    elif res.kind == "Secret" and sum(_decoded_length(v) for v in data.values()) > MAX_DATA_BYTES:
        errs.too_long("data", MAX_DATA_BYTES)


_KIND_RULES: dict[str, Callable[[_Errors, Obj, FeatureGates], None]] = {
    "ResourceSlice": validate_resource_slice,
    "ResourceClaim": lambda errs, obj, gates: validate_claim_spec(errs, "spec", obj.get("spec"), gates),
    "ResourceClaimTemplate": lambda errs, obj, gates: validate_claim_spec(
        errs, "spec.spec", (obj.get("spec") or {}).get("spec"), gates
    ),
    "DeviceClass": _validate_device_class,
}


def validate_object(res: ResourceType, obj: Obj, gates: FeatureGates = NEWEST_DEFAULTS) -> list[Cause]:
    """Rules for an object being created (storage version), as the release of ``gates`` has them."""
    errs = _Errors()
    _validate_metadata(errs, res, obj.get("metadata") or {})
    if res.group == "" and res.kind in ("ConfigMap", "Secret"):
        _validate_data_size(errs, res, obj)
    if res.group == "resource.k8s.io":
        _KIND_RULES[res.kind](errs, obj, gates)
        if res.kind == "ResourceClaim" and obj.get("status"):
            validate_claim_status(errs, obj, None)
    elif res.kind == "Event":
        _validate_event(errs, obj)
    elif res.kind == "CustomResourceDefinition" and res.group == "apiextensions.k8s.io":
        errs.causes += validate_crd(dict(obj))
    return errs.causes


def validate_update(
    res: ResourceType, new: Obj, old: Obj, subresource: str | None, gates: FeatureGates = NEWEST_DEFAULTS
) -> list[Cause]:
    """Rules for an update of ``old`` to ``new`` (storage versions, after status semantics)."""
    errs = _Errors()
    if subresource != "status":
        _validate_metadata(errs, res, new.get("metadata") or {})
    if res.kind == "Event":
        _validate_event(errs, new)
    if res.group == "" and res.kind in ("ConfigMap", "Secret"):
        _validate_data_size(errs, res, new)
    if res.kind == "CustomResourceDefinition" and res.group == "apiextensions.k8s.io" and subresource is None:
        errs.causes += validate_crd_update(dict(new), dict(old))
    if res.group != "resource.k8s.io":
        return errs.causes
    if res.kind in ("ResourceClaim", "ResourceClaimTemplate") and new.get("spec") != old.get("spec"):
        errs.invalid("spec", None, "field is immutable")
    if res.kind == "ResourceClaim":
        validate_claim_status(errs, new, old)
    elif res.kind == "ResourceSlice":
        validate_resource_slice(errs, new, gates)
        _slice_immutable_fields(errs, new, old)
    elif res.kind == "DeviceClass":
        _validate_device_class(errs, new, gates)
    return errs.causes


def _slice_immutable_fields(errs: _Errors, new: Obj, old: Obj) -> None:
    """``ValidateResourceSliceUpdate``: driver, nodeName and pool.name are ``ValidateImmutableField``
    (a slice moving to another node is recreated)."""
    new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
    immutable: list[tuple[str, Any, Any]] = [
        ("spec.driver", new_spec.get("driver"), old_spec.get("driver")),
        ("spec.nodeName", new_spec.get("nodeName"), old_spec.get("nodeName")),
        (
            "spec.pool.name",
            (new_spec.get("pool") or {}).get("name"),
            (old_spec.get("pool") or {}).get("name"),
        ),
    ]
    for field_path, now, before in immutable:
        if now != before:
            errs.invalid(field_path, now, "field is immutable")
