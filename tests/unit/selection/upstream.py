"""The fixtures of Kubernetes' shared allocator tests, in Python.

``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting/
allocator_testing.go`` builds its cases from a few helpers (``device``, ``sliceWithDevices``,
``sliceWithCounterSets``, ``withDeviceCounterConsumption``, ``withCapacityRequestPolicyRange`` …);
these are the same helpers with the same defaults, so a case ports line by line and keeps its
upstream name.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from dra_driver.selection.allocator import AllocationResult, Allocator, ClaimToAllocate, Features
from dra_driver.selection.model import DeviceClass, Node, ResourceClaimSpec, ResourceSlice
from dra_driver.selection.quantity import parse_quantity

DRIVER_A, DRIVER_B = "driver-a", "driver-b"
NODE1, NODE2 = "node-1", "node-2"
REGION1 = "region-1"
CLASS_A, CLASS_B = "class-a", "class-b"
POOL1, POOL2 = "pool-1", "pool-2"
SET1, SET2 = "counter-set-1", "counter-set-2"
CAP0, CAP1 = "capacity0", "capacity1"
#: ``fromCounters``: the device's capacity mirrors the counters it consumes
FROM_COUNTERS = "fromCounters"
ALL_NODES, PER_DEVICE = "nodeSelectionAll", "nodeSelectionPerDevice"


def node(name: str = NODE1, region: str = REGION1) -> Node:
    return Node.model_validate({"metadata": {"name": name, "labels": {"region": region, "planet": "earth"}}})


def device_class(name: str = CLASS_A, driver: str = DRIVER_A, multi: bool | None = None) -> DeviceClass:
    """``class`` / ``classWithAllowMultipleAllocations``."""
    expression = f'device.driver == "{driver}"'
    if multi is not None:
        expression += f" && device.allowMultipleAllocations == {str(multi).lower()}"
    return DeviceClass.model_validate(
        {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}
    )


def counters(values: dict[str, str]) -> dict[str, Any]:
    return {name: {"value": value} for name, value in values.items()}


def counter_set(name: str, values: dict[str, str]) -> dict[str, Any]:
    return {"name": name, "counters": counters(values)}


def consumes(counter_set_name: str, values: dict[str, str]) -> dict[str, Any]:
    return {"counterSet": counter_set_name, "counters": counters(values)}


def device(
    name: str,
    capacity: dict[str, str] | str | None = None,
    attributes: dict[str, Any] | None = None,
    *,
    consumes_counters: list[dict[str, Any]] | None = None,
    multi: bool = False,
    range_policy: dict[str, str] | None = None,
    valid_values: tuple[str, dict[str, str], list[str]] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """``device(name, capacity, attributes)`` with the ``with…`` wrappers as keywords:
    ``range_policy`` is ``withCapacityRequestPolicyRange`` (default 2, min 2, step 2, max 4),
    ``valid_values`` is ``withCapacityRequestPolicyValidValues(default, capacity, extra)``."""
    body: dict[str, Any] = {"name": name, **fields}
    if attributes:
        body["attributes"] = attributes
    caps: dict[str, Any] = {}
    if isinstance(capacity, dict):
        caps = {n: {"value": v} for n, v in capacity.items()}
    if consumes_counters:
        body["consumesCounters"] = consumes_counters
        if capacity == FROM_COUNTERS:
            for consumption in consumes_counters:
                caps.update(consumption["counters"])
    for n, v in (range_policy or {}).items():
        caps[n] = {
            "value": v,
            "requestPolicy": {"default": "2", "validRange": {"min": "2", "step": "2", "max": "4"}},
        }
    if valid_values is not None:
        default, values, extra = valid_values
        for n, v in values.items():
            caps[n] = {"value": v, "requestPolicy": {"default": default, "validValues": [default, *extra]}}
    if caps:
        body["capacity"] = caps
    if multi:
        body["allowMultipleAllocations"] = True
    return body


def _slice(
    name: str, node_selection: Any, pool: str, count: int, driver: str, generation: int
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
    }
    if isinstance(node_selection, dict):
        spec["nodeSelector"] = node_selection
    elif node_selection == ALL_NODES:
        spec["allNodes"] = True
    elif node_selection == PER_DEVICE:
        spec["perDeviceNodeSelection"] = True
    else:
        spec["nodeName"] = node_selection
    return {"metadata": {"name": name}, "spec": spec}


def slice_with_devices(
    name: str,
    node_selection: Any,
    pool: str,
    *devices: dict[str, Any],
    count: int = 1,
    driver: str = DRIVER_A,
    generation: int = 1,
) -> ResourceSlice:
    obj = _slice(name, node_selection, pool, count, driver, generation)
    obj["spec"]["devices"] = list(devices)
    return ResourceSlice.model_validate(obj)


def slice_with_counter_sets(
    name: str,
    node_selection: Any,
    pool: str,
    *sets: dict[str, Any],
    count: int = 1,
    driver: str = DRIVER_A,
    generation: int = 1,
) -> ResourceSlice:
    obj = _slice(name, node_selection, pool, count, driver, generation)
    obj["spec"]["sharedCounters"] = list(sets)
    return ResourceSlice.model_validate(obj)


def node_label_selector(key: str, *values: str) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}]
    }


def request(
    name: str,
    cls: str = CLASS_A,
    count: int = 1,
    *selectors: str,
    capacity: str | None = None,
    mode: str = "ExactCount",
    **exact: Any,
) -> dict[str, Any]:
    """``deviceRequest`` / ``allDeviceRequest`` (``mode="All"``), ``.withCapacityRequest`` as ``capacity``."""
    body: dict[str, Any] = {"deviceClassName": cls, "allocationMode": mode, **exact}
    if mode == "ExactCount":
        body["count"] = count
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if capacity is not None:
        body["capacity"] = {"requests": {CAP0: capacity}}
    return {"name": name, "exactly": body}


def sub_request(
    name: str, cls: str = CLASS_A, count: int = 1, *selectors: str, capacity: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {"name": name, "deviceClassName": cls, "count": count}
    if selectors:
        body["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    if capacity is not None:
        body["capacity"] = {"requests": {CAP0: capacity}}
    return body


def first_available(name: str, *subs: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "firstAvailable": list(subs)}


def claim(
    name: str, *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None
) -> ClaimToAllocate:
    spec = ResourceClaimSpec.model_validate(
        {"devices": {"requests": list(requests), "constraints": constraints or []}}
    )
    return ClaimToAllocate("default", name, spec)


def memory_at_least(quantity: str, driver: str = DRIVER_A) -> str:
    return f'device.capacity["{driver}"].memory.compareTo(quantity("{quantity}")) >= 0'


def allocate(
    slices: list[ResourceSlice],
    claims: list[ClaimToAllocate],
    *,
    classes: list[DeviceClass] | None = None,
    allocated: Any = None,
    features: Features | None = None,
    on: Node | None = None,
) -> list[AllocationResult] | None:
    classes = classes if classes is not None else [device_class()]
    allocator = Allocator(slices, {c.name: c for c in classes}, allocated, features=features)
    return allocator.allocate(claims, on or node())


Picked = tuple[str, str, str, str]


def picked(result: AllocationResult) -> list[Picked]:
    """(request, driver, pool, device) of each result, sorted: upstream's ``ConsistOf``."""
    return sorted(
        (r["request"], r["driver"], r["pool"], r["device"]) for r in result.body["devices"]["results"]
    )


def consumed(result: AllocationResult) -> list[tuple[str, str, dict[str, Fraction] | None]]:
    """(request, device, consumedCapacity values) of each result, sorted."""
    out = []
    for r in result.body["devices"]["results"]:
        caps = r.get("consumedCapacity")
        values = {k: parse_quantity(v).value for k, v in caps.items()} if caps is not None else None
        out.append((r["request"], r["device"], values))
    return sorted(out, key=lambda t: (t[0], t[1]))


def values(**quantities: str) -> dict[str, Fraction]:
    return {name: parse_quantity(q).value for name, q in quantities.items()}


def local_selector(node_name: str = NODE1) -> dict[str, Any]:
    return {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
        ]
    }
