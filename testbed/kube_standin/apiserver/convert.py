"""Conversion between served versions and the storage version, plus the server-side defaults.

``resource.k8s.io`` objects are stored as ``v1``. ``v1beta2`` has the same shape as ``v1``
for every kind served here. ``v1beta1`` differs in two places (k8s.io/api/resource/v1beta1,
Kubernetes 1.34):

* a ``DeviceRequest`` carries ``deviceClassName``, ``selectors``, ``allocationMode``,
  ``count``, ``adminAccess``, ``tolerations``, ``capacity`` directly, where ``v1`` puts them
  under ``exactly`` (``firstAvailable`` requests are the same in both);
* a ``Device`` in a ResourceSlice wraps its fields in ``basic``, where ``v1`` has them inline.

The defaults are those of ``pkg/apis/resource/v1/defaults.go`` the fields fabric-dra reads need
(:func:`apply_defaults`): a request's allocation mode and count, a toleration's operator, a
device taint's ``timeAdded``; and every quantity in the canonical form the real server stores
(:mod:`kube_standin.apiserver.quantities`).

``events.k8s.io/v1`` Events are stored as core ``v1`` Events, with the field mapping of
``k8s.io/kubernetes/pkg/apis/events/v1/conversion.go``.

The verb handlers take a written object to its stored form with :func:`storage_form` and a stored
one back to the client's version with :func:`from_storage` (:func:`list_item` inside a list).
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kube_standin.apiserver.customresources.definitions import default_crd
from kube_standin.apiserver.quantities import canonical_quantities
from kube_standin.apiserver.registry import ResourceType

__all__ = ["apply_defaults", "from_storage", "list_item", "storage_form", "to_storage"]

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


_REQUEST_PATHS = {
    "ResourceClaim": ("spec", "devices", "requests"),
    "ResourceClaimTemplate": ("spec", "spec", "devices", "requests"),
}


def _requests_of(obj: Obj, kind: str) -> list[Any] | None:
    node: Any = obj
    for key in _REQUEST_PATHS.get(kind, ("-",)):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, list) else None


def _map_list_at(node: Any, path: tuple[str, ...], fn: Callable[[Any], Any]) -> Any:
    """``node`` with the list at ``path`` mapped through ``fn``; only the dicts on the way are
    copied, so the (stored, shared) original is left alone."""
    if not path:
        return [fn(item) for item in node] if isinstance(node, list) else node
    if not isinstance(node, dict) or path[0] not in node:
        return node
    out = dict(node)
    out[path[0]] = _map_list_at(node[path[0]], path[1:], fn)
    return out


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


def _map_dra(obj: Obj, kind: str, request_fn: Callable[[Any], Any], device_fn: Callable[[Any], Any]) -> Obj:
    if kind in _REQUEST_PATHS:
        out: Obj = _map_list_at(obj, _REQUEST_PATHS[kind], request_fn)
        return out
    if kind == "ResourceSlice":
        sliced: Obj = _map_list_at(obj, ("spec", "devices"), device_fn)
        return sliced
    return obj


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
    """``obj`` (as sent in ``version``) in the storage version; ``obj`` itself is not modified,
    and parts that need no conversion are shared with it."""
    if res.group == "events.k8s.io":
        out = _rename(obj, _EVENTS_TO_CORE)
        out.setdefault("involvedObject", {})
        out["apiVersion"] = "v1"
        return out
    out = obj
    if res.group == "resource.k8s.io" and version == "v1beta1":
        out = _map_dra(obj, res.kind, _request_v1beta1_to_v1, _device_v1beta1_to_v1)
    out = dict(out)
    out["apiVersion"] = res.api_version(res.storage_version)
    return out


def from_storage(res: ResourceType, version: str, obj: Obj) -> Obj:
    """The stored ``obj`` as ``version`` of ``res`` presents it (sharing what needs no change)."""
    if res.group == "events.k8s.io":
        out = _rename(obj, _CORE_TO_EVENTS)
        out.setdefault("eventTime", None)
        out["apiVersion"] = res.api_version(version)
        return out
    if version == res.storage_version and res.storage_group is None:
        return obj
    out = obj
    if res.group == "resource.k8s.io" and version == "v1beta1":
        out = _map_dra(obj, res.kind, _request_v1_to_v1beta1, _device_v1_to_v1beta1)
    out = dict(out)
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


def _default_taint_times(obj: Obj) -> None:
    """``SetDefaults_DeviceTaint`` (``k8s.io/kubernetes/pkg/apis/resource/v1/defaults.go``, since
    1.33): a device taint written without ``timeAdded`` gets the time of the write, to the second.
    Copies what it changes: parts of ``obj`` may be shared with an object already stored."""
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    devices = spec.get("devices")
    if not isinstance(devices, list) or not any(
        isinstance(t, dict) and not t.get("timeAdded")
        for d in devices
        if isinstance(d, dict)
        for t in d.get("taints") or ()
    ):
        return
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def defaulted(device: Any) -> Any:
        taints = device.get("taints") if isinstance(device, dict) else None
        if not isinstance(taints, list):
            return device
        return {
            **device,
            "taints": [
                {**t, "timeAdded": now} if isinstance(t, dict) and not t.get("timeAdded") else t
                for t in taints
            ],
        }

    obj["spec"] = {**spec, "devices": [defaulted(d) for d in devices]}


def _default_rule_taint_time(obj: Obj) -> None:
    """A DeviceTaintRule's taint "Added automatically during create or update if not set"
    (``DeviceTaint.TimeAdded``, k8s.io/api/resource/v1beta2/types.go). Copies what it changes."""
    spec = obj.get("spec")
    taint = spec.get("taint") if isinstance(spec, dict) else None
    if isinstance(spec, dict) and isinstance(taint, dict) and not taint.get("timeAdded"):
        obj["spec"] = {
            **spec,
            "taint": {**taint, "timeAdded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
        }


def apply_defaults(res: ResourceType, obj: Obj) -> None:
    """The defaults the real server fills in on write, for the fields fabric-dra reads (storage
    version). Modifies ``obj`` in place: give it a document of your own."""
    if res.group == "resource.k8s.io":
        # Decoded into resource.Quantity and encoded again: stored, and answered, canonical.
        canonical_quantities(res.kind, obj)
    if res.group == "resource.k8s.io" and res.kind == "ResourceSlice":
        _default_taint_times(obj)
    elif res.kind == "DeviceTaintRule":
        _default_rule_taint_time(obj)
    elif res.group == "resource.k8s.io":
        for request in _requests_of(obj, res.kind) or ():
            if not isinstance(request, dict):
                continue
            if isinstance(request.get("exactly"), dict):
                _default_exact(request["exactly"])
            for sub in request.get("firstAvailable") or ():
                if isinstance(sub, dict):
                    _default_exact(sub)
    elif res.kind == "CustomResourceDefinition" and res.group == "apiextensions.k8s.io":
        default_crd(obj)
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


def _fold_string_data(res: ResourceType, obj: Obj) -> None:
    # The API server folds stringData into data (base64) and never stores stringData
    # (Convert_v1_Secret_To_core_Secret in pkg/apis/core/v1/conversion.go).
    if res.kind != "Secret":
        return
    string_data = obj.pop("stringData", None)
    if isinstance(string_data, dict) and string_data:
        data = obj.setdefault("data", {}) or {}
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        obj["data"] = data


def storage_form(res: ResourceType, version: str, obj: Obj) -> Obj:
    """A written object (checked, as sent in ``version``) as the store keeps it: in the storage
    version, with the server's defaults, a Secret's ``stringData`` folded into ``data``."""
    stored = to_storage(res, version, obj)
    apply_defaults(res, stored)
    _fold_string_data(res, stored)
    return stored


def list_item(res: ResourceType, version: str, obj: Obj) -> Obj:
    """A stored object as an item of a list in ``version``: a list's items carry no apiVersion or
    kind of their own, as on a real server."""
    shown = dict(from_storage(res, version, obj))
    shown.pop("apiVersion", None)
    shown.pop("kind", None)
    return shown
