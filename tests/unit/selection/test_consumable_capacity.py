"""Consumable capacity, ported from Kubernetes: the allocator cases of
``internal/allocatortesting/allocator_testing.go`` (each test named after its upstream case) and
the rounding table of ``internal/incubating/consumable_capacity_test.go``."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest

from dra_driver.selection.allocated import AllocatedState, Share
from dra_driver.selection.allocator import AllocationError, Features
from dra_driver.selection.capacity import calculate_consumed_capacity, violates_policy
from dra_driver.selection.model import CapacityRequestPolicy, ResourceSlice
from dra_driver.selection.quantity import parse_quantity
from tests.unit.selection.upstream import (
    CAP0,
    CAP1,
    CLASS_A,
    DRIVER_A,
    FROM_COUNTERS,
    NODE1,
    POOL1,
    SET1,
    SET2,
    allocate,
    claim,
    consumed,
    consumes,
    counter_set,
    device,
    device_class,
    first_available,
    memory_at_least,
    picked,
    request,
    slice_with_counter_sets,
    slice_with_devices,
    sub_request,
    values,
)

MULTI = [device_class(CLASS_A, DRIVER_A, multi=True)]
DEDICATED = [device_class(CLASS_A, DRIVER_A, multi=False)]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def one_slice(*devices: dict[str, Any]) -> list[ResourceSlice]:
    return [slice_with_devices("slice-1", NODE1, POOL1, *devices)]


def aggregated(**by_device: str) -> AllocatedState:
    """``allocatedCapacityDevices``: earlier shares of capacity0 per device."""
    return AllocatedState(
        shares={
            (DRIVER_A, POOL1, name): [Share("default/earlier", str(uuid.uuid4()), {CAP0: parse_quantity(q)})]
            for name, q in by_device.items()
        }
    )


def test_consumable_capacity_disabled_feature() -> None:
    off = Features(consumable_capacity=False)
    with pytest.raises(
        AllocationError,
        match="claim default/claim-0, request req-0: has capacity requests, but the DRAConsumableCapacity "
        "feature is disabled",
    ):
        allocate(
            one_slice(device("device-1")), [claim("claim-0", request("req-0", capacity="1"))], features=off
        )


def test_consumable_capacity_disabled_feature_with_prioritized_list() -> None:
    off = Features(consumable_capacity=False)
    c = claim(
        "claim-0",
        first_available(
            "req-0", sub_request("subReq-0", capacity="1"), sub_request("subReq-1", capacity="1")
        ),
    )
    with pytest.raises(
        AllocationError, match="claim default/claim-0, subrequest subReq-0: has capacity requests"
    ):
        allocate(one_slice(device("device-1")), [c], features=off)


def test_consumable_capacity_multi_allocatable_device_with_missing_capacity_request() -> None:
    slices = one_slice(device("device-1", {CAP1: "1"}, multi=True))
    assert allocate(slices, [claim("claim-0", request("req-0", capacity="1"))]) is None
    # "...-allocation-mode-all-with-missing-capacity-request"
    all_mode = claim("claim-0", request("req-0", mode="All", capacity="1"))
    assert allocate(slices, [all_mode], classes=MULTI) is None


def test_consumable_capacity_multi_allocatable_device_without_capacity_without_capacity_request() -> None:
    results = allocate(
        one_slice(device("device-1", multi=True)),
        [claim("claim-0", request("req-0")), claim("claim-1", request("req-0"))],
        classes=MULTI,
    )
    assert results is not None
    shares = [r.body["devices"]["results"][0] for r in results]
    assert [s["device"] for s in shares] == ["device-1", "device-1"]
    assert all(UUID.fullmatch(s["shareID"]) for s in shares) and shares[0]["shareID"] != shares[1]["shareID"]
    assert all("consumedCapacity" not in s for s in shares)  # no capacity, nothing consumed


def test_consumable_capacity_multi_allocatable_device_without_policy_without_capacity_request() -> None:
    slices = one_slice(
        device("device-1", {CAP0: "1"}, multi=True), device("device-2", {CAP0: "1"}, multi=True)
    )
    results = allocate(
        slices, [claim("claim-0", request("req-0")), claim("claim-1", request("req-0"))], classes=MULTI
    )
    assert results is not None
    assert [consumed(r) for r in results] == [
        [("req-0", "device-1", values(capacity0="1"))],
        [("req-0", "device-2", values(capacity0="1"))],
    ]


def test_consumable_capacity_multi_allocatable_device_without_policy_without_capacity_request_block() -> None:
    slices = one_slice(device("device-1", {CAP0: "2"}, multi=True))
    both = [claim("claim-0", request("req-0")), claim("claim-1", request("req-0"))]
    assert allocate(slices, both, classes=MULTI) is None  # the first share takes all of it


def test_consumable_capacity_multi_allocatable_device_without_policy_with_capacity_request() -> None:
    slices = one_slice(device("device-1", {CAP0: "2"}, multi=True))
    both = [
        claim("claim-0", request("req-0", capacity="1")),
        claim("claim-1", request("req-0", capacity="1")),
    ]
    results = allocate(slices, both, classes=MULTI) or []
    assert [consumed(r) for r in results] == [[("req-0", "device-1", values(capacity0="1"))]] * 2


def test_consumable_capacity_multi_allocatable_device_with_policy_without_capacity_request() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "4"}, multi=True))
    results = allocate(
        slices, [claim("claim-0", request("req-0")), claim("claim-1", request("req-0"))], classes=MULTI
    )
    assert [consumed(r) for r in results or []] == [[("req-0", "device-1", values(capacity0="2"))]] * 2


def test_consumable_capacity_multi_allocatable_device_with_zero_request_policy() -> None:
    slices = one_slice(device("device-1", valid_values=("0", {CAP0: "1"}, []), multi=True))
    results = allocate(
        slices, [claim("claim-0", request("req-0")), claim("claim-1", request("req-0"))], classes=MULTI
    )
    assert [consumed(r) for r in results or []] == [[("req-0", "device-1", values(capacity0="0"))]] * 2
    # "...-violates-zero-request-policy": 1 is not a valid value, and none is larger
    assert allocate(slices, [claim("claim-0", request("req-0", capacity="1"))], classes=MULTI) is None


def test_consumable_capacity_multi_allocatable_device_with_range_policy_with_capacity_request() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "4"}, multi=True))
    both = [
        claim("claim-0", request("req-0", capacity="1")),
        claim("claim-1", request("req-0", capacity="1")),
    ]
    results = allocate(slices, both, classes=MULTI)
    # rounded up to the range's minimum
    assert [consumed(r) for r in results or []] == [[("req-0", "device-1", values(capacity0="2"))]] * 2


def test_consumable_capacity_multi_allocatable_device_with_range_policy_step() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "4"}, multi=True))
    (result,) = allocate(slices, [claim("claim-0", request("req-0", capacity="3"))], classes=MULTI) or []
    assert consumed(result) == [("req-0", "device-1", values(capacity0="4"))]  # 3 → 2 + 2


def test_consumable_capacity_multi_allocatable_device_with_valid_values_policy() -> None:
    slices = one_slice(device("device-1", valid_values=("1", {CAP0: "4"}, ["2"]), multi=True))
    (result,) = allocate(slices, [claim("claim-0", request("req-0", capacity="2"))], classes=MULTI) or []
    assert consumed(result) == [("req-0", "device-1", values(capacity0="2"))]


def test_consumable_capacity_multi_allocatable_device_with_valid_values_policy_round_up() -> None:
    slices = one_slice(device("device-1", valid_values=("1", {CAP0: "3"}, ["3"]), multi=True))
    (result,) = allocate(slices, [claim("claim-0", request("req-0", capacity="2"))], classes=MULTI) or []
    assert consumed(result) == [("req-0", "device-1", values(capacity0="3"))]


def test_consumable_capacity_multi_allocatable_device_with_exceeded_consumable_capacity_request() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "2"}, multi=True))
    both = [
        claim("claim-0", request("req-0", capacity="1")),
        claim("claim-1", request("req-0", capacity="2")),
    ]
    assert allocate(slices, both, classes=MULTI) is None


def test_consumable_capacity_multi_allocatable_device_with_request_over_max_sharing_policy() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "10"}, multi=True))
    # the policy's max is 4: 6 does not go, though 6 < 10
    assert allocate(slices, [claim("claim-0", request("req-0", capacity="6"))], classes=MULTI) is None


def test_consumable_capacity_multi_allocatable_device_with_allocated_capacity_use_remaining() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "4"}, multi=True))
    (result,) = (
        allocate(
            slices,
            [claim("claim-0", request("req-0", capacity="2"))],
            classes=MULTI,
            allocated=aggregated(**{"device-1": "2"}),
        )
        or []
    )
    assert consumed(result) == [("req-0", "device-1", values(capacity0="2"))]


def test_consumable_capacity_multi_allocatable_device_with_allocated_capacity_next_device() -> None:
    slices = one_slice(
        device("device-1", range_policy={CAP0: "2"}, multi=True),
        device("device-2", range_policy={CAP0: "2"}, multi=True),
    )
    (result,) = (
        allocate(
            slices,
            [claim("claim-0", request("req-0", capacity="2"))],
            classes=MULTI,
            allocated=aggregated(**{"device-1": "2"}),
        )
        or []
    )
    assert consumed(result) == [("req-0", "device-2", values(capacity0="2"))]


def test_consumable_capacity_with_multi_allocatable_device_backtrack() -> None:
    attr = f"{DRIVER_A}/stringAttribute"
    slices = one_slice(
        device(
            "device-2",
            None,
            {"stringAttribute": {"string": "stringAttributeValue1"}},
            range_policy={CAP0: "2"},
            multi=True,
        ),
        device(
            "device-1",
            None,
            {"stringAttribute": {"string": "stringAttributeValue2"}},
            range_policy={CAP0: "4"},
            multi=True,
        ),
    )
    claims = [
        claim(
            "claim-0",
            request("req-0", capacity="2"),
            request("req-1", capacity="2"),
            constraints=[{"matchAttribute": attr}],
        ),
        claim("claim-1", request("req-0", capacity="2")),
    ]
    results = allocate(slices, claims) or []
    assert [consumed(r) for r in results] == [
        [("req-0", "device-1", values(capacity0="2")), ("req-1", "device-1", values(capacity0="2"))],
        [("req-0", "device-2", values(capacity0="2"))],
    ]


def test_consumable_capacity_multi_allocatable_device_with_subrequest() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "2"}, multi=True))
    c = claim(
        "claim-0",
        first_available(
            "req-0",
            sub_request("subReq-0", capacity="4"),
            sub_request("subReq-1", capacity="2"),
            sub_request("subReq-1"),
        ),
    )
    (result,) = allocate(slices, [c], classes=MULTI) or []
    assert consumed(result) == [("req-0/subReq-1", "device-1", values(capacity0="2"))]


def test_consumable_capacity_multi_allocatable_device_with_no_available_consumable_capacity() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "2"}, multi=True))
    c = claim("claim-0", request("req-0", capacity="2"))
    assert allocate(slices, [c], classes=MULTI, allocated=aggregated(**{"device-1": "2"})) is None


@pytest.mark.parametrize(
    "second",
    [device("device-2", multi=True), device("device-2", {CAP0: "1"}, multi=True)],
    ids=["no-capacity", "insufficient-capacity"],
)
def test_consumable_capacity_multi_allocatable_device_allocation_mode_all_filter_out(
    second: dict[str, Any],
) -> None:
    """``...-allocation-mode-all-filter-out-no-capacity`` and ``...-insufficient-capacity``."""
    slices = one_slice(device("device-1", {CAP0: "2"}, multi=True), second)
    (result,) = (
        allocate(slices, [claim("claim-0", request("req-0", mode="All", capacity="2"))], classes=MULTI) or []
    )
    assert consumed(result) == [("req-0", "device-1", values(capacity0="2"))]


def test_consumable_capacity_multi_allocatable_device_allocation_mode_all_allocating_sufficient() -> None:
    slices = one_slice(
        device("device-1", {CAP0: "2"}, multi=True), device("device-2", {CAP0: "1"}, multi=True)
    )
    c = claim("claim-0", request("req-0", capacity="1"), request("req-1", mode="All", capacity="1"))
    (result,) = allocate(slices, [c]) or []
    assert consumed(result) == [
        ("req-0", "device-1", values(capacity0="1")),
        ("req-1", "device-1", values(capacity0="1")),
        ("req-1", "device-2", values(capacity0="1")),
    ]


def test_consumable_capacity_multi_allocatable_device_allocation_mode_all_in_use_sufficient() -> None:
    slices = one_slice(
        device("device-1", {CAP0: "2"}, multi=True), device("device-2", {CAP0: "1"}, multi=True)
    )
    c = claim("claim-0", request("req-0", mode="All", capacity="1"))
    (result,) = allocate(slices, [c], allocated=aggregated(**{"device-1": "1"})) or []
    assert consumed(result) == [
        ("req-0", "device-1", values(capacity0="1")),
        ("req-0", "device-2", values(capacity0="1")),
    ]


def test_consumable_capacity_multi_allocatable_device_allocation_mode_all_allocating_insufficient() -> None:
    slices = one_slice(
        device("device-1", {CAP0: "1"}, multi=True), device("device-2", {CAP0: "1"}, multi=True)
    )
    c = claim("claim-0", request("req-0", capacity="1"), request("req-1", mode="All", capacity="1"))
    assert allocate(slices, [c]) is None


def test_consumable_capacity_multi_allocatable_device_allocation_mode_all_in_use_insufficient() -> None:
    slices = one_slice(
        device("device-1", {CAP0: "1"}, multi=True), device("device-2", {CAP0: "1"}, multi=True)
    )
    c = claim("claim-0", request("req-0", mode="All", capacity="1"))
    (result,) = allocate(slices, [c], allocated=aggregated(**{"device-1": "1"})) or []
    assert consumed(result) == [("req-0", "device-2", values(capacity0="1"))]


def test_consumable_capacity_dedicated_device_with_consumable_capacity_request() -> None:
    slices = one_slice(device("device-1", {CAP0: "1"}))
    (result,) = allocate(slices, [claim("claim-0", request("req-0", capacity="1"))], classes=DEDICATED) or []
    (entry,) = result.body["devices"]["results"]
    assert entry["device"] == "device-1" and "shareID" not in entry and "consumedCapacity" not in entry
    # a dedicated device's capacity is only a filter: more than it has does not fit
    assert allocate(slices, [claim("claim-0", request("req-0", capacity="2"))], classes=DEDICATED) is None


def test_consumable_capacity_dedicated_device_with_multiple_consumable_capacity_request() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "2"}))
    both = [
        claim("claim-0", request("req-0", capacity="1")),
        claim("claim-1", request("req-0", capacity="1")),
    ]
    assert allocate(slices, both, classes=DEDICATED) is None


def test_allow_multiple_allocations_exclude_multi_allocatable_device_by_class_selector() -> None:
    slices = one_slice(device("device-1", {CAP0: "1"}, multi=True))
    assert allocate(slices, [claim("claim-0", request("req-0", capacity="1"))], classes=DEDICATED) is None


def test_allow_multiple_allocations_not_allocate_multi_allocatable_device_which_already_dedicated() -> None:
    slices = one_slice(device("device-1", range_policy={CAP0: "2"}, multi=True))
    held = {(DRIVER_A, POOL1, "device-1"): "default/exclusive"}
    assert (
        allocate(slices, [claim("claim-0", request("req-0", capacity="1"))], classes=MULTI, allocated=held)
        is None
    )


def test_allow_multiple_allocations_not_allocate_dedicated_device_which_change_from_multi_allocatable() -> (
    None
):
    slices = one_slice(device("device-1", range_policy={CAP0: "2"}))
    c = claim("claim-0", request("req-0", capacity="1"))
    assert allocate(slices, [c], classes=MULTI, allocated=aggregated(**{"device-1": "1"})) is None


def test_allow_multiple_allocations_with_partitionable_device() -> None:
    def dev(name: str, memory: str) -> dict[str, Any]:
        return device(name, FROM_COUNTERS, consumes_counters=[consumes(SET1, {"memory": memory})], multi=True)

    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            dev("device-1", "4Gi"),
            dev("device-2", "6Gi"),
            dev("device-3", "4Gi"),
            count=2,
        ),
        slice_with_counter_sets("slice-2", NODE1, POOL1, counter_set(SET1, {"memory": "8Gi"}), count=2),
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
    (result,) = allocate(slices, [c], classes=MULTI) or []
    assert consumed(result) == [
        ("req-0", "device-1", values(memory="4Gi")),
        ("req-1/subReq-1", "device-3", values(memory="4Gi")),
    ]


def test_consumable_capacity_with_partitionable_device_multiple_capacity_pools() -> None:
    def dev(name: str, cap0: str) -> dict[str, Any]:
        return device(
            name,
            FROM_COUNTERS,
            consumes_counters=[consumes(SET1, {CAP0: cap0}), consumes(SET2, {CAP1: "4"})],
            multi=True,
            range_policy={CAP1: "4"},
        )

    slices = [
        slice_with_devices(
            "slice-1", NODE1, POOL1, dev("device-1", "2"), dev("device-2", "4"), dev("device-3", "2"), count=2
        ),
        slice_with_counter_sets(
            "slice-2", NODE1, POOL1, counter_set(SET1, {CAP0: "4"}), counter_set(SET2, {CAP1: "8"}), count=2
        ),
    ]
    at_least = f'device.capacity["{DRIVER_A}"]["{CAP0}"].compareTo(quantity("{{}}")) >= 0'
    c = claim(
        "claim-0",
        request("req-0", capacity="1"),
        request("req-2", capacity="2"),
        first_available(
            "req-1",
            sub_request("subReq-0", CLASS_A, 1, at_least.format("4"), capacity="1"),
            sub_request("subReq-1", CLASS_A, 1, at_least.format("2"), capacity="1"),
        ),
    )
    (result,) = allocate(slices, [c]) or []
    assert consumed(result) == [
        ("req-0", "device-1", values(capacity0="1", capacity1="2")),
        ("req-1/subReq-1", "device-1", values(capacity0="1", capacity1="2")),
        ("req-2", "device-3", values(capacity0="2", capacity1="2")),
    ]


def _distinct_devices() -> list[ResourceSlice]:
    return one_slice(
        *(
            device(
                f"device-{i}",
                None,
                {"driverVersion": {"version": v}, "numa": {"int": n}, "boolAttribute": {"bool": b}},
                multi=True,
            )
            for i, (v, n, b) in enumerate(
                [("1.0.0", 0, True), ("1.0.1", 1, False), ("1.0.2", 2, True), ("1.0.0", 3, True)], start=1
            )
        )
    )


def test_with_distinct_constraints() -> None:
    constraints = [
        {"distinctAttribute": f"{DRIVER_A}/boolAttribute", "requests": ["req-0", "req-1"]},
        {"distinctAttribute": f"{DRIVER_A}/driverVersion", "requests": ["req-0", "req-1", "req-2"]},
        {"distinctAttribute": f"{DRIVER_A}/numa", "requests": ["req-0", "req-1", "req-2", "req-3"]},
    ]
    c = claim("claim-0", *(request(f"req-{i}") for i in range(4)), constraints=constraints)
    (result,) = allocate(_distinct_devices(), [c]) or []
    assert picked(result) == [(f"req-{i}", DRIVER_A, POOL1, f"device-{i + 1}") for i in range(4)]


def test_with_distinct_constraints_attribute_not_set() -> None:
    c = claim(
        "claim-0",
        request("req-0"),
        constraints=[{"distinctAttribute": f"{DRIVER_A}/boolAttribute", "requests": ["req-0"]}],
    )
    assert allocate(one_slice(device("device-1", multi=True)), [c]) is None


def test_with_distinct_constraints_unknown_type_attribute() -> None:
    c = claim(
        "claim-0",
        request("req-0"),
        constraints=[{"distinctAttribute": f"{DRIVER_A}/boolAttribute", "requests": ["req-0"]}],
    )
    slices = one_slice(device("device-1", None, {"boolAttribute": {}}, multi=True))
    with pytest.raises(AllocationError, match="unsupported attribute value"):
        allocate(slices, [c])


def test_with_distinct_constraints_with_subrequests() -> None:
    special = f'device.attributes["{DRIVER_A}"].boolAttribute'
    slices = one_slice(
        device("device-1", None, {"boolAttribute": {"bool": True}}, multi=True),
        device("device-2", None, {"boolAttribute": {"bool": False}}, multi=True),
    )
    c = claim(
        "claim-0",
        *(
            first_available(f"req-{i}", sub_request("subReq-0", CLASS_A, 1, special), sub_request("subReq-1"))
            for i in range(3)
        ),
        constraints=[{"distinctAttribute": f"{DRIVER_A}/boolAttribute", "requests": ["req-0", "req-1"]}],
    )
    (result,) = allocate(slices, [c]) or []
    assert picked(result) == [
        ("req-0/subReq-0", DRIVER_A, POOL1, "device-1"),
        ("req-1/subReq-1", DRIVER_A, POOL1, "device-2"),
        ("req-2/subReq-0", DRIVER_A, POOL1, "device-1"),
    ]


def test_distinct_constraint_one_multi_allocatable_device_with_distinct_constraint() -> None:
    slices = one_slice(
        device("device-1", None, {"stringAttribute": {"string": "v"}}, range_policy={CAP0: "2"}, multi=True)
    )
    c = claim(
        "claim-0",
        request("req-0", capacity="1"),
        request("req-1", capacity="1"),
        constraints=[{"distinctAttribute": f"{DRIVER_A}/stringAttribute"}],
    )
    assert allocate(slices, [c], classes=MULTI) is None


def test_distinct_constraint_two_multi_allocatable_devices_with_distinct_constraint() -> None:
    slices = [
        slice_with_devices(
            "slice-1",
            NODE1,
            POOL1,
            device(
                f"device-{i}",
                None,
                {"stringAttribute": {"string": f"v{i}"}},
                range_policy={CAP0: "4"},
                multi=True,
            ),
            count=2,
        )
        for i in (1, 2)
    ]
    c = claim(
        "claim-0",
        request("req-0", capacity="2"),
        request("req-1", capacity="2"),
        constraints=[{"distinctAttribute": f"{DRIVER_A}/stringAttribute"}],
    )
    (result,) = allocate(slices, [c], classes=MULTI) or []
    assert consumed(result) == [
        ("req-0", "device-1", values(capacity0="2")),
        ("req-1", "device-2", values(capacity0="2")),
    ]


def test_one_request_never_takes_a_shared_device_twice() -> None:
    """count: 2 on one shared device: upstream moves past each pick (startLocation), so a request
    gets two different devices or none."""
    slices = one_slice(device("device-1", {CAP0: "4"}, multi=True))
    assert (
        allocate(slices, [claim("claim-0", request("req-0", CLASS_A, 2, capacity="1"))], classes=MULTI)
        is None
    )


def test_backtracking_gives_back_a_shares_capacity() -> None:
    """req-0 takes 3 of device-1's 4, req-1's selector wants device-1 with 2: the search moves req-0
    to device-2, and device-1's capacity must be whole again for req-1."""
    big = 'device.attributes["driver-a"].big'
    slices = one_slice(
        device("device-1", {CAP0: "4"}, {"big": {"bool": True}}, multi=True),
        device("device-2", {CAP0: "4"}, {"big": {"bool": False}}, multi=True),
    )
    c = claim("claim-0", request("req-0", capacity="3"), request("req-1", CLASS_A, 1, big, capacity="2"))
    (result,) = allocate(slices, [c]) or []
    assert consumed(result) == [
        ("req-0", "device-2", values(capacity0="3")),
        ("req-1", "device-1", values(capacity0="2")),
    ]


