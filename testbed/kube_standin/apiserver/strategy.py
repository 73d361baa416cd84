"""What the registry strategies do to an object before it is validated and stored
(``PrepareForCreate`` / ``PrepareForUpdate``), for the fields fabric-dra relies on:

* **fields of disabled feature gates are dropped**, unless the old object already used them
  (``dropDisabledFields`` in ``pkg/registry/resource/resourceslice/strategy.go`` and
  ``resourceclaim/strategy.go``): device taints (``DRADeviceTaints``); ``bindsToNode``,
  ``bindingConditions`` and ``bindingFailureConditions`` (``DRADeviceBindingConditions`` *and*
  ``DRAResourceClaimDeviceStatus``); shared counters and per-device node selection
  (``DRAPartitionableDevices``); ``allowMultipleAllocations`` and capacity request policies
  (``DRAConsumableCapacity``); node allocatable resource mappings
  (``DRANodeAllocatableResources``); a claim's tolerations, and the binding conditions copied into
  its allocation results; ``status.devices`` (``DRAResourceClaimDeviceStatus``); a claim's
  capacity requests and ``distinctAttribute`` constraints, its results' ``shareID`` and
  ``consumedCapacity`` and its ``status.devices`` share IDs (``DRAConsumableCapacity``:
  ``dropDisabledDRAResourceClaimConsumableCapacityFields`` and ``…StatusFields``);
* **a claim's ``status.devices`` entries of deallocated devices are dropped**
  (``dropDeallocatedStatusDevices`` in ``resourceclaim/strategy.go``);
* **a CustomResourceDefinition gets the status its controllers give it**
  (:func:`~kube_standin.apiserver.customresources.definitions.crd_status`), and a custom resource is
  validated against its CRD's schema and CEL rules
  (:meth:`~kube_standin.apiserver.customresources.served.CustomKind.validate`).

A client sees the result in the answer to its write, as on a real server: the write succeeds,
the field is just not there.

:func:`before_create` and :func:`before_update` are what ``rest.BeforeCreate`` / ``BeforeUpdate``
do with a strategy (``k8s.io/apiserver/pkg/registry/rest/create.go``, ``update.go``): prepare, then
validate with the server's own rules (:mod:`kube_standin.apiserver.rules`); the store runs them
as its admission step, on the object it is about to keep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kube_standin.apiserver import rules
from kube_standin.apiserver.customresources.definitions import crd_status
from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.status import Cause, invalid

__all__ = ["before_create", "before_update", "prepare_for_create", "prepare_for_update"]

_BINDING_FIELDS = ("bindsToNode", "bindingConditions", "bindingFailureConditions")
_PER_DEVICE_NODE = ("consumesCounters", "nodeName", "nodeSelector", "allNodes")


def _devices(slice_obj: Obj | None) -> list[dict[str, Any]]:
    if not slice_obj:
        return []
    devices = (slice_obj.get("spec") or {}).get("devices") or []
    return [d for d in devices if isinstance(d, dict)]


def _any_device_has(slice_obj: Obj | None, *keys: str) -> bool:
    return any(d.get(k) not in (None, [], {}) for d in _devices(slice_obj) for k in keys)


def _drop_device_keys(slice_obj: Obj, *keys: str) -> None:
    for device in _devices(slice_obj):
        for key in keys:
            device.pop(key, None)


def _request_policies(slice_obj: Obj | None) -> bool:
    return any(
        isinstance(c, dict) and c.get("requestPolicy")
        for d in _devices(slice_obj)
        for c in (d.get("capacity") or {}).values()
    )


def _drop_slice_fields(gates: FeatureGates, new: Obj, old: Obj | None) -> None:
    if not gates.enabled("DRADeviceTaints") and not _any_device_has(old, "taints"):
        _drop_device_keys(new, "taints")
    if not gates.bindings_on() and not _any_device_has(old, *_BINDING_FIELDS):
        _drop_device_keys(new, *_BINDING_FIELDS)
    spec = new.get("spec") or {}
    old_spec = (old or {}).get("spec") or {}
    partitionable_in_use = bool(
        old_spec.get("sharedCounters") or old_spec.get("perDeviceNodeSelection") is not None
    ) or _any_device_has(old, *_PER_DEVICE_NODE)
    if not gates.enabled("DRAPartitionableDevices") and not partitionable_in_use:
        spec.pop("sharedCounters", None)
        spec.pop("perDeviceNodeSelection", None)
        _drop_device_keys(new, *_PER_DEVICE_NODE)
    if not gates.enabled("DRAConsumableCapacity") and not (
        _any_device_has(old, "allowMultipleAllocations") or _request_policies(old)
    ):
        _drop_device_keys(new, "allowMultipleAllocations")
        for device in _devices(new):
            for capacity in (device.get("capacity") or {}).values():
                if isinstance(capacity, dict):
                    capacity.pop("requestPolicy", None)
    if not gates.enabled("DRANodeAllocatableResources") and not _any_device_has(
        old, "nodeAllocatableResourceMappings"
    ):
        _drop_device_keys(new, "nodeAllocatableResourceMappings")


def _requests(claim_spec: Any) -> list[dict[str, Any]]:
    """Every request and subrequest body that can carry tolerations."""
    devices = (claim_spec or {}).get("devices") or {} if isinstance(claim_spec, dict) else {}
    found: list[dict[str, Any]] = []
    for request in devices.get("requests") or []:
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            found.append(request["exactly"])
        found += [s for s in request.get("firstAvailable") or [] if isinstance(s, dict)]
    return found


def _results(claim: Obj | None) -> list[dict[str, Any]]:
    allocation = ((claim or {}).get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [r for r in results if isinstance(r, dict)]


def _constraints(claim_spec: Any) -> list[dict[str, Any]]:
    devices = (claim_spec or {}).get("devices") or {} if isinstance(claim_spec, dict) else {}
    return [c for c in devices.get("constraints") or [] if isinstance(c, dict)]


def _status_devices(claim: Obj | None) -> list[dict[str, Any]]:
    devices = ((claim or {}).get("status") or {}).get("devices") or []
    return [d for d in devices if isinstance(d, dict)]


def _drop_consumable_capacity(gates: FeatureGates, spec_holder: Obj, new: Obj, old: Obj | None) -> None:
    """``dropDisabledDRAResourceClaimConsumableCapacityFields`` and its status counterpart."""
    if gates.enabled("DRAConsumableCapacity"):
        return
    old_spec = ((old or {}).get("spec") or {}) if spec_holder is new else None
    spec_in_use = any(r.get("capacity") is not None for r in _requests(old_spec)) or any(
        c.get("distinctAttribute") is not None for c in _constraints(old_spec)
    )
    if not spec_in_use:
        for request in _requests(spec_holder.get("spec")):
            request.pop("capacity", None)
        for constraint in _constraints(spec_holder.get("spec")):
            constraint.pop("distinctAttribute", None)
    status_in_use = any(r.get("shareID") or r.get("consumedCapacity") for r in _results(old)) or any(
        d.get("shareID") for d in _status_devices(old)
    )
    if not status_in_use:
        for result in _results(new):
            result.pop("shareID", None)
            result.pop("consumedCapacity", None)
        status = new.get("status")
        if isinstance(status, dict) and any(d.get("shareID") for d in _status_devices(new)):
            # Copies: parts of ``new`` may be shared with the stored object, which never changes.
            devices = [{k: v for k, v in d.items() if k != "shareID"} for d in _status_devices(new)]
            new["status"] = {**status, "devices": devices}


def _drop_claim_fields(gates: FeatureGates, spec_holder: Obj, new: Obj, old: Obj | None) -> None:
    _drop_consumable_capacity(gates, spec_holder, new, old)
    old_spec = ((old or {}).get("spec") or {}) if spec_holder is new else None
    taints_in_use = any(r.get("tolerations") for r in _requests(old_spec)) or any(
        r.get("tolerations") for r in _results(old)
    )
    if not gates.enabled("DRADeviceTaints") and not taints_in_use:
        for request in _requests(spec_holder.get("spec")):
            request.pop("tolerations", None)
        for result in _results(new):
            result.pop("tolerations", None)
    if not gates.bindings_on() and not any(r.get("bindingConditions") for r in _results(old)):
        for result in _results(new):
            result.pop("bindingConditions", None)
            result.pop("bindingFailureConditions", None)
    status = new.get("status")
    old_devices = ((old or {}).get("status") or {}).get("devices")
    if (
        isinstance(status, dict)
        and "devices" in status
        and not gates.enabled("DRAResourceClaimDeviceStatus")
        and not old_devices
    ):
        # A copy: parts of ``new`` may be shared with the stored object, which never changes.
        new["status"] = {k: v for k, v in status.items() if k != "devices"}


def _drop_deallocated_status_devices(new: Obj, old: Obj) -> None:
    status = new.get("status")
    if not isinstance(status, dict) or not status.get("devices"):
        return

    def key(entry: dict[str, Any]) -> tuple[Any, Any, Any]:
        return entry.get("driver"), entry.get("pool"), entry.get("device")

    gone = {key(r) for r in _results(old)} - {key(r) for r in _results(new)}
    kept = [d for d in status["devices"] if not (isinstance(d, dict) and key(d) in gone)]
    if len(kept) == len(status["devices"]):
        return
    # A copy: parts of ``new`` may be shared with the stored object, which never changes.
    new["status"] = {k: v for k, v in status.items() if k != "devices"}
    if kept:
        new["status"]["devices"] = kept


def prepare_for_create(res: ResourceType, obj: Obj, gates: FeatureGates) -> None:
    """``PrepareForCreate`` of ``res``'s strategy, on the storage form (in place)."""
    if res.kind == "CustomResourceDefinition" and res.group == "apiextensions.k8s.io":
        obj["status"] = crd_status(obj, None)
    if res.group != "resource.k8s.io":
        return
    if res.kind == "ResourceSlice":
        _drop_slice_fields(gates, obj, None)
    elif res.kind == "ResourceClaim":
        _drop_claim_fields(gates, obj, obj, None)
    elif res.kind == "ResourceClaimTemplate":
        _drop_claim_fields(gates, obj.get("spec") or {}, obj, None)


