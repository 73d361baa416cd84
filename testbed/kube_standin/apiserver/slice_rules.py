"""What the API server checks in a ResourceSlice beyond its schema (``validateResourceSliceSpec``,
``validateDevice``, ``validateCounterSet``, ``validateDeviceCounterConsumption``,
``validateRequestPolicy`` … in ``pkg/apis/resource/validation/validation.go``), per release.

The layout of shared counters changed in 1.35 (KEP-4815): 1.35 and later want a slice to hold
``sharedCounters`` *or* ``devices`` — counter sets live in slices of their own, still with one of
the node-selection fields — and bound counter sets per slice (8), counters per set (32),
``consumesCounters`` per device (2, of at most 32 counters each) and devices per slice (64 when
any device has taints or consumes counters, else 128). 1.34 kept both in one slice and checked
that a device's ``consumesCounters`` name a set and counters of that same slice, bounding the
counters in all sets (32), the counters one device consumes (32) and all counters the devices of
a slice consume (1024); devices 128, taints 4 per device.

Consumable capacity (``requestPolicy``) follows ``validateMultiAllocatableDeviceCapacity`` as 1.35
and 1.36 have it: integer ``Quantity.Value()`` arithmetic for the step grid.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

from dra_driver.selection.capacity import go_value
from dra_driver.selection.quantity import Quantity, QuantityError, parse_quantity
from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.fielderrors import (
    C_IDENTIFIER_MSG,
    FieldErrors,
    dns_label,
    dns_subdomain,
    driver_name,
    pool_name,
    qualified_key,
)
from kube_standin.apiserver.status import Cause
from plumbing.names import is_label_value

__all__ = ["device_taint", "validate_resource_slice"]

Obj = Mapping[str, Any]

# k8s.io/api/resource/v1/types.go
RESOURCE_SLICE_MAX_DEVICES = 128
RESOURCE_SLICE_MAX_DEVICES_ADVANCED = 64  # ResourceSliceMaxDevicesWithTaintsOrConsumesCounters
MAX_ATTRIBUTES_AND_CAPACITIES = 32
ATTRIBUTE_MAX_VALUE_LENGTH = 64
DEVICE_MAX_DOMAIN_LENGTH = 63
DEVICE_MAX_ID_LENGTH = 32
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet
MAX_CONSUMPTIONS_PER_DEVICE = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_COUNTERS_PER_CONSUMPTION = 32  # ResourceSliceMaxCountersPerDeviceCounterConsumption
MAX_VALID_VALUES = 10  # CapacityRequestPolicyDiscreteMaxOptions
BINDING_CONDITIONS_MAX = 4
# 1.35 raised the taints per device from 4 (DeviceTaintsMaxLength)
TAINTS_MAX = {(1, 34): 4}
TAINTS_MAX_DEFAULT = 16
# validDeviceTaintEffects (pkg/apis/resource/validation/validation.go): 1.35 added None
TAINT_EFFECTS = {(1, 34): frozenset({"NoSchedule", "NoExecute"})}
TAINT_EFFECTS_DEFAULT = frozenset({"NoSchedule", "NoExecute", "None"})
# 1.34 only (k8s.io/api/resource/v1 of 1.34)
MAX_SHARED_COUNTERS_1_34 = 32  # ResourceSliceMaxSharedCounters
MAX_COUNTERS_PER_DEVICE_1_34 = 32  # ResourceSliceMaxCountersPerDevice
MAX_DEVICE_COUNTERS_PER_SLICE_1_34 = 1024  # ResourceSliceMaxDeviceCountersPerSlice

_BOTH_POLICIES = (
    'exactly one policy can be specified, cannot specify "validValues" and "validRange" at the same time'
)
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
_SCALAR_ATTRIBUTE_KINDS = ("bool", "int", "string", "version")
_LIST_ATTRIBUTE_KINDS = ("bools", "ints", "strings", "versions")


def _split_layout(gates: FeatureGates) -> bool:
    """Whether the server is 1.35 or later: counters in slices of their own."""
    return gates.release >= (1, 35)


# -- names and attributes ---------------------------------------------------------------------


def _attribute_name(errs: FieldErrors, path: str, key: str) -> None:
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
            driver_name(errs, path, parts[0])
    if not ident:
        errs.invalid(path, "", "the name must not be empty")
    elif len(ident) > DEVICE_MAX_ID_LENGTH:
        errs.too_long(path, DEVICE_MAX_ID_LENGTH)
    elif not _C_IDENTIFIER.fullmatch(ident):
        errs.invalid(path, ident, C_IDENTIFIER_MSG)


@functools.lru_cache(maxsize=4096)
def _attribute_name_causes(key: str) -> tuple[Cause, ...]:
    # Every device of a slice repeats the same few attribute names: check each name once.
    errs = FieldErrors()
    _attribute_name(errs, "", key)
    return tuple(errs.causes)


def _check_attribute_name(errs: FieldErrors, path: str, key: str) -> None:
    errs.causes.extend(Cause(path, c.reason, c.message) for c in _attribute_name_causes(key))


def _plainly_valid_attribute(value: Any) -> bool:
    """The common case, decided without building a field path: one bool, int or short string."""
    if type(value) is not dict or len(value) != 1:
        return False
    kind, item = next(iter(value.items()))
    if kind in ("bool", "int"):
        return item is not None
    return kind == "string" and type(item) is str and len(item) <= ATTRIBUTE_MAX_VALUE_LENGTH


def _attribute_value(errs: FieldErrors, path: str, value: Any) -> None:
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


# -- node selection -----------------------------------------------------------------------------


def _node_selection(errs: FieldErrors, path: str, holder: Obj, *, per_device_field: bool) -> list[str]:
    set_fields: list[str] = []
    node_name = holder.get("nodeName")
    if node_name is not None:
        if node_name:
            set_fields.append("`nodeName`")
            dns_subdomain(errs, f"{path}.nodeName", node_name)
        elif per_device_field:
            errs.invalid(f"{path}.nodeName", node_name, "must not be empty")
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


def _device_node_selection(errs: FieldErrors, path: str, device: Obj, per_device: bool) -> None:
    if per_device:
        chosen = _node_selection(errs, path, device, per_device_field=True)
        message = (
            "exactly one of `nodeName`, `nodeSelector`, or `allNodes` is required when "
            "`perDeviceNodeSelection` is set to true in the ResourceSlice spec"
        )
        if not chosen:
            errs.required(path, message)
        elif len(chosen) > 1:
            errs.invalid(path, "{" + ", ".join(chosen) + "}", message)
    elif any(device.get(k) is not None for k in ("nodeName", "nodeSelector", "allNodes")):
        errs.invalid(
            path,
            None,
            "`nodeName`, `nodeSelector` and `allNodes` can only be set if `perDeviceNodeSelection` is set "
            "to true in the ResourceSlice spec",
        )


def binding_parameters(errs: FieldErrors, path: str, holder: Obj) -> None:
    """``validateDeviceBindingParameters`` (devices and allocation results alike)."""
    conditions, failures = holder.get("bindingConditions"), holder.get("bindingFailureConditions")
    lists = (("bindingConditions", conditions), ("bindingFailureConditions", failures))
    for name, values in lists:
        if isinstance(values, list) and len(values) > BINDING_CONDITIONS_MAX:
            errs.too_many(f"{path}.{name}", len(values), BINDING_CONDITIONS_MAX)
        elif isinstance(values, list):
            for index, value in enumerate(values):
                qualified_key(errs, f"{path}.{name}[{index}]", str(value))
    wanted = list(conditions) if isinstance(conditions, list) else []
    failing = list(failures) if isinstance(failures, list) else []
    for name, values in (("bindingConditions", wanted), ("bindingFailureConditions", failing)):
        for index, value in enumerate(values):
            if value in values[:index]:
                errs.duplicate(f"{path}.{name}[{index}]", value)
    for index, value in enumerate(failing):
        if value in wanted:
            errs.invalid(
                f"{path}.bindingFailureConditions[{index}]",
                value,
                "bindingFailureConditions must not overlap with bindingConditions",
            )
    if not wanted and failing:
        shown = "[]string{}" if conditions is not None else "[]string(nil)"
        errs.invalid_shown(
            f"{path}.bindingConditions",
            shown,
            "bindingConditions are required to use bindingFailureConditions",
        )
    if not failing and wanted:
        shown = "[]string{}" if failures is not None else "[]string(nil)"
        errs.invalid_shown(
            f"{path}.bindingFailureConditions",
            shown,
            "bindingFailureConditions are required to use bindingConditions",
        )


# -- counters -----------------------------------------------------------------------------------


def _counter_map(errs: FieldErrors, path: str, counters: Any, limit: int | None) -> None:
    """``validateMap`` of counters: required, at most ``limit`` keys (then nothing else), DNS-label keys."""
    if not isinstance(counters, Mapping) or not counters:
        errs.required(path)
        return
    if limit is not None and len(counters) > limit:
        errs.too_many(path, len(counters), limit)
        return
    for key in counters:
        dns_label(errs, f"{path}[{key}]", key)


def _named(errs: FieldErrors, path: str, value: Any) -> None:
    if not value:
        errs.required(path)
    else:
        dns_label(errs, path, value)


def _counter_sets(errs: FieldErrors, spec: Obj, split: bool) -> None:
    sets = spec.get("sharedCounters")
    if not isinstance(sets, list):
        return
    if split and len(sets) > MAX_COUNTER_SETS:
        errs.too_many("spec.sharedCounters", len(sets), MAX_COUNTER_SETS)
        return
    if not split:
        total = sum(len(s.get("counters") or {}) for s in sets if isinstance(s, Mapping))
        if total > MAX_SHARED_COUNTERS_1_34:
            errs.invalid(
                "spec.sharedCounters",
                total,
                f"the total number of shared counters must not exceed {MAX_SHARED_COUNTERS_1_34}",
            )
    seen: set[str] = set()
    for index, counter_set in enumerate(sets):
        if not isinstance(counter_set, Mapping):
            continue
        path = f"spec.sharedCounters[{index}]"
        _named(errs, f"{path}.name", counter_set.get("name"))
        _counter_map(
            errs, f"{path}.counters", counter_set.get("counters"), MAX_COUNTERS_PER_SET if split else None
        )
        name = counter_set.get("name")
        if isinstance(name, str) and name:
            if name in seen:
                # 1.34 keyed the duplicate on the name field
                errs.duplicate(path if split else f"{path}.name", name)
            seen.add(name)


def _consumes_counters(errs: FieldErrors, path: str, device: Obj, spec: Obj, split: bool) -> int:
    """A device's ``consumesCounters``; the number of counters it consumes (1.34's slice total)."""
    consumptions = device.get("consumesCounters")
    if not isinstance(consumptions, list):
        return 0
    if split and len(consumptions) > MAX_CONSUMPTIONS_PER_DEVICE:
        errs.too_many(f"{path}.consumesCounters", len(consumptions), MAX_CONSUMPTIONS_PER_DEVICE)
        return 0
    total = sum(len(c.get("counters") or {}) for c in consumptions if isinstance(c, Mapping))
    if not split and total > MAX_COUNTERS_PER_DEVICE_1_34:
        errs.invalid(
            path, total, f"the total number of counters must not exceed {MAX_COUNTERS_PER_DEVICE_1_34}"
        )
    published = {
        s.get("name"): set(s.get("counters") or {})
        for s in spec.get("sharedCounters") or ()
        if isinstance(s, Mapping)
    }
    seen: set[str] = set()
    for index, consumption in enumerate(consumptions):
        if not isinstance(consumption, Mapping):
            continue
        where = f"{path}.consumesCounters[{index}]"
        counter_set = consumption.get("counterSet")
        _named(errs, f"{where}.counterSet", counter_set)
        counters = consumption.get("counters")
        _counter_map(errs, f"{where}.counters", counters, MAX_COUNTERS_PER_CONSUMPTION if split else None)
        if isinstance(counter_set, str) and counter_set:
            if split and counter_set in seen:
                errs.duplicate(where, counter_set)
            seen.add(counter_set)
        if not split:
            _same_slice_reference(errs, where, counter_set, counters, published)
    return total


def _same_slice_reference(
    errs: FieldErrors, where: str, counter_set: Any, counters: Any, published: Mapping[Any, set[str]]
) -> None:
    """1.34: a device consumes counters of a set published in its own slice."""
    if counter_set not in published:
        errs.invalid(
            f"{where}.counterSet",
            counter_set or "",
            "must reference a counterSet defined in the ResourceSlice sharedCounters",
        )
        return
    for name in counters or {}:
        if name not in published[counter_set]:
            errs.invalid(
                f"{where}.counters",
                name,
                "must reference a counter defined in the ResourceSlice sharedCounters",
            )


# -- consumable capacity ------------------------------------------------------------------------


def _quantity(value: Any) -> Quantity | None:
    try:
        return parse_quantity(str(value)) if value is not None else None
    except QuantityError:
        return None  # the decoder refuses it before validation does


def _capacity(errs: FieldErrors, path: str, device: Obj) -> None:
    capacity = device.get("capacity") or {}
    multi = device.get("allowMultipleAllocations") is True
    for name, entry in capacity.items() if isinstance(capacity, Mapping) else ():
        if _attribute_name_causes(name):
            _check_attribute_name(errs, f"{path}.capacity[{name}]", name)
        policy = entry.get("requestPolicy") if isinstance(entry, Mapping) else None
        if policy is None:
            continue
        where = f"{path}.capacity[{name}].requestPolicy"
        if not multi:
            # validateSingleAllocatableDeviceCapacity
            errs.forbidden(where, "allowMultipleAllocations must be true")
            continue
        value = _quantity(entry.get("value"))
        if value is not None and isinstance(policy, Mapping):
            _request_policy(errs, where, value, policy)


def _request_policy(errs: FieldErrors, path: str, value: Quantity, policy: Obj) -> None:
    """``validateRequestPolicy`` → ``validateValidRequestValues``."""
    valid_values, valid_range = policy.get("validValues") or [], policy.get("validRange")
    if valid_values and valid_range is not None:
        errs.forbidden(path, _BOTH_POLICIES)
        return
    default = _quantity(policy.get("default"))
    if valid_values:
        if default is None:
            errs.required(f"{path}.default", "required when validValues is defined")
        else:
            _valid_values(errs, f"{path}.validValues", default, value, valid_values)
    elif isinstance(valid_range, Mapping):
        if default is None:
            errs.required(f"{path}.default", "required when validRange is defined")
        else:
            _valid_range(errs, path, default, value, valid_range)


def _valid_values(errs: FieldErrors, path: str, default: Quantity, value: Quantity, raw: list[Any]) -> None:
    """``validateRequestPolicyValidValues``: ascending, at most 10, unique (by integer value), within
    the capacity, the default among them."""
    options = [_quantity(v) for v in raw]
    for index in range(len(options) - 1):
        first, second = options[index], options[index + 1]
        if first is not None and second is not None and first.value > second.value:
            errs.invalid(
                f"{path}[{index + 1}]", second.canonical(), "values must be sorted in ascending order"
            )
    found_default = False
    if len(options) > MAX_VALID_VALUES:
        # validateSet stops at the size, so the default is never found either
        errs.too_many(path, len(options), MAX_VALID_VALUES)
    else:
        seen: set[str] = set()
        for index, option in enumerate(options):
            if option is None:
                continue
            if option.value > value.value:
                errs.invalid(
                    f"{path}[{index}]",
                    option.canonical(),
                    f"option is larger than capacity value: {value.canonical()}",
                )
            found_default = found_default or option.value == default.value
            key = str(go_value(option.value))  # quantityKey
            if key in seen:
                errs.duplicate(f"{path}[{index}]", key)
            seen.add(key)
    if not found_default:
        errs.invalid(path, default.canonical(), "default value is not valid according to the requestPolicy")


def _valid_range(errs: FieldErrors, path: str, default: Quantity, value: Quantity, valid_range: Obj) -> None:
    """``validateRequestPolicyRange``."""
    where = f"{path}.validRange"
    minimum, maximum, step = (_quantity(valid_range.get(k)) for k in ("min", "max", "step"))
    if minimum is None:
        errs.required(f"{where}.min", "required when validRange is defined")
        return
    if minimum.value > value.value:
        errs.invalid(
            f"{where}.min", minimum.canonical(), f"min is larger than capacity value: {value.canonical()}"
        )
    if default.value < minimum.value:
        errs.invalid(
            f"{where}.default", default.canonical(), f"default is less than min: {minimum.canonical()}"
        )
    if maximum is not None:
        if minimum.value > maximum.value:
            errs.invalid(
                f"{where}.max", minimum.canonical(), f"min is larger than max: {maximum.canonical()}"
            )
        if maximum.value > value.value:
            errs.invalid(
                f"{where}.max", maximum.canonical(), f"max is larger than capacity value: {value.canonical()}"
            )
        if default.value > maximum.value:
            errs.invalid(
                f"{where}.default", default.canonical(), f"default is more than max: {maximum.canonical()}"
            )
    if step is None:
        return
    if step.value <= 0:
        errs.invalid(f"{where}.step", step.canonical(), "must be greater than zero")
        return
    one_step = Quantity(minimum.value + step.value)
    if one_step.value > value.value:
        errs.invalid(
            f"{where}.step",
            step.canonical(),
            f"one step {one_step.canonical()} is larger than capacity value: {value.canonical()}",
        )
    for amount in (default, maximum):
        if amount is None or go_value(step.value) == 0:
            continue
        if (go_value(amount.value) - go_value(minimum.value)) % go_value(step.value):
            errs.invalid(
                f"{where}.step",
                amount.canonical(),
                f"value is not a multiple of a given step ({step.canonical()}) from ({minimum.canonical()})",
            )


# -- devices and the slice ----------------------------------------------------------------------


def _validate_device(errs: FieldErrors, path: str, device: Obj, spec: Obj, gates: FeatureGates) -> int:
    """``validateDevice``; the number of counters the device consumes."""
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
    _capacity(errs, path, device)
    _taints(errs, f"{path}.taints", device.get("taints"), gates)
    consumed = _consumes_counters(errs, path, device, spec, _split_layout(gates))
    _device_node_selection(errs, path, device, spec.get("perDeviceNodeSelection") is True)
    binding_parameters(errs, path, device)
    return consumed


def _taints(errs: FieldErrors, path: str, taints: Any, gates: FeatureGates) -> None:
    """:func:`device_taint` for each taint; at most ``DeviceTaintsMaxLength`` of them."""
    if not isinstance(taints, list):
        return
    taints_max = TAINTS_MAX.get(gates.release, TAINTS_MAX_DEFAULT)
    if len(taints) > taints_max:
        errs.too_many(path, len(taints), taints_max)
    for i, taint in enumerate(taints):
        if isinstance(taint, Mapping):
            device_taint(errs, f"{path}[{i}]", taint, gates)


def device_taint(
    errs: FieldErrors,
    path: str,
    taint: Mapping[str, Any],
    gates: FeatureGates,
    old: Mapping[str, Any] | None = None,
) -> None:
    """``validateDeviceTaint`` (a slice's taints and a DeviceTaintRule's): the key a label name
    (``ValidateLabelName``: a qualified name), a value that is given a label value, the effect one of
    the release's effects (``validDeviceTaintEffects``: 1.35 added ``None``, purely informational),
    checked only where it changed from ``old``."""
    key, value, effect = taint.get("key"), taint.get("value"), taint.get("effect")
    if not key:
        errs.required(f"{path}.key")
    elif isinstance(key, str):
        qualified_key(errs, f"{path}.key", key)
    if isinstance(value, str) and value and (len(value) > 63 or not is_label_value(value)):
        errs.invalid(
            f"{path}.value",
            value,
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
            "or '.', and must start and end with an alphanumeric character (at most 63 characters)",
        )
    effects = TAINT_EFFECTS.get(gates.release, TAINT_EFFECTS_DEFAULT)
    if old is not None and old.get("effect") == effect:
        return
    if not effect:
        errs.required(f"{path}.effect")
    elif isinstance(effect, str) and effect not in effects:
        errs.not_supported(f"{path}.effect", effect, sorted(effects))


def _uses_advanced_features(devices: list[Any]) -> bool:
    """Taints, counters or list-valued attributes halve the device limit (1.35+:
    ``ResourceSliceMaxDevicesWithTaintsOrConsumesCounters``)."""
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


def _spec_basics(errs: FieldErrors, spec: Obj) -> None:
    driver_name(errs, "spec.driver", spec.get("driver"))
    pool = spec.get("pool") or {}
    pool_name(errs, "spec.pool.name", pool.get("name"))
    if isinstance(pool.get("resourceSliceCount"), int) and pool["resourceSliceCount"] <= 0:
        errs.invalid("spec.pool.resourceSliceCount", pool["resourceSliceCount"], "must be greater than zero")
    if isinstance(pool.get("generation"), int) and pool["generation"] < 0:
        errs.invalid("spec.pool.generation", pool["generation"], "must be greater than or equal to zero")
    chosen = _node_selection(errs, "spec", spec, per_device_field=False)
    # a counter slice needs one of them as much as a device slice
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


def validate_resource_slice(errs: FieldErrors, obj: Obj, gates: FeatureGates) -> None:
    """``validateResourceSliceSpec`` of the release ``gates`` describes."""
    spec = obj.get("spec") or {}
    split = _split_layout(gates)
    _spec_basics(errs, spec)
    devices = spec.get("devices")
    # on presence, not length: `devices: []` beside counters is refused as well
    if split and spec.get("sharedCounters") is not None and devices is not None:
        errs.invalid("spec", "", "only one of `sharedCounters` or `devices` is allowed")
    if isinstance(devices, list):
        _devices(errs, devices, spec, gates)
    _counter_sets(errs, spec, split)


def _devices(errs: FieldErrors, devices: list[Any], spec: Obj, gates: FeatureGates) -> None:
    split = _split_layout(gates)
    limit = (
        RESOURCE_SLICE_MAX_DEVICES_ADVANCED
        if split and _uses_advanced_features(devices)
        else RESOURCE_SLICE_MAX_DEVICES
    )
    if len(devices) > limit:
        errs.too_many("spec.devices", len(devices), limit)
        return  # validateSet stops at the size
    seen: set[str] = set()
    consumed = 0
    for index, device in enumerate(devices):
        if not isinstance(device, Mapping):
            continue
        path = f"spec.devices[{index}]"
        name = device.get("name")
        dns_label(errs, f"{path}.name", name)
        if isinstance(name, str) and name:
            if name in seen:
                # validateSet: 1.35 reports the entry, 1.34 its name field
                errs.duplicate(path if split else f"{path}.name", name)
            seen.add(name)
        consumed += _validate_device(errs, path, device, spec, gates)
    if not split and consumed > MAX_DEVICE_COUNTERS_PER_SLICE_1_34:
        errs.invalid(
            "spec.devices",
            consumed,
            f"the total number of counters in devices must not exceed {MAX_DEVICE_COUNTERS_PER_SLICE_1_34}",
        )
