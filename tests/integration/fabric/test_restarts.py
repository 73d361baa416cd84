"""Crashes in the middle of an operation: of the Redfish service, and of the manager itself.

The emulator runs binds as tasks that take seconds (a latency profile), so each crash lands while
the fabric is working. Afterwards the binding must exist exactly once, made by exactly one
successful task, and the ledger must agree.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from manager_api.client import ManagerClient
from manager_api.models import AttachmentState, BindingState
from tests.integration.fabric.conftest import (
    CONTROLLER_TOKEN,
    FabricAdmin,
    Tls,
    manager_args,
    tls_emulator,
)
from tests.support.fabric_manager import start_manager
from tests.support.uids import claim_uid

NODE = "kind-worker2"
PROFILE = {
    "name": "slow-binds",
    "tasks": True,
    "bind": {"gpu": {"seconds": 2.0}, "nvme": {"seconds": 2.0}},
    "unbind": {"gpu": {"seconds": 0.2}, "nvme": {"seconds": 0.2}},
    "retry_after_seconds": 1,
}


@pytest.fixture(scope="module")
def slow_fabric(tmp_path_factory: pytest.TempPathFactory, tls: Tls) -> Iterator[FabricAdmin]:
    root = tmp_path_factory.mktemp("slow-fabric")
    profile = root / "latency.json"
    profile.write_text(json.dumps(PROFILE))
    with tls_emulator(root, tls, latency=str(profile)) as admin:
        yield admin


def wait_in_flight(fabric: FabricAdmin, target: str, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while not any(
        t["Target"] == target for t in fabric.get("/redfish/v1/Oem/FabricDRA/Bindings")["InFlight"]
    ):
        assert time.monotonic() < deadline, f"no task for {target} started"
        time.sleep(0.05)


def wait_task_recorded(ledger: Path, device: str, within: float = 10) -> dict[str, object]:
    """The ledger entry of ``device`` once it names the fabric's task monitor."""
    deadline = time.monotonic() + within
    while True:
        entry: dict[str, object] = json.loads(ledger.read_text())["entries"].get(device) or {}
        if entry.get("task_monitor"):
            return entry
        assert time.monotonic() < deadline, f"the ledger never recorded the task of {device}"
        time.sleep(0.02)


def bind_tasks(fabric: FabricAdmin, target: str) -> list[dict[str, object]]:
    """Every bind task the fabric ran for ``target`` with its end state."""
    tasks = []
    for member in fabric.get("/redfish/v1/TaskService/Tasks")["Members"]:
        task = fabric.get(member["@odata.id"])
        body = task["Payload"].get("JsonBody")  # absent for a request without a body (DELETE)
        if body and target in json.dumps(body):
            tasks.append({"state": task["TaskState"], "status": task["TaskStatus"]})
    return tasks


async def attach_until_attached(client: ManagerClient, device: str, claim: str, within: float = 40) -> None:
    deadline = time.monotonic() + within
    while True:
        attachment = await client.attach(device, NODE, claim, wait_seconds=10)
        if attachment.state == AttachmentState.ATTACHED:
            return
        assert time.monotonic() < deadline, f"{device} not attached after {within}s"


async def test_fabric_restart_in_the_middle_of_a_bind(slow_fabric: FabricAdmin, tmp_path: Path) -> None:
    manager = start_manager(
        tmp_path, slow_fabric.url, args=manager_args(slow_fabric, tmp_path, "--poll-seconds", "1")
    )
    try:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            first = await client.attach("gpu0", NODE, claim_uid("claim-a"))
            assert first.state == AttachmentState.ATTACHING
            wait_in_flight(slow_fabric, "gpu0")
            slow_fabric.emulator.kill()  # the task dies with the service: "Interrupted", not bound
            await asyncio.sleep(1.5)
            slow_fabric.emulator.restart()
            await attach_until_attached(client, "gpu0", claim_uid("claim-a"))
            assert slow_fabric.bound_hosts() == {"gpu0": NODE}
            tasks = bind_tasks(slow_fabric, "gpu0")
            # one task cut short by the crash, one that bound it: never two bindings
            assert [t["state"] for t in tasks].count("Completed") == 1, tasks
            device = await client.device("gpu0")
            assert (device.state, device.claim_uid, device.managed) == (
                BindingState.BOUND,
                claim_uid("claim-a"),
                True,
            )
            await client.detach("gpu0", NODE, claim_uid("claim-a"), wait_seconds=20)
            assert slow_fabric.bound_hosts() == {}
    finally:
        manager.stop()


async def test_manager_crash_in_the_middle_of_a_bind(slow_fabric: FabricAdmin, tmp_path: Path) -> None:
    args = manager_args(slow_fabric, tmp_path, "--poll-seconds", "1")
    manager = start_manager(tmp_path, slow_fabric.url, args=args)
    try:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            first = await client.attach("nvme1", NODE, claim_uid("claim-b"))
            assert first.state == AttachmentState.ATTACHING
        wait_in_flight(slow_fabric, "nvme1")
        entry = wait_task_recorded(tmp_path / "manager-state" / "ledger.json", "nvme1")
        manager.kill()  # kill -9 while the fabric's task runs
        assert entry["state"] == "attaching" and slow_fabric.bound_hosts() == {}
    finally:
        manager.stop()
    restarted = start_manager(tmp_path, slow_fabric.url, args=args, name="manager-restarted")
    try:
        async with ManagerClient(restarted.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            await attach_until_attached(client, "nvme1", claim_uid("claim-b"))
            assert slow_fabric.bound_hosts() == {"nvme1": NODE}
            # the restarted manager waited for the running task instead of binding again
            assert bind_tasks(slow_fabric, "nvme1") == [{"state": "Completed", "status": "OK"}]
            operation = await client.operation(first.operation_id or "")
            assert operation.state.value == "succeeded"
            await client.detach("nvme1", NODE, claim_uid("claim-b"), wait_seconds=20)
        assert slow_fabric.bound_hosts() == {}
    finally:
        restarted.stop()