def prepare_for_update(
    res: ResourceType, new: Obj, old: Obj, gates: FeatureGates, subresource: str | None = None
) -> None:
    """``PrepareForUpdate`` of ``res``'s strategy (main resource and ``/status``), in place."""
    if res.kind == "CustomResourceDefinition" and res.group == "apiextensions.k8s.io" and subresource is None:
        new["status"] = crd_status(new, old.get("status"))
    if res.group != "resource.k8s.io":
        return
    if res.kind == "ResourceSlice":
        _drop_slice_fields(gates, new, old)
    elif res.kind == "ResourceClaim":
        _drop_claim_fields(gates, new, new, old)
        _drop_deallocated_status_devices(new, old)
    elif res.kind == "ResourceClaimTemplate":
        _drop_claim_fields(gates, new.get("spec") or {}, new, None)


def _refuse(res: ResourceType, name: str, causes: list[Cause]) -> None:
    if causes:
        raise invalid(res, name, causes)


def before_create(res: ResourceType, gates: FeatureGates) -> Callable[[Obj], None]:
    """The strategy's ``PrepareForCreate`` (fields of disabled gates dropped), then the server's
    own rules for a new object, as the store's admission step."""

    def admit(obj: Obj) -> None:
        prepare_for_create(res, obj, gates)
        causes = rules.validate_object(res, obj, gates)
        if res.custom is not None:
            causes += res.custom.validate(res.storage_version, obj, None)
        _refuse(res, obj["metadata"].get("name", ""), causes)

    return admit


def before_update(
    res: ResourceType, subresource: str | None, gates: FeatureGates
) -> Callable[[Obj, Obj], None]:
    """``PrepareForUpdate``, then the server's own rules for an update (of ``subresource``), as the
    store's admission step."""

    def admit(new: Obj, old: Obj) -> None:
        prepare_for_update(res, new, old, gates, subresource)
        causes = rules.validate_update(res, new, old, subresource, gates)
        if res.custom is not None:
            # The status strategy validates the whole object too, rules and transition rules alike.
            causes += res.custom.validate(res.storage_version, new, old)
        _refuse(res, new["metadata"]["name"], causes)

    return admit
