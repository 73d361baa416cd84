"""Partitionable devices: shared counters, ported from Kubernetes' shared allocator tests
(``internal/allocatortesting/allocator_testing.go``; each test is named after its upstream case),
then the project's own cases for backtracking, invalid pools and the 1.34 slice layout."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.selection.allocated import Share
from dra_driver.selection.allocator import AllocatedState, AllocationError, Allocator, Features
from dra_driver.selection.model import ResourceSlice
from dra_driver.selection.quantity import parse_quantity
from tests.unit.selection.upstream import (
    ALL_NODES,
    CLASS_A,
    CLASS_B,
    DRIVER_A,
    DRIVER_B,
    FROM_COUNTERS,
    NODE1,
    NODE2,
    PER_DEVICE,
    POOL1,
    POOL2,
    SET1,
    SET2,
    allocate,
    claim,
    consumes,
    counter_set,
    device,
    device_class,
    first_available,
    local_selector,
    memory_at_least,
    node,
    node_label_selector,
    picked,
    request,
    slice_with_counter_sets,
    slice_with_devices,
    sub_request,
)

MEM8 = counter_set(SET1, {"memory": "8Gi"})


def mem_device(name: str, memory: str, **extra: Any) -> dict[str, Any]:
    return device(name, FROM_COUNTERS, consumes_counters=[consumes(SET1, {"memory": memory})], **extra)


def three_devices(*sets: dict[str, Any], count: int = 2) -> list[ResourceSlice]:
    """dev1 4Gi, dev2 6Gi, dev3 4Gi of one memory counter set (the cases' usual pool)."""
    return [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            mem_device("device-1", "4Gi"),
            mem_device("device-2", "6Gi"),
            mem_device("device-3", "4Gi"),
            count=count,
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, *(sets or (MEM8,)), count=count),
    ]


def test_partitionable_devices_single_device() -> None:
    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            device("device-1", consumes_counters=[consumes(SET1, {"memory": "4Gi"})]),
            count=2,
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, MEM8, count=2),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0"))]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-1")]
    assert result.body["nodeSelector"] == local_selector()


def test_partitionable_devices_prioritized_list() -> None:
    c = claim(
        "claim-0",
        request("req-0"),
        first_available(
            "req-1",
            sub_request("subReq-0", CLASS_A, 1, memory_at_least("6Gi")),
            sub_request("subReq-1", CLASS_A, 1, memory_at_least("4Gi")),
        ),
    )
    (result,) = allocate(three_devices(), [c]) or []
    assert picked(result) == [
        ("req-0", DRIVER_A, POOL1, "device-1"),
        ("req-1/subReq-1", DRIVER_A, POOL1, "device-3"),
    ]


def test_partitionable_devices_multiple_devices() -> None:
    (result,) = allocate(three_devices(), [claim("claim-0", request("req-0"), request("req-1"))]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-1"), ("req-1", DRIVER_A, POOL1, "device-3")]


def test_partitionable_devices_multiple_capacity_pools() -> None:
    def dev(name: str, memory: str, cpus: str) -> dict[str, Any]:
        return device(
            name,
            FROM_COUNTERS,
            consumes_counters=[consumes(SET1, {"memory": memory}), consumes(SET2, {"cpus": cpus})],
        )

    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            dev("device-1", "4Gi", "4"),
            dev("device-2", "6Gi", "6"),
            dev("device-3", "4Gi", "4"),
            count=2,
        ),
        slice_with_counter_sets(
            "slice-2",
            NODE1,
            POOL1,
            counter_set(SET1, {"memory": "18Gi"}),
            counter_set(SET2, {"cpus": "8"}),
            count=2,
        ),
    ]
    c = claim(
        "claim-0",
        request("req-0"),
        first_available(
            "req-1",
            sub_request("subReq-0", CLASS_A, 1, memory_at_least("6Gi")),
            sub_request("subReq-1", CLASS_A, 1, memory_at_least("4Gi")),
        ),
    )
    (result,) = allocate(slices, [c]) or []
    assert picked(result) == [
        ("req-0", DRIVER_A, POOL1, "device-1"),
        ("req-1/subReq-1", DRIVER_A, POOL1, "device-3"),
    ]


