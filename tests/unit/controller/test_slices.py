from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.controller.devices import (
    ATTRIBUTE_NAMES,
    CAPACITY_NAMES,
    WARM_ATTRIBUTE,
    PublishPolicy,
    WithheldReason,
)
from dra_driver.controller.slices import (
    DesiredPool,
    NormalCache,
    SliceInvalid,
    check_slice,
    chunk_devices,
    desired_node_labels,
    desired_pools,
    plan_pool,
)
from dra_driver.selection import (
    Allocator,
    ClaimToAllocate,
    DeviceClass,
    Node,
    ResourceClaimSpec,
    ResourceSlice,
)
from dra_driver.selection.pools import gather_pools
from dra_driver.selection.quantity import format_bytes
from manager_api.models import BindingState, Health, ReachGroup
from tests.support.controller import make_device, make_inventory

DRIVER = "fabric-dra.io"
POLICY = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=False)


def gpus(n: int, *, pool: str = "fabric-pcie", unhealthy: set[int] | None = None) -> list[Any]:
    return [
        make_device(
            f"gpu-{i:05d}",
            pool=pool,
            switch=f"Switch{i % 4}",
            health=Health.CRITICAL if i in (unhealthy or set()) else Health.OK,
        )
        for i in range(n)
    ]


def store(plan_writes: list[Any], rv_start: int = 1) -> dict[str, dict[str, Any]]:
    """What the API server would hold after the writes: objects with a resourceVersion."""
    stored = {}
    for i, write in enumerate(plan_writes):
        obj = copy.deepcopy(write.obj)
        obj["metadata"]["resourceVersion"] = str(rv_start + i)
        obj["metadata"]["uid"] = f"uid-{write.name}"
        stored[write.name] = obj
    return stored


def pool_of(pools: dict[str, DesiredPool], name: str = "fabric-pcie") -> DesiredPool:
    return pools[name]


def test_chunks_hold_at_most_128_and_64_where_tainted() -> None:
    plain = [{"name": f"d{i}"} for i in range(300)]
    assert [len(c) for c in chunk_devices(plain)] == [128, 128, 44]
    tainted = [{"name": f"d{i}", "taints": [{"key": "k", "effect": "NoSchedule"}]} for i in range(130)]
    assert [len(c) for c in chunk_devices(tainted)] == [64, 64, 2]
    mixed: list[dict[str, Any]] = [{"name": f"d{i}"} for i in range(100)]
    mixed[90] = {"name": "d90", "taints": [{"key": "k", "effect": "NoSchedule"}]}
    chunks = chunk_devices(mixed)
    for chunk in chunks:
        limit = 64 if any(d.get("taints") for d in chunk) else 128
        assert len(chunk) <= limit
    assert sum(len(c) for c in chunks) == 100
    assert chunk_devices([]) == [[]]
    # where any device may be tainted tomorrow, every slice is cut at 64: a taint moves nothing
    assert [len(c) for c in chunk_devices(plain, taintable=True)] == [64, 64, 64, 64, 44]


def test_a_pool_publishes_in_consistent_slices() -> None:
    pools = desired_pools(make_inventory(gpus(300)), POLICY)
    plan = plan_pool("fabric-pcie", pool_of(pools), {}, driver=DRIVER)
    assert plan is not None and not plan.deletes
    # taints published: 64 a slice, so that a device turning unhealthy changes its slice alone
    assert [w.name for w in plan.writes] == [f"fabric-dra.io-fabric-pcie-{i}" for i in range(5)]
    assert all(w.resource_version is None for w in plan.writes)
    specs = [w.obj["spec"] for w in plan.writes]
    assert {s["pool"]["generation"] for s in specs} == {1}
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {5}
    untainted = PublishPolicy(driver=DRIVER, device_taints=False, binding_conditions=False)
    assert len(pool_of(desired_pools(make_inventory(gpus(300)), untainted)).chunks) == 3
    names = [d["name"] for s in specs for d in s["devices"]]
    assert names == sorted(names) and len(set(names)) == 300
    selector = specs[0]["nodeSelector"]["nodeSelectorTerms"]
    assert selector == [
        {
            "matchExpressions": [
                {
                    "key": "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie",
                    "operator": "In",
                    "values": ["true"],
                }
            ]
        }
    ]
    for write in plan.writes:
        check_slice(write.obj)


