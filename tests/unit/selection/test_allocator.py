"""The allocator against hand-built slices: the scheduler's rules, one by one."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.selection.allocator import AllocationError, Allocator, ClaimToAllocate, Features
from tests.unit.selection.fixtures import (
    claim_spec,
    device_class,
    gpu,
    gpus,
    node,
    nvme,
    pool_slice,
)

SWITCHED = [
    gpu("gpu-0", "sw1"),
    gpu("gpu-1", "sw1"),
    gpu("gpu-2", "sw2"),
    gpu("gpu-3", "sw2"),
    nvme("nvme-0"),
]
CLASSES = {"fabric-gpu": device_class()}


def claim(
    *requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None, name: str = "c"
) -> ClaimToAllocate:
    return ClaimToAllocate("default", name, claim_spec(list(requests), constraints))


def devices_of(results: list[Any]) -> list[str]:
    return [f"{r['pool']}/{r['device']}" for r in results[0].body["devices"]["results"]]


def test_first_fit_in_slice_order_with_pool_node_selector_copied() -> None:
    allocator = Allocator([pool_slice(SWITCHED)], CLASSES)
    results = allocator.allocate([claim(gpus(2))], node())
    assert results is not None
    assert devices_of(results) == ["fabric-pcie/gpu-0", "fabric-pcie/gpu-1"]
    assert results[0].body["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == [
        "pcie"
    ]


def test_unreachable_node_gets_nothing() -> None:
    allocator = Allocator([pool_slice(SWITCHED)], CLASSES)
    assert allocator.allocate([claim(gpus(1))], node("node-x", fabric=None)) is None


def test_match_attribute_backtracks_to_a_switch_with_room() -> None:
    allocated = {("fabric-dra.io", "fabric-pcie", "gpu-0"): "default/other"}
    allocator = Allocator([pool_slice(SWITCHED)], CLASSES, allocated)
    results = allocator.allocate(
        [claim(gpus(2), constraints=[{"matchAttribute": "fabric-dra.io/switch"}])], node()
    )
    assert results is not None
    assert devices_of(results) == ["fabric-pcie/gpu-2", "fabric-pcie/gpu-3"]
    three = claim(gpus(3), constraints=[{"matchAttribute": "fabric-dra.io/switch"}])
    assert Allocator([pool_slice(SWITCHED)], CLASSES).allocate([three], node()) is None


def test_distinct_attribute_spreads_over_switches() -> None:
    allocator = Allocator([pool_slice(SWITCHED)], CLASSES)
    results = allocator.allocate(
        [claim(gpus(2), constraints=[{"distinctAttribute": "fabric-dra.io/switch"}])], node()
    )
    assert results is not None
    assert devices_of(results) == ["fabric-pcie/gpu-0", "fabric-pcie/gpu-2"]
    three = claim(gpus(3), constraints=[{"distinctAttribute": "fabric-dra.io/switch"}])
    assert allocator.allocate([three], node()) is None


def test_constraint_fails_on_device_without_the_attribute() -> None:
    allocator = Allocator([pool_slice([gpu("gpu-0"), gpu("gpu-1")])], CLASSES)
    assert (
        allocator.allocate([claim(gpus(1), constraints=[{"matchAttribute": "fabric-dra.io/switch"}])], node())
        is None
    )


def test_request_selectors_and_quantities() -> None:
    slices = [pool_slice([gpu("small", "sw1", memory="40Gi"), gpu("big", "sw1", memory="80Gi")])]
    big = 'device.capacity["fabric-dra.io"].memory.compareTo(quantity("64Gi")) >= 0'
    results = Allocator(slices, CLASSES).allocate([claim(gpus(1, selectors=[big]))], node())
    assert results is not None and devices_of(results) == ["fabric-pcie/big"]


def test_cel_runtime_error_on_an_examined_device_aborts_like_kubernetes() -> None:
    # gpu-0 has no "vendor" attribute: the first device examined fails, and Kubernetes stops.
    slices = [pool_slice([gpu("gpu-0", "sw1"), gpu("gpu-1", "sw1")])]
    selector = 'device.attributes["fabric-dra.io"].vendor == "acme"'
    with pytest.raises(
        AllocationError, match=r"selector #0 on device fabric-pcie/gpu-0: CEL runtime error: no such key"
    ):
        Allocator(slices, CLASSES).allocate([claim(gpus(1, selectors=[selector]))], node())


def test_all_mode_takes_every_matching_device_and_refuses_incomplete_pools() -> None:
    results = Allocator([pool_slice(SWITCHED)], CLASSES).allocate(
        [claim(gpus(0, allocationMode="All"))], node()
    )
    assert results is not None and len(devices_of(results)) == 4
    incomplete = pool_slice(SWITCHED, count=2)
    with pytest.raises(AllocationError, match="currently being updated"):
        Allocator([incomplete], CLASSES).allocate([claim(gpus(0, allocationMode="All"))], node())
    # ExactCount simply skips an incomplete pool
    assert Allocator([incomplete], CLASSES).allocate([claim(gpus(1))], node()) is None


def test_newest_generation_wins_and_duplicates_invalidate() -> None:
    old = pool_slice([gpu("gpu-old", "sw1")], name="a", generation=1)
    new = pool_slice([gpu("gpu-new", "sw1")], name="b", generation=2)
    results = Allocator([old, new], CLASSES).allocate([claim(gpus(1))], node())
    assert results is not None and devices_of(results) == ["fabric-pcie/gpu-new"]
    dup = [pool_slice([gpu("g", "sw1")], name="a", count=2), pool_slice([gpu("g", "sw1")], name="b", count=2)]
    # nothing fits and a pool was invalid: upstream's Allocate says so instead of "no fit"
    with pytest.raises(AllocationError, match=r"^invalid resource pools were encountered$"):
        Allocator(dup, CLASSES).allocate([claim(gpus(1))], node())
    # another pool that fits wins: an invalid pool is no error then
    # ("invalid-pool-is-ok-if-devices-can-be-allocated-from-other" upstream)
    other = pool_slice([gpu("h", "sw1")], name="c", pool="other")
    results = Allocator([*dup, other], CLASSES).allocate([claim(gpus(1))], node())
    assert results is not None and devices_of(results) == ["other/h"]


def test_taints_block_unless_tolerated() -> None:
    tainted = gpu(
        "gpu-0", "sw1", taints=[{"key": "fabric-dra.io/unhealthy", "value": "true", "effect": "NoSchedule"}]
    )
    slices = [pool_slice([tainted])]
    assert Allocator(slices, CLASSES).allocate([claim(gpus(1))], node()) is None
    tolerating = gpus(1, tolerations=[{"key": "fabric-dra.io/unhealthy", "operator": "Exists"}])
    results = Allocator(slices, CLASSES).allocate([claim(tolerating)], node())
    assert (
        results is not None
        and results[0].body["devices"]["results"][0]["tolerations"][0]["operator"] == "Exists"
    )
    assert Allocator(slices, CLASSES, features=Features(device_taints=False)).allocate(
        [claim(gpus(1))], node()
    )


def test_first_available_picks_the_first_satisfiable_subrequest() -> None:
    request = {
        "name": "accel",
        "firstAvailable": [
            {
                "name": "four",
                "deviceClassName": "fabric-gpu",
                "count": 4,
                "selectors": [{"cel": {"expression": 'device.attributes["fabric-dra.io"].switch == "sw1"'}}],
            },
            {"name": "two", "deviceClassName": "fabric-gpu", "count": 2},
        ],
    }
    results = Allocator([pool_slice(SWITCHED)], CLASSES).allocate([claim(request)], node())
    assert results is not None
    assert {r["request"] for r in results[0].body["devices"]["results"]} == {"accel/two"}


def test_binding_conditions_pin_the_node_and_are_copied() -> None:
    bound = gpu(
        "gpu-0",
        "sw1",
        bindsToNode=True,
        bindingConditions=["FabricAttached"],
        bindingFailureConditions=["FabricAttachFailed"],
    )
    results = Allocator([pool_slice([bound])], CLASSES).allocate([claim(gpus(1))], node("node-a"))
    assert results is not None
    entry = results[0].body["devices"]["results"][0]
    assert entry["bindingConditions"] == ["FabricAttached"]
    assert entry["bindingFailureConditions"] == ["FabricAttachFailed"]
    assert results[0].body["nodeSelector"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        ]
    }
    off = Allocator([pool_slice([bound])], CLASSES, features=Features(binding_conditions=False))
    assert off.allocate([claim(gpus(1))], node("node-a")) is None


def test_pool_with_binding_conditions_is_searched_last() -> None:
    plain = pool_slice([gpu("plain", "sw1")], name="z", pool="zz-plain")
    bound = pool_slice([gpu("bound", "sw1", bindingConditions=["Ready"])], name="a", pool="aa-bound")
    results = Allocator([bound, plain], CLASSES).allocate([claim(gpus(1))], node())
    assert results is not None and devices_of(results) == ["zz-plain/plain"]


def test_claims_of_one_pod_do_not_share_devices_and_node_local_slices_pin() -> None:
    local = pool_slice([gpu("gpu-0", "sw1"), gpu("gpu-1", "sw1")], nodeName="node-a")
    allocator = Allocator([local], CLASSES)
    results = allocator.allocate([claim(gpus(1), name="a"), claim(gpus(1), name="b")], node("node-a"))
    assert results is not None
    assert [devices_of([r]) for r in results] == [["fabric-pcie/gpu-0"], ["fabric-pcie/gpu-1"]]
    assert results[0].body["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["node-a"]
    assert allocator.allocate([claim(gpus(1))], node("node-b")) is None
    assert allocator.allocate([claim(gpus(2), name="a"), claim(gpus(1), name="b")], node("node-a")) is None


def test_admin_access_ignores_other_allocations() -> None:
    allocated = {("fabric-dra.io", "fabric-pcie", "gpu-0"): "default/other"}
    allocator = Allocator([pool_slice([gpu("gpu-0", "sw1")])], CLASSES, allocated)
    assert allocator.allocate([claim(gpus(1))], node()) is None
    results = allocator.allocate([claim(gpus(1, adminAccess=True))], node())
    assert results is not None and results[0].body["devices"]["results"][0]["adminAccess"] is True


def test_unknown_class_and_v1beta1_requests() -> None:
    with pytest.raises(AllocationError, match="device class nope not found"):
        Allocator([pool_slice(SWITCHED)], CLASSES).allocate(
            [claim({"name": "x", "exactly": {"deviceClassName": "nope"}})], node()
        )
    beta = claim({"name": "gpus", "deviceClassName": "fabric-gpu", "count": 2})
    assert Allocator([pool_slice(SWITCHED)], CLASSES).allocate([beta], node()) is not None


def test_class_config_is_copied_into_the_allocation() -> None:
    config = {"opaque": {"driver": "fabric-dra.io", "parameters": {"mode": "exclusive"}}}
    cls = device_class().model_copy(
        update={"spec": device_class().spec.model_copy(update={"config": [config]})}
    )
    results = Allocator([pool_slice(SWITCHED)], {"fabric-gpu": cls}).allocate([claim(gpus(1))], node())
    assert results is not None
    assert results[0].body["devices"]["config"] == [{"source": "FromClass", **config}]


def test_selector_outcomes_shared_across_snapshots_follow_the_device_not_its_name() -> None:
    """Allocators of successive snapshots may share their selector outcomes (the stand-in scheduler
    does): a device whose slice was rewritten unchanged is not evaluated again, and a device that
    changed under the same name is."""
    outcomes: dict[tuple[str, str], Any] = {}
    wants_h100 = claim(gpus(1, selectors=['device.attributes["fabric-dra.io"].model == "H100"']))
    first = Allocator([pool_slice([gpu("gpu-0")])], CLASSES, outcomes=outcomes)
    results = first.allocate([wants_h100], node())
    assert results is not None and devices_of(results) == ["fabric-pcie/gpu-0"]
    evaluated = len(outcomes)
    assert evaluated == 2  # the class's selector and the request's, on gpu-0

    rewritten = Allocator([pool_slice([gpu("gpu-0")], generation=2)], CLASSES, outcomes=outcomes)
    assert rewritten.allocate([wants_h100], node()) is not None
    assert len(outcomes) == evaluated

    changed = gpu("gpu-0")
    changed["attributes"]["model"] = {"string": "A100"}
    now_a100 = Allocator([pool_slice([changed], generation=3)], CLASSES, outcomes=outcomes)
    assert now_a100.allocate([wants_h100], node()) is None
    assert len(outcomes) > evaluated
