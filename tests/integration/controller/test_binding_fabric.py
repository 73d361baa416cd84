"""The binding-condition flow through real processes: API test server, Redfish emulator, fabric
manager (static-token auth, the controller holding the controller role) and the controller.

allocated claim → device bound to the chosen node (in the manager *and* in the emulator's own
binding table and the node's emulated sysfs tree) → ``Attached=True``; a bind the emulator is
told to fail → ``AttachFailed=True`` and nothing bound; deallocation → the device is free again.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabric_dra_testbed.stack import Role, Stack, short_dir
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, DeviceType, Inventory
from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.integration.controller.test_binding import (
    allocate,
    condition,
    condition_status,
    create_claim,
    deallocate,
)
from tests.support.waiting import wait_until

CONTROLLER_TOKEN = "controller-token-for-tests-0001"


@dataclass
class Fabric:
    root: Path
    emulator: Role
    manager: Role
    token_file: Path

    def inventory(self) -> Inventory:
        async def fetch() -> Inventory:
            async with ManagerClient(self.manager.address, token=CONTROLLER_TOKEN) as client:
                return await client.inventory()

        return asyncio.run(fetch())

    def device(self, name: str) -> Device:
        return next(d for d in self.inventory().devices if d.name == name)

    def emulator_bindings(self) -> list[dict[str, Any]]:
        answer = httpx.get(f"{self.emulator.address}/redfish/v1/Oem/FabricDRA/Bindings", timeout=10)
        answer.raise_for_status()
        return list(answer.json().get("Bindings") or [])

    def fail_next_bind(self) -> None:
        answer = httpx.post(
            f"{self.emulator.address}/redfish/v1/Oem/FabricDRA/Faults",
            json={"Kind": "FailOperations", "Operation": "bind", "Count": 1, "MessageId": "OperationFailed"},
            timeout=10,
        )
        assert answer.status_code in (200, 201), answer.text


@pytest.fixture(scope="module")
def fabric() -> Iterator[Fabric]:
    root = short_dir("fdcb-")
    try:
        with Stack(root, logs_dir=root) as stack:
            emulator = stack.emulator(state_dir=root / "emu", auth=False)
            manager = stack.manager(
                emulator, state_dir=root / "manager", static_tokens={CONTROLLER_TOKEN: ("controller", None)}
            )
            token_file = root / "controller.token"
            token_file.write_text(CONTROLLER_TOKEN + "\n")
            yield Fabric(root, emulator.role, manager.role, token_file)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def free_gpus(fabric: Fabric, node: str) -> list[Device]:
    inventory = fabric.inventory()
    reachable = {p.pool for p in inventory.pools if node in p.nodes}
    return [
        d
        for d in inventory.devices
        if d.type is DeviceType.GPU and d.state is BindingState.FREE and d.managed and d.pool in reachable
    ]


def bound_on_host(fabric: Fabric, device: Device, host: str) -> bool:
    """The emulator's own view: a binding of the device's resource to ``host``, and the device in
    the host's sysfs tree (its serial file) — not the manager's word for it."""
    target = device.redfish_uri.rstrip("/").rsplit("/", 1)[-1]
    in_table = any(
        b["Host"] == host and target in (b["Target"], b["Device"]) for b in fabric.emulator_bindings()
    )
    pci = fabric.root / "emu" / "hosts" / host / "sys" / "bus" / "pci" / "devices"
    serials = {p.read_text().strip() for p in pci.glob("*/serial")} if pci.is_dir() else set()
    return in_table and device.serial in serials


def test_allocated_claim_is_attached_to_the_chosen_node_or_reports_the_failure(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str, fabric: Fabric
) -> None:
    inventory = fabric.inventory()
    node = inventory.nodes[0]
    for n in inventory.nodes:
        response = apiserver.http.post(
            "/api/v1/nodes", json={"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name}}
        )
        assert response.status_code in (201, 409)
    start_controller(
        fabric.manager.address,
        driver,
        "--manager-token-file",
        str(fabric.token_file),
        "--binding-conditions",
        "--release-grace",
        "0.5",
    )
    wait_until(
        lambda: {s["spec"]["pool"]["name"] for s in apiserver.slices(driver)} >= {"fabric-pcie"},
        what="slices",
    )
    first, second = free_gpus(fabric, node.name)[:2]

    # Allocated claim → attached to the chosen node → Attached=True.
    claim = create_claim(apiserver, ["gpu"])
    allocate(apiserver, claim, driver, {"gpu": first.name}, node.name, pool=first.pool)
    attached = wait_until(
        lambda: (
            (c := condition(apiserver, claim, first.name, f"{driver}/Attached"))
            and c["status"] == "True"
            and c
        ),
        timeout=30,
        what="Attached=True from the real manager",
    )
    assert attached["reason"] == "Attached"
    held = fabric.device(first.name)
    assert held.state is BindingState.BOUND
    assert (held.node, held.claim_uid) == (node.name, claim["metadata"]["uid"])
    assert wait_until(lambda: bound_on_host(fabric, held, node.host), what="the emulator's own binding")

    # The emulator fails the next bind → AttachFailed=True, and the device is left unbound.
    fabric.fail_next_bind()
    doomed = create_claim(apiserver, ["gpu"])
    allocate(apiserver, doomed, driver, {"gpu": second.name}, node.name, pool=second.pool)
    failed = wait_until(
        lambda: (
            (c := condition(apiserver, doomed, second.name, f"{driver}/AttachFailed"))
            and c["status"] == "True"
            and c
        ),
        timeout=30,
        what="AttachFailed=True after an injected bind failure",
    )
    assert failed["reason"] == "BindFailed" and "refused" in failed["message"]
    assert condition_status(apiserver, doomed, second.name, f"{driver}/Attached") == "False"
    after = fabric.device(second.name)
    assert after.state is BindingState.FREE and after.claim_uid is None
    assert not bound_on_host(fabric, after, node.host)

    # The first claim is deallocated: the device goes back to the free pool.
    deallocate(apiserver, claim)
    wait_until(lambda: fabric.device(first.name).state is BindingState.FREE, timeout=30, what="release")
    assert not bound_on_host(fabric, fabric.device(first.name), node.host)
