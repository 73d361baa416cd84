"""Conflicting binds over real HTTP: however many arrive at once, one device gets one host."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.emulator import (
    ENDPOINTS,
    ZONES,
    RunningEmulator,
    block_action,
    run_emulator,
    zone_add,
)

HOSTS = ["kind-worker", "kind-worker2", "kind-worker3", "kind-worker4"]


def _contenders(device: str, n: int) -> list[tuple[str, dict[str, Any], str]]:
    """``n`` requests binding ``device``, spread over every host and all PCIe binding styles."""
    requests: list[tuple[str, dict[str, Any], str]] = []
    for i in range(n):
        host = HOSTS[i % len(HOSTS)]
        style = i % 3
        if style == 0:
            uri, body = zone_add(host, device)
        elif style == 1:
            uri, body = block_action(host, device)
        else:
            uri = ZONES
            body = {
                "Links": {
                    "Endpoints": [
                        {"@odata.id": f"{ENDPOINTS}/{host}"},
                        {"@odata.id": f"{ENDPOINTS}/{device}"},
                    ]
                }
            }
        requests.append((uri, body, host))
    return requests


@contextlib.asynccontextmanager
async def _connections(emu: RunningEmulator, n: int) -> AsyncIterator[list[httpx.AsyncClient]]:
    """``n`` clients of one connection each. One client with an ``n``-connection pool would do the
    same on the wire, but httpcore matches every queued request against every pooled connection
    on each change of state: at 100 to 200 connections that was seconds of the test process's CPU."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(emu.async_client(limits=limits)) for _ in range(n)]


async def _race(emu: RunningEmulator, device: str, n: int) -> list[tuple[httpx.Response, str]]:
    async with _connections(emu, n) as clients:
        contenders = _contenders(device, n)
        # open every connection first, so the binds really arrive together
        await asyncio.gather(*(client.get("/redfish/v1/") for client in clients))
        start = asyncio.Event()

        async def one(client: httpx.AsyncClient, uri: str, body: dict[str, Any]) -> httpx.Response:
            await start.wait()
            return await client.post(uri, json=body)

        tasks = [
            asyncio.ensure_future(one(client, uri, body))
            for client, (uri, body, _) in zip(clients, contenders, strict=True)
        ]
        await asyncio.sleep(0)
        start.set()
        responses = await asyncio.gather(*tasks)
    return [(r, host) for r, (_, _, host) in zip(responses, contenders, strict=True)]


def _check_one_winner(results: list[tuple[httpx.Response, str]], emu: RunningEmulator, device: str) -> str:
    statuses = Counter(r.status_code for r, _ in results)
    winners = [(r, host) for r, host in results if r.status_code < 300]
    assert len(winners) == 1, f"expected exactly one winner, got {statuses}"
    losers = [r for r, _ in results if r.status_code >= 300]
    assert all(r.status_code == 409 for r in losers), statuses
    assert {r.json()["error"]["@Message.ExtendedInfo"][0]["MessageId"] for r in losers} == {
        "Base.1.22.ResourceInUse"
    }
    return winners[0][1]


def test_100_concurrent_binds_of_one_device_have_one_winner(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        results = asyncio.run(_race(emu, "gpu0", 100))
        host = _check_one_winner(results, emu, "gpu0")
        table = emu.bindings()
        assert [(b["Target"], b["Host"]) for b in table["Bindings"]] == [("gpu0", host)]
        # no loser left a zone behind: at most the winner's own zone was created
        zones = emu.get(ZONES)["Members"]
        assert len(zones) <= len(HOSTS) + 1
        # the winner's host sees exactly one device; no other host sees any
        for name in HOSTS:
            seen = list((emu.sysfs(name) / "bus" / "pci" / "devices").iterdir())
            assert len(seen) == (1 if name == host else 0), name


def test_concurrent_binds_with_tasks_have_one_winner(tmp_path: Path) -> None:
    profile = tmp_path / "slow-binds.json"
    profile.write_text(json.dumps({"name": "slow-binds", "tasks": True, "bind": {"gpu": {"seconds": 0.5}}}))
    with run_emulator(tmp_path, latency=str(profile)) as emu:
        # The winner's task is held until the table is read: on a loaded machine the 60 requests
        # can take longer than the task's 0.5 s.
        emu.inject({"Kind": "HangTasks", "Target": "gpu4", "Count": 1})
        results = asyncio.run(_race(emu, "gpu4", 60))
        accepted = [(r, h) for r, h in results if r.status_code == 202]
        assert len(accepted) == 1, Counter(r.status_code for r, _ in results)
        assert all(r.status_code == 409 for r, _ in results if r.status_code != 202)
        # while the task runs the device is reserved, not bound
        table = emu.bindings()
        assert table["Bindings"] == []
        assert [(op["Target"], op["Operation"]) for op in table["InFlight"]] == [("gpu4", "bind")]
        emu.reset_faults()  # the held task resumes
        monitor = accepted[0][0].headers["Location"]
        client = emu.client()
        final = client.get(monitor)
        while final.status_code == 202:
            final = client.get(monitor)
        assert final.status_code in (201, 204), final.text
        assert emu.bound_hosts() == {"gpu4": accepted[0][1]}


@pytest.mark.slow
def test_many_devices_many_hosts(tmp_path: Path) -> None:
    """200 concurrent binds over 20 devices and 10 hosts: every device ends with exactly one host."""
    from emulator.topology.generate import GenerateSpec, generate_topology_yaml

    topology = tmp_path / "big.yaml"
    topology.write_text(
        generate_topology_yaml(GenerateSpec(hosts=10, gpus=20, nvme=0, nics=0, fpgas=0, cxl_devices=0))
    )
    hosts = ["kind-worker"] + [f"kind-worker{i}" for i in range(2, 11)]

    async def storm(emu: RunningEmulator) -> list[tuple[int, str, str]]:
        async with _connections(emu, 200) as clients:

            async def bind(i: int) -> tuple[int, str, str]:
                device, host = f"gpu{i % 20}", hosts[(i * 7) % 10]
                uri, body = block_action(host, device) if i % 2 else zone_add(host, device)
                response = await clients[i].post(uri, json=body)
                return response.status_code, device, host

            return await asyncio.gather(*(bind(i) for i in range(200)))

    with run_emulator(tmp_path, topology=topology) as emu:
        results = asyncio.run(storm(emu))
        winners = [(device, host) for status, device, host in results if status < 300]
        assert {status for status, _, _ in results} <= {204, 409}
        assert Counter(device for device, _ in winners) == Counter({f"gpu{i}": 1 for i in range(20)})
        assert emu.bound_hosts() == dict(winners)
