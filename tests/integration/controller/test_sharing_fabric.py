"""GPU partitions and a CXL memory share through the real processes: API test server, Redfish
emulator (its default topology), fabric manager and the controller with binding conditions.

Two claims of one GPU's partitions, allocated from one view for two nodes: the manager binds the
GPU to the first node and refuses the second with DeviceBusy; the controller fails that binding at
once, the GPU's placements move to the first node's slice, and the claim scheduled again is
attached there. A share of the default memory pool is carved and attached, then released.
Skipped, saying so, where the manager's fabric offers no partitionable GPU or memory pool."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.integration.controller.test_binding import condition, deallocate
from tests.integration.controller.test_binding_fabric import Fabric, fabric  # noqa: F401 - the fixture
from tests.integration.controller.test_sharing import create_claim, one_g, schedule, share, slices_by_node
from tests.support.waiting import wait_until


def test_partitions_race_and_a_share_against_the_real_manager(
    apiserver: ApiServer,
    start_controller: ControllerFactory,
    driver: str,
    fabric: Fabric,  # noqa: F811 - the fixture imported above
) -> None:
    inventory = fabric.inventory()
    gpu = next((d for d in inventory.devices if d.partition_table is not None), None)
    memory = next((d for d in inventory.devices if d.memory_pool is not None), None)
    if gpu is None or memory is None:
        pytest.skip("the emulator's default fabric offers no partitionable GPU or no memory pool")
    for node in inventory.nodes:
        apiserver.http.post(
            "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node.name}}
        )
    start_controller(
        fabric.manager.address,
        driver,
        "--manager-token-file",
        str(fabric.token_file),
        "--binding-conditions",
        "--release-grace",
        "0.5",
        "--busy-timeout",
        "60",
    )
    first_node, second_node = next(p for p in inventory.pools if p.pool == gpu.pool).nodes[:2]
    wait_until(
        lambda: apiserver.node_labels(first_node) and apiserver.node_labels(second_node), what="labels"
    )
    wait_until(
        lambda: any(
            d["name"].startswith(f"{gpu.name}-")
            for s in apiserver.slices(driver)
            for d in s["spec"].get("devices") or []
        ),
        timeout=60,
        what="the GPU's partitions published",
    )

    def told(claim: dict[str, Any], device: str, kind: str) -> dict[str, Any] | None:
        found = condition(apiserver, claim, device, f"{driver}/{kind}")
        return found if found is not None and found["status"] == "True" else None

    request = one_g(driver)
    this_gpu = f'device.attributes["{driver}"].serial == "{gpu.serial}"'
    request["exactly"]["selectors"].append({"cel": {"expression": this_gpu}})
    a, b = create_claim(apiserver, request), create_claim(apiserver, request)
    got_a = schedule(apiserver, driver, a, first_node)
    got_b = schedule(apiserver, driver, b, second_node)
    assert got_a and got_b
    wait_until(
        lambda: told(a, got_a[0]["device"], "Attached"), timeout=60, what="the first partition attached"
    )
    refused = wait_until(
        lambda: told(b, got_b[0]["device"], "AttachFailed"), timeout=60, what="the other node refused"
    )
    assert refused["reason"] == "DeviceBusy", refused
    bound = fabric.device(gpu.name)
    assert bound.node == first_node and {h.node for h in bound.partitions} == {first_node}
    wait_until(
        lambda: got_a[0]["device"] in slices_by_node(apiserver, driver).get(first_node, set()),
        what="the GPU offered on its node only",
    )
    deallocate(apiserver, b)
    assert schedule(apiserver, driver, b, second_node) is None
    again = schedule(apiserver, driver, b, first_node)
    assert again
    wait_until(lambda: told(b, again[0]["device"], "Attached"), timeout=60, what="the second attached there")
    deallocate(apiserver, a)
    deallocate(apiserver, b)
    wait_until(lambda: not fabric.device(gpu.name).partitions, timeout=60, what="the GPU released")

    c = create_claim(apiserver, share(driver, "1Gi"))
    pool_nodes = next(p for p in inventory.pools if p.pool == memory.pool).nodes
    wait_until(lambda: apiserver.node_labels(pool_nodes[0]), what="labels")
    got_c = schedule(apiserver, driver, c, pool_nodes[0])
    assert got_c and got_c[0]["shareID"]
    wait_until(lambda: told(c, memory.name, "Attached"), timeout=60, what="the share attached")
    pool = fabric.device(memory.name).memory_pool
    assert pool is not None
    assert [(s.share_id, s.node, s.memory_bytes) for s in pool.shares] == [
        (got_c[0]["shareID"], pool_nodes[0], 1 << 30)
    ]
    deallocate(apiserver, c)

    def released() -> bool:
        left = fabric.device(memory.name).memory_pool
        return left is not None and not left.shares

    wait_until(released, timeout=60, what="the share released")