def test_an_unchanged_pool_plans_no_writes() -> None:
    inventory = make_inventory(gpus(200, unhealthy={5}))
    first = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert first is not None
    stored = store(first.writes)
    assert plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), stored, driver=DRIVER) is None


def test_comparison_is_semantic_like_the_api_server() -> None:
    inventory = make_inventory([*gpus(3, unhealthy={1}), make_device("nvme-0", memory_bytes=10**9)])
    first = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert first is not None
    stored = store(first.writes)
    # What a real API server does to what it stores: canonical quantities, timeAdded filled in,
    # nulls dropped, plus metadata of its own.
    obj = stored["fabric-dra.io-fabric-pcie-0"]
    for device in obj["spec"]["devices"]:
        cap = device.get("capacity", {}).get(f"{DRIVER}/memory")
        if cap and cap["value"] == "1000000000":
            cap["value"] = "1G"
        for taint in device.get("taints", []):
            taint["timeAdded"] = "2026-01-01T00:00:00Z"
    obj["spec"]["allNodes"] = None
    obj["metadata"]["generation"] = 1
    obj["metadata"]["labels"]["extra"] = "kept"
    assert plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), stored, driver=DRIVER) is None


def test_a_device_change_rewrites_its_slice_alone_and_a_new_layout_every_slice() -> None:
    devices = gpus(300)
    first = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(devices), POLICY)), {}, driver=DRIVER
    )
    assert first is not None
    stored = store(first.writes)
    # One device of the last slice turns critical: that slice is written, in place.
    devices[299] = make_device("gpu-00299", switch="Switch3", health=Health.CRITICAL)
    plan = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(devices), POLICY)), stored, driver=DRIVER
    )
    assert plan is not None and plan.generation == 1 and not plan.writes_after
    assert [w.name for w in plan.writes] == ["fabric-dra.io-fabric-pcie-4"]
    # Updates are compare-and-swap on what was stored.
    assert [w.resource_version for w in plan.writes] == ["5"]
    assert plan.writes[0].obj["metadata"]["resourceVersion"] == "5"
    assert plan.writes[0].obj["spec"]["devices"][-1]["taints"][0]["value"] == "Critical"
    # 30 more devices need a sixth slice: a new layout is a new generation on every slice.
    grown = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(gpus(330)), POLICY)), stored, driver=DRIVER
    )
    assert grown is not None and grown.generation == 2 and len(grown.writes) == 6
    assert {w.obj["spec"]["pool"]["generation"] for w in grown.writes} == {2}
    assert [w.resource_version for w in grown.writes] == ["1", "2", "3", "4", "5", None]


def test_a_shrinking_pool_deletes_its_extra_slices_after_writing() -> None:
    first = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(gpus(300)), POLICY)), {}, driver=DRIVER
    )
    assert first is not None
    stored = store(first.writes)
    plan = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(gpus(100)), POLICY)), stored, driver=DRIVER
    )
    assert plan is not None
    assert [w.name for w in plan.writes] == ["fabric-dra.io-fabric-pcie-0", "fabric-dra.io-fabric-pcie-1"]
    assert plan.writes[0].obj["spec"]["pool"]["resourceSliceCount"] == 2
    assert [name for name, _ in plan.deletes] == [f"fabric-dra.io-fabric-pcie-{i}" for i in (2, 3, 4)]


def test_a_vanished_pool_is_deleted_whole() -> None:
    first = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(gpus(130)), POLICY)), {}, driver=DRIVER
    )
    assert first is not None
    plan = plan_pool("fabric-pcie", None, store(first.writes), driver=DRIVER)
    assert plan is not None and not plan.writes
    assert len(plan.deletes) == 3


def test_a_half_written_generation_is_completed_with_a_new_one() -> None:
    inventory = make_inventory(gpus(300))
    first = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert first is not None
    stored = store(first.writes)
    stored["fabric-dra.io-fabric-pcie-1"]["spec"]["pool"]["generation"] = 7  # a crash between writes
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), stored, driver=DRIVER)
    assert plan is not None and plan.generation == 8 and len(plan.writes) == 5


