"""What the API server checks in a ResourceClaim (and a template's claim spec) beyond its schema:
``validateDeviceClaim``, ``validateDeviceConstraint``, ``validateResourceClaimStatusUpdate``,
``validateDeviceRequestAllocationResult`` and ``validateDeviceStatus`` in
``pkg/apis/resource/validation/validation.go``.

Shared devices bring two rules: a result's ``shareID`` is a UUID in normalized (lowercase)
form (``validateUID``), and a ``status.devices`` entry names an allocated device *and* its share:
driver, pool, device and shareID together (``SharedDeviceID``), or it is refused.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any

from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.fielderrors import (
    FieldErrors,
    dns_label,
    dns_subdomain,
    driver_name,
    pool_name,
    qualified_key,
)
from kube_standin.apiserver.slice_rules import binding_parameters

__all__ = ["selectors", "validate_claim_spec", "validate_claim_status", "validate_conditions"]

Obj = Mapping[str, Any]

# k8s.io/api/resource/v1/types.go
DEVICE_REQUESTS_MAX = 32
DEVICE_SELECTORS_MAX = 32
RESERVED_FOR_MAX = 256
STATUS_MAX_CONDITIONS = 8  # AllocatedDeviceStatusMaxConditions
STATUS_DATA_MAX_LENGTH = 10 * 1024  # AllocatedDeviceStatusDataMaxLength
NETWORK_MAX_IPS = 16
NETWORK_INTERFACE_NAME_MAX = 256
NETWORK_HARDWARE_ADDRESS_MAX = 128
# metav1validation.ValidateCondition
_CONDITION_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
_CONDITION_STATUSES = ["False", "True", "Unknown"]
_CONDITION_REASON_MAX = 1024
_CONDITION_MESSAGE_MAX = 32 * 1024

_REQUEST_REF_MSG = (
    "must be the name of a request in the claim or the name of a request and the subrequest separated by '/'"
)
_NEITHER_CONSTRAINT = (
    'exactly one of "matchAttribute" or "distinctAttribute" is required, but multiple fields are set'
)
_UID_NORMALIZED = (
    "uid must be in RFC 4122 normalized form, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` "
    "with lowercase hexadecimal characters"
)
_HEX = re.compile(r"[0-9a-fA-F]{2}")


# -- the claim spec -----------------------------------------------------------------------------


def _cel(errs: FieldErrors, path: str, expression: Any) -> None:
    if not isinstance(expression, str) or not expression.strip():
        errs.required(path)
        return
    try:
        import celpy

        celpy.Environment().compile(expression)
    except Exception as err:  # celpy raises its own parse error types
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        errs.invalid(path, expression, f"compilation failed: {first}")


def selectors(errs: FieldErrors, path: str, value: Any) -> None:
    if not isinstance(value, list):
        return
    if len(value) > DEVICE_SELECTORS_MAX:
        errs.too_many(path, len(value), DEVICE_SELECTORS_MAX)
    for index, selector in enumerate(value):
        if isinstance(selector, Mapping):
            cel = selector.get("cel")
            if not isinstance(cel, Mapping):
                errs.required(f"{path}[{index}].cel")
            else:
                _cel(errs, f"{path}[{index}].cel.expression", cel.get("expression"))


def _exact_request(errs: FieldErrors, path: str, request: Obj) -> None:
    dns_subdomain(errs, f"{path}.deviceClassName", request.get("deviceClassName"))
    selectors(errs, f"{path}.selectors", request.get("selectors"))
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


def _request(errs: FieldErrors, where: str, request: Obj) -> None:
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
            dns_label(errs, f"{sub_where}.name", sub.get("name"))
            if sub.get("name") in sub_seen:
                errs.duplicate(f"{sub_where}.name", sub.get("name"))
            sub_seen.add(str(sub.get("name")))
            _exact_request(errs, sub_where, sub)


def _fully_qualified(errs: FieldErrors, path: str, name: Any) -> None:
    """``validateFullyQualifiedName``: the attribute of a constraint names its domain."""
    if isinstance(name, str) and "/" not in name:
        errs.invalid(path, name, "a fully qualified name must be a domain and a name separated by a slash")


def _constraints(errs: FieldErrors, path: str, devices: Obj, gates: FeatureGates) -> None:
    names = _request_names(devices)
    for index, constraint in enumerate(devices.get("constraints") or ()):
        if not isinstance(constraint, Mapping):
            continue
        where = f"{path}.devices.constraints[{index}]"
        for ref_index, ref in enumerate(constraint.get("requests") or ()):
            if not _request_ref_ok(names, ref):
                errs.invalid(f"{where}.requests[{ref_index}]", ref, _REQUEST_REF_MSG)
        if constraint.get("matchAttribute") is not None:
            _fully_qualified(errs, f"{where}.matchAttribute", constraint["matchAttribute"])
        elif constraint.get("distinctAttribute") is not None:
            _fully_qualified(errs, f"{where}.distinctAttribute", constraint["distinctAttribute"])
        elif gates.enabled("DRAConsumableCapacity"):
            # upstream's text, for the case of neither
            errs.required(where, _NEITHER_CONSTRAINT)
        else:
            errs.required(f"{where}.matchAttribute")


def validate_claim_spec(errs: FieldErrors, path: str, spec: Any, gates: FeatureGates) -> None:
    """``validateDeviceClaim``."""
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
        dns_label(errs, f"{where}.name", name)
        if isinstance(name, str) and name in seen:
            errs.duplicate(f"{where}.name", name)
        seen.add(str(name))
        _request(errs, where, request)
    _constraints(errs, path, devices, gates)
    names = _request_names(devices)
    for index, config in enumerate(devices.get("config") or ()):
        if not isinstance(config, Mapping):
            continue
        for ref_index, ref in enumerate(config.get("requests") or ()):
            if not _request_ref_ok(names, ref):
                errs.invalid(f"{path}.devices.config[{index}].requests[{ref_index}]", ref, _REQUEST_REF_MSG)


# -- the claim status ---------------------------------------------------------------------------


def _uuid_problem(value: str) -> str | None:
    """google/uuid's ``Validate`` (standard, ``urn:uuid:``, braced and 32-hex forms)."""
    text = value
    if len(text) == 36 + 9:
        if text[:9].lower() != "urn:uuid:":
            return f"invalid urn prefix: {json.dumps(text[:9])}"
        text = text[9:]
    elif len(text) == 36 + 2:
        if text[0] != "{" or text[-1] != "}":
            return "invalid bracketed UUID format"
        text = text[1:-1]
    elif len(text) == 32:
        return (
            None if all(_HEX.fullmatch(text[i : i + 2]) for i in range(0, 32, 2)) else "invalid UUID format"
        )
    elif len(text) != 36:
        return f"invalid UUID length: {len(text)}"
    if any(text[i] != "-" for i in (8, 13, 18, 23)):
        return "invalid UUID format"
    pairs = (0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34)
    return None if all(_HEX.fullmatch(text[i : i + 2]) for i in pairs) else "invalid UUID format"


