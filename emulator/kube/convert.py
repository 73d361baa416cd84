"""Conversion between served versions and the storage version, plus the server-side defaults.

``resource.k8s.io`` objects are stored as ``v1``. ``v1beta2`` has the same shape as ``v1``
for every kind served here. ``v1beta1`` differs in two places (k8s.io/api/resource/v1beta1,
Kubernetes 1.34):

* a ``DeviceRequest`` carries ``deviceClassName``, ``selectors``, ``allocationMode``,
  ``count``, ``adminAccess``, ``tolerations``, ``capacity`` directly, where ``v1`` puts them
  under ``exactly`` (``firstAvailable`` requests are the same in both);
* a ``Device`` in a ResourceSlice wraps its fields in ``basic``, where ``v1`` has them inline.

``events.k8s.io/v1`` Events are stored as core ``v1`` Events, with the field mapping of
``k8s.io/kubernetes/pkg/apis/events/v1/conversion.go``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from emulator.kube.registry import ResourceType

__all__ = ["apply_defaults", "from_storage", "to_storage"]

Obj = dict[str, Any]

_EXACT_FIELDS = (
    "deviceClassName",
    "selectors",
    "allocationMode",
    "count",
    "adminAccess",
    "tolerations",
    "capacity",
    "derivedAttributes",
)


def _requests_of(obj: Obj, kind: str) -> list[Any] | None:
    if kind == "ResourceClaim":
        spec = obj.get("spec")
    elif kind == "ResourceClaimTemplate":
        spec = (obj.get("spec") or {}).get("spec")
    else:
        return None
    devices = (spec or {}).get("devices") if isinstance(spec, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    return requests if isinstance(requests, list) else None


def _request_v1beta1_to_v1(request: Any) -> Any:
    if not isinstance(request, dict) or "firstAvailable" in request or "exactly" in request:
        return request
    exactly = {k: request[k] for k in _EXACT_FIELDS if k in request}
    rest = {k: v for k, v in request.items() if k not in _EXACT_FIELDS}
    if exactly:
        rest["exactly"] = exactly
    return rest


def _request_v1_to_v1beta1(request: Any) -> Any:
    if not isinstance(request, dict) or not isinstance(request.get("exactly"), dict):
        return request
    out = {k: v for k, v in request.items() if k != "exactly"}
    out.update(request["exactly"])
    return out


def _device_v1beta1_to_v1(device: Any) -> Any:
    if not isinstance(device, dict) or not isinstance(device.get("basic"), dict):
        return device
    out = {k: v for k, v in device.items() if k != "basic"}
    out.update(device["basic"])
    return out


def _device_v1_to_v1beta1(device: Any) -> Any:
    if not isinstance(device, dict):
        return device
    basic = {k: v for k, v in device.items() if k != "name"}
    out: Obj = {"name": device.get("name")} if "name" in device else {}
    out["basic"] = basic
    return out


def _map_dra(obj: Obj, kind: str, request_fn: Callable[[Any], Any], device_fn: Callable[[Any], Any]) -> None:
    requests = _requests_of(obj, kind)
    if requests is not None:
        requests[:] = [request_fn(r) for r in requests]
    if kind == "ResourceSlice":
        spec = obj.get("spec")
        if isinstance(spec, dict) and isinstance(spec.get("devices"), list):
            spec["devices"] = [device_fn(d) for d in spec["devices"]]


_CORE_TO_EVENTS = {
    "involvedObject": "regarding",
    "message": "note",
    "reportingComponent": "reportingController",
    "source": "deprecatedSource",
    "firstTimestamp": "deprecatedFirstTimestamp",
    "lastTimestamp": "deprecatedLastTimestamp",
    "count": "deprecatedCount",
}
_EVENTS_TO_CORE = {v: k for k, v in _CORE_TO_EVENTS.items()}


def _rename(obj: Obj, mapping: dict[str, str]) -> Obj:
    return {mapping.get(k, k): v for k, v in obj.items()}


def to_storage(res: ResourceType, version: str, obj: Obj) -> Obj:
    """A copy of ``obj`` (as sent in ``version``) in the storage version."""
    out = copy.deepcopy(obj)
    if res.group == "events.k8s.io":
        out = _rename(out, _EVENTS_TO_CORE)
        out.setdefault("involvedObject", {})
        out["apiVersion"] = "v1"
        return out
    if res.group == "resource.k8s.io" and version == "v1beta1":
        _map_dra(out, res.kind, _request_v1beta1_to_v1, _device_v1beta1_to_v1)
    out["apiVersion"] = res.api_version(res.storage_version)
    return out


def from_storage(res: ResourceType, version: str, obj: Obj) -> Obj:
    """A copy of the stored ``obj`` as ``version`` of ``res`` presents it."""
    if res.group == "events.k8s.io":
        out = _rename(obj, _CORE_TO_EVENTS)
        out.setdefault("eventTime", None)
        out["apiVersion"] = res.api_version(version)
        return out
    if version == res.storage_version and res.storage_group is None:
        return obj
    out = copy.deepcopy(obj)
    if res.group == "resource.k8s.io" and version == "v1beta1":
        _map_dra(out, res.kind, _request_v1_to_v1beta1, _device_v1_to_v1beta1)
    out["apiVersion"] = res.api_version(version)
    return out


def _default_exact(request: Obj) -> None:
    # k8s.io/kubernetes/pkg/apis/resource/v1/defaults.go
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount":
        request.setdefault("count", 1)
    for toleration in request.get("tolerations") or ():
        if isinstance(toleration, dict):
            toleration.setdefault("operator", "Equal")


def apply_defaults(res: ResourceType, obj: Obj) -> None:
    """The defaults the real server fills in on write, for the fields fabric-dra reads (storage version)."""
    if res.group == "resource.k8s.io":
        for request in _requests_of(obj, res.kind) or ():
            if not isinstance(request, dict):
                continue
            if isinstance(request.get("exactly"), dict):
                _default_exact(request["exactly"])
            for sub in request.get("firstAvailable") or ():
                if isinstance(sub, dict):
                    _default_exact(sub)
    elif res.kind == "Secret":
        obj.setdefault("type", "Opaque")
    elif res.kind == "Deployment":
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec.setdefault("replicas", 1)
    elif res.kind == "Pod":
        spec = obj.get("spec")
        if isinstance(spec, dict):
            spec.setdefault("restartPolicy", "Always")
            spec.setdefault("schedulerName", "default-scheduler")
            spec.setdefault("dnsPolicy", "ClusterFirst")
            spec.setdefault("terminationGracePeriodSeconds", 30)