def test_taint_time_is_kept_across_rewrites() -> None:
    devices = gpus(3, unhealthy={0})
    first = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(devices), POLICY)), {}, driver=DRIVER
    )
    assert first is not None
    stored = store(first.writes)
    stored["fabric-dra.io-fabric-pcie-0"]["spec"]["devices"][0]["taints"][0]["timeAdded"] = (
        "2026-01-01T00:00:00Z"
    )
    devices.append(make_device("gpu-00003"))
    plan = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(devices), POLICY)), stored, driver=DRIVER
    )
    assert plan is not None
    # the slice gains gpu-00003 in place: its final write keeps gpu-00000's taint time
    final = [*plan.writes, *plan.writes_after][-1]
    taint = final.obj["spec"]["devices"][0]["taints"][0]
    assert taint["timeAdded"] == "2026-01-01T00:00:00Z"


def test_withheld_devices_are_reported_per_pool() -> None:
    policy = PublishPolicy(driver=DRIVER, device_taints=False, binding_conditions=False)
    devices = [*gpus(3, unhealthy={2}), make_device("unmanaged", managed=False)]
    pool = pool_of(desired_pools(make_inventory(devices), policy))
    assert pool.device_count == 2
    assert pool.withheld == {"gpu-00002": WithheldReason.UNHEALTHY, "unmanaged": WithheldReason.UNMANAGED}


def test_every_pool_of_the_inventory_gets_slices_even_when_empty() -> None:
    inventory = make_inventory(gpus(2), pools={"fabric-pcie": ["node-a"], "fabric-cxl": ["node-b"]})
    pools = desired_pools(inventory, POLICY)
    assert set(pools) == {"fabric-pcie", "fabric-cxl"}
    assert pools["fabric-cxl"].chunks == [[]]
    plan = plan_pool("fabric-cxl", pools["fabric-cxl"], {}, driver=DRIVER)
    assert plan is not None and "devices" not in plan.writes[0].obj["spec"]
    check_slice(plan.writes[0].obj)


def test_a_name_taken_by_another_pool_is_freed_first() -> None:
    pools = desired_pools(make_inventory(gpus(1)), POLICY)
    squatter: dict[str, Any] = {
        "metadata": {"name": "fabric-dra.io-fabric-pcie-0", "resourceVersion": "9"},
        "spec": {"pool": {"name": "other", "generation": 1, "resourceSliceCount": 1}},
    }
    plan = plan_pool(
        "fabric-pcie",
        pools["fabric-pcie"],
        {},
        driver=DRIVER,
        all_slices={squatter["metadata"]["name"]: squatter},
    )
    assert plan is not None and plan.deletes_first == [("fabric-dra.io-fabric-pcie-0", "9")]


def _valid_slice() -> dict[str, Any]:
    plan = plan_pool(
        "fabric-pcie", pool_of(desired_pools(make_inventory(gpus(2)), POLICY)), {}, driver=DRIVER
    )
    assert plan is not None
    return copy.deepcopy(plan.writes[0].obj)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda s: s["metadata"].update(name="Bad_Name"), "metadata.name"),
        (lambda s: s["spec"].update(driver="x" * 64), "spec.driver"),
        (lambda s: s["spec"]["pool"].update(resourceSliceCount=0), "spec.pool.resourceSliceCount"),
        (lambda s: s["spec"].update(allNodes=True), "exactly one of nodeName"),
        (lambda s: s["spec"]["devices"][0].update(name="GPU"), "spec.devices[0].name"),
        (lambda s: s["spec"]["devices"][1].update(name=s["spec"]["devices"][0]["name"]), "duplicate"),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update({"fabric-dra.io/bad-name": {"int": 1}}),
            "C identifier",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update({"fabric-dra.io/x": {"string": "v" * 65}}),
            "64 bytes",
        ),
        (
            lambda s: s["spec"]["devices"][0]["attributes"].update(
                {"fabric-dra.io/x": {"int": 1, "bool": True}}
            ),
            "exactly one",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(capacity={"fabric-dra.io/memory": {"value": "lots"}}),
            "capacity",
        ),
        (
            lambda s: s["spec"]["devices"][0].update(taints=[{"key": "k", "effect": "PreferNoSchedule"}]),
            "effect",
        ),
        (lambda s: s["spec"]["devices"][0].update(bindingConditions=["a/B"]), "bindsToNode"),
        (
            lambda s: s["spec"].update(
                devices=[{**s["spec"]["devices"][0], "name": f"d{i}"} for i in range(129)]
            ),
            "at most 128",
        ),
        (
            lambda s: s["spec"].update(
                devices=[
                    {
                        **s["spec"]["devices"][0],
                        "name": f"d{i}",
                        "taints": [{"key": "k", "effect": "NoSchedule"}],
                    }
                    for i in range(65)
                ]
            ),
            "at most 64",
        ),
    ],
)
def test_check_slice_names_the_field_the_api_server_would_reject(mutate: Any, field: str) -> None:
    obj = _valid_slice()
    check_slice(obj)
    mutate(obj)
    with pytest.raises(SliceInvalid, match=field.replace("[", r"\[").replace("]", r"\]")):
        check_slice(obj)