def validate_uid(errs: FieldErrors, path: str, value: Any) -> None:
    """``validateUID``: a UUID, and in its normalized form (36 characters, lowercase)."""
    text = str(value)
    problem = _uuid_problem(text)
    if problem is not None:
        errs.invalid(path, text, f"error validating uid: {problem}")
    elif len(text) != 36 or text != text.lower():
        errs.invalid(path, text, _UID_NORMALIZED)


def _shared_device_id(entry: Obj) -> tuple[Any, Any, Any, Any]:
    return (entry.get("driver"), entry.get("pool"), entry.get("device"), entry.get("shareID") or None)


def _shown(key: tuple[Any, Any, Any, Any]) -> str:
    """``SharedDeviceID.String()``: driver/pool/device, then /shareID when there is one."""
    return "/".join(str(part) for part in key if part is not None)


def _results(errs: FieldErrors, allocation: Obj, names: dict[str, set[str]]) -> None:
    """``validateDeviceRequestAllocationResult`` of each result of a new allocation."""
    for index, result in enumerate(((allocation.get("devices") or {}).get("results")) or []):
        if not isinstance(result, Mapping):
            continue
        where = f"status.allocation.devices.results[{index}]"
        if not _request_ref_ok(names, result.get("request")):
            errs.invalid(f"{where}.request", result.get("request"), _REQUEST_REF_MSG)
        driver_name(errs, f"{where}.driver", result.get("driver"))
        pool_name(errs, f"{where}.pool", result.get("pool"))
        dns_label(errs, f"{where}.device", result.get("device"))
        binding_parameters(errs, where, result)
        if result.get("shareID") is not None:
            validate_uid(errs, f"{where}.shareID", result["shareID"])


