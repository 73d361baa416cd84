"""The publisher as a real process against the API test server (which validates every slice it
stores against the strict schemas of Kubernetes 1.34 to 1.37) and a real HTTP inventory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from dra_driver.controller.resourcenames import pool_label_key
from manager_api.models import DeviceType, Health
from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.support.apiserver import start_apiserver
from tests.support.controller import InventoryServer, make_device, make_inventory
from tests.support.waiting import wait_until


@dataclass
class Pool:
    generation: int
    slices: list[dict[str, Any]]

    @property
    def devices(self) -> dict[str, dict[str, Any]]:
        return {d["name"]: d for s in self.slices for d in s["spec"].get("devices", [])}


def pools(apiserver: ApiServer, driver: str) -> dict[str, Pool] | None:
    """The published pools, or None while some pool is mid-update (mixed generations / counts)."""
    by_pool: dict[str, list[dict[str, Any]]] = {}
    for obj in apiserver.slices(driver):
        by_pool.setdefault(obj["spec"]["pool"]["name"], []).append(obj)
    out = {}
    for name, slices in by_pool.items():
        generations = {s["spec"]["pool"]["generation"] for s in slices}
        counts = {s["spec"]["pool"]["resourceSliceCount"] for s in slices}
        if len(generations) != 1 or counts != {len(slices)}:
            return None
        out[name] = Pool(generations.pop(), sorted(slices, key=lambda s: s["metadata"]["name"]))
    return out


def wait_pools(apiserver: ApiServer, driver: str, check: Any, what: str) -> dict[str, Pool]:
    def done() -> dict[str, Pool] | None:
        current = pools(apiserver, driver)
        try:
            return current if current is not None and check(current) else None
        except KeyError:  # a pool not published yet
            return None

    return wait_until(done, what=what)


def gpu(i: int, **kw: Any) -> Any:
    return make_device(f"gpu-{i:04d}", switch=f"Switch{i % 3}", **kw)


def cxl(i: int) -> Any:
    return make_device(
        f"cxl-{i:03d}", type=DeviceType.CXL_MEMORY, pool="fabric-cxl", fabric="CXL", switch="CXLSw"
    )


def test_pools_publish_update_and_shrink(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    for node in ("pa-1", "pa-2", "pa-3"):
        apiserver.node(node)
    reach = {"fabric-pcie": ["pa-1", "pa-2"], "fabric-cxl": ["pa-2", "pa-3"]}
    inventory = make_inventory([*(gpu(i) for i in range(300)), *(cxl(i) for i in range(10))], pools=reach)
    with InventoryServer(inventory) as manager:
        start_controller(manager, driver, "--device-taints", "on")

        published = wait_pools(
            apiserver,
            driver,
            lambda p: set(p) == {"fabric-pcie", "fabric-cxl"} and len(p["fabric-pcie"].devices) == 300,
            "first publication",
        )
        pcie, cxl_pool = published["fabric-pcie"], published["fabric-cxl"]
        # taints published: 64 a slice, so that a taint changes its device's slice alone
        assert [len(s["spec"]["devices"]) for s in pcie.slices] == [64, 64, 64, 64, 44]
        assert len(cxl_pool.slices) == 1 and len(cxl_pool.devices) == 10
        gpu0 = pcie.devices["gpu-0000"]
        assert gpu0["attributes"][f"{driver}/type"] == {"string": "gpu"}
        assert gpu0["attributes"][f"{driver}/switch"] == {"string": "fabric-pcie/Switch0"}
        assert gpu0["capacity"][f"{driver}/memory"]["value"] == "80Gi"
        # The node selector matches exactly the nodes each fabric reaches, through their labels.
        pcie_key, cxl_key = pool_label_key(driver, "fabric-pcie"), pool_label_key(driver, "fabric-cxl")
        term = pcie.slices[0]["spec"]["nodeSelector"]["nodeSelectorTerms"][0]["matchExpressions"][0]
        assert term == {"key": pcie_key, "operator": "In", "values": ["true"]}
        wait_until(
            lambda: (
                apiserver.node_labels("pa-1").get(pcie_key) == "true"
                and cxl_key not in apiserver.node_labels("pa-1")
                and apiserver.node_labels("pa-2").get(pcie_key)
                == apiserver.node_labels("pa-2").get(cxl_key)
                == "true"
                and pcie_key not in apiserver.node_labels("pa-3")
                and apiserver.node_labels("pa-3").get(cxl_key) == "true"
            ),
            what="node pool labels",
        )

        # Update: one device added, one removed, one turns unhealthy. The pool keeps its five slices,
        # so the slices whose devices changed or moved are written in place, under the same generation.
        def change(devices: list[Any]) -> list[Any]:
            kept = [d for d in devices if d.name != "gpu-0005"]
            kept = [gpu(7, health=Health.CRITICAL) if d.name == "gpu-0007" else d for d in kept]
            return [*kept, gpu(300)]

        manager.update_devices(change)
        updated = wait_pools(
            apiserver,
            driver,
            # the whole pool: slices rewritten in place go one after another (losing ones first), so
            # a device that moves between two is missing for the moment between their writes
            lambda p: (
                "gpu-0300" in p["fabric-pcie"].devices
                and "gpu-0005" not in p["fabric-pcie"].devices
                and len(p["fabric-pcie"].devices) == 300
            ),
            "the update",
        )["fabric-pcie"]
        assert updated.devices["gpu-0007"]["attributes"][f"{driver}/health"] == {"string": "Critical"}
        assert {s["spec"]["pool"]["generation"] for s in updated.slices} == {pcie.generation}
        assert len(updated.devices) == 300 and len(updated.slices) == 5

        # Shrink: 59 devices (gpu-0005 is gone) fit one slice; the surplus slices go, CXL is untouched.
        cxl_generation = cxl_pool.generation
        manager.update_devices(
            lambda devices: [d for d in devices if d.pool == "fabric-cxl" or d.name < "gpu-0060"]
        )
        shrunk = wait_pools(
            apiserver,
            driver,
            lambda p: len(p["fabric-pcie"].slices) == 1 and len(p["fabric-pcie"].devices) == 59,
            "the shrink",
        )
        assert shrunk["fabric-pcie"].slices[0]["spec"]["pool"]["resourceSliceCount"] == 1
        assert shrunk["fabric-cxl"].generation == cxl_generation

        # A fabric leaves the inventory: its slices and its node labels go.
        manager.set_inventory(
            make_inventory(
                [d for d in manager.inventory.devices if d.pool == "fabric-pcie"],
                pools={"fabric-pcie": reach["fabric-pcie"]},
            )
        )
        wait_pools(apiserver, driver, lambda p: set(p) == {"fabric-pcie"}, "the CXL pool's removal")
        wait_until(
            lambda: all(cxl_key not in apiserver.node_labels(n) for n in ("pa-2", "pa-3")),
            what="CXL labels gone",
        )


def test_an_unchanged_pool_costs_no_write(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    inventory = make_inventory([gpu(i) for i in range(200)])
    with InventoryServer(inventory) as manager:
        first = start_controller(manager, driver, "--resync-period", "0.2")
        wait_pools(
            apiserver, driver, lambda p: len(p.get("fabric-pcie", Pool(0, [])).devices) == 200, "publication"
        )
        stored = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in apiserver.slices(driver)}
        apiserver.reset_counts()
        # Several resyncs: each re-lists every slice and compares; none may write.
        wait_until(
            lambda: apiserver.requests("resource.k8s.io/resourceslices", "list") >= 5,
            what="five resync passes",
        )
        assert apiserver.writes() == 0
        first.stop()

        # A restarted controller over the same inventory finds everything in place.
        apiserver.reset_counts()
        second = start_controller(manager, driver, "--resync-period", "0.2")
        wait_until(
            lambda: apiserver.requests("resource.k8s.io/resourceslices", "list") >= 3, what="restart resyncs"
        )
        assert apiserver.writes() == 0
        assert {
            s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in apiserver.slices(driver)
        } == stored
        status = httpx.get(f"{second.address}/status").json()
        assert status["slicesSyncedVersion"] == manager.inventory.version
        assert httpx.get(f"{second.address}/healthz").status_code == 200
        assert httpx.get(f"{second.address}/readyz").status_code == 200
        metrics = httpx.get(f"{second.address}/metrics").text
        assert 'fabric_dra_controller_pool_devices{pool="fabric-pcie",state="published"} 200.0' in metrics
        assert "fabric_dra_controller_leader 1.0" in metrics


def test_recovers_from_api_errors_conflicts_and_foreign_edits(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    inventory = make_inventory([gpu(i) for i in range(150)])
    with InventoryServer(inventory) as manager:
        # The first writes fail with 500s, then with conflicts: the controller must still converge.
        apiserver.fault("resourceslices", verbs=["create"], count=3, code=500)
        apiserver.fault("resourceslices", verbs=["update"], count=2, code=409)
        start_controller(manager, driver)
        first = wait_pools(
            apiserver, driver, lambda p: len(p.get("fabric-pcie", Pool(0, [])).devices) == 150, "publication"
        )["fabric-pcie"]
        manager.update_devices(lambda devices: [*devices, gpu(150)])
        wait_pools(
            apiserver, driver, lambda p: "gpu-0150" in p["fabric-pcie"].devices, "update through conflicts"
        )
        assert apiserver.faults_left() == 0

        # Someone deletes one of our slices: it comes back, in a consistent pool.
        victim = first.slices[1]["metadata"]["name"]
        assert apiserver.http.delete(f"/apis/resource.k8s.io/v1/resourceslices/{victim}").status_code == 200
        wait_pools(
            apiserver,
            driver,
            lambda p: (
                victim in {s["metadata"]["name"] for s in p["fabric-pcie"].slices}
                and len(p["fabric-pcie"].devices) == 151
            ),
            "the deleted slice to come back",
        )

        # Someone edits a device away: the edit is undone.
        name = first.slices[0]["metadata"]["name"]
        obj = apiserver.http.get(f"/apis/resource.k8s.io/v1/resourceslices/{name}").json()
        obj["spec"]["devices"] = obj["spec"]["devices"][:-1]
        assert (
            apiserver.http.put(f"/apis/resource.k8s.io/v1/resourceslices/{name}", json=obj).status_code == 200
        )
        wait_pools(apiserver, driver, lambda p: len(p["fabric-pcie"].devices) == 151, "the edit to be undone")


def test_unhealthy_devices_are_tainted_or_withheld(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    devices = [gpu(i, health=Health.CRITICAL if i in (3, 70) else Health.OK) for i in range(100)]
    devices.append(gpu(100, health=Health.WARNING))
    with InventoryServer(make_inventory(devices)) as manager:
        start_controller(manager, driver, "--device-taints", "on")
        pool = wait_pools(
            apiserver, driver, lambda p: len(p["fabric-pcie"].devices) == 101, "tainted publication"
        )["fabric-pcie"]
        taint = pool.devices["gpu-0003"]["taints"]
        assert taint[0]["key"] == f"{driver}/unhealthy" and taint[0]["value"] == "Critical"
        assert taint[0]["effect"] == "NoSchedule"
        assert pool.devices["gpu-0100"]["taints"][0]["value"] == "Warning"
        assert "taints" not in pool.devices["gpu-0000"]
        for obj in pool.slices:
            devices_in = obj["spec"]["devices"]
            assert len(devices_in) <= (64 if any("taints" in d for d in devices_in) else 128)

    other = f"w{driver}"
    with InventoryServer(make_inventory(devices)) as manager:
        start_controller(manager, other, "--device-taints", "off")
        pool = wait_pools(apiserver, other, lambda p: len(p["fabric-pcie"].devices) == 98, "withholding")[
            "fabric-pcie"
        ]
        assert not {"gpu-0003", "gpu-0070", "gpu-0100"} & set(pool.devices)


@pytest.mark.parametrize(("release", "kept"), [("1.35.4", False), ("1.36.2", True), ("1.37.0", True)])
def test_auto_modes_follow_what_a_default_server_of_each_release_keeps(
    release: str, kept: bool, tmp_path: Path, start_controller: ControllerFactory, driver: str
) -> None:
    """--device-taints auto and --binds-to-node auto: a default 1.36 server serves no
    devicetaintrules yet keeps taints and bindsToNode; a 1.35 one drops both."""
    devices = [gpu(i, health=Health.CRITICAL if i == 3 else Health.OK) for i in range(10)]
    with (
        start_apiserver(tmp_path / "api", extra_args=["--server-version", release]) as server,
        InventoryServer(make_inventory(devices)) as manager,
    ):
        proc = start_controller(manager, driver, kubeconfig=server.kubeconfig)
        api = ApiServer(server)
        try:
            expected = 10 if kept else 9
            pool = wait_pools(api, driver, lambda p: len(p["fabric-pcie"].devices) == expected, "auto mode")
            devices_out = pool["fabric-pcie"].devices
            assert ("gpu-0003" in devices_out) is kept
            assert all(d.get("bindsToNode", False) is kept for d in devices_out.values())
            status = httpx.get(f"{proc.address}/status").json()
            assert (status["deviceTaints"], status["bindsToNode"]) == (kept, kept)
            assert not api.slices(driver) or all(
                s["metadata"]["name"] != f"{driver}-feature-probe" for s in api.slices(driver)
            )  # the probe was a dry run
        finally:
            api.close()


def test_node_labels_follow_nodes_and_undo_stray_ones(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    key = pool_label_key(driver, "fabric-pcie")
    apiserver.node("nl-1")
    apiserver.node("nl-stray", labels={key: "true", "keep": "me"})
    with InventoryServer(make_inventory([gpu(0)], pools={"fabric-pcie": ["nl-1", "nl-late"]})) as manager:
        start_controller(manager, driver)
        wait_until(lambda: apiserver.node_labels("nl-1").get(key) == "true", what="label on a reachable node")
        wait_until(lambda: key not in apiserver.node_labels("nl-stray"), what="stray label removed")
        assert apiserver.node_labels("nl-stray")["keep"] == "me"
        # A node the fabric reaches registers late: it is labelled when it appears.
        apiserver.node("nl-late")
        wait_until(lambda: apiserver.node_labels("nl-late").get(key) == "true", what="label on a late node")


def test_one_leader_writes_and_a_standby_takes_over(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    with InventoryServer(make_inventory([gpu(i) for i in range(10)])) as manager:
        lease = [
            "--leader-elect",
            "--lease-name",
            f"lease-{driver.split('.')[0]}",
            "--lease-namespace",
            "default",
        ]
        first = start_controller(manager, driver, *lease, "--identity", "one")
        wait_pools(
            apiserver, driver, lambda p: len(p["fabric-pcie"].devices) == 10, "publication by the leader"
        )
        second = start_controller(manager, driver, *lease, "--identity", "two")
        wait_until(lambda: httpx.get(f"{second.address}/status").json()["leader"] is False, what="standby")
        assert httpx.get(f"{first.address}/status").json()["leader"] is True
        # The leader stops (SIGTERM releases the lease): the standby leads and keeps publishing.
        first.stop()
        wait_until(lambda: httpx.get(f"{second.address}/status").json()["leader"] is True, what="takeover")
        manager.update_devices(lambda devices: [*devices, gpu(10)])
        wait_pools(
            apiserver,
            driver,
            lambda p: "gpu-0010" in p["fabric-pcie"].devices,
            "publication by the new leader",
        )


def test_two_publishers_share_one_driver_without_undoing_each_other(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    """Two fabric managers (pools rack1-pcie and rack2-pcie), one controller each, one driver."""
    apiserver.node("tp-1")
    rack1 = make_inventory([gpu(i, pool="rack1-pcie") for i in range(3)], pools={"rack1-pcie": ["tp-1"]})
    rack2 = make_inventory([gpu(i, pool="rack2-pcie") for i in range(5)], pools={"rack2-pcie": ["tp-1"]})
    with InventoryServer(rack1) as one, InventoryServer(rack2) as two:
        start_controller(one, driver, "--publisher", "rack1", "--resync-period", "0.3")
        start_controller(two, driver, "--publisher", "rack2", "--resync-period", "0.3")
        published = wait_pools(
            apiserver,
            driver,
            lambda p: len(p["rack1-pcie"].devices) == 3 and len(p["rack2-pcie"].devices) == 5,
            "both pools",
        )
        keys = {pool_label_key(driver, "rack1-pcie"), pool_label_key(driver, "rack2-pcie")}
        wait_until(lambda: keys <= set(apiserver.node_labels("tp-1")), what="both pool labels on the node")
        # Resyncs of both run; neither deletes or rewrites the other's slices or labels.
        apiserver.reset_counts()
        wait_until(lambda: apiserver.requests("resource.k8s.io/resourceslices", "list") >= 4, what="resyncs")
        assert apiserver.writes() == 0
        assert apiserver.writes("nodes") == 0
        assert {p: v.generation for p, v in (pools(apiserver, driver) or {}).items()} == {
            p: v.generation for p, v in published.items()
        }
