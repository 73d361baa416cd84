"""``kill -9`` of the emulator process, then a restart on the same state directory: every device
is bound or not — never half — the interrupted tasks say so, and each host's sysfs view agrees."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import httpx

from emulator.redfish.model.state import StateStore
from tests.support.emulator import (
    CONNECTIONS,
    ENDPOINTS,
    ZONES,
    RunningEmulator,
    block_action,
    connection_body,
    run_emulator,
    zone_add,
    zone_remove,
)


def _sysfs_view(emu: RunningEmulator) -> dict[str, set[str]]:
    """Per host, the entries a node agent would find (PCI BDFs, CXL memdevs/regions)."""
    view: dict[str, set[str]] = {}
    for host_dir in sorted((emu.state_dir / "hosts").iterdir()):
        sys_root = host_dir / "sys"
        entries = {f"pci:{p.name}" for p in (sys_root / "bus" / "pci" / "devices").iterdir()}
        entries |= {f"cxl:{p.name}" for p in (sys_root / "bus" / "cxl" / "devices").iterdir()}
        for entry in (sys_root / "bus" / "pci" / "devices").iterdir():
            assert (entry / "vendor").read_text().startswith("0x"), f"{entry} is incomplete"
        view[host_dir.name] = entries
    return view


def _expected_entries(table: dict[str, Any]) -> dict[str, set[str]]:
    expected: dict[str, set[str]] = {}
    for b in table["Bindings"]:
        if not b["VisibleToHost"]:
            continue
        entries = expected.setdefault(b["Host"], set())
        address = b["HostAddress"]
        if "bdf" in address:
            entries.add(f"pci:{address['bdf']}")
        else:
            entries |= {f"cxl:mem{address['memdev']}", f"cxl:region{address['region']}"}
    return expected


def _assert_views_match_state(emu: RunningEmulator) -> None:
    table = emu.bindings()
    expected = _expected_entries(table)
    for host, entries in _sysfs_view(emu).items():
        assert entries == expected.get(host, set()), host


def test_bindings_survive_kill_9(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        for uri, body in (zone_add("kind-worker", "gpu0"), block_action("kind-worker2", "nvme0")):
            assert client.post(uri, json=body).status_code == 204
        zone = client.post(
            ZONES,
            json={
                "Links": {
                    "Endpoints": [
                        {"@odata.id": f"{ENDPOINTS}/kind-worker3"},
                        {"@odata.id": f"{ENDPOINTS}/gpu4"},
                    ]
                }
            },
        )
        assert zone.status_code == 201
        connection = client.post(CONNECTIONS, json=connection_body("kind-worker4", "cxlmem0", 0, 1))
        assert connection.status_code == 201
        before = emu.bindings()["Bindings"]
        zone_etag = client.get(zone.headers["Location"]).headers["ETag"]
        views = _sysfs_view(emu)
        password = emu.password

        emu.kill()
        emu.restart()

        assert emu.password == password, "the generated credentials survive a restart"
        assert emu.bindings()["Bindings"] == before
        client = emu.client()
        assert client.get(zone.headers["Location"]).headers["ETag"] == zone_etag
        assert client.get(connection.headers["Location"]).status_code == 200
        assert _sysfs_view(emu) == views
        _assert_views_match_state(emu)
        # and the fabric works on: unbind what survived
        uri, body = zone_remove("kind-worker", "gpu0")
        assert client.post(uri, json=body).status_code == 204
        assert client.delete(connection.headers["Location"]).status_code == 204
        assert set(emu.bound_hosts()) == {"nvme0", "gpu4"}


def test_kill_9_during_a_realistic_gpu_hot_add(tmp_path: Path) -> None:
    with run_emulator(tmp_path, latency="realistic") as emu:
        client = emu.client()
        uri, body = zone_add("kind-worker", "gpu1")
        accepted = client.post(uri, json=body)
        assert accepted.status_code == 202, accepted.text
        assert accepted.headers["Retry-After"].isdigit()
        monitor = accepted.headers["Location"]
        task = accepted.json()
        assert task["TaskState"] == "Running"
        # a GPU hot-add takes 2-4 s in the realistic profile: this lands in the middle of it
        emu.kill()
        emu.restart()

        client = emu.client()
        table = emu.bindings()
        assert table["Bindings"] == [] and table["InFlight"] == []
        interrupted = client.get(task["@odata.id"]).json()
        assert interrupted["TaskState"] == "Interrupted"
        assert interrupted["TaskStatus"] == "Critical"
        assert "gpu1 was not bound to kind-worker" in json.dumps(interrupted["Messages"])
        final = client.get(monitor)
        assert final.status_code == 503
        assert (
            final.json()["error"]["@Message.ExtendedInfo"][0]["MessageId"] == "Base.1.22.ServiceShuttingDown"
        )
        assert not any((emu.sysfs("kind-worker") / "bus" / "pci" / "devices").iterdir())
        # the device is free: binding it again works and completes
        again = client.post(uri, json=body)
        assert again.status_code == 202
        result = client.get(again.headers["Location"])
        while result.status_code == 202:
            result = client.get(again.headers["Location"])
        assert result.status_code == 204
        assert emu.bound_hosts() == {"gpu1": "kind-worker"}
        assert int(again.json()["Id"]) > int(task["Id"]), "task Ids are never reused"


def test_kill_9_during_an_unbind_task_leaves_the_device_bound(tmp_path: Path) -> None:
    profile = tmp_path / "slow-unbinds.json"
    profile.write_text(
        json.dumps({"name": "slow-unbinds", "tasks": True, "unbind": {"nvme": {"seconds": 120}}})
    )
    with run_emulator(tmp_path, latency=str(profile)) as emu:
        client = emu.client()
        uri, body = block_action("kind-worker3", "nvme1")
        bound = client.post(uri, json=body)
        result = client.get(bound.headers["Location"])
        while result.status_code == 202:
            result = client.get(bound.headers["Location"])
        assert result.status_code == 204
        uri, body = block_action("kind-worker3", "nvme1", "RemoveResourceBlock")
        unbinding = client.post(uri, json=body)
        assert unbinding.status_code == 202
        assert emu.bindings()["InFlight"][0]["Operation"] == "unbind"

        emu.kill()
        emu.restart()

        assert emu.bound_hosts() == {"nvme1": "kind-worker3"}
        task = emu.client().get(unbinding.json()["@odata.id"]).json()
        assert task["TaskState"] == "Interrupted"
        assert "nvme1 is still bound to kind-worker3" in json.dumps(task["Messages"])
        nvme = list((emu.sysfs("kind-worker3") / "class" / "nvme").iterdir())
        assert [p.name for p in nvme] == ["nvme0"]
        _assert_views_match_state(emu)


def test_kill_9_under_load_leaves_a_consistent_fabric(tmp_path: Path) -> None:
    """Kill the emulator while binds and unbinds stream in; afterwards state and views agree."""
    devices = ["gpu0", "gpu1", "gpu2", "gpu3", "nvme0", "nic0", "gpu4", "gpu5", "nvme1", "fpga0"]
    hosts = ["kind-worker", "kind-worker2", "kind-worker3", "kind-worker4"]
    rng = random.Random(7)

    answered = 0
    enough = asyncio.Event()

    async def churn(emu: RunningEmulator) -> None:
        nonlocal answered
        async with emu.async_client() as client:
            while True:
                device, host = rng.choice(devices), rng.choice(hosts)
                uri, body = block_action(
                    host, device, rng.choice(["AddResourceBlock", "RemoveResourceBlock"])
                )
                try:
                    await client.post(uri, json=body)
                except httpx.HTTPError:
                    return  # the emulator is gone
                answered += 1
                if answered >= 150:
                    enough.set()

    async def run(emu: RunningEmulator) -> int:
        workers = [asyncio.ensure_future(churn(emu)) for _ in range(8)]
        await enough.wait()
        emu.kill()  # with 8 requests in flight
        await asyncio.gather(*workers)
        return answered

    with run_emulator(tmp_path) as emu:
        requests = asyncio.run(run(emu))
        assert requests > 10
        # what the killed process left on disk: its snapshot and the journal after it
        state = StateStore(emu.state_dir).load()
        emu.restart()
        table = emu.bindings()
        assert {b["Target"]: b["Host"] for b in table["Bindings"]} == {
            t: b.host for t, b in state.bindings.items()
        }
        assert table["InFlight"] == []
        _assert_views_match_state(emu)
