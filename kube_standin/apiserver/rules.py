"""Validation the real API server does beyond what the JSON schemas can express.

The schemas check shapes (types, unknown fields, required fields). The API server also
checks names, label syntax, limits, mutually exclusive fields and immutability; the subset
here is what fabric-dra's objects exercise, taken from Kubernetes v1.34
``pkg/apis/core/validation`` (object metadata) and ``pkg/apis/resource/validation``
(ResourceSlice, ResourceClaim, ResourceClaimTemplate, DeviceClass), and the length limits of
``pkg/apis/core/validation/events.go`` (Events). Every rule runs on the storage version
(``resource.k8s.io/v1``, core ``v1`` Events), so field paths are storage paths whatever version
the client wrote, as the real server reports them.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.status import Cause

__all__ = ["validate_object", "validate_update"]

Obj = Mapping[str, Any]

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
_LABEL_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character"
)
_SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
    "and must start and end with an alphanumeric character"
)
_C_IDENTIFIER_MSG = (
    "a valid C identifier must start with alphabetic character or '_', "
    "followed by a string of alphanumeric characters or '_'"
)
_REQUEST_REF_MSG = (
    "must be the name of a request in the claim or the name of a request and the subrequest separated by '/'"
)
_STANDARD_FINALIZERS = {"kubernetes", "orphan", "foregroundDeletion"}
_ANNOTATIONS_MAX_BYTES = 256 * 1024

# k8s.io/kubernetes/pkg/apis/resource/types.go (v1.34)
RESOURCE_SLICE_MAX_DEVICES = 128
RESOURCE_SLICE_MAX_DEVICES_ADVANCED = 64
MAX_ATTRIBUTES_AND_CAPACITIES = 32
ATTRIBUTE_MAX_VALUE_LENGTH = 64
DEVICE_MAX_DOMAIN_LENGTH = 63
DEVICE_MAX_ID_LENGTH = 32
POOL_NAME_MAX_LENGTH = 253
DEVICE_REQUESTS_MAX = 32
DEVICE_SELECTORS_MAX = 32
RESERVED_FOR_MAX = 256
# k8s.io/kubernetes/pkg/apis/core/types.go MaxSecretSize: what a ConfigMap's data + binaryData
# (ValidateConfigMap) and a Secret's data (ValidateSecret) may hold together, in bytes.
MAX_DATA_BYTES = 1024 * 1024


class _Errors:
    def __init__(self) -> None:
        self.causes: list[Cause] = []

    def invalid(self, path: str, value: Any, detail: str) -> None:
        self.causes.append(Cause(path, "FieldValueInvalid", f"Invalid value: {json.dumps(value)}: {detail}"))

    def required(self, path: str, detail: str = "") -> None:
        self.causes.append(
            Cause(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))
        )

    def too_many(self, path: str, have: int, limit: int) -> None:
        self.causes.append(
            Cause(path, "FieldValueTooMany", f"Too many: {have}: must have at most {limit} items")
        )

    def too_long(self, path: str, limit: int) -> None:
        self.causes.append(Cause(path, "FieldValueTooLong", f"Too long: may not be more than {limit} bytes"))

    def duplicate(self, path: str, value: Any) -> None:
        self.causes.append(Cause(path, "FieldValueDuplicate", f"Duplicate value: {json.dumps(value)}"))

    def forbidden(self, path: str, detail: str) -> None:
        self.causes.append(Cause(path, "FieldValueForbidden", f"Forbidden: {detail}"))

    def not_supported(self, path: str, value: Any, allowed: list[str]) -> None:
        options = ", ".join(json.dumps(a) for a in allowed)
        self.causes.append(
            Cause(
                path,
                "FieldValueNotSupported",
                f"Unsupported value: {json.dumps(value)}: supported values: {options}",
            )
        )


def _dns_label(errs: _Errors, path: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
    elif len(value) > 63:
        errs.invalid(path, value, "must be no more than 63 characters")
    elif not _DNS1123_LABEL.fullmatch(value):
        errs.invalid(path, value, _LABEL_MSG)


def _dns_subdomain(errs: _Errors, path: str, value: Any, max_len: int = 253) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
    elif len(value) > max_len:
        errs.invalid(path, value, f"must be no more than {max_len} characters")
    elif not _DNS1123_SUBDOMAIN.fullmatch(value):
        errs.invalid(path, value, _SUBDOMAIN_MSG)


def _qualified_key(errs: _Errors, path: str, key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if not slash:
        name = key
    if not name or len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        errs.invalid(
            path,
            key,
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
            "with an alphanumeric character (at most 63 characters)",
        )
    if slash:
        if not prefix:
            errs.invalid(path, key, "prefix part must be non-empty")
        else:
            _dns_subdomain(errs, path, prefix)


# -- object metadata ----------------------------------------------------------------------------


def _validate_metadata(errs: _Errors, res: ResourceType, meta: Obj) -> None:
    name = meta.get("name")
    if name:
        if res.name_is_path_segment:
            if name in (".", "..") or "/" in name or "%" in name:
                errs.invalid("metadata.name", name, "may not be '.' or '..' and may not contain '/' or '%'")
        elif res.name_is_label:
            _dns_label(errs, "metadata.name", name)
        else:
            _dns_subdomain(errs, "metadata.name", name)
    elif not meta.get("generateName"):
        errs.required("metadata.name", "name or generateName is required")
    for key, value in (meta.get("labels") or {}).items():
        _qualified_key(errs, f"metadata.labels[{key}]", key)
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
        _qualified_key(errs, f"metadata.annotations[{key}]", key)
        size += len(key) + len(value or "")
    if size > _ANNOTATIONS_MAX_BYTES:
        errs.too_long("metadata.annotations", _ANNOTATIONS_MAX_BYTES)
    for index, finalizer in enumerate(meta.get("finalizers") or ()):
        if finalizer in _STANDARD_FINALIZERS:
            continue
        _qualified_key(errs, f"metadata.finalizers[{index}]", str(finalizer))


# -- resource.k8s.io ----------------------------------------------------------------------------


def _driver_name(errs: _Errors, path: str, value: Any) -> None:
    # A DRA driver name follows CSI driver name rules: a DNS subdomain of at most 63 characters.
    if not isinstance(value, str) or not value:
        errs.required(path)
        return
    if len(value) > 63:
        errs.invalid(path, value, "must be no more than 63 characters")
    if not _DNS1123_SUBDOMAIN.fullmatch(value.lower()):
        errs.invalid(path, value, _SUBDOMAIN_MSG)


def _pool_name(errs: _Errors, path: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        errs.required(path)
        return
    if len(value) > POOL_NAME_MAX_LENGTH:
        errs.too_long(path, POOL_NAME_MAX_LENGTH)
    for part in value.split("/"):
        if not _DNS1123_SUBDOMAIN.fullmatch(part):
            errs.invalid(path, value, _SUBDOMAIN_MSG + " (in each '/'-separated part)")
            break


def _attribute_name(errs: _Errors, path: str, key: str) -> None:
    parts = key.split("/")
    if len(parts) > 2:
        errs.invalid(path, key, "must not contain more than one slash")
        return
    if len(key) > DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH:
        errs.too_long(path, DEVICE_MAX_DOMAIN_LENGTH + 1 + DEVICE_MAX_ID_LENGTH)
    ident = parts[-1]
    if len(parts) == 2:
        if not parts[0]:
            errs.invalid(path, "", "the domain must not be empty")
        else:
            _driver_name(errs, path, parts[0])
    if not ident:
        errs.invalid(path, "", "the name must not be empty")
    elif len(ident) > DEVICE_MAX_ID_LENGTH:
        errs.too_long(path, DEVICE_MAX_ID_LENGTH)
    elif not _C_IDENTIFIER.fullmatch(ident):
        errs.invalid(
            path,
            ident,
            _C_IDENTIFIER_MSG,
        )


@functools.lru_cache(maxsize=4096)
def _attribute_name_causes(key: str) -> tuple[Cause, ...]:
    # Every device of a slice repeats the same few attribute names: check each name once.
    errs = _Errors()
    _attribute_name(errs, "", key)
    return tuple(errs.causes)


def _check_attribute_name(errs: _Errors, path: str, key: str) -> None:
    errs.causes.extend(Cause(path, c.reason, c.message) for c in _attribute_name_causes(key))


_SCALAR_ATTRIBUTE_KINDS = ("bool", "int", "string", "version")
_LIST_ATTRIBUTE_KINDS = ("bools", "ints", "strings", "versions")


def _plainly_valid_attribute(value: Any) -> bool:
    """The common case, decided without building a field path: one bool, int or short string."""
    if type(value) is not dict or len(value) != 1:
        return False
    kind, item = next(iter(value.items()))
    if kind in ("bool", "int"):
        return item is not None
    return kind == "string" and type(item) is str and len(item) <= ATTRIBUTE_MAX_VALUE_LENGTH


def _attribute_value(errs: _Errors, path: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        return
    present = [k for k in (*_SCALAR_ATTRIBUTE_KINDS, *_LIST_ATTRIBUTE_KINDS) if value.get(k) is not None]
    if not present:
        errs.required(path, "exactly one value must be specified")
        return
    if len(present) > 1:
        errs.invalid(path, {k: value[k] for k in present}, "exactly one value must be specified")
        return
    kind = present[0]
    items = value[kind] if kind in _LIST_ATTRIBUTE_KINDS else [value[kind]]
    for index, item in enumerate(items if isinstance(items, list) else []):
        where = f"{path}.{kind}" + (f"[{index}]" if kind in _LIST_ATTRIBUTE_KINDS else "")
        if kind.startswith("string") and isinstance(item, str) and len(item) > ATTRIBUTE_MAX_VALUE_LENGTH:
            errs.too_long(where, ATTRIBUTE_MAX_VALUE_LENGTH)
        if kind.startswith("version") and isinstance(item, str):
            if not _SEMVER.fullmatch(item):
                errs.invalid(where, item, "must be a string compatible with semver.org spec 2.0.0")
            if len(item) > ATTRIBUTE_MAX_VALUE_LENGTH:
                errs.too_long(where, ATTRIBUTE_MAX_VALUE_LENGTH)


def _node_selection(errs: _Errors, path: str, holder: Obj, *, per_device_field: bool) -> list[str]:
    set_fields: list[str] = []
    node_name = holder.get("nodeName")
    if node_name is not None:
        if node_name:
            set_fields.append("`nodeName`")
            _dns_subdomain(errs, f"{path}.nodeName", node_name)
        else:
            errs.invalid(f"{path}.nodeName", node_name, "must be either unset or set to a non-empty string")
    selector = holder.get("nodeSelector")
    if selector is not None:
        set_fields.append("`nodeSelector`")
        terms = selector.get("nodeSelectorTerms") if isinstance(selector, Mapping) else None
        if not per_device_field and (not isinstance(terms, list) or len(terms) != 1):
            errs.invalid(
                f"{path}.nodeSelector.nodeSelectorTerms", terms, "must have exactly one node selector term"
            )
    flags = ("allNodes",) if per_device_field else ("allNodes", "perDeviceNodeSelection")
    for flag in flags:
        value = holder.get(flag)
        if value is None:
            continue
        if value is True:
            set_fields.append(f"`{flag}`")
        else:
            errs.invalid(f"{path}.{flag}", value, "must be either unset or set to true")
    return set_fields


def _validate_device(errs: _Errors, path: str, device: Obj, per_device: bool) -> None:
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errs.invalid(
            path,
            len(attributes) + len(capacity),
            f"the total number of attributes and capacities must not exceed {MAX_ATTRIBUTES_AND_CAPACITIES}",
        )
    for key, value in attributes.items():
        if _attribute_name_causes(key) or not _plainly_valid_attribute(value):
            where = f"{path}.attributes[{key}]"
            _check_attribute_name(errs, where, key)
            _attribute_value(errs, where, value)
    for key in capacity:
        if _attribute_name_causes(key):
            _check_attribute_name(errs, f"{path}.capacity[{key}]", key)
    if per_device:
        chosen = _node_selection(errs, path, device, per_device_field=True)
        if len(chosen) != 1:
            errs.invalid(
                path,
                "{" + ", ".join(chosen) + "}",
                "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
                "`perDeviceNodeSelection` is set to true in the ResourceSlice spec",
            )
    elif any(device.get(k) is not None for k in ("nodeName", "nodeSelector", "allNodes")):
        errs.invalid(
            path,
            None,
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set "
            "to true in the ResourceSlice spec",
        )
    conditions = device.get("bindingConditions") or []
    failures = device.get("bindingFailureConditions") or []
    if conditions and not failures:
        errs.required(f"{path}.bindingFailureConditions", "required when bindingConditions are set")
    if failures and not conditions:
        errs.required(f"{path}.bindingConditions", "required when bindingFailureConditions are set")
    if len(conditions) > 4:
        errs.too_many(f"{path}.bindingConditions", len(conditions), 4)
    if len(failures) > 4:
        errs.too_many(f"{path}.bindingFailureConditions", len(failures), 4)


def _uses_advanced_features(devices: list[Any]) -> bool:
    """Taints, counters or list-valued attributes halve the device limit
    (ResourceSliceMaxDevicesWithAdvancedFeatures)."""
    for device in devices:
        if not isinstance(device, Mapping):
            continue
        if device.get("taints") or device.get("consumesCounters"):
            return True
        for value in (device.get("attributes") or {}).values():
            if (
                isinstance(value, Mapping)
                and len(value) == 1
                and next(iter(value)) in _SCALAR_ATTRIBUTE_KINDS
            ):
                continue
            if isinstance(value, Mapping) and any(value.get(k) is not None for k in _LIST_ATTRIBUTE_KINDS):
                return True
    return False


def _validate_resource_slice(errs: _Errors, obj: Obj) -> None:
    spec = obj.get("spec") or {}
    _driver_name(errs, "spec.driver", spec.get("driver"))
    pool = spec.get("pool") or {}
    _pool_name(errs, "spec.pool.name", pool.get("name"))
    if isinstance(pool.get("resourceSliceCount"), int) and pool["resourceSliceCount"] <= 0:
        errs.invalid("spec.pool.resourceSliceCount", pool["resourceSliceCount"], "must be greater than zero")
    if isinstance(pool.get("generation"), int) and pool["generation"] < 0:
        errs.invalid("spec.pool.generation", pool["generation"], "must be greater than or equal to zero")
    chosen = _node_selection(errs, "spec", spec, per_device_field=False)
    if not chosen:
        errs.required(
            "spec",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
        )
    elif len(chosen) > 1:
        errs.invalid(
            "spec",
            "{" + ", ".join(chosen) + "}",
            "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required, "
            "but multiple fields are set",
        )
    devices = spec.get("devices")
    if spec.get("sharedCounters") is not None and devices is not None:
        errs.invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed")
    if not isinstance(devices, list):
        return
    limit = (
        RESOURCE_SLICE_MAX_DEVICES_ADVANCED
        if _uses_advanced_features(devices)
        else RESOURCE_SLICE_MAX_DEVICES
    )
    if len(devices) > limit:
        errs.too_many("spec.devices", len(devices), limit)
    seen: set[str] = set()
    per_device = spec.get("perDeviceNodeSelection") is True
    for index, device in enumerate(devices):
        if not isinstance(device, Mapping):
            continue
        path = f"spec.devices[{index}]"
        name = device.get("name")
        _dns_label(errs, f"{path}.name", name)
        if isinstance(name, str) and name:
            if name in seen:
                errs.duplicate(f"{path}.name", name)
            seen.add(name)
        _validate_device(errs, path, device, per_device)


def _cel(errs: _Errors, path: str, expression: Any) -> None:
    if not isinstance(expression, str) or not expression.strip():
        errs.required(path)
        return
    try:
        import celpy

        celpy.Environment().compile(expression)
    except Exception as err:  # celpy raises its own parse error types
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        errs.invalid(path, expression, f"compilation failed: {first}")


def _selectors(errs: _Errors, path: str, selectors: Any) -> None:
    if not isinstance(selectors, list):
        return
    if len(selectors) > DEVICE_SELECTORS_MAX:
        errs.too_many(path, len(selectors), DEVICE_SELECTORS_MAX)
    for index, selector in enumerate(selectors):
        if isinstance(selector, Mapping):
            cel = selector.get("cel")
            if not isinstance(cel, Mapping):
                errs.required(f"{path}[{index}].cel")
            else:
                _cel(errs, f"{path}[{index}].cel.expression", cel.get("expression"))


def _exact_request(errs: _Errors, path: str, request: Obj) -> None:
    _dns_subdomain(errs, f"{path}.deviceClassName", request.get("deviceClassName"))
    _selectors(errs, f"{path}.selectors", request.get("selectors"))
    mode = request.get("allocationMode", "ExactCount")
    count = request.get("count")
    if mode == "All":
        if count not in (None, 0):
            errs.invalid(f"{path}.count", count, "must not be specified when allocationMode is 'All'")
    elif mode == "ExactCount":
        if isinstance(count, int) and count <= 0:
            errs.invalid(f"{path}.count", count, "must be greater than zero")
    else:
        errs.not_supported(f"{path}.allocationMode", mode, ["All", "ExactCount"])


def _request_names(devices: Obj) -> dict[str, set[str]]:
    names: dict[str, set[str]] = {}
    for request in devices.get("requests") or ():
        if isinstance(request, Mapping) and isinstance(request.get("name"), str):
            names[request["name"]] = {
                str(s.get("name")) for s in request.get("firstAvailable") or () if isinstance(s, Mapping)
            }
    return names


def _request_ref_ok(names: dict[str, set[str]], ref: Any) -> bool:
    if not isinstance(ref, str):
        return False
    parts = ref.split("/")
    if len(parts) > 2 or parts[0] not in names:
        return False
    return len(parts) == 1 or parts[1] in names[parts[0]]


def _validate_claim_spec(errs: _Errors, path: str, spec: Any) -> None:
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    if not isinstance(devices, Mapping):
        return
    requests = devices.get("requests") or []
    if len(requests) > DEVICE_REQUESTS_MAX:
        errs.too_many(f"{path}.devices.requests", len(requests), DEVICE_REQUESTS_MAX)
    seen: set[str] = set()
    for index, request in enumerate(requests):
        if not isinstance(request, Mapping):
            continue
        where = f"{path}.devices.requests[{index}]"
        name = request.get("name")
        _dns_label(errs, f"{where}.name", name)
        if isinstance(name, str) and name in seen:
            errs.duplicate(f"{where}.name", name)
        seen.add(str(name))
        exactly, first = request.get("exactly"), request.get("firstAvailable")
        if exactly is None and not first:
            errs.required(where, "exactly one of `exactly` or `firstAvailable` is required")
        elif exactly is not None and first:
            errs.invalid(
                where,
                None,
                "exactly one of `exactly` or `firstAvailable` is required, but multiple fields are set",
            )
        elif isinstance(exactly, Mapping):
            _exact_request(errs, f"{where}.exactly", exactly)
        else:
            sub_seen: set[str] = set()
            for sub_index, sub in enumerate(first or ()):
                if not isinstance(sub, Mapping):
                    continue
                sub_where = f"{where}.firstAvailable[{sub_index}]"
                _dns_label(errs, f"{sub_where}.name", sub.get("name"))
                if sub.get("name") in sub_seen:
                    errs.duplicate(f"{sub_where}.name", sub.get("name"))
                sub_seen.add(str(sub.get("name")))
                _exact_request(errs, sub_where, sub)
    names = _request_names(devices)
    for index, constraint in enumerate(devices.get("constraints") or ()):
        if not isinstance(constraint, Mapping):
            continue
        for ref_index, ref in enumerate(constraint.get("requests") or ()):
            if not _request_ref_ok(names, ref):
                errs.invalid(
                    f"{path}.devices.constraints[{index}].requests[{ref_index}]",
                    ref,
                    _REQUEST_REF_MSG,
                )
    for index, config in enumerate(devices.get("config") or ()):
        if not isinstance(config, Mapping):
            continue
        for ref_index, ref in enumerate(config.get("requests") or ()):
            if not _request_ref_ok(names, ref):
                errs.invalid(
                    f"{path}.devices.config[{index}].requests[{ref_index}]",
                    ref,
                    _REQUEST_REF_MSG,
                )


def _validate_claim_status(errs: _Errors, claim: Obj, old: Obj | None) -> None:
    status = claim.get("status") or {}
    old_status = (old or {}).get("status") or {}
    names = _request_names(((claim.get("spec") or {}).get("devices")) or {})
    allocation = status.get("allocation")
    old_allocation = old_status.get("allocation")
    if allocation is not None and old_allocation is not None and allocation != old_allocation:
        errs.invalid("status.allocation", None, "field is immutable")
    reserved = status.get("reservedFor") or []
    if reserved and allocation is None:
        errs.forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
    if len(reserved) > RESERVED_FOR_MAX:
        errs.too_many("status.reservedFor", len(reserved), RESERVED_FOR_MAX)
    uids: set[str] = set()
    for index, ref in enumerate(reserved):
        uid = ref.get("uid") if isinstance(ref, Mapping) else None
        if uid in uids:
            errs.duplicate(f"status.reservedFor[{index}].uid", uid)
        uids.add(str(uid))
    if isinstance(allocation, Mapping):
        results = ((allocation.get("devices") or {}).get("results")) or []
        for index, result in enumerate(results):
            if not isinstance(result, Mapping):
                continue
            where = f"status.allocation.devices.results[{index}]"
            if not _request_ref_ok(names, result.get("request")):
                errs.invalid(
                    f"{where}.request",
                    result.get("request"),
                    _REQUEST_REF_MSG,
                )
            _driver_name(errs, f"{where}.driver", result.get("driver"))
            _pool_name(errs, f"{where}.pool", result.get("pool"))
            _dns_label(errs, f"{where}.device", result.get("device"))
    allocated = set()
    if isinstance(allocation, Mapping):
        for result in ((allocation.get("devices") or {}).get("results")) or []:
            if isinstance(result, Mapping):
                allocated.add(
                    (result.get("driver"), result.get("pool"), result.get("device"), result.get("shareID"))
                )
    for index, device in enumerate(status.get("devices") or ()):
        if not isinstance(device, Mapping):
            continue
        key = (device.get("driver"), device.get("pool"), device.get("device"), device.get("shareID"))
        if key not in allocated:
            errs.invalid(
                f"status.devices[{index}]", list(key[:3]), "must be an allocated device in the claim"
            )


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


def _validate_device_class(errs: _Errors, obj: Obj) -> None:
    spec = obj.get("spec") or {}
    _selectors(errs, "spec.selectors", spec.get("selectors"))


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


_KIND_RULES: dict[str, Callable[[_Errors, Obj], None]] = {
    "ResourceSlice": _validate_resource_slice,
    "ResourceClaim": lambda errs, obj: _validate_claim_spec(errs, "spec", obj.get("spec")),
    "ResourceClaimTemplate": lambda errs, obj: _validate_claim_spec(
        errs, "spec.spec", (obj.get("spec") or {}).get("spec")
    ),
    "DeviceClass": _validate_device_class,
}


def validate_object(res: ResourceType, obj: Obj) -> list[Cause]:
    """Rules for an object being created (storage version)."""
    errs = _Errors()
    _validate_metadata(errs, res, obj.get("metadata") or {})
    if res.group == "" and res.kind in ("ConfigMap", "Secret"):
        _validate_data_size(errs, res, obj)
    if res.group == "resource.k8s.io":
        _KIND_RULES[res.kind](errs, obj)
        if res.kind == "ResourceClaim" and obj.get("status"):
            _validate_claim_status(errs, obj, None)
    elif res.kind == "Event":
        _validate_event(errs, obj)
    return errs.causes


def validate_update(res: ResourceType, new: Obj, old: Obj, subresource: str | None) -> list[Cause]:
    """Rules for an update of ``old`` to ``new`` (storage versions, after status semantics)."""
    errs = _Errors()
    if subresource != "status":
        _validate_metadata(errs, res, new.get("metadata") or {})
    if res.kind == "Event":
        _validate_event(errs, new)
    if res.group == "" and res.kind in ("ConfigMap", "Secret"):
        _validate_data_size(errs, res, new)
    if res.group != "resource.k8s.io":
        return errs.causes
    if res.kind in ("ResourceClaim", "ResourceClaimTemplate") and new.get("spec") != old.get("spec"):
        errs.invalid("spec", None, "field is immutable")
    if res.kind == "ResourceClaim":
        _validate_claim_status(errs, new, old)
    elif res.kind == "ResourceSlice":
        _validate_resource_slice(errs, new)
        new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
        # pkg/apis/resource/validation/validation.go ValidateResourceSliceUpdate: driver, nodeName
        # and pool.name are ValidateImmutableField (a slice moving to another node is recreated)
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
    elif res.kind == "DeviceClass":
        _validate_device_class(errs, new)
    return errs.causes