def test_partitionable_devices_multiple_counters() -> None:
    def dev(name: str, s1: dict[str, str], s2: dict[str, str]) -> dict[str, Any]:
        return device(name, FROM_COUNTERS, consumes_counters=[consumes(SET1, s1), consumes(SET2, s2)])

    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            dev("device-1", {"memory": "4Gi", "cpus": "6"}, {"cpus": "4", "memory": "2Gi"}),
            dev("device-2", {"memory": "6Gi", "cpus": "4"}, {"cpus": "6", "memory": "6Gi"}),
            dev("device-3", {"memory": "4Gi", "cpus": "4"}, {"cpus": "4", "memory": "4Gi"}),
            count=2,
        ),
        slice_with_counter_sets(
            "slice-2",
            NODE1,
            POOL1,
            counter_set(SET1, {"cpus": "8", "memory": "18Gi"}),
            counter_set(SET2, {"cpus": "12", "memory": "18Gi"}),
            count=2,
        ),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0"), request("req-1"))]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-2"), ("req-1", DRIVER_A, POOL1, "device-3")]


def test_partitionable_devices_multiple_pools() -> None:
    def pool(pool_name: str, first: str, devices: list[tuple[str, str, str]]) -> list[ResourceSlice]:
        return [
            slice_with_devices(
                first,
                NODE1,
                pool_name,
                *(
                    device(n, FROM_COUNTERS, consumes_counters=[consumes(SET1, {"cpus": c, "memory": m})])
                    for n, c, m in devices
                ),
                count=2,
            ),
            slice_with_counter_sets(
                first + "-counters",
                NODE1,
                pool_name,
                counter_set(SET1, {"cpus": "8", "memory": "18Gi"}),
                count=2,
            ),
        ]

    slices = [
        *pool(
            POOL1, "slice-1", [("device-1", "6", "4Gi"), ("device-2", "4", "6Gi"), ("device-3", "4", "4Gi")]
        ),
        *pool(
            POOL2, "slice-3", [("device-1", "6", "4Gi"), ("device-2", "1", "7Gi"), ("device-3", "1", "7Gi")]
        ),
    ]
    allocated = {
        (DRIVER_A, POOL1, "device-2"): "default/a",
        (DRIVER_A, POOL1, "device-3"): "default/a",
        (DRIVER_A, POOL2, "device-1"): "default/b",
    }
    (result,) = (
        allocate(slices, [claim("claim-0", request("req-0"), request("req-1"))], allocated=allocated) or []
    )
    assert picked(result) == [("req-0", DRIVER_A, POOL2, "device-2"), ("req-1", DRIVER_A, POOL2, "device-3")]


def test_partitionable_devices_unused_counters_in_counter_set() -> None:
    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            *(
                device(n, consumes_counters=[consumes(SET1, {"memory": m})])
                for n, m in (("device-1", "5Gi"), ("device-2", "4Gi"), ("device-3", "4Gi"))
            ),
            count=2,
        ),
        slice_with_counter_sets(
            "slice-2", NODE1, POOL1, counter_set(SET1, {"memory": "8Gi", "unused": "1Gi"}), count=2
        ),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0", CLASS_A, 2))]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-2"), ("req-0", DRIVER_A, POOL1, "device-3")]


# Upstream builds the next two with resourceSliceCount 1 on both slices, which also makes the pool
# incomplete; with the count right, only the counters keep the device out.


