"""GPU partitions and CXL memory shares through the controller as a real process, the API test
server (which validates every slice and claim status as its release does) and the manager stand-in
(tests/support/controller.py: binds a GPU to the node of its first partition and refuses another
node 409 DeviceBusy; carves a share per shareID and refuses over-commit). Claims are allocated by
the scheduler's allocator (dra_driver.selection) over the slices the controller published, and
written as the scheduler writes them."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dra_driver.selection import AllocatedState, Allocator, ClaimToAllocate, DeviceClass, Node, ResourceSlice
from dra_driver.selection.model import ResourceClaimSpec
from manager_api.models import BindingState, DeviceDrain, DeviceType, DrainEffect, Health, Inventory
from manager_api.partitions import BUILTIN_TABLES, partition_devices
from tests.conftest import REPO_ROOT
from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.integration.controller.test_binding import (
    claim_path,
    condition,
    condition_status,
    deallocate,
    ensure_namespace,
)
from tests.support.apiserver import start_apiserver
from tests.support.controller import InventoryServer, make_device, make_inventory, make_pool
from tests.support.waiting import wait_until

H100 = BUILTIN_TABLES["h100-80gb"]
_names = itertools.count(1)


def device_classes(driver: str) -> dict[str, DeviceClass]:
    """deploy/base/deviceclasses.yaml for this test's driver name."""
    text = (REPO_ROOT / "deploy/base/deviceclasses.yaml").read_text().replace("fabric-dra.io", driver)
    return {d["metadata"]["name"]: DeviceClass.model_validate(d) for d in yaml.safe_load_all(text) if d}


def nodes(apiserver: ApiServer, count: int) -> list[str]:
    """Nodes of this test's own (the API server outlives it)."""
    names = [f"sn-{next(_names)}" for _ in range(count)]
    for name in names:
        apiserver.node(name)
    return names


def create_claim(apiserver: ApiServer, request: dict[str, Any]) -> dict[str, Any]:
    ensure_namespace(apiserver)
    return apiserver.create(
        claim_path(),
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": f"share-claim-{next(_names)}", "namespace": "default"},
            "spec": {"devices": {"requests": [request]}},
        },
    )