def test_memory_capacity_is_canonical() -> None:
    pool = pool_of(desired_pools(make_inventory(gpus(1)), POLICY))
    assert pool.chunks[0][0]["capacity"][f"{DRIVER}/memory"]["value"] == format_bytes(80 * 2**30)


def test_normal_cache_reuses_unchanged_slices_and_notices_new_versions() -> None:
    inventory = make_inventory(gpus(3))
    first = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert first is not None
    stored = store(first.writes)
    cache = NormalCache()
    obj = stored["fabric-dra.io-fabric-pcie-0"]
    assert cache(obj) is cache(copy.deepcopy(obj))  # same uid + resourceVersion: computed once
    assert (
        plan_pool(
            "fabric-pcie", pool_of(desired_pools(inventory, POLICY)), stored, driver=DRIVER, normal_of=cache
        )
        is None
    )
    # Someone else changes the slice: a new resourceVersion is normalised afresh and differs.
    edited = copy.deepcopy(obj)
    edited["spec"]["devices"] = edited["spec"]["devices"][:1]
    edited["metadata"]["resourceVersion"] = "99"
    assert cache(edited) != cache(obj)
    plan = plan_pool(
        "fabric-pcie",
        pool_of(desired_pools(inventory, POLICY)),
        {"fabric-dra.io-fabric-pcie-0": edited},
        driver=DRIVER,
        normal_of=cache,
    )
    # in place: the pool keeps its slices and the edited one is written back whole
    assert (
        plan is not None
        and plan.generation == 1
        and [w.name for w in plan.writes_after] == ["fabric-dra.io-fabric-pcie-0"]
    )


def _partially_cabled(everywhere: int, behind: int) -> Any:
    """Pool fabric-pcie over nodes a-d; ``behind`` GPUs reached by a and b only (reach group r1)."""
    devices = [*gpus(everywhere)] + [
        make_device(f"gpu-b{i:04d}", switch="Switch9", reach="r1") for i in range(behind)
    ]
    inventory = make_inventory(devices, pools={"fabric-pcie": ["a", "b", "c", "d"]})
    inventory.pools[0].reach_groups = [ReachGroup(id="r1", nodes=["a", "b"])]
    return inventory


def _selected_key(spec: dict[str, Any]) -> str:
    (term,) = spec["nodeSelector"]["nodeSelectorTerms"]
    (requirement,) = term["matchExpressions"]
    return str(requirement["key"])


def test_devices_reached_by_some_nodes_get_slices_that_select_exactly_those_nodes() -> None:
    inventory = _partially_cabled(3, 200)
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert plan is not None
    specs = [w.obj["spec"] for w in plan.writes]
    # 3 devices every node reaches, then the group's 200 in slices of at most 64 (taints published)
    assert [len(s["devices"]) for s in specs] == [3, 64, 64, 64, 8]
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {5}
    everywhere, group = (
        "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie",
        "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie.r1",
    )
    assert [_selected_key(s) for s in specs] == [everywhere, group, group, group, group]
    assert all(d["name"].startswith("gpu-b") for s in specs[1:] for d in s["devices"])
    for write in plan.writes:
        check_slice(write.obj)
    labels = desired_node_labels(inventory, DRIVER)
    assert labels == {
        "a": {everywhere, group},
        "b": {everywhere, group},
        "c": {everywhere},
        "d": {everywhere},
    }


def test_a_pool_whose_devices_all_sit_behind_a_partial_switch_has_no_empty_slice() -> None:
    plan = plan_pool(
        "fabric-pcie", pool_of(desired_pools(_partially_cabled(0, 5), POLICY)), {}, driver=DRIVER
    )
    assert plan is not None
    assert [(len(w.obj["spec"]["devices"]), _selected_key(w.obj["spec"])) for w in plan.writes] == [
        (5, "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie.r1")
    ]