def test_partitionable_devices_no_capacity_available() -> None:
    slices = [
        slice_with_devices(
            "slice-1", NODE1, POOL1, mem_device("device-1", "4Gi"), mem_device("device-2", "16Gi"), count=2
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, counter_set(SET1, {"memory": "18Gi"}), count=2),
    ]
    held = {(DRIVER_A, POOL1, "device-2"): "default/holder"}
    assert allocate(slices, [claim("claim-0", request("req-0"))], allocated=held) is None
    assert allocate(slices, [claim("claim-0", request("req-0"))]) is not None


def test_partitionable_devices_overallocated_capacity_pool() -> None:
    slices = [
        slice_with_devices(
            "slice-1", NODE1, POOL1, mem_device("device-1", "4Gi"), mem_device("device-2", "20Gi"), count=2
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, counter_set(SET1, {"memory": "18Gi"}), count=2),
    ]
    held = {(DRIVER_A, POOL1, "device-2"): "default/holder"}
    assert allocate(slices, [claim("claim-0", request("req-0"))], allocated=held) is None


def test_partitionable_devices_disabled_device_consumes_counters() -> None:
    off = Features(partitionable_devices=False)
    slices = [
        slice_with_devices(
            "slice-1", NODE1, POOL1, device("device-1", consumes_counters=[consumes(SET1, {"memory": "4Gi"})])
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, counter_set(SET1, {"memory": "18Gi"})),
    ]
    assert allocate(slices, [claim("claim-0", request("req-0"))], features=off) is None


def test_partitionable_devices_disabled_other_device_do_not_consume_counters() -> None:
    off = Features(partitionable_devices=False)
    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            device("device-1", consumes_counters=[consumes(SET1, {"memory": "4Gi"})]),
            device("device-2"),
            count=2,
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, counter_set(SET1, {"memory": "18Gi"}), count=2),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0"))], features=off) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-2")]


def test_partitionable_devices_disabled_per_device_node_selection() -> None:
    off = Features(partitionable_devices=False)
    slices = [slice_with_devices("slice-1", PER_DEVICE, POOL1, device("device-2", nodeName=NODE1))]
    assert allocate(slices, [claim("claim-0", request("req-0"))], features=off) is None


def test_partitionable_devices_per_device_node_selection_nodename() -> None:
    slices = [
        slice_with_devices(
            "slice-1",
            PER_DEVICE,
            POOL1,
            mem_device("device-1", "4Gi", nodeName=NODE1),
            mem_device("device-2", "6Gi", nodeName=NODE2),
            count=2,
        ),
        slice_with_counter_sets("slice-2", PER_DEVICE, POOL1, counter_set(SET1, {"memory": "18Gi"}), count=2),
    ]
    c = claim(
        "claim-0",
        first_available(
            "req-0",
            sub_request("subReq-0", CLASS_A, 1, memory_at_least("6Gi")),
            sub_request("subReq-1", CLASS_A, 1, memory_at_least("4Gi")),
        ),
    )
    (result,) = allocate(slices, [c]) or []
    assert picked(result) == [("req-0/subReq-1", DRIVER_A, POOL1, "device-1")]
    assert result.body["nodeSelector"] == local_selector()


def test_partitionable_devices_per_device_node_selection_node_selector() -> None:
    slices = [
        slice_with_devices(
            "slice-1",
            PER_DEVICE,
            POOL1,
            mem_device("device-1", "4Gi", nodeSelector=node_label_selector("region", "region-1")),
            count=2,
        ),
        slice_with_counter_sets("slice-2", PER_DEVICE, POOL1, counter_set(SET1, {"memory": "18Gi"}), count=2),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0"))]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-1")]
    assert result.body["nodeSelector"] == node_label_selector("region", "region-1")