def schedule(
    apiserver: ApiServer,
    driver: str,
    claim: dict[str, Any],
    node: str,
    view: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]] | None:
    """What kube-scheduler does for ``claim`` on ``node``: allocate from the published slices (or
    ``view``, slices read earlier) beside every allocated claim (the allocator of
    dra_driver.selection), and write the allocation with the node; the results, or None when
    nothing fits there."""
    slices = [
        ResourceSlice.model_validate(s) for s in (view if view is not None else apiserver.slices(driver))
    ]
    claims = apiserver.http.get(claim_path()).json()["items"]
    obj = apiserver.http.get(claim_path(claim["metadata"]["name"])).json()
    allocated = AllocatedState.from_claims(claims, exclude={f"default/{obj['metadata']['name']}"})
    spec = ResourceClaimSpec.model_validate(obj["spec"])
    node_obj = Node.model_validate({"metadata": {"name": node, "labels": apiserver.node_labels(node)}})
    results = Allocator(slices, device_classes(driver), allocated).allocate(
        [ClaimToAllocate("default", obj["metadata"]["name"], spec, obj["metadata"]["uid"])], node_obj
    )
    if results is None:
        return None
    allocation = {**results[0].body, "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
    obj["status"] = {
        "allocation": allocation,
        "reservedFor": [
            {"resource": "pods", "name": "p-" + obj["metadata"]["name"], "uid": "u-" + obj["metadata"]["uid"]}
        ],
    }
    response = apiserver.http.put(claim_path(obj["metadata"]["name"]) + "/status", json=obj)
    assert response.status_code == 200, response.text
    return list(allocation["devices"]["results"])


def slices_by_node(apiserver: ApiServer, driver: str) -> dict[str | None, set[str]]:
    out: dict[str | None, set[str]] = {}
    for s in apiserver.slices(driver):
        out.setdefault(s["spec"].get("nodeName"), set()).update(
            d["name"] for d in s["spec"].get("devices") or []
        )
    return out


def status(proc: Any) -> dict[str, Any]:
    return dict(httpx.get(f"{proc.address}/status").json())


def synced(proc: Any, manager: InventoryServer) -> Callable[[], bool]:
    return lambda: status(proc).get("slicesSyncedVersion") == manager.inventory.version


def partitioned(pool_nodes: list[str], *, gpus: int = 1) -> Inventory:
    devices = [make_device(f"gpu{i}", partition_table=H100) for i in range(gpus)]
    return make_inventory(
        [*devices, make_pool("cxlpool0", 8 * 2**30)],
        pools={"fabric-pcie": pool_nodes, "fabric-cxl": pool_nodes},
    )


BINDING = ("--binding-conditions", "--busy-timeout", "60", "--release-grace", "0.5")


# -- publication ----------------------------------------------------------------------------


def test_partitions_and_a_pool_are_published_and_a_restart_over_them_writes_nothing(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    pool_nodes = nodes(apiserver, 2)
    with InventoryServer(partitioned(pool_nodes, gpus=4)) as manager:
        first = start_controller(manager, driver, *BINDING)
        wait_until(synced(first, manager), what="the first publication")
        assert (status(first)["partitions"], status(first)["memoryShares"]) == ("split", True)
        slices = apiserver.slices(driver)
        names = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
        expected = {f"gpu{i}" for i in range(4)} | {
            p.name for i in range(4) for p in partition_devices(f"gpu{i}", H100)
        }
        assert names == expected | {"cxlpool0"}
        counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
        assert [sorted(c["name"] for c in s["spec"]["sharedCounters"]) for s in counter_slices] == [
            ["gpu0", "gpu1", "gpu2", "gpu3"]
        ]
        first.stop()
        apiserver.reset_counts()
        second = start_controller(manager, driver, *BINDING)
        wait_until(synced(second, manager), what="the restarted controller's pass")
        time.sleep(0.5)
        assert apiserver.writes() == 0


def test_a_restart_over_a_1_36_server_writes_nothing_though_it_stamps_every_taint(
    tmp_path: Path, start_controller: ControllerFactory, driver: str
) -> None:
    """A default 1.36 server keeps taints, counters, shares and binding conditions, and stamps each
    taint with ``timeAdded`` (``SetDefaults_DeviceTaint``), which the controller never renders: a
    restart over the same inventory must still find every slice in place — the PCIe pool holding an
    unhealthy GPU, a drained one (NoExecute), a warm one in its node-local slice and a partitionable
    one with its counter slice. The server stores every quantity canonically (``Quantity.String()``):
    a GPU with 3*10^9 bytes and a drive of 10^12 read back as the controller wrote them."""
    pool_nodes = ["on-1", "on-2"]
    drain = DeviceDrain(
        reason="maintenance", effect=DrainEffect.NO_EXECUTE, since=datetime.now(UTC), drains=["switch/s1"]
    )
    inventory = make_inventory(
        [
            make_device("gpu0", partition_table=H100),
            make_device("gpu1", health=Health.WARNING),
            make_device("gpu2", drain=drain),
            make_device("gpu3", state=BindingState.WARM, node="on-1"),
            make_device("gpu4", memory_bytes=3 * 10**9),
            make_device("nvme0", type=DeviceType.NVME, capacity_bytes=10**12 + 5),
            make_pool("cxlpool0", 8 * 2**30),
        ],
        pools={"fabric-pcie": pool_nodes, "fabric-cxl": pool_nodes},
    )
    args = ["--server-version", "1.36.0"]
    with (
        start_apiserver(tmp_path / "api", extra_args=args) as server,
        InventoryServer(inventory) as manager,
    ):
        api = ApiServer(server)
        try:
            first = start_controller(manager, driver, *BINDING, kubeconfig=server.kubeconfig)
            wait_until(synced(first, manager), what="publication")
            assert status(first)["deviceTaints"] is True
            slices = api.slices(driver)
            devices = [d for s in slices for d in s["spec"].get("devices") or []]
            taints = {d["name"]: d["taints"] for d in devices if d.get("taints")}
            assert set(taints) == {"gpu1", "gpu2"}
            assert all(t.get("timeAdded") for ts in taints.values() for t in ts)
            assert any(s["spec"].get("nodeName") == "on-1" for s in slices)
            assert any(s["spec"].get("sharedCounters") for s in slices)
            by_name = {d["name"]: d for d in devices}
            assert by_name["gpu4"]["capacity"][f"{driver}/memory"] == {"value": "3G"}
            assert by_name["nvme0"]["capacity"][f"{driver}/storage"] == {"value": "1000000000005"}
            stored = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices}
            first.stop()
            api.reset_counts()
            second = start_controller(manager, driver, *BINDING, kubeconfig=server.kubeconfig)
            wait_until(synced(second, manager), what="the restarted controller's pass")
            time.sleep(0.5)
            assert api.writes() == 0
            after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in api.slices(driver)}
            assert after == stored
        finally:
            api.close()