def test_a_device_changing_reach_group_is_a_new_generation() -> None:
    first = plan_pool(
        "fabric-pcie", pool_of(desired_pools(_partially_cabled(3, 2), POLICY)), {}, driver=DRIVER
    )
    assert first is not None
    stored = store(first.writes)
    recabled = _partially_cabled(3, 2)
    for device in recabled.devices:
        device.reach = None  # the switch is cabled to every host now
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(recabled, POLICY)), stored, driver=DRIVER)
    assert plan is not None and plan.generation == 2
    assert [_selected_key(w.obj["spec"]) for w in plan.writes] == [
        "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie"
    ]
    assert [name for name, _ in plan.deletes] == ["fabric-dra.io-fabric-pcie-1"]


# -- warm devices: node-local slices ----------------------------------------------------------


def _warm(inventory: Any, **warm_on: str) -> Any:
    """``inventory`` with each named device warm on its node (device name → node)."""
    for device in inventory.devices:
        if device.name.replace("-", "_") in warm_on:
            device.state, device.node = BindingState.WARM, warm_on[device.name.replace("-", "_")]
    return inventory


def _placement(spec: dict[str, Any]) -> str:
    return f"node {spec['nodeName']}" if "nodeName" in spec else _selected_key(spec)


def _assert_one_slice_per_device(writes: list[Any]) -> None:
    names = [d["name"] for w in writes for d in w.obj["spec"].get("devices", [])]
    assert len(names) == len(set(names)), "a device in two slices makes the pool invalid"


def test_a_warm_device_is_published_node_local_first_with_the_warm_attribute() -> None:
    inventory = _warm(_partially_cabled(3, 2), gpu_00001="c", gpu_b0001="b")
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert plan is not None
    specs = [w.obj["spec"] for w in plan.writes]
    assert [(_placement(s), [d["name"] for d in s["devices"]]) for s in specs] == [
        ("node b", ["gpu-b0001"]),
        ("node c", ["gpu-00001"]),
        ("pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie", ["gpu-00000", "gpu-00002"]),
        ("pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie.r1", ["gpu-b0000"]),
    ]
    assert {s["pool"]["resourceSliceCount"] for s in specs} == {4}
    assert {s["pool"]["generation"] for s in specs} == {1}
    warm = {d["name"] for s in specs for d in s["devices"] if d["attributes"].get(f"{DRIVER}/warm")}
    assert warm == {"gpu-b0001", "gpu-00001"}
    assert specs[0]["devices"][0]["attributes"][f"{DRIVER}/warm"] == {"bool": True}
    assert WARM_ATTRIBUTE == "warm" and WARM_ATTRIBUTE not in ATTRIBUTE_NAMES + CAPACITY_NAMES
    _assert_one_slice_per_device(plan.writes)
    for write in plan.writes:
        check_slice(write.obj)


def test_a_device_warm_on_a_node_that_cannot_reach_it_stays_in_its_group() -> None:
    # r1 is reached by a and b only: an inventory saying it is warm on c is not believed
    inventory = _warm(_partially_cabled(0, 2), gpu_b0000="c")
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert plan is not None
    assert [_placement(w.obj["spec"]) for w in plan.writes] == [
        "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie.r1"
    ]
    assert all(f"{DRIVER}/warm" not in d["attributes"] for d in plan.writes[0].obj["spec"]["devices"])


def test_only_the_warm_node_sees_its_warm_device_and_sees_it_first() -> None:
    """Through the allocator's own pool gathering (GatherPools): complete, valid, warm first."""
    inventory = _warm(_partially_cabled(3, 0), gpu_00002="c")
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert plan is not None
    slices = [ResourceSlice.model_validate(obj) for obj in store(plan.writes).values()]
    labels = desired_node_labels(inventory, DRIVER)
    for node in "abcd":
        raw = {"metadata": {"name": node, "labels": dict.fromkeys(labels[node], "true")}}
        (pool,) = gather_pools(slices, Node.model_validate(raw)).pools
        assert not pool.incomplete and pool.invalid_reason is None
        seen = [ref.device.name for ref in pool.refs]
        assert seen == (
            ["gpu-00002", "gpu-00000", "gpu-00001"] if node == "c" else ["gpu-00000", "gpu-00001"]
        )