def _reserved_for(errs: FieldErrors, status: Obj, old_status: Obj, deleted: bool) -> None:
    reserved = status.get("reservedFor") or []
    if len(reserved) > RESERVED_FOR_MAX:
        errs.too_many("status.reservedFor", len(reserved), RESERVED_FOR_MAX)
    uids: set[str] = set()
    for index, ref in enumerate(reserved):
        uid = ref.get("uid") if isinstance(ref, Mapping) else None
        if uid in uids:
            errs.duplicate(f"status.reservedFor[{index}].uid", uid)
        uids.add(str(uid))
    if not reserved:
        return
    if status.get("allocation") is None:
        errs.forbidden("status.reservedFor", "may not be specified when `allocated` is not set")
    elif deleted:
        before = {json.dumps(r, sort_keys=True) for r in old_status.get("reservedFor") or ()}
        if any(json.dumps(r, sort_keys=True) not in before for r in reserved):
            errs.forbidden(
                "status.reservedFor",
                "new entries may not be added while `deallocationRequested` or `deletionTimestamp` are set",
            )


def validate_claim_status(errs: FieldErrors, claim: Obj, old: Obj | None) -> None:
    """``validateResourceClaimStatusUpdate``."""
    status = claim.get("status") or {}
    old_status = (old or {}).get("status") or {}
    names = _request_names(((claim.get("spec") or {}).get("devices")) or {})
    allocation = status.get("allocation")
    _reserved_for(errs, status, old_status, bool((claim.get("metadata") or {}).get("deletionTimestamp")))
    allocated: set[tuple[Any, Any, Any, Any]] = set()
    if isinstance(allocation, Mapping):
        for result in ((allocation.get("devices") or {}).get("results")) or []:
            if isinstance(result, Mapping):
                allocated.add(_shared_device_id(result))
    _device_statuses(errs, status.get("devices"), allocated)
    old_allocation = old_status.get("allocation")
    if allocation is not None and old_allocation is not None:
        if allocation != old_allocation:
            errs.invalid("status.allocation", None, "field is immutable")
    elif isinstance(allocation, Mapping):
        _results(errs, allocation, names)


def _device_statuses(errs: FieldErrors, devices: Any, allocated: set[tuple[Any, Any, Any, Any]]) -> None:
    seen: set[tuple[Any, Any, Any, Any]] = set()
    for index, device in enumerate(devices if isinstance(devices, list) else ()):
        if not isinstance(device, Mapping):
            continue
        where = f"status.devices[{index}]"
        key = _shared_device_id(device)
        _device_status(errs, where, device, key in allocated)
        if key in seen:
            errs.duplicate_shown(where, _shown(key))
        seen.add(key)


def _device_status(errs: FieldErrors, where: str, device: Obj, is_allocated: bool) -> None:
    """``validateDeviceStatus`` (``pkg/apis/resource/validation/validation.go``, Kubernetes 1.36):
    names, the shareID a normalized UUID, the entry an allocated device of the claim (driver, pool,
    device and shareID: ``structured.SharedDeviceID``), at most
    ``AllocatedDeviceStatusMaxConditions`` (8) valid conditions, ``data`` a JSON object of at most
    ``AllocatedDeviceStatusDataMaxLength`` (10 KiB; ``validateRawExtension``) and the limits of
    ``validateNetworkDeviceData``. Entries are unique by that key (``validateResourceClaimStatusUpdate``,
    ``validateSet`` with ``uniquenessCovered``)."""
    driver_name(errs, f"{where}.driver", device.get("driver"))
    pool_name(errs, f"{where}.pool", device.get("pool"))
    dns_label(errs, f"{where}.device", device.get("device"))
    if device.get("shareID") is not None:
        validate_uid(errs, f"{where}.shareID", device["shareID"])
    if not is_allocated:
        errs.invalid_shown(
            where, _shown(_shared_device_id(device)), "must be an allocated device in the claim"
        )
    conditions = device.get("conditions")
    if isinstance(conditions, list):
        if len(conditions) > STATUS_MAX_CONDITIONS:
            errs.too_many(f"{where}.conditions", len(conditions), STATUS_MAX_CONDITIONS)
        validate_conditions(errs, f"{where}.conditions", conditions)
    data = device.get("data")
    if data is not None:
        _data(errs, f"{where}.data", data)
    network = device.get("networkData")
    if isinstance(network, Mapping):
        _network_data(errs, f"{where}.networkData", network)


