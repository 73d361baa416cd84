"""Binds to one host run at once: a burst of claims on one node does not wait out each hot-add in
turn, and every device still lands in the host's zone exactly once.

The emulator's GPU hot-add is a Redfish task of :data:`HOT_ADD_SECONDS`; :data:`DEVICES` attaches to
one node are sent together. The manager takes turns on the host's zone only from its ETag to the
``Zone.AddEndpoint`` answer (fabric/backends/zones.py), not for the task, so the emulator's own task
records (their ``StartTime`` and ``EndTime``) show the tasks running at once — counted from those
records, not timed here. Afterwards each device is bound to the host once: one binding in the
emulator's table, one bind task per device (no change sent twice), every attach answered attached.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest

from fabric_dra_testbed.stack import Emulator, Manager, Stack
from tests.support.emulator import slow_gpu_profile
from tests.support.uids import claim_uid

pytestmark = pytest.mark.slow(seconds=30)

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"
HOT_ADD_SECONDS = 8.0
DEVICES = [f"gpu{i}" for i in range(6)]
NODE = "kind-worker"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Emulator, Manager]]:
    profile = slow_gpu_profile(tmp_path_factory.mktemp("profile"), HOT_ADD_SECONDS)
    with Stack.temporary("fdra-onehost-") as stack:
        emulator = stack.emulator(auth=False, latency=str(profile))
        tokens = {CONTROLLER_TOKEN: ("controller", None), OPERATOR_TOKEN: ("operator", None)}
        manager = stack.manager(emulator, static_tokens=tokens)
        yield emulator, manager


def _most_at_once(tasks: list[dict[str, Any]]) -> int:
    """The most tasks running at one moment, from their own start and end times."""
    edges: list[tuple[datetime, int]] = []
    for task in tasks:
        edges.append((datetime.fromisoformat(task["StartTime"]), 1))
        edges.append((datetime.fromisoformat(task["EndTime"]), -1))
    running = most = 0
    for _, step in sorted(edges):  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


def _bind_tasks(emulator: Emulator) -> list[dict[str, Any]]:
    """The emulator's finished ``Zone.AddEndpoint`` tasks, read member by member."""
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        listing = http.get("/redfish/v1/TaskService/Tasks").json()
        tasks = [http.get(m["@odata.id"]).json() for m in listing["Members"]]
    return [
        t
        for t in tasks
        if t.get("Payload", {}).get("TargetUri", "").endswith("Zone.AddEndpoint") and t.get("EndTime")
    ]


async def _attach_all(manager: Manager) -> list[tuple[int, dict[str, Any]]]:
    headers = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    async with httpx.AsyncClient(base_url=manager.url, timeout=120, headers=headers) as http:

        async def attach(device: str) -> tuple[int, dict[str, Any]]:
            body = {"device": device, "node": NODE, "claimUid": claim_uid(f"onehost-{device}")}
            for _ in range(5):  # 202: still attaching, ask again (idempotent per claim and device)
                answer = await http.post("/api/v1/attachments", params={"waitSeconds": 40}, json=body)
                if answer.status_code != 202:
                    break
            return answer.status_code, answer.json()

        return await asyncio.gather(*(attach(d) for d in DEVICES))


def test_binds_to_one_host_overlap_and_land_once(stack: tuple[Emulator, Manager]) -> None:
    emulator, manager = stack
    answers = asyncio.run(_attach_all(manager))
    assert [status for status, _ in answers] == [200] * len(DEVICES), answers
    assert {body["state"] for _, body in answers} == {"attached"}, answers

    tasks = _bind_tasks(emulator)
    endpoints = Counter(json.loads(t["Payload"]["JsonBody"])["Endpoint"]["@odata.id"] for t in tasks)
    # one bind task per device: no change was sent twice
    assert len(tasks) == len(DEVICES), tasks
    assert all(count == 1 for count in endpoints.values()), endpoints
    # the hot-adds ran at once, not one after another
    assert _most_at_once(tasks) >= len(DEVICES) // 2, [(t["StartTime"], t["EndTime"]) for t in tasks]

    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        table = http.get("/redfish/v1/Oem/FabricDRA/Bindings").json()["Bindings"]
    bound = Counter(b["Target"] for b in table)
    hosts = {b["Target"]: b["Host"] for b in table}
    for device in DEVICES:
        assert bound[device] == 1, table
    assert len({hosts[d] for d in DEVICES}) == 1, hosts  # all on the node's host


def test_a_refused_etag_is_read_again_and_the_device_lands_once(stack: tuple[Emulator, Manager]) -> None:
    """The service refuses the next bind of gpu6 with PreconditionFailed (its task ends so): the
    manager reads the binding again, finds the device free and binds it once more; in the end one
    binding, and one bind task that completed."""
    emulator, manager = stack
    fault = {"Kind": "FailOperations", "Target": "gpu6", "MessageId": "PreconditionFailed", "HttpStatus": 412}
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        http.post("/redfish/v1/Oem/FabricDRA/Faults", json=fault).raise_for_status()
    headers = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    body = {"device": "gpu6", "node": NODE, "claimUid": claim_uid("onehost-refused")}
    with httpx.Client(base_url=manager.url, timeout=120, headers=headers) as http:
        for _ in range(5):
            answer = http.post("/api/v1/attachments", params={"waitSeconds": 40}, json=body)
            if answer.status_code != 202:
                break
    assert answer.status_code == 200 and answer.json()["state"] == "attached", answer.text
    gpu6 = [
        t
        for t in _bind_tasks(emulator)
        if json.loads(t["Payload"]["JsonBody"])["Endpoint"]["@odata.id"].endswith("/gpu6")
    ]
    states = Counter(t["TaskState"] for t in gpu6)
    assert states["Completed"] == 1 and len(gpu6) >= 2, [(t["TaskState"], t.get("Messages")) for t in gpu6]
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        table = http.get("/redfish/v1/Oem/FabricDRA/Bindings").json()["Bindings"]
    assert [b["Target"] for b in table].count("gpu6") == 1, table