def test_partitionable_devices_per_device_node_selection_node_selector_multiple_devices() -> None:
    slices = [
        slice_with_devices(
            "slice-1",
            PER_DEVICE,
            POOL1,
            mem_device("device-1", "4Gi", nodeSelector=node_label_selector("region", "region-1")),
            mem_device("device-2", "4Gi", nodeName=NODE1),
            mem_device("device-3", "4Gi", allNodes=True),
            count=2,
        ),
        slice_with_counter_sets("slice-2", PER_DEVICE, POOL1, counter_set(SET1, {"memory": "18Gi"}), count=2),
        slice_with_devices(
            "slice-3",
            NODE1,
            POOL2,
            *(
                device(f"device-{i}", FROM_COUNTERS, consumes_counters=[consumes(SET2, {"memory": "4Gi"})])
                for i in (1, 2, 3)
            ),
            count=2,
            driver=DRIVER_B,
        ),
        slice_with_counter_sets(
            "slice-4", NODE1, POOL2, counter_set(SET2, {"memory": "12Gi"}), count=2, driver=DRIVER_B
        ),
    ]
    classes = [device_class(CLASS_A, DRIVER_A), device_class(CLASS_B, DRIVER_B)]
    (result,) = (
        allocate(
            slices,
            [claim("claim-0", request("req-0", CLASS_A, 3), request("req-1", CLASS_B, 3))],
            classes=classes,
        )
        or []
    )
    assert picked(result) == sorted(
        [
            *(("req-0", DRIVER_A, POOL1, f"device-{i}") for i in (1, 2, 3)),
            *(("req-1", DRIVER_B, POOL2, f"device-{i}") for i in (1, 2, 3)),
        ]
    )
    assert result.body["nodeSelector"] == local_selector()


def test_partitionable_devices_with_attribute_selector() -> None:
    def dev(name: str, special: bool, cpu: str) -> dict[str, Any]:
        return device(
            name,
            None,
            {"special": {"bool": special}},
            consumes_counters=[consumes(SET1, {cpu: "1"}), consumes(SET2, {"mem": "10Gi"})],
        )

    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            dev("device-1", True, "cpu1"),
            dev("device-2", False, "cpu2"),
            dev("device-3", False, "cpu3"),
            count=2,
        ),
        slice_with_counter_sets(
            "slice-2",
            NODE1,
            POOL1,
            counter_set(SET1, {"cpu1": "1", "cpu2": "1", "cpu3": "1"}),
            counter_set(SET2, {"mem": "30Gi"}),
            count=2,
        ),
    ]
    c = claim(
        "claim-0",
        request("req-0", CLASS_A, 2),
        request("req-1", CLASS_A, 1, f'device.attributes["{DRIVER_A}"].special'),
    )
    (result,) = allocate(slices, [c]) or []
    assert picked(result) == [
        ("req-0", DRIVER_A, POOL1, "device-2"),
        ("req-0", DRIVER_A, POOL1, "device-3"),
        ("req-1", DRIVER_A, POOL1, "device-1"),
    ]


