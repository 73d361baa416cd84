"""deploy/kind's sharing manifests (what ``fabric-dra demo`` applies beside the article's): two pods
on two partitions of one GPU, and a pod with 64 GiB of a CXL memory pool.

They pass the API test server's rules as a 1.36 server has them (nothing dropped by a gate), and
over the slices the controller publishes for the emulator's default fabric — its GPUs with their
partition tables, its memory pool with its chunk grid, read from the topology file — the
scheduler's allocator (dra_driver.selection, with deploy/base's DeviceClasses) gives the two
partition claims placements of one GPU, the one the manifest names, and the memory claim a share
of the pool of exactly 64 GiB."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.controller.devices import PublishPolicy
from dra_driver.controller.slices import desired_node_labels, desired_pools, plan_pool
from dra_driver.selection import AllocatedState, Allocator, ClaimToAllocate, DeviceClass, Node, ResourceSlice
from dra_driver.selection.model import ResourceClaimSpec
from emulator.topology import default_topology_path, load_topology
from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.registry import find_resource
from kube_standin.apiserver.rules import validate_object
from kube_standin.apiserver.strategy import prepare_for_create
from manager_api.devices import DeviceType
from manager_api.models import Inventory
from manager_api.partitions import parse_partition
from tests.support.controller import make_device, make_inventory, make_pool
from tests.support.deploy import DEPLOY_DIR, DRIVER_NAME, SHARING_MANIFESTS, load_yaml_documents

Obj = dict[str, Any]
K136 = FeatureGates.of("1.36.0")
DRIVER = DRIVER_NAME
POLICY = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=True)
_MIB = 1 << 20


def objects(name: str) -> list[Obj]:
    return load_yaml_documents(SHARING_MANIFESTS[name].read_text())


def claims_of(name: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects(name) if o["kind"] == "ResourceClaim"}


@pytest.mark.parametrize("name", sorted(SHARING_MANIFESTS))
def test_every_object_passes_the_api_servers_rules_and_keeps_its_fields(name: str) -> None:
    for obj in objects(name):
        group, _, version = obj["apiVersion"].rpartition("/")
        plural = obj["kind"].lower() + "s"
        res = find_resource(group, version, plural)
        assert res is not None, obj["kind"]
        stored = copy.deepcopy(obj)
        prepare_for_create(res, stored, K136)
        assert stored == obj, f"{obj['kind']} {obj['metadata']['name']}: a 1.36 server drops a field"
        causes = validate_object(res, stored, K136)
        assert [f"{c.field}: {c.message}" for c in causes] == [], obj["metadata"]["name"]


@pytest.mark.parametrize("name", sorted(SHARING_MANIFESTS))
def test_every_pod_uses_the_claims_of_its_file(name: str) -> None:
    claims = claims_of(name)
    used = []
    for pod in (o for o in objects(name) if o["kind"] == "Pod"):
        spec = pod["spec"]
        (entry,) = spec["resourceClaims"]
        assert entry["resourceClaimName"] in claims
        assert [c["resources"]["claims"] for c in spec["containers"]] == [[{"name": entry["name"]}]]
        used.append(entry["resourceClaimName"])
    assert sorted(used) == sorted(claims)


def default_fabric() -> Inventory:
    """The emulator's default fabric as the manager's inventory shows it, for what the publisher
    reads: its GPUs (partitionable where their model names a table) and its memory pools."""
    index = load_topology(default_topology_path())
    devices = []
    for d in index.devices.values():
        if d.type is DeviceType.GPU:
            devices.append(
                make_device(
                    d.id,
                    serial=d.serial,
                    model=d.model.model,
                    memory_bytes=int(d.model.memory or 0),
                    partition_table=d.model.partitions,
                )
            )
        elif d.pool is not None:
            devices.append(
                make_pool(
                    d.id,
                    int(d.model.memory or 0),
                    serial=d.serial,
                    min_chunk_bytes=d.pool.min_chunk_mib * _MIB,
                    increment_bytes=d.pool.increment_mib * _MIB,
                )
            )
    return make_inventory(devices)


def published(inventory: Inventory) -> list[Obj]:
    out: list[Obj] = []
    for pool, desired in desired_pools(inventory, POLICY).items():
        plan = plan_pool(pool, desired, {}, driver=DRIVER)
        assert plan is not None
        out.extend(w.obj for w in plan.writes)
    return out


def device_classes() -> dict[str, DeviceClass]:
    docs = load_yaml_documents((DEPLOY_DIR / "base" / "deviceclasses.yaml").read_text())
    return {d["metadata"]["name"]: DeviceClass.model_validate(d) for d in docs}


def allocate_in_turn(inventory: Inventory, claims: list[Obj]) -> list[list[Obj]]:
    """Each claim allocated after the one before, on the first node, as the scheduler would."""
    slices = [ResourceSlice.model_validate(s) for s in published(inventory)]
    node = inventory.nodes[0].name
    labels = desired_node_labels(inventory, DRIVER)[node]
    node_obj = Node.model_validate({"metadata": {"name": node, "labels": dict.fromkeys(labels, "true")}})
    done: list[Obj] = []
    out = []
    for claim in claims:
        spec = ResourceClaimSpec.model_validate(claim["spec"])
        name = claim["metadata"]["name"]
        results = Allocator(slices, device_classes(), AllocatedState.from_claims(done)).allocate(
            [ClaimToAllocate(claim["metadata"]["namespace"], name, spec)], node_obj
        )
        assert results is not None, f"claim {name} fits no published device"
        body = results[0].body
        done.append({"metadata": claim["metadata"], "status": {"allocation": body}})
        out.append(body["devices"]["results"])
    return out


def test_the_two_partition_claims_get_placements_of_the_one_gpu_they_name() -> None:
    inventory = default_fabric()
    tables = {d.name: d.partition_table for d in inventory.devices if d.partition_table is not None}
    assert sum(t.name == "h100-80gb" for t in tables.values()) > 1  # the serial is what picks one
    claims = claims_of("gpu-partitions")
    ((a,), (b,)) = allocate_in_turn(
        inventory, [claims["agent-small-partition"], claims["agent-large-partition"]]
    )
    first, second = parse_partition(a["device"], tables), parse_partition(b["device"], tables)
    assert first is not None and second is not None
    assert (first.profile.name, second.profile.name) == ("1g.10gb", "3g.40gb")
    assert first.gpu == second.gpu
    named = {d.name: d.serial for d in inventory.devices}[first.gpu]
    for claim in claims.values():
        (request,) = claim["spec"]["devices"]["requests"]
        (selector,) = request["exactly"]["selectors"]
        assert f'.serial == "{named}"' in selector["cel"]["expression"]


def test_the_memory_claim_gets_a_share_of_exactly_64_gib_of_the_pool() -> None:
    inventory = default_fabric()
    (claim,) = claims_of("cxl-memory").values()
    ((result,),) = allocate_in_turn(inventory, [claim])
    pool = {d.name: d for d in inventory.devices}[result["device"]]
    assert pool.memory_pool is not None
    assert result["shareID"]
    assert result["consumedCapacity"] == {f"{DRIVER}/memory": "64Gi"}
    assert 65536 % (pool.memory_pool.increment_bytes // _MIB) == 0  # on the grid: carved as asked


def test_the_classes_the_manifests_ask_for_are_deployed() -> None:
    asked = {
        r["exactly"]["deviceClassName"]
        for name in SHARING_MANIFESTS
        for c in claims_of(name).values()
        for r in c["spec"]["devices"]["requests"]
    }
    assert asked <= set(device_classes())