def test_a_restart_that_rewrites_a_slice_logs_the_field_that_differs(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    """A stored slice that differs from what the controller renders (here another writer changed
    one device's attribute while the controller was down — on a real server it could be a field
    stored differently from how it was written) is rewritten on restart, and the log line of that
    rewrite names the device and the field with both values."""
    pool_nodes = nodes(apiserver, 1)
    with InventoryServer(make_inventory([make_device("gpu0")], pools={"fabric-pcie": pool_nodes})) as manager:
        first = start_controller(manager, driver)
        wait_until(synced(first, manager), what="the first publication")
        first.stop()
        stored = next(s for s in apiserver.slices(driver) if s["spec"].get("devices"))
        device = stored["spec"]["devices"][0]
        key = next(iter(device["attributes"]))
        device["attributes"][key] = {"string": "edited-while-down"}
        path = f"/apis/resource.k8s.io/v1/resourceslices/{stored['metadata']['name']}"
        assert apiserver.http.put(path, json=stored).status_code == 200
        apiserver.reset_counts()
        second = start_controller(manager, driver)
        wait_until(synced(second, manager), what="the restarted controller's pass")
        assert apiserver.writes() == 1
        lines = [line for line in second.log_file.read_text().splitlines() if "rewriting a stored" in line]
        assert len(lines) == 1, lines
        assert f"devices.gpu0.attributes[{key}].string" in lines[0]
        assert "stored 'edited-while-down'" in lines[0]


@pytest.mark.parametrize(
    ("release", "gates", "layout", "shares"),
    [
        ("1.35.4", "", "off", False),
        (
            "1.34.1",
            "DRAPartitionableDevices=true,DRAConsumableCapacity=true,DRADeviceBindingConditions=true",
            "combined",
            True,
        ),
    ],
)
def test_what_older_servers_keep_decides_the_layout(
    release: str,
    gates: str,
    layout: str,
    shares: bool,
    tmp_path: Path,
    start_controller: ControllerFactory,
    driver: str,
) -> None:
    """A default 1.35 server drops counters and multi-allocatable devices: GPUs whole, no pool; a 1.34
    server with the gates on wants each counter set beside its devices."""
    args = ["--server-version", release] + (["--feature-gates", gates] if gates else [])
    with (
        start_apiserver(tmp_path / "api", extra_args=args) as server,
        InventoryServer(partitioned(["on-1"], gpus=4)) as manager,
    ):
        api = ApiServer(server)
        try:
            proc = start_controller(manager, driver, *BINDING, kubeconfig=server.kubeconfig)
            wait_until(synced(proc, manager), what="publication")
            assert (status(proc)["partitions"], status(proc)["memoryShares"]) == (layout, shares)
            want = {f"gpu{i}" for i in range(4)} if layout == "off" else 4 * 19 + 1

            def published() -> list[dict[str, Any]] | None:
                # a pass that finds the server dropping bindsToNode (1.34) publishes again: wait
                # for the pool as it settles
                slices = api.slices(driver)
                names = {d["name"] for s in slices for d in s["spec"].get("devices") or []}
                counts = {
                    s["spec"]["pool"]["resourceSliceCount"]
                    for s in slices
                    if s["spec"]["pool"]["name"] == "fabric-pcie"
                }
                pcie = [s for s in slices if s["spec"]["pool"]["name"] == "fabric-pcie"]
                settled = counts == {len(pcie)} and len({s["spec"]["pool"]["generation"] for s in pcie}) == 1
                ok = names == want if isinstance(want, set) else len(names) == want
                return slices if ok and settled else None

            slices = wait_until(published, what="the pool as this release keeps it")
            for s in slices:
                sets = {c["name"] for c in s["spec"].get("sharedCounters") or []}
                used = {
                    c["counterSet"]
                    for d in s["spec"].get("devices") or []
                    for c in d.get("consumesCounters") or []
                }
                assert used == sets
        finally:
            api.close()


# -- one GPU, one node ----------------------------------------------------------------------


def one_g(driver: str, profile: str = "1g.10gb") -> dict[str, Any]:
    return {
        "name": "p",
        "exactly": {
            "deviceClassName": "fabric-h100-80gb-partition",
            "selectors": [{"cel": {"expression": f'device.attributes["{driver}"].partition == "{profile}"'}}],
        },
    }


def test_two_nodes_racing_for_one_gpus_partitions_one_gets_it_the_other_is_scheduled_again(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    """Both claims are allocated from one view of the pool, each for its own node (the race). The
    manager binds the GPU to the first; the second fails its binding condition at once (DeviceBusy,
    well before --busy-timeout), is scheduled again, finds the GPU's placements only on the first
    node — where it is attached. Both released, the GPU is offered to every node again."""
    a, b = nodes(apiserver, 2)
    with InventoryServer(partitioned([a, b])) as manager:
        proc = start_controller(manager, driver, *BINDING)
        wait_until(synced(proc, manager), what="publication")
        wait_until(lambda: bool(apiserver.node_labels(b)), what="pool labels")
        first, second = create_claim(apiserver, one_g(driver)), create_claim(apiserver, one_g(driver))
        got_first = schedule(apiserver, driver, first, a)
        started = time.monotonic()
        got_second = schedule(apiserver, driver, second, b)
        assert got_first and got_second and got_first[0]["device"] != got_second[0]["device"]

        def told(claim: dict[str, Any], device: str, kind: str) -> bool:
            return condition_status(apiserver, claim, device, f"{driver}/{kind}") == "True"

        wait_until(lambda: told(first, got_first[0]["device"], "Attached"), what="the first claim attached")
        wait_until(lambda: told(second, got_second[0]["device"], "AttachFailed"), what="the second refused")
        assert time.monotonic() - started < 30  # failed at once, not after --busy-timeout 60
        refused = condition(apiserver, second, got_second[0]["device"], f"{driver}/AttachFailed")
        assert refused is not None and refused["reason"] == "DeviceBusy"
        (gpu,) = [d for d in manager.inventory.devices if d.name == "gpu0"]
        assert gpu.node == a and [h.node for h in gpu.partitions] == [a]
        # the GPU's placements are now offered on node a only
        wait_until(
            lambda: "gpu0-1g10gb-6" in slices_by_node(apiserver, driver).get(a, set()), what="node-local"
        )
        assert not any(n.startswith("gpu0") for n in slices_by_node(apiserver, driver).get(None, set()))
        # the scheduler gives the allocation up and tries again: not on b, but on a
        deallocate(apiserver, second)
        assert schedule(apiserver, driver, second, b) is None
        again = schedule(apiserver, driver, second, a)
        assert again and again[0]["device"] != got_first[0]["device"]
        wait_until(lambda: told(second, again[0]["device"], "Attached"), what="the second attached on a")
        (gpu,) = [d for d in manager.inventory.devices if d.name == "gpu0"]
        assert sorted(h.partition for h in gpu.partitions) == sorted(
            [got_first[0]["device"], again[0]["device"]]
        )
        # both released: the GPU is free and offered to every node again
        deallocate(apiserver, first)
        deallocate(apiserver, second)
        wait_until(
            lambda: not next(d for d in manager.inventory.devices if d.name == "gpu0").partitions,
            what="released",
        )
        wait_until(lambda: "gpu0-1g10gb-6" in slices_by_node(apiserver, driver).get(None, set()), what="back")


# -- memory shares --------------------------------------------------------------------------


def told(apiserver: ApiServer, claim: dict[str, Any], kind: str) -> Callable[[], bool]:
    return lambda: condition_status(apiserver, claim, "cxlpool0", kind) == "True"


def pool_shares(manager: InventoryServer) -> list[Any]:
    pool = next(d for d in manager.inventory.devices if d.name == "cxlpool0").memory_pool
    assert pool is not None
    return list(pool.shares)


def share(driver: str, size: str) -> dict[str, Any]:
    return {
        "name": "m",
        "exactly": {
            "deviceClassName": "fabric-cxl-memory-pool",
            "capacity": {"requests": {f"{driver}/memory": size}},
        },
    }


def test_memory_shares_are_attached_many_times_and_over_commit_is_refused(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    """An 8 GiB pool: three shares for two nodes are carved and attached (one chunk each, of the
    consumed size); a share the scheduler allocated from a stale view (the pool partly carved
    outside fabric-dra meanwhile) is refused by the manager and its binding condition fails."""
    a, b = nodes(apiserver, 2)
    with InventoryServer(partitioned([a, b])) as manager:
        proc = start_controller(
            manager, driver, "--binding-conditions", "--busy-timeout", "1", "--release-grace", "0.5"
        )
        wait_until(synced(proc, manager), what="publication")
        wait_until(lambda: bool(apiserver.node_labels(b)), what="pool labels")
        claims = [create_claim(apiserver, share(driver, size)) for size in ("2Gi", "3000Mi", "1Gi")]
        results = [schedule(apiserver, driver, c, n) for c, n in zip(claims, (a, b, a), strict=True)]
        for claim, got in zip(claims, results, strict=True):
            assert got is not None
            wait_until(told(apiserver, claim, f"{driver}/Attached"), what="a share attached")
        made = {(s.node, s.memory_bytes) for s in manager.shares_made}
        assert made == {(a, 2 * 2**30), (b, 3 * 2**30), (a, 2**30)}  # 3000Mi rounded up to the 1 GiB grid
        assert {s.share_id for s in manager.shares_made} == {r[0]["shareID"] for r in results if r}
        # 6 GiB of 8 are shared; 2 GiB are carved outside fabric-dra after the scheduler looked
        late = create_claim(apiserver, share(driver, "2Gi"))
        view = apiserver.slices(driver)

        def carve_outside(devices: list[Any]) -> list[Any]:
            for d in devices:
                if d.memory_pool is not None:
                    d.memory_pool = d.memory_pool.model_copy(update={"outside_bytes": 2 * 2**30})
            return devices

        manager.update_devices(carve_outside)
        assert schedule(apiserver, driver, late, b, view) is not None
        wait_until(told(apiserver, late, f"{driver}/AttachFailed"), what="the over-committing share refused")
        refused = condition(apiserver, late, "cxlpool0", f"{driver}/AttachFailed")
        assert refused is not None and refused["reason"] == "DeviceBusy"
        assert len(manager.shares_made) == 3
        # a released share goes back to the pool
        deallocate(apiserver, claims[1])
        wait_until(lambda: len(pool_shares(manager)) == 2, what="released")