def test_partitionable_devices_with_binding_conditions_multi_slices() -> None:
    bound = mem_device(
        "device-1", "4Gi", bindingConditions=["IsPrepare"], bindingFailureConditions=["BindingFailed"]
    )
    plain = device("device-2", FROM_COUNTERS, consumes_counters=[consumes(SET2, {"memory": "4Gi"})])
    slices = [
        slice_with_devices("slice-1", NODE1, POOL1, bound, count=4),
        slice_with_counter_sets("slice-2", NODE1, POOL1, MEM8, count=4),
        slice_with_devices("slice-3", NODE1, POOL1, plain, count=4),
        slice_with_counter_sets("slice-4", NODE1, POOL1, counter_set(SET2, {"memory": "8Gi"}), count=4),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0", CLASS_A, 2))]) or []
    entries = {r["device"]: r for r in result.body["devices"]["results"]}
    assert entries["device-1"]["bindingConditions"] == ["IsPrepare"]
    assert "bindingConditions" not in entries["device-2"]


def test_partitionable_devices_with_binding_conditions_and_taints() -> None:
    tainted = mem_device(
        "device-1",
        "4Gi",
        bindingConditions=["IsPrepare"],
        bindingFailureConditions=["BindingFailed"],
        taints=[{"key": "key1", "value": "value1", "effect": "NoSchedule"}],
    )
    slices = [
        slice_with_devices("slice-1", NODE1, POOL1, tainted, mem_device("device-2", "4Gi"), count=2),
        slice_with_counter_sets("slice-2", NODE1, POOL1, MEM8, count=2),
    ]
    assert allocate(slices, [claim("claim-0", request("req-0", CLASS_A, 2))]) is None
    tolerating = request(
        "req-0", CLASS_A, 2, tolerations=[{"key": "key1", "operator": "Exists", "effect": "NoSchedule"}]
    )
    # "...-and-taints-tolerated"
    (result,) = allocate(slices, [claim("claim-0", tolerating)]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-1"), ("req-0", DRIVER_A, POOL1, "device-2")]


def test_partitionable_devices_devices_on_different_nodes_consume_same_counter_set() -> None:
    """A device of another node's slice holds counters of the same set: upstream counts every
    allocated device of the pool, node1's slices and node2's alike."""
    slices = [
        slice_with_counter_sets("slice-0", NODE1, POOL1, MEM8, count=3),
        slice_with_devices(
            "slice-1", NODE1, POOL1, mem_device("device-1", "6Gi"), mem_device("device-2", "2Gi"), count=3
        ),
        slice_with_devices("slice-2", NODE2, POOL1, mem_device("device-3", "6Gi"), count=3),
    ]
    held = {(DRIVER_A, POOL1, "device-3"): "default/on-node-2"}
    c = claim(
        "claim-0",
        first_available(
            "req-0",
            sub_request("subReq-0", CLASS_A, 1, memory_at_least("6Gi")),
            sub_request("subReq-1", CLASS_A, 1, memory_at_least("2Gi")),
        ),
    )
    (result,) = allocate(slices, [c], allocated=held) or []
    assert picked(result) == [("req-0/subReq-1", DRIVER_A, POOL1, "device-2")]


def test_partitionable_devices_validation_error_on_non_targeting_slice() -> None:
    slices = [
        slice_with_counter_sets("slice-0", NODE1, POOL1, MEM8, count=3),
        slice_with_devices("slice-1", NODE1, POOL1, mem_device("device-1", "4Gi"), count=3),
        slice_with_devices(
            "slice-2",
            NODE2,
            POOL1,
            device("device-2", consumes_counters=[consumes(SET2, {"memory": "4Gi"})]),
            count=3,
        ),
    ]
    # node1 could take device-1, but node2's slice makes the pool invalid as a whole
    with pytest.raises(AllocationError, match=r"^invalid resource pools were encountered$"):
        allocate(slices, [claim("claim-0", request("req-0"))])


@pytest.mark.parametrize(
    ("devices", "sets", "reason"),
    [
        ([mem_device("device-1", "4Gi")], [MEM8, MEM8], "duplicate counter set name counter-set-1"),
        (
            [device("device-1", consumes_counters=[consumes(SET2, {"memory": "4Gi"})])],
            [MEM8],
            "counter set counter-set-2 not found",
        ),
        (
            [device("device-1", consumes_counters=[consumes(SET1, {"cpus": "4"})])],
            [MEM8],
            "counter cpus not found in counter set counter-set-1",
        ),
    ],
    ids=["duplicate-counter-set", "unknown-counter-set", "unknown-counter"],
)
def test_invalid_pools_are_refused_with_upstreams_reason(
    devices: list[dict[str, Any]], sets: list[dict[str, Any]], reason: str
) -> None:
    slices = [
        slice_with_devices("slice-1", NODE1, POOL1, *devices, count=1 + len(sets)),
        *(
            slice_with_counter_sets(f"slice-c{i}", NODE1, POOL1, s, count=1 + len(sets))
            for i, s in enumerate(sets)
        ),
    ]
    allocator = Allocator(slices, {CLASS_A: device_class()})
    (pool,) = allocator.pool_view(node()).pools
    assert pool.invalid_reason == reason
    with pytest.raises(AllocationError, match=r"^invalid resource pools were encountered$"):
        allocator.allocate([claim("claim-0", request("req-0"))], node())
    all_mode = claim("claim-0", request("req-0", mode="All"))
    with pytest.raises(
        AllocationError, match=r"asks for all devices, but resource pool driver-a/pool-1 is invalid"
    ):
        allocator.allocate([all_mode], node())


def test_counter_set_in_another_pool_does_not_count() -> None:
    """A counter set of the same name published by another pool is not this pool's."""
    slices = [
        slice_with_devices("slice-1", NODE1, POOL1, mem_device("device-1", "4Gi")),
        slice_with_counter_sets("slice-2", NODE1, POOL2, MEM8),
    ]
    with pytest.raises(AllocationError, match="invalid resource pools"):
        allocate(slices, [claim("claim-0", request("req-0"))])


def test_counter_slice_for_another_node_still_counts() -> None:
    """The counter slice names another node; the pool's devices on this node still use its sets
    (GatherPools adds counter slices whatever their node selection)."""
    slices = [
        slice_with_counter_sets("counters", NODE2, POOL1, MEM8, count=2),
        slice_with_devices(
            "devices", ALL_NODES, POOL1, mem_device("device-1", "6Gi"), mem_device("device-2", "6Gi"), count=2
        ),
    ]
    results = allocate(slices, [claim("claim-0", request("req-0")), claim("claim-1", request("req-0"))])
    assert results is None  # 6Gi + 6Gi > 8Gi
    (result,) = allocate(slices, [claim("claim-0", request("req-0"))]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-1")]


def test_backtracking_gives_back_the_counters_of_a_dropped_device() -> None:
    """req-0 first takes device-1 (all 8Gi); req-1 wants the special device-3 (4Gi), which does not
    fit; the search drops device-1 — its counters must come back, or device-2 + device-3 (4+4)
    would look over-committed too."""

    def dev(name: str, memory: str, special: bool) -> dict[str, Any]:
        return device(
            name, None, {"special": {"bool": special}}, consumes_counters=[consumes(SET1, {"memory": memory})]
        )

    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            dev("device-1", "8Gi", False),
            dev("device-2", "4Gi", False),
            dev("device-3", "4Gi", True),
            count=2,
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, MEM8, count=2),
    ]
    c = claim(
        "claim-0", request("req-0"), request("req-1", CLASS_A, 1, f'device.attributes["{DRIVER_A}"].special')
    )
    (result,) = allocate(slices, [c]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-2"), ("req-1", DRIVER_A, POOL1, "device-3")]


def test_a_rejected_tainted_device_gives_its_counters_back() -> None:
    """device-1 takes every counter but is tainted: refused after the counter check, it must not
    keep them (kubernetes/kubernetes#140431, in 1.36 by #140663), or device-2 could not follow."""
    tainted = mem_device("device-1", "8Gi", taints=[{"key": "broken", "effect": "NoSchedule"}])
    slices = [
        slice_with_devices("slice-1", NODE1, POOL1, tainted, mem_device("device-2", "8Gi"), count=2),
        slice_with_counter_sets("slice-2", NODE1, POOL1, MEM8, count=2),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0"))]) or []
    assert picked(result) == [("req-0", DRIVER_A, POOL1, "device-2")]


def test_two_claims_of_one_pod_share_the_counters() -> None:
    slices = three_devices()
    results = allocate(
        slices, [claim("a", request("req-0")), claim("b", request("req-0")), claim("c", request("req-0"))]
    )
    assert results is None  # 4 + 4 fit 8Gi; device-2 (6Gi) never does beside one of them
    results = allocate(slices, [claim("a", request("req-0")), claim("b", request("req-0"))]) or []
    assert [picked(r)[0][3] for r in results] == ["device-1", "device-3"]


def test_shared_device_consumes_its_counters_once() -> None:
    """An allowMultipleAllocations device with counters: its shares take the counters once, also
    when a share was allocated before (its consumption is already subtracted)."""
    shared = device(
        "device-1", {"capacity0": "4"}, consumes_counters=[consumes(SET1, {"memory": "8Gi"})], multi=True
    )
    slices = [
        slice_with_devices("slice-1", NODE1, POOL1, shared, count=2),
        slice_with_counter_sets("slice-2", NODE1, POOL1, MEM8, count=2),
    ]
    results = allocate(slices, [claim(f"c{i}", request("req-0", capacity="1")) for i in range(4)]) or []
    assert len(results) == 4 and all(picked(r)[0][3] == "device-1" for r in results)
    share = Share(
        "default/before", "6f1b0e3c-8b1a-4c1e-9a53-2b3f5f9f6b77", {"capacity0": parse_quantity("1")}
    )
    before = AllocatedState(shares={(DRIVER_A, POOL1, "device-1"): [share]})
    results = (
        allocate(slices, [claim(f"c{i}", request("req-0", capacity="1")) for i in range(3)], allocated=before)
        or []
    )
    assert len(results) == 3


def test_the_1_34_layout_counters_count_and_devices_are_never_allocated() -> None:
    """sharedCounters beside devices in one slice (Kubernetes 1.34): the 1.36 allocator files the
    slice as a counter slice, so its devices are never candidates and the view says why."""
    combined = slice_with_counter_sets("combined", NODE1, POOL1, MEM8)
    combined = combined.model_copy(
        update={
            "spec": combined.spec.model_copy(
                update={
                    "devices": slice_with_devices(
                        "x", NODE1, POOL1, mem_device("device-1", "4Gi")
                    ).spec.devices
                }
            )
        }
    )
    allocator = Allocator([combined], {CLASS_A: device_class()})
    assert allocator.allocate([claim("claim-0", request("req-0"))], node()) is None
    view = allocator.pool_view(node())
    (pool,) = view.pools
    assert pool.refs == [] and pool.invalid_reason is None and "memory" in pool.counter_sets[SET1]
    assert "the Kubernetes 1.34 layout" in view.unreachable[(DRIVER_A, POOL1, "device-1")]


@pytest.mark.parametrize(
    ("devices", "count", "expected"),
    [
        ([("device-1", "4Gi", ["IsPrepare"])], 1, {"device-1": ["IsPrepare"]}),
        (
            [("device-1", "4Gi", ["IsPrepare"]), ("device-2", "4Gi", ["IsPrepare2"])],
            2,
            {"device-1": ["IsPrepare"], "device-2": ["IsPrepare2"]},
        ),
        (
            [("device-1", "2Gi", ["IsPrepare"]), ("device-2", "2Gi", None), ("device-3", "4Gi", ["IsReady"])],
            3,
            {"device-1": ["IsPrepare"], "device-2": None, "device-3": ["IsReady"]},
        ),
    ],
    ids=[
        "with-binding-conditions",
        "with-binding-conditions-multiple",
        "with-binding-conditions-some-devices-no-conditions",
    ],
)
def test_partitionable_devices_with_binding_conditions(
    devices: list[tuple[str, str, list[str] | None]], count: int, expected: dict[str, list[str] | None]
) -> None:
    """``partitionable-devices-with-binding-conditions*``: conditions are copied into the results."""
    built = [
        mem_device(
            name,
            memory,
            **({"bindingConditions": c, "bindingFailureConditions": ["BindingFailed"]} if c else {}),
        )
        for name, memory, c in devices
    ]
    slices = [
        slice_with_devices("slice-1", NODE1, POOL1, *built, count=2),
        slice_with_counter_sets("slice-2", NODE1, POOL1, MEM8, count=2),
    ]
    (result,) = allocate(slices, [claim("claim-0", request("req-0", CLASS_A, count))]) or []
    found = {r["device"]: r.get("bindingConditions") for r in result.body["devices"]["results"]}
    assert found == expected