# consumable_capacity_test.go: calculateConsumedCapacity and violatesPolicy


def _policy(**fields: object) -> CapacityRequestPolicy:
    return CapacityRequestPolicy.model_validate(fields)


@pytest.mark.parametrize(
    ("policy", "requested", "expected"),
    [
        (None, None, "10"),
        (_policy(default="3", validRange={"min": "1"}), None, "3"),
        (_policy(default="3", validValues=["3", "5"]), None, "3"),
        (_policy(default="1", validRange={"min": "1"}), "2", "2"),
        (_policy(default="2", validRange={"min": "2"}), "1", "2"),
        (_policy(default="1", validRange={"min": "1", "step": "2"}), "2", "3"),
        (_policy(default="1", validRange={"min": "1", "step": "1"}), "2", "2"),
        (_policy(default="1", validValues=["1", "2", "3"]), "2", "2"),
        (_policy(default="1", validValues=["1", "3"]), "2", "3"),
        (_policy(default="1", validValues=["1", "2"]), "3", "3"),
    ],
    ids=[
        "no-policy-no-request",
        "range-no-request",
        "valid-values-no-request",
        "min-1-request-2",
        "min-2-request-1",
        "min-1-step-2-request-2",
        "min-1-step-1-request-2",
        "valid-values-1-2-3-request-2",
        "valid-values-1-3-request-2",
        "valid-values-1-2-request-3",
    ],
)
def test_calculate_consumed_capacity(
    policy: CapacityRequestPolicy | None, requested: str | None, expected: str
) -> None:
    amount = calculate_consumed_capacity(
        parse_quantity(requested) if requested else None, parse_quantity("10"), policy
    )
    assert amount == parse_quantity(expected)


@pytest.mark.parametrize(
    ("policy", "amount", "violates"),
    [
        (None, "100", False),
        (_policy(validRange={"min": "1", "max": "2"}), "1", False),
        (_policy(validRange={"min": "0", "max": "1"}), "2", True),
        (_policy(validValues=["1", "2"]), "2", False),
        (_policy(validValues=["1", "2"]), "3", True),
        (_policy(default="1", validRange={"min": "1", "step": "2"}), "2", True),
    ],
    ids=["no-policy", "within-range", "above-max", "valid-value", "not-a-valid-value", "off-the-step-grid"],
)
def test_violates_policy(policy: CapacityRequestPolicy | None, amount: str, violates: bool) -> None:
    assert violates_policy(parse_quantity(amount), policy) is violates
