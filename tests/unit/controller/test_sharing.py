"""GPU partitions and CXL memory pools as the controller publishes them: the devices and counter
sets (names and counters from manager_api.partitions), the slice limits of 1.34 and 1.35+, the
move of a GPU's placements to the node that holds its partitions, and what the scheduler's
allocator (dra_driver.selection) makes of it — against the API test server's own slice rules."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from dra_driver.controller.devices import (
    CounterLayout,
    PublishPolicy,
    WithheldReason,
    memory_request_policy,
)
from dra_driver.controller.slices import (
    DesiredPool,
    SliceInvalid,
    check_pool,
    check_slice,
    desired_node_labels,
    desired_pools,
    plan_pool,
)
from dra_driver.selection import AllocatedState, Allocator, ClaimToAllocate, DeviceClass, Node, ResourceSlice
from dra_driver.selection.model import ResourceClaimSpec
from dra_driver.selection.quantity import parse_quantity
from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.fielderrors import FieldErrors
from kube_standin.apiserver.slice_rules import validate_resource_slice
from manager_api.models import BindingState, Health, Inventory, MemoryPool, PartitionHolder
from manager_api.partitions import BUILTIN_TABLES, counter_set, partition_devices, whole_gpu_consumes
from tests.conftest import REPO_ROOT
from tests.support.controller import make_device, make_inventory, make_pool

DRIVER = "fabric-dra.io"
H100 = BUILTIN_TABLES["h100-80gb"]
BINDING = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=True)
PLAIN = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=False)
COMBINED = PublishPolicy(
    driver=DRIVER, device_taints=True, binding_conditions=True, counters=CounterLayout.COMBINED
)
#: the API test server's rules: 1.36 (counters split) and 1.34 with the gates on (counters beside devices)
GATES = {
    CounterLayout.SPLIT: FeatureGates.of("1.36.0"),
    CounterLayout.COMBINED: FeatureGates.of(
        "1.34.0", {"DRAPartitionableDevices": True, "DRAConsumableCapacity": True, "DRADeviceTaints": True}
    ),
}


def gpus(count: int, **fields: Any) -> list[Any]:
    return [make_device(f"gpu{i}", partition_table=H100, **fields) for i in range(count)]


def written(inventory: Inventory, policy: PublishPolicy, pool: str = "fabric-pcie") -> list[dict[str, Any]]:
    desired = desired_pools(inventory, policy)[pool]
    plan = plan_pool(pool, desired, {}, driver=DRIVER)
    assert plan is not None
    return [w.obj for w in plan.writes]


def api_server_errors(obj: dict[str, Any], layout: CounterLayout) -> list[str]:
    errs = FieldErrors()
    validate_resource_slice(errs, obj, GATES[layout])
    return [f"{c.field}: {c.message}" for c in errs.causes]


def devices_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def counter_sets_of(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for s in slices for c in s["spec"].get("sharedCounters") or []}


# -- what a partitionable GPU becomes -------------------------------------------------------


def test_a_partitionable_gpu_is_its_whole_device_and_every_placement_consuming_its_counter_set() -> None:
    slices = written(make_inventory(gpus(1)), BINDING)
    devices = devices_of(slices)
    placements = partition_devices("gpu0", H100)
    assert set(devices) == {"gpu0", *(p.name for p in placements)}
    assert len(devices) == 19  # 7 + 4 + 3 + 2 + 1 + 1 placements and the whole GPU
    name, counters = counter_set("gpu0", H100)
    (published,) = counter_sets_of(slices).values()
    assert published["name"] == name
    assert {k: v["value"] for k, v in published["counters"].items()} == {
        k: "81152Mi" if k == "memory" else str(v) for k, v in counters.items()
    }
    whole = devices["gpu0"]
    assert whole["consumesCounters"][0]["counterSet"] == "gpu0"
    assert set(whole["consumesCounters"][0]["counters"]) == set(whole_gpu_consumes(H100))
    assert whole["attributes"][f"{DRIVER}/type"] == {"string": "gpu"}
    assert whole["attributes"][f"{DRIVER}/partitionTable"] == {"string": "h100-80gb"}
    one = devices["gpu0-1g10gb-3"]
    attrs = one["attributes"]
    assert attrs[f"{DRIVER}/type"] == {"string": "gpu-partition"}
    assert attrs[f"{DRIVER}/partition"] == {"string": "1g.10gb"}
    assert attrs[f"{DRIVER}/partitionStart"] == {"int": 3}
    assert f"{DRIVER}/uuid" not in attrs
    assert one["capacity"] == {f"{DRIVER}/memory": {"value": "9984Mi"}}
    assert one["consumesCounters"] == [
        {
            "counterSet": "gpu0",
            "counters": {
                "multiprocessors": {"value": "16"},
                "memory": {"value": "9984Mi"},
                "memory-slice-3": {"value": "1"},
            },
        }
    ]
    assert one["bindingConditions"] == [f"{DRIVER}/Attached"] and one["bindsToNode"] is True


def test_a_table_that_does_not_fit_its_gpu_offers_the_gpu_whole_only() -> None:
    inventory = make_inventory(gpus(1, memory_bytes=40 * 2**30))  # an 80 GB table on a 40 GiB GPU
    desired = desired_pools(inventory, BINDING)["fabric-pcie"]
    slices = written(inventory, BINDING)
    assert set(devices_of(slices)) == {"gpu0"}
    assert "consumesCounters" not in devices_of(slices)["gpu0"]
    assert counter_sets_of(slices) == {}
    assert set(desired.withheld.values()) == {WithheldReason.PARTITION} and len(desired.withheld) == 18


def test_a_cluster_without_counters_gets_gpus_whole() -> None:
    off = PublishPolicy(
        driver=DRIVER, device_taints=True, binding_conditions=True, counters=CounterLayout.OFF
    )
    slices = written(make_inventory(gpus(2)), off)
    assert set(devices_of(slices)) == {"gpu0", "gpu1"}
    assert all("consumesCounters" not in d for d in devices_of(slices).values())
    assert counter_sets_of(slices) == {}


def test_an_unhealthy_gpu_taints_its_partitions_and_a_withheld_one_withholds_them() -> None:
    sick = written(make_inventory(gpus(1, health=Health.CRITICAL)), BINDING)
    assert all(d.get("taints") for d in devices_of(sick).values())
    no_taints = PublishPolicy(driver=DRIVER, device_taints=False, binding_conditions=True)
    desired = desired_pools(make_inventory(gpus(1, health=Health.CRITICAL)), no_taints)["fabric-pcie"]
    assert desired.device_count == 0 and desired.chunks[-1] == []
    assert len(desired.withheld) == 19


def test_a_partition_name_taken_by_another_device_of_the_pool_is_withheld() -> None:
    inventory = make_inventory([*gpus(1), make_device("gpu0-7g80gb-0")])
    desired = desired_pools(inventory, BINDING)["fabric-pcie"]
    assert desired.withheld == {"gpu0-7g80gb-0": WithheldReason.PARTITION}
    names = [d["name"] for chunk in desired.chunks for d in chunk]
    assert names.count("gpu0-7g80gb-0") == 1  # the inventory's own device


# -- limits and layouts ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", [CounterLayout.SPLIT, CounterLayout.COMBINED])
@pytest.mark.parametrize("count", [1, 4, 20])
def test_every_slice_passes_the_api_servers_rules_of_its_release(layout: CounterLayout, count: int) -> None:
    policy = BINDING if layout is CounterLayout.SPLIT else COMBINED
    inventory = make_inventory([*gpus(count), *(make_device(f"nic{i}") for i in range(100))])
    slices = written(inventory, policy)
    for obj in slices:
        check_slice(obj, layout)
        assert api_server_errors(obj, layout) == []
    assert len(devices_of(slices)) == 19 * count + 100
    assert len(counter_sets_of(slices)) == count
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}
    assert {s["spec"]["pool"]["generation"] for s in slices} == {1}


def test_split_layout_counter_slices_hold_eight_sets_and_device_slices_64_devices() -> None:
    slices = written(make_inventory(gpus(20)), BINDING)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    device_slices = [s for s in slices if "devices" in s["spec"]]
    assert [len(s["spec"]["sharedCounters"]) for s in counter_slices] == [8, 8, 4]
    assert all("devices" not in s["spec"] for s in counter_slices)
    assert max(len(s["spec"]["devices"]) for s in device_slices) == 64
    assert len(device_slices) == -(-20 * 19 // 64)
    # after the device slices, selecting the pool's nodes
    assert slices[-3:] == counter_slices
    assert all("nodeSelector" in s["spec"] for s in counter_slices)


def test_combined_layout_keeps_each_gpu_with_its_counter_set_within_32_counters() -> None:
    slices = written(make_inventory(gpus(7)), COMBINED)
    for obj in slices:
        sets = {c["name"] for c in obj["spec"].get("sharedCounters") or []}
        consumed = {c["counterSet"] for d in obj["spec"]["devices"] for c in d.get("consumesCounters") or []}
        assert consumed == sets
        assert sum(len(c["counters"]) for c in obj["spec"].get("sharedCounters") or []) <= 32
    assert [len(s["spec"]["sharedCounters"]) for s in slices] == [3, 3, 1]


def test_the_api_servers_rules_refuse_what_the_checks_refuse() -> None:
    """The controller's own check and the API test server agree: counters beside devices on 1.35+,
    a ninth counter set, a 65th device consuming counters."""
    counters = [s for s in written(make_inventory(gpus(9)), BINDING) if "sharedCounters" in s["spec"]]
    mixed = {**counters[0], "spec": {**counters[0]["spec"], "devices": [{"name": "x"}]}}
    ninth = {
        **counters[0],
        "spec": {
            **counters[0]["spec"],
            "sharedCounters": [
                *counters[0]["spec"]["sharedCounters"],
                *counters[1]["spec"]["sharedCounters"],
            ],
        },
    }
    device_slice = written(make_inventory(gpus(9)), BINDING)[0]
    sixty_five = {
        **device_slice,
        "spec": {
            **device_slice["spec"],
            "devices": [
                *device_slice["spec"]["devices"],
                {**device_slice["spec"]["devices"][0], "name": "extra"},
            ],
        },
    }
    for bad in (mixed, ninth, sixty_five):
        assert api_server_errors(bad, CounterLayout.SPLIT)
        with pytest.raises(SliceInvalid):
            check_slice(bad, CounterLayout.SPLIT)


def test_a_pool_missing_a_referenced_counter_set_is_never_planned() -> None:
    desired = desired_pools(make_inventory(gpus(2)), BINDING)["fabric-pcie"]
    broken = DesiredPool(
        name=desired.name,
        chunks=desired.chunks,
        placements=desired.placements,
        labels=desired.labels,
        counter_sets=[[c for c in sets if c["name"] != "gpu1"] for sets in desired.counter_sets],
    )
    with pytest.raises(SliceInvalid, match="gpu1"):
        check_pool(broken)
    with pytest.raises(SliceInvalid):
        plan_pool("fabric-pcie", broken, {}, driver=DRIVER)


def test_an_unchanged_pool_with_partitions_and_shares_plans_no_writes() -> None:
    """Quantities spelt as the API server stores them compare equal: a restart writes nothing."""
    inventory = make_inventory([*gpus(3), make_pool("cxlpool0", 256 * 2**30)])
    for pool in ("fabric-pcie", "fabric-cxl"):
        desired = desired_pools(inventory, BINDING)[pool]
        plan = plan_pool(pool, desired, {}, driver=DRIVER)
        assert plan is not None
        stored = {}
        for i, write in enumerate(plan.writes):
            obj = yaml.safe_load(yaml.safe_dump(write.obj))
            obj["metadata"] |= {"uid": f"u{i}", "resourceVersion": "1"}
            for counter_set_ in obj["spec"].get("sharedCounters") or []:
                for entry in counter_set_["counters"].values():
                    entry["value"] = str(int(_bytes(entry["value"])))  # another spelling, same value
            stored[write.name] = obj
        assert plan_pool(pool, desired_pools(inventory, BINDING)[pool], stored, driver=DRIVER) is None


def _bytes(text: str) -> int:
    return int(parse_quantity(text).value)


# -- one GPU, one node ----------------------------------------------------------------------


def holding(inventory: Inventory, gpu: str, node: str, partition: str) -> Inventory:
    for device in inventory.devices:
        if device.name == gpu:
            device.state, device.node = BindingState.BOUND, node
            device.partitions = [PartitionHolder(partition=partition, claim_uid="c-1", node=node)]
    return inventory


def test_a_gpu_holding_partitions_on_a_node_is_offered_on_that_node_only() -> None:
    inventory = holding(make_inventory(gpus(2)), "gpu1", "node-a", "gpu1-1g10gb-0")
    slices = written(inventory, BINDING)
    local = [s for s in slices if s["spec"].get("nodeName") == "node-a"]
    shared = [s for s in slices if "nodeName" not in s["spec"]]
    gpu1 = {"gpu1", *(p.name for p in partition_devices("gpu1", H100))}
    assert set(devices_of(local)) == gpu1
    assert not gpu1 & set(devices_of(shared))
    assert set(devices_of(shared)) == {"gpu0", *(p.name for p in partition_devices("gpu0", H100))}
    # the counter sets stay in the pool's counter slice, for every node's allocator
    assert set(counter_sets_of(shared)) == {"gpu0", "gpu1"}


def test_the_move_to_a_nodes_existing_slice_keeps_the_generation() -> None:
    """Node-a already has its node-local slice (a warm device there): the GPU's 19 devices move in
    place, the pool stays complete and valid, and no device is in two slices at any instant."""
    warm_nic = make_device("nic0")
    inventory = make_inventory([*gpus(2), warm_nic])
    warm_nic.state, warm_nic.node = BindingState.WARM, "node-a"
    desired = desired_pools(inventory, BINDING)["fabric-pcie"]
    first = plan_pool("fabric-pcie", desired, {}, driver=DRIVER)
    assert first is not None
    stored = {}
    for i, w in enumerate(first.writes):
        stored[w.name] = {**w.obj, "metadata": {**w.obj["metadata"], "uid": f"u{i}", "resourceVersion": "1"}}
    moved = holding(inventory, "gpu1", "node-a", "gpu1-3g40gb-4")
    plan = plan_pool("fabric-pcie", desired_pools(moved, BINDING)["fabric-pcie"], stored, driver=DRIVER)
    assert plan is not None and plan.generation == 1 and plan.deletes == []
    state = dict(stored)
    for batch in (plan.writes, plan.writes_after):
        for write in batch:
            state[write.name] = write.obj
            names = [d["name"] for s in state.values() for d in s["spec"].get("devices") or []]
            assert len(names) == len(set(names))
    local = next(s for s in state.values() if s["spec"].get("nodeName") == "node-a")
    assert {"gpu1", "gpu1-1g10gb-6", "nic0"} <= set(devices_of([local]))


def test_without_binding_conditions_only_gpus_on_a_node_offer_partitions() -> None:
    inventory = holding(make_inventory(gpus(3)), "gpu1", "node-b", "gpu1-1g10gb-0")
    warm = next(d for d in inventory.devices if d.name == "gpu2")
    warm.state, warm.node = BindingState.WARM, "node-a"
    slices = written(inventory, PLAIN)
    by_node = {s["spec"].get("nodeName"): set(devices_of([s])) for s in slices if "devices" in s["spec"]}
    assert by_node[None] == {"gpu0"}  # free: whole only
    assert len(by_node["node-b"]) == 19 and len(by_node["node-a"]) == 19
    assert all(
        d["attributes"].get(f"{DRIVER}/warm")
        for d in devices_of(slices).values()
        if d["name"].startswith("gpu2")
    )
    assert set(counter_sets_of(slices)) == {"gpu0", "gpu1", "gpu2"}


# -- the scheduler's allocator over what is published -----------------------------------------


def classes() -> dict[str, DeviceClass]:
    path = REPO_ROOT / "deploy/base/deviceclasses.yaml"
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return {d["metadata"]["name"]: DeviceClass.model_validate(d) for d in docs}


def allocate_in_turn(
    slices: list[dict[str, Any]], requests: list[dict[str, Any]], node: str, labels: set[str]
) -> list[list[dict[str, Any]] | None]:
    """Each request as a claim of its own, allocated one after another as the scheduler would."""
    models = [ResourceSlice.model_validate(s) for s in slices]
    node_obj = Node.model_validate({"metadata": {"name": node, "labels": dict.fromkeys(labels, "true")}})
    claims: list[dict[str, Any]] = []
    out: list[list[dict[str, Any]] | None] = []
    for i, request in enumerate(requests):
        spec = ResourceClaimSpec.model_validate({"devices": {"requests": [request]}})
        allocated = AllocatedState.from_claims(claims)
        results = Allocator(models, classes(), allocated).allocate(
            [ClaimToAllocate("ns", f"c{i}", spec)], node_obj
        )
        if results is None:
            out.append(None)
            continue
        body = results[0].body
        claims.append({"metadata": {"namespace": "ns", "name": f"c{i}"}, "status": {"allocation": body}})
        out.append(body["devices"]["results"])
    return out


def test_seven_one_slice_partitions_fit_one_gpu_and_then_nothing_else_does() -> None:
    inventory = make_inventory(gpus(1))
    slices = written(inventory, BINDING)
    labels = desired_node_labels(inventory, DRIVER)["node-a"]
    one_g = {
        "name": "p",
        "exactly": {
            "deviceClassName": "fabric-h100-80gb-partition",
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].partition == "1g.10gb"'}}],
        },
    }
    whole = {"name": "g", "exactly": {"deviceClassName": "fabric-gpu"}}
    got = allocate_in_turn(slices, [one_g] * 8 + [whole], "node-a", labels)
    placed = [r[0]["device"] for r in got[:7] if r]
    assert sorted(placed) == sorted(
        p.name for p in partition_devices("gpu0", H100) if p.profile.name == "1g.10gb"
    )
    assert got[7] is None and got[8] is None  # no eighth slice; the whole GPU is in use


def test_a_claim_asking_for_memory_gets_a_partition_with_at_least_that_much() -> None:
    inventory = make_inventory(gpus(1))
    slices = written(inventory, BINDING)
    labels = desired_node_labels(inventory, DRIVER)["node-a"]
    at_least_30g = {
        "name": "p",
        "exactly": {
            "deviceClassName": "fabric-gpu-partition",
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.capacity["{DRIVER}"].memory.compareTo(quantity("30Gi")) >= 0'
                    }
                }
            ],
        },
    }
    (first, second, third) = allocate_in_turn(slices, [at_least_30g] * 3, "node-a", labels)
    assert first and first[0]["device"] == "gpu0-3g40gb-0"
    assert second and second[0]["device"] == "gpu0-3g40gb-4"
    assert third is None  # both halves taken: no 40 GB placement left


# -- memory pools ---------------------------------------------------------------------------


def test_a_memory_pool_is_one_device_allocated_many_times_with_the_domains_grid() -> None:
    pool = make_pool("cxlpool0", 256 * 2**30, min_chunk_bytes=64 << 20, increment_bytes=64 << 20)
    assert pool.memory_pool is not None
    pool.memory_pool = pool.memory_pool.model_copy(update={"outside_bytes": 16 * 2**30})
    inventory = make_inventory([pool])
    (obj,) = written(inventory, BINDING, "fabric-cxl")
    (device,) = obj["spec"]["devices"]
    assert device["allowMultipleAllocations"] is True
    assert device["attributes"][f"{DRIVER}/type"] == {"string": "cxl-memory"}
    assert device["attributes"][f"{DRIVER}/memoryPool"] == {"bool": True}
    assert device["capacity"] == {
        f"{DRIVER}/memory": {
            "value": "240Gi",  # less what is carved outside fabric-dra, never less this driver's shares
            "requestPolicy": {
                "default": "1Gi",
                "validRange": {"min": "64Mi", "max": "240Gi", "step": "64Mi"},
            },
        }
    }
    assert api_server_errors(obj, CounterLayout.SPLIT) == []
    check_slice(obj)


@pytest.mark.parametrize(
    ("size", "low", "step", "want"),
    [
        # max on the grid from min, as validateRequestPolicyRange wants; default ≥ 1 GiB on the grid
        (10 * 2**30 + 5, 3 << 20, 2 << 20, ("1025Mi", "3Mi", "10239Mi", "2Mi")),
        (512 << 20, 64 << 20, 64 << 20, ("512Mi", "64Mi", "512Mi", "64Mi")),
        (4 * 2**30, 2 * 2**30, 2 * 2**30, ("2Gi", "2Gi", "4Gi", "2Gi")),
    ],
)
def test_the_request_policy_is_a_grid_the_api_server_accepts(
    size: int, low: int, step: int, want: tuple[str, str, str, str]
) -> None:
    found = memory_request_policy(MemoryPool(size_bytes=size, min_chunk_bytes=low, increment_bytes=step))
    assert found is not None
    _, policy = found
    assert (policy["default"], *policy["validRange"].values()) == want
    pool = make_pool("p", size, min_chunk_bytes=low, increment_bytes=step)
    (obj,) = written(make_inventory([pool]), BINDING, "fabric-cxl")
    assert api_server_errors(obj, CounterLayout.SPLIT) == []


def test_a_pool_smaller_than_its_smallest_chunk_or_a_cluster_without_shares_withholds_it() -> None:
    tiny = make_pool("tiny", 32 << 20, min_chunk_bytes=64 << 20, increment_bytes=64 << 20)
    ok = make_pool("ok", 2**30)
    desired = desired_pools(make_inventory([tiny, ok]), BINDING)["fabric-cxl"]
    assert desired.withheld == {"tiny": WithheldReason.NO_ROOM}
    no_shares = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=True, shares=False)
    desired = desired_pools(make_inventory([tiny, ok]), no_shares)["fabric-cxl"]
    assert desired.withheld["ok"] is WithheldReason.SHARES_UNSUPPORTED


def test_memory_shares_are_rounded_and_summed_against_the_pool_by_the_allocator() -> None:
    inventory = make_inventory([make_pool("cxlpool0", 10 * 2**30)])
    slices = written(inventory, BINDING, "fabric-cxl")
    labels = desired_node_labels(inventory, DRIVER)["node-a"]

    def share(size: str) -> dict[str, Any]:
        return {
            "name": "m",
            "exactly": {
                "deviceClassName": "fabric-cxl-memory-pool",
                "capacity": {"requests": {f"{DRIVER}/memory": size}},
            },
        }

    got = allocate_in_turn(
        slices, [share("4Gi"), share("3500Mi"), share("3Gi"), share("2Gi")], "node-a", labels
    )
    consumed = [r[0]["consumedCapacity"][f"{DRIVER}/memory"] if r else None for r in got]
    # 3500Mi rounds up to 4Gi on the 1 GiB grid; 3 GiB more would pass 10 GiB; 2 GiB fits
    assert consumed == ["4Gi", "4Gi", None, "2Gi"]
    assert all(r[0]["shareID"] for r in got if r)


def test_on_1_34_the_gpu_moving_to_its_node_takes_its_counter_set_along() -> None:
    inventory = holding(make_inventory(gpus(4)), "gpu2", "node-b", "gpu2-2g20gb-0")
    slices = written(inventory, COMBINED)
    (local,) = [s for s in slices if s["spec"].get("nodeName") == "node-b"]
    assert [c["name"] for c in local["spec"]["sharedCounters"]] == ["gpu2"]
    assert len(local["spec"]["devices"]) == 19
    shared = [s for s in slices if "nodeName" not in s["spec"]]
    assert set(counter_sets_of(shared)) == {"gpu0", "gpu1", "gpu3"}
    for obj in slices:
        assert api_server_errors(obj, CounterLayout.COMBINED) == []