def _stored_with_gpu_00002_warm_on_c() -> dict[str, dict[str, Any]]:
    inventory = _warm(_partially_cabled(3, 0), gpu_00002="c")
    first = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert first is not None
    return store(first.writes)


def _apply(stored: dict[str, dict[str, Any]], writes: list[Any], rv: int) -> dict[str, dict[str, Any]]:
    """``stored`` after ``writes`` (replacements in place), each a new resourceVersion."""
    out = dict(stored)
    for offset, write in enumerate(writes):
        out.update(store([write], rv + offset))
    return out


def _views(stored: dict[str, dict[str, Any]], inventory: Any) -> dict[str, list[str]]:
    """Node → the devices it can allocate from, as the allocator's GatherPools sees the pool;
    every node's view must be complete and valid."""
    slices = [ResourceSlice.model_validate(obj) for obj in stored.values()]
    labels = desired_node_labels(inventory, DRIVER)
    views = {}
    for node in "abcd":
        raw = {"metadata": {"name": node, "labels": dict.fromkeys(labels[node], "true")}}
        (pool,) = gather_pools(slices, Node.model_validate(raw)).pools
        assert not pool.incomplete, f"node {node}: the pool is incomplete"
        assert pool.invalid_reason is None, f"node {node}: {pool.invalid_reason}"
        views[node] = [ref.device.name for ref in pool.refs]
    return views


def test_a_warm_device_claimed_or_cooled_moves_back_to_its_group_slice() -> None:
    stored = _stored_with_gpu_00002_warm_on_c()
    claimed = _partially_cabled(3, 0)
    claimed.devices[2].state, claimed.devices[2].node = BindingState.BOUND, "c"
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(claimed, POLICY)), stored, driver=DRIVER)
    assert plan is not None
    # In place under the pool's generation: node c's slice stays (empty) and keeps its nodeName,
    # so nothing is deleted or recreated and the slice count stays 2.
    assert plan.generation == 1 and plan.deletes == plan.deletes_first == []
    (emptied,) = plan.writes
    (gained,) = plan.writes_after
    assert (emptied.name, emptied.resource_version) == ("fabric-dra.io-fabric-pcie-0", "1")
    assert emptied.obj["spec"]["nodeName"] == "c" and "devices" not in emptied.obj["spec"]
    assert gained.name == "fabric-dra.io-fabric-pcie-1"
    assert [d["name"] for d in gained.obj["spec"]["devices"]] == ["gpu-00000", "gpu-00001", "gpu-00002"]
    assert f"{DRIVER}/warm" not in gained.obj["spec"]["devices"][2]["attributes"]
    assert {w.obj["spec"]["pool"]["resourceSliceCount"] for w in (emptied, gained)} == {2}
    final = _apply(_apply(stored, plan.writes, 10), plan.writes_after, 20)
    assert plan_pool("fabric-pcie", pool_of(desired_pools(claimed, POLICY)), final, driver=DRIVER) is None


def test_a_warm_device_moving_to_another_node_recreates_the_node_local_slice() -> None:
    stored = _stored_with_gpu_00002_warm_on_c()
    moved = _warm(_partially_cabled(3, 0), gpu_00002="d")
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(moved, POLICY)), stored, driver=DRIVER)
    # d has no node-local slice yet: the pool's slices change, so a new generation everywhere —
    # c keeps its (now empty) slice, d's comes next, the shared one moves to index 2.
    assert plan is not None and plan.generation == 2 and plan.writes_after == []
    assert [_placement(w.obj["spec"]) for w in plan.writes] == [
        "node c",
        "node d",
        "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie",
    ]
    # slice 1 was the shared one: nodeName is immutable, so it is deleted and created anew
    assert plan.deletes_first == [("fabric-dra.io-fabric-pcie-1", "2")]
    assert [w.resource_version for w in plan.writes] == ["1", None, None]
    _assert_one_slice_per_device(plan.writes)
    # and an unchanged warm pool plans nothing
    assert (
        plan_pool("fabric-pcie", pool_of(desired_pools(moved, POLICY)), store(plan.writes), driver=DRIVER)
        is None
    )


