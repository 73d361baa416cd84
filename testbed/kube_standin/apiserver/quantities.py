"""Quantities as a real API server stores them: canonical, whatever spelling was written.

A ``resource.Quantity`` is decoded into a number and a format (``k8s.io/apimachinery/pkg/api/
resource/quantity.go``, ``ParseQuantity``: ``BinarySI`` for ``Ki``…``Ei``, ``DecimalExponent``
for ``e3``, ``DecimalSI`` otherwise) and encoded again with ``Quantity.String()`` →
``CanonicalizeBytes``: the largest suffix of its format that keeps the mantissa whole. So a slice
written with ``1024Mi`` reads back ``1Gi``, ``0.5Gi`` reads back ``512Mi``, ``1000000000`` reads
back ``1G`` and ``1000e0`` reads back ``1e3`` — in the answer to the write, in a get, a list and a
watch event, because the stored object is the decoded one. A client that compares what it sent
with what it reads must compare values, as ``apiequality.Semantic`` does (``Quantity.Cmp``).

:func:`canonical_quantities` rewrites every quantity field of the ``resource.k8s.io/v1`` types
fabric-dra writes (``k8s.io/api/resource/v1/types.go``): a device's ``capacity`` (``value`` and the
``requestPolicy``'s ``default``, ``validValues``, ``validRange``), ``consumesCounters`` and the
slice's ``sharedCounters`` (``Counter.value``), a node allocatable mapping's
``allocationMultiplier``; a claim's capacity requests and its results' ``consumedCapacity``.
A value that does not parse is left alone: the schema check refuses it before it is stored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dra_driver.selection.quantity import QuantityError, parse_quantity

__all__ = ["canonical_quantities", "canonical_quantity"]

Obj = dict[str, Any]


def canonical_quantity(value: Any) -> Any:
    """``value`` as ``Quantity.String()`` writes it back; anything that is no quantity, unchanged."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        return value
    try:
        return parse_quantity(str(value)).canonical()
    except QuantityError:
        return value


def _map_values(counters: Any, fn: Callable[[Any], Any]) -> Any:
    """``{name: {"value": q}}`` with each ``value`` through ``fn`` (copies, never edits in place:
    parts of a written object may be shared with one already stored)."""
    if not isinstance(counters, dict):
        return counters
    return {
        name: {**entry, "value": fn(entry["value"])}
        if isinstance(entry, dict) and "value" in entry
        else entry
        for name, entry in counters.items()
    }


def _policy(policy: Any) -> Any:
    if not isinstance(policy, dict):
        return policy
    out = dict(policy)
    if "default" in out:
        out["default"] = canonical_quantity(out["default"])
    if isinstance(out.get("validValues"), list):
        out["validValues"] = [canonical_quantity(v) for v in out["validValues"]]
    if isinstance(out.get("validRange"), dict):
        out["validRange"] = {k: canonical_quantity(v) for k, v in out["validRange"].items()}
    return out


def _capacity(capacity: Any) -> Any:
    if not isinstance(capacity, dict):
        return capacity
    out = {}
    for name, entry in capacity.items():
        if isinstance(entry, dict):
            entry = dict(entry)
            if "value" in entry:
                entry["value"] = canonical_quantity(entry["value"])
            if "requestPolicy" in entry:
                entry["requestPolicy"] = _policy(entry["requestPolicy"])
        out[name] = entry
    return out


def _consumes(consumes: Any) -> Any:
    if not isinstance(consumes, list):
        return consumes
    return [
        {**c, "counters": _map_values(c.get("counters"), canonical_quantity)} if isinstance(c, dict) else c
        for c in consumes
    ]


def _device(device: Any) -> Any:
    if not isinstance(device, dict):
        return device
    out = dict(device)
    if "capacity" in out:
        out["capacity"] = _capacity(out["capacity"])
    if "consumesCounters" in out:
        out["consumesCounters"] = _consumes(out["consumesCounters"])
    mappings = out.get("nodeAllocatableResourceMappings")
    if isinstance(mappings, dict):
        out["nodeAllocatableResourceMappings"] = {
            k: {**m, "allocationMultiplier": canonical_quantity(m["allocationMultiplier"])}
            if isinstance(m, dict) and "allocationMultiplier" in m
            else m
            for k, m in mappings.items()
        }
    return out


def _slice(obj: Obj) -> None:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    spec = dict(spec)
    if isinstance(spec.get("devices"), list):
        spec["devices"] = [_device(d) for d in spec["devices"]]
    if isinstance(spec.get("sharedCounters"), list):
        spec["sharedCounters"] = [
            {**s, "counters": _map_values(s.get("counters"), canonical_quantity)}
            if isinstance(s, dict)
            else s
            for s in spec["sharedCounters"]
        ]
    obj["spec"] = spec


def _capacity_requests(request: Any) -> Any:
    if not isinstance(request, dict) or not isinstance(request.get("capacity"), dict):
        return request
    requests = request["capacity"].get("requests")
    if not isinstance(requests, dict):
        return request
    return {
        **request,
        "capacity": {
            **request["capacity"],
            "requests": {k: canonical_quantity(v) for k, v in requests.items()},
        },
    }


def _claim_spec(spec: Any) -> Any:
    devices = spec.get("devices") if isinstance(spec, dict) else None
    if not isinstance(devices, dict) or not isinstance(devices.get("requests"), list):
        return spec
    requests = devices["requests"]
    out = []
    for request in requests:
        if isinstance(request, dict):
            request = dict(request)
            if "exactly" in request:
                request["exactly"] = _capacity_requests(request["exactly"])
            if isinstance(request.get("firstAvailable"), list):
                request["firstAvailable"] = [_capacity_requests(s) for s in request["firstAvailable"]]
        out.append(request)
    return {**spec, "devices": {**devices, "requests": out}}


def _claim(obj: Obj, spec_path: tuple[str, ...]) -> None:
    holder: Any = obj
    for key in spec_path[:-1]:
        holder = holder.get(key) if isinstance(holder, dict) else None
    if isinstance(holder, dict) and spec_path[-1] in holder:
        holder[spec_path[-1]] = _claim_spec(holder[spec_path[-1]])
    status = obj.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    if not isinstance(status, dict) or not isinstance(allocation, dict) or not isinstance(devices, dict):
        return
    results = devices.get("results")
    if not isinstance(results, list):
        return
    canonical = [
        {**r, "consumedCapacity": {k: canonical_quantity(v) for k, v in r["consumedCapacity"].items()}}
        if isinstance(r, dict) and isinstance(r.get("consumedCapacity"), dict)
        else r
        for r in results
    ]
    obj["status"] = {**status, "allocation": {**allocation, "devices": {**devices, "results": canonical}}}


def canonical_quantities(kind: str, obj: Obj) -> None:
    """Every quantity of a ``resource.k8s.io`` object of ``kind`` (storage form) in canonical form,
    in place at the top (nested parts are copied)."""
    if kind == "ResourceSlice":
        _slice(obj)
    elif kind == "ResourceClaim":
        _claim(obj, ("spec",))
    elif kind == "ResourceClaimTemplate":
        _claim(obj, ("spec", "spec"))