def validate_conditions(errs: FieldErrors, path: str, conditions: list[Any]) -> None:
    """``metav1validation.ValidateConditions`` and ``ValidateCondition``
    (``k8s.io/apimachinery/pkg/apis/meta/v1/validation/validation.go``)."""
    types: set[str] = set()
    for index, condition in enumerate(conditions):
        if not isinstance(condition, Mapping):
            continue
        where = f"{path}[{index}]"
        kind = condition.get("type")
        if kind in types:
            errs.duplicate(f"{where}.type", kind)
        types.add(str(kind))
        # ValidateCondition: the type is a label name (a qualified name), the transition time is set
        if not isinstance(kind, str) or not kind:
            errs.invalid(f"{where}.type", kind or "", "name part must be non-empty")
        else:
            qualified_key(errs, f"{where}.type", kind)
        status = condition.get("status")
        if status not in _CONDITION_STATUSES:
            errs.not_supported(f"{where}.status", status, _CONDITION_STATUSES)
        generation = condition.get("observedGeneration")
        if isinstance(generation, int) and generation < 0:
            errs.invalid(f"{where}.observedGeneration", generation, "must be greater than or equal to zero")
        if not condition.get("lastTransitionTime"):
            errs.required(f"{where}.lastTransitionTime", "must be set")
        reason = condition.get("reason")
        if not reason:
            errs.required(f"{where}.reason", "must be set")
        elif not _CONDITION_REASON.fullmatch(str(reason)):
            errs.invalid(
                f"{where}.reason",
                reason,
                "a condition reason must start with alphabetic character, optionally followed by a string of "
                "alphanumeric characters or '_,:', and must end with an alphanumeric character or '_' (e.g. "
                "'my_name',  or 'MY_NAME',  or 'MyName',  or 'ReasonA,ReasonB',  or 'ReasonA:ReasonB', regex "
                "used for validation is '[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?')",
            )
        elif len(str(reason)) > _CONDITION_REASON_MAX:
            errs.too_long(f"{where}.reason", _CONDITION_REASON_MAX)
        if len(str(condition.get("message") or "")) > _CONDITION_MESSAGE_MAX:
            errs.too_long(f"{where}.message", _CONDITION_MESSAGE_MAX)


def _data(errs: FieldErrors, path: str, data: Any) -> None:
    """``validateRawExtension``: at most 10 KiB of JSON, and an object. The raw bytes are the
    client's; the compact encoding of what it sent stands in for them."""
    if len(json.dumps(data, separators=(",", ":"))) > STATUS_DATA_MAX_LENGTH:
        errs.too_long(path, STATUS_DATA_MAX_LENGTH)
    elif not isinstance(data, Mapping):
        errs.invalid(path, "<value omitted>", "must be a valid JSON object")


def _network_data(errs: FieldErrors, path: str, network: Obj) -> None:
    """``validateNetworkDeviceData``."""
    if len(str(network.get("interfaceName") or "")) > NETWORK_INTERFACE_NAME_MAX:
        errs.too_long(f"{path}.interfaceName", NETWORK_INTERFACE_NAME_MAX)
    if len(str(network.get("hardwareAddress") or "")) > NETWORK_HARDWARE_ADDRESS_MAX:
        errs.too_long(f"{path}.hardwareAddress", NETWORK_HARDWARE_ADDRESS_MAX)
    ips = network.get("ips")
    if not isinstance(ips, list):
        return
    if len(ips) > NETWORK_MAX_IPS:
        errs.too_many(f"{path}.ips", len(ips), NETWORK_MAX_IPS)
        return
    for index, address in enumerate(ips):
        where = f"{path}.ips[{index}]"
        try:
            interface = ipaddress.ip_interface(str(address))
        except ValueError:
            errs.invalid(
                where, address, "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)"
            )
            continue
        if "/" not in str(address):
            errs.invalid(
                where, address, "must be a valid address in CIDR form, (e.g. 10.9.8.7/24 or 2001:db8::1/64)"
            )
        elif str(interface) != str(address):
            errs.invalid(where, address, f"must be in canonical form ({json.dumps(str(interface))})")
        if address in ips[:index]:
            errs.duplicate(where, address)