def test_warm_changes_between_existing_slices_keep_every_view_complete_and_valid() -> None:
    """Each write of a warm change, applied one at a time, leaves the pool complete (its
    generation and slice count unchanged) and valid (no device twice) for every node — what the
    allocator needs to allocate from it at all."""
    inventory = _warm(_partially_cabled(4, 0), gpu_00001="c", gpu_00003="d")
    first = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert first is not None
    stored = store(first.writes)
    # c's device is claimed while gpu-00000 warms on d and gpu-00002 on c: devices move both ways
    swapped = _warm(_partially_cabled(4, 0), gpu_00003="d", gpu_00000="d", gpu_00002="c")
    swapped.devices[1].state, swapped.devices[1].node = BindingState.BOUND, "c"
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(swapped, POLICY)), stored, driver=DRIVER)
    assert plan is not None and plan.generation == 1 and plan.writes_after
    rv = 100
    for phase in (plan.writes, plan.writes_after):
        for write in phase:
            assert write.obj["spec"]["pool"] == {
                "name": "fabric-pcie",
                "generation": 1,
                "resourceSliceCount": 3,
            }
            stored = _apply(stored, [write], rv)
            rv += 1
            _views(stored, swapped)
    assert _views(stored, swapped) == {
        "a": ["gpu-00001"],
        "b": ["gpu-00001"],
        "c": ["gpu-00002", "gpu-00001"],
        "d": ["gpu-00000", "gpu-00003", "gpu-00001"],
    }
    assert plan_pool("fabric-pcie", pool_of(desired_pools(swapped, POLICY)), stored, driver=DRIVER) is None


def test_a_device_added_to_a_slice_that_exists_is_written_in_place() -> None:
    stored = _stored_with_gpu_00002_warm_on_c()
    grown = _warm(_partially_cabled(4, 0), gpu_00002="c")
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(grown, POLICY)), stored, driver=DRIVER)
    assert plan is not None and plan.generation == 1 and not plan.deletes
    written = [*plan.writes, *plan.writes_after]
    assert {w.obj["spec"]["pool"]["generation"] for w in written} == {1}
    assert "gpu-00003" in {d["name"] for d in written[-1].obj["spec"]["devices"]}
    assert all(w.resource_version for w in written)  # compare-and-swap on the slices stored


def test_slice_names_sort_as_their_indices_so_node_local_slices_come_first() -> None:
    """Eleven nodes with warm devices: the shared slice is the 12th, named after all of them."""
    inventory = _partially_cabled(12, 0)
    for device, node in zip(inventory.devices, [*"ab", *(f"n{i:02d}" for i in range(9))], strict=False):
        device.state, device.node = BindingState.WARM, node
    inventory.pools[0].nodes.extend(f"n{i:02d}" for i in range(9))
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert plan is not None
    names = [w.name for w in plan.writes]
    assert names == sorted(names) and names[0] == "fabric-dra.io-fabric-pcie-00"
    assert "nodeName" not in plan.writes[-1].obj["spec"]


def test_first_available_warm_then_any_takes_the_warm_device_on_its_node_only() -> None:
    """The selector the docs give (``"warm" in …``) through the allocator: no CEL error on the
    cold devices that lack the attribute; the warm subrequest is used where a warm device is seen."""
    inventory = _warm(_partially_cabled(3, 0), gpu_00002="c")
    plan = plan_pool("fabric-pcie", pool_of(desired_pools(inventory, POLICY)), {}, driver=DRIVER)
    assert plan is not None
    slices = [ResourceSlice.model_validate(obj) for obj in store(plan.writes).values()]
    classes = {"gpu": DeviceClass.model_validate({"metadata": {"name": "gpu"}, "spec": {}})}
    warm_first = {
        "name": "gpu",
        "firstAvailable": [
            {
                "name": "warm",
                "deviceClassName": "gpu",
                "selectors": [{"cel": {"expression": f'"warm" in device.attributes["{DRIVER}"]'}}],
            },
            {"name": "any", "deviceClassName": "gpu"},
        ],
    }
    spec = ResourceClaimSpec.model_validate({"devices": {"requests": [warm_first]}})
    labels = desired_node_labels(inventory, DRIVER)
    got = {}
    for name in ("a", "c"):
        node = Node.model_validate(
            {"metadata": {"name": name, "labels": dict.fromkeys(labels[name], "true")}}
        )
        results = Allocator(slices, classes).allocate([ClaimToAllocate("ns", "claim", spec)], node)
        assert results is not None
        (entry,) = results[0].body["devices"]["results"]
        got[name] = (entry["request"], entry["device"])
    assert got == {"a": ("gpu/any", "gpu-00000"), "c": ("gpu/warm", "gpu-00002")}
