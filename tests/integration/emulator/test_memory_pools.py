"""CXL memory by the GiB, against a real emulator process: chunks carved from a pool's memory domain
(POST to its MemoryChunks), connected to a host, seen by the host, released — and the refusals,
restarts, crashes and races of a fabric that must never hand out more memory than it has."""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from emulator.topology import default_topology_path
from tests.support.emulator import CONNECTIONS, RunningEmulator, run_emulator

pytestmark = pytest.mark.slow(seconds=40)

DOMAIN = "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0"
CHUNKS = f"{DOMAIN}/MemoryChunks"
POOL_MIB = 256 * 1024
GIB = 1 << 30


def _create(client: httpx.Client, mib: int, **extra: Any) -> httpx.Response:
    return client.post(CHUNKS, json={"MemoryChunkSizeMiB": mib, **extra})


def _connect(client: httpx.Client, host: str, chunk: str) -> httpx.Response:
    return client.post(
        CONNECTIONS,
        json={
            "ConnectionType": "Memory",
            "MemoryChunkInfo": [
                {"MemoryChunk": {"@odata.id": chunk}, "AccessCapabilities": ["Read", "Write"]}
            ],
            "Links": {"InitiatorEndpoints": [{"@odata.id": f"/redfish/v1/Fabrics/CXL/Endpoints/{host}"}]},
        },
    )


def _error(response: httpx.Response) -> tuple[str, list[str]]:
    info = response.json()["error"]["@Message.ExtendedInfo"][0]
    return info["MessageId"], info["MessageArgs"]


def _pool(emu: RunningEmulator) -> dict[str, Any]:
    pools: list[dict[str, Any]] = emu.bindings()["Pools"]
    return next(p for p in pools if p["Device"] == "cxlpool0")


def _wait(what: str, check: Any, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"{what} did not happen within {within} s"
        time.sleep(0.02)


def _host_memory(sys_root: Path) -> dict[str, Any]:
    """What a node agent finds of hot-added CXL memory on a host."""
    system = sys_root / "devices" / "system"
    return {
        "regions": sorted(
            p.name for p in (sys_root / "bus" / "cxl" / "devices").iterdir() if "region" in p.name
        ),
        "dax": sorted(p.name for p in (sys_root / "bus" / "dax" / "devices").iterdir()),
        "blocks": sorted(p.name for p in (system / "memory").glob("memory[0-9]*")),
        "nodes": sorted(p.name for p in (system / "node").glob("node[0-9]*")),
        "has_memory": (system / "node" / "has_memory").read_text(),
    }


def test_create_connect_see_release(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        domain = client.get(DOMAIN).json()
        assert domain["AllowsMemoryChunkCreation"] is True
        assert (domain["MinMemoryChunkSizeMiB"], domain["MemoryChunkIncrementMiB"]) == (1024, 1024)
        assert domain["MemorySizeMiB"] == POOL_MIB
        assert "POST" in client.get(CHUNKS).headers["Allow"]

        made = _create(client, 4096, Name="claim 1234")
        assert made.status_code == 201, made.text
        chunk_uri = made.headers["Location"]
        chunk = made.json()
        # the created resource is what a GET answers, with the same ETag
        again = client.get(chunk_uri)
        assert again.json() == chunk and again.headers["ETag"] == made.headers["ETag"]
        assert (chunk["MemoryChunkSizeMiB"], chunk["AddressRangeType"], chunk["Name"]) == (
            4096,
            "Volatile",
            "claim 1234",
        )
        assert chunk_uri in {m["@odata.id"] for m in client.get(CHUNKS).json()["Members"]}
        endpoint = client.get("/redfish/v1/Fabrics/CXL/Endpoints/cxlpool0").json()
        assert {
            "EntityType": "MemoryChunk",
            "EntityRole": "Target",
            "EntityLink": {"@odata.id": chunk_uri},
        } in (endpoint["ConnectedEntities"])
        target = f"cxlpool0-chunk{chunk['Id']}"
        assert _pool(emu)["UsedMiB"] == 4096

        sys_root = emu.sysfs("kind-worker3")
        assert _host_memory(sys_root)["regions"] == []
        connection = _connect(client, "kind-worker3", chunk_uri)
        assert connection.status_code == 201, connection.text
        # the host sees a ram region, its dax device, its memory blocks and a CPU-less node
        seen = _host_memory(sys_root)
        assert seen["regions"] == ["region0"] and seen["dax"] == ["dax0.0"]
        assert len(seen["blocks"]) == 4 and seen["nodes"] == ["node0", "node1", "node2"]
        region = sys_root / "bus" / "cxl" / "devices" / "region0"
        assert (region / "size").read_text() == f"{4 * GIB:#x}\n" and (region / "mode").read_text() == "ram\n"
        dax = sys_root / "bus" / "dax" / "devices" / "dax0.0"
        assert (dax / "size").read_text() == f"{4 * GIB}\n" and (dax / "target_node").read_text() == "2\n"
        node = sys_root / "devices" / "system" / "node" / "node2"
        assert (node / "cpulist").read_text() == "\n"
        assert "MemTotal:              0 kB" in (node / "meminfo").read_text()
        assert (sys_root / "devices" / "system" / "memory" / "block_size_bytes").read_text() == "40000000\n"
        # a node agent onlines the blocks as on a real host; the emulated kernel answers
        for block in seen["blocks"]:
            (sys_root / "devices" / "system" / "memory" / block / "state").write_text("online_movable\n")
        _wait(
            "the blocks onlined",
            lambda: (
                f"MemTotal:        {4 * GIB >> 10} kB" in (node / "meminfo").read_text()
                and _host_memory(sys_root)["has_memory"] == "0-2\n"
            ),
        )
        first = sys_root / "devices" / "system" / "memory" / seen["blocks"][0]
        assert (first / "state").read_text() == "online\n" and (
            first / "valid_zones"
        ).read_text() == "Movable\n"
        assert _host_memory(sys_root)["has_memory"] == "0-2\n"
        assert emu.bound_hosts()[target] == "kind-worker3"

        # release: the connection, then the chunk; the host's memory goes with the connection
        assert client.delete(connection.headers["Location"]).status_code == 204
        gone = _host_memory(sys_root)
        assert (gone["regions"], gone["dax"], gone["blocks"], gone["nodes"]) == (
            [],
            [],
            [],
            ["node0", "node1"],
        )
        assert client.delete(chunk_uri).status_code == 204
        assert client.get(chunk_uri).status_code == 404
        assert _pool(emu)["UsedMiB"] == 0 and target not in emu.bound_hosts()


def test_sizes_alignment_and_exhaustion_are_refused_with_base_messages(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        small = _create(client, 512)
        assert small.status_code == 400
        assert _error(small) == ("Base.1.22.PropertyValueOutOfRange", ["512", "MemoryChunkSizeMiB"])
        odd = _create(client, 1536)
        assert odd.status_code == 400
        # PropertyValueIncorrect takes (property, value): the other order (Base 1.22.1)
        assert _error(odd) == ("Base.1.22.PropertyValueIncorrect", ["MemoryChunkSizeMiB", "1536"])
        assert "1024 and 2048 MiB" in odd.json()["error"]["message"]
        huge = _create(client, POOL_MIB + 1024)
        assert _error(huge)[0] == "Base.1.22.PropertyValueOutOfRange"
        typed = client.post(CHUNKS, json={"MemoryChunkSizeMiB": "4096"})
        assert _error(typed)[0] == "Base.1.22.PropertyValueTypeError"
        assert _error(client.post(CHUNKS, json={}))[0] == "Base.1.22.PropertyMissing"
        pmem = _create(client, 1024, AddressRangeType="PMEM")
        assert _error(pmem) == ("Base.1.22.PropertyValueNotInList", ["PMEM", "AddressRangeType"])
        # nothing was carved by any of those
        assert _pool(emu)["UsedMiB"] == 0

        assert _create(client, 250 * 1024).status_code == 201
        full = _create(client, 8 * 1024)
        assert full.status_code == 409
        assert _error(full) == ("Base.1.22.ResourceExhaustion", [DOMAIN])
        assert "6144 MiB of its 262144 MiB free" in full.json()["error"]["message"]
        assert _create(client, 6 * 1024).status_code == 201  # exactly what is left
        assert _pool(emu)["FreeMiB"] == 0
        # a domain without chunk creation takes no POST, and a pre-made chunk no DELETE
        premade = "/redfish/v1/Chassis/cxlmem0/MemoryDomains/0/MemoryChunks"
        refused = client.post(premade, json={"MemoryChunkSizeMiB": 1024})
        assert refused.status_code == 405 and refused.headers["Allow"] == "GET, HEAD"
        assert (
            client.get("/redfish/v1/Chassis/cxlmem0/MemoryDomains/0").json()["AllowsMemoryChunkCreation"]
            is False
        )
        assert client.delete(f"{premade}/0").status_code == 405


def test_a_connected_chunk_cannot_be_deleted(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        chunk = _create(client, 2048).headers["Location"]
        connection = _connect(client, "kind-worker", chunk)
        assert connection.status_code == 201
        refused = client.delete(chunk)
        assert refused.status_code == 409
        assert _error(refused)[0] == "Base.1.22.ResourceInUse"
        assert "connected to kind-worker through connection" in refused.json()["error"]["message"]
        assert client.get(chunk).status_code == 200
        # a stale ETag is refused like any other change; the current one is taken
        assert client.delete(connection.headers["Location"]).status_code == 204
        assert client.delete(chunk, headers={"If-Match": 'W/"stale"'}).status_code == 412
        assert (
            client.delete(chunk, headers={"If-Match": client.get(chunk).headers["ETag"]}).status_code == 204
        )


def test_chunks_and_connections_survive_restarts_and_kills(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        kept = _create(client, 8192).headers["Location"]
        loose = _create(client, 1024).headers["Location"]
        connection = _connect(client, "kind-worker2", kept).headers["Location"]
        before = _host_memory(emu.sysfs("kind-worker2"))
        assert before["regions"] == ["region0"] and len(before["blocks"]) == 8
        # the node agent onlined one block: the host keeps it online across the fabric's restart
        memory = emu.sysfs("kind-worker2") / "devices" / "system" / "memory"
        (memory / before["blocks"][0] / "state").write_text("online_movable\n")
        _wait("the block onlined", lambda: _host_memory(emu.sysfs("kind-worker2"))["has_memory"] == "0-1\n")
        assert (memory / before["blocks"][0] / "state").read_text() == "online\n"
        before = _host_memory(emu.sysfs("kind-worker2"))
        emu.stop()
        emu.restart()
        client = emu.client()
        assert (memory / before["blocks"][0] / "valid_zones").read_text() == "Movable\n"
        assert (memory / before["blocks"][1] / "state").read_text() == "offline\n"
        assert client.get(kept).json()["MemoryChunkSizeMiB"] == 8192
        assert client.get(loose).status_code == 200
        assert client.get(connection).json()["MemoryChunkInfo"][0]["MemoryChunk"]["@odata.id"] == kept
        assert _host_memory(emu.sysfs("kind-worker2")) == before
        assert _pool(emu)["UsedMiB"] == 9216
        # a new chunk never reuses the Id of one that exists, across restarts
        newer = _create(client, 1024).headers["Location"]
        assert newer not in (kept, loose)
        emu.kill()
        emu.restart()
        client = emu.client()
        assert {m["@odata.id"] for m in client.get(CHUNKS).json()["Members"]} == {kept, loose, newer}
        assert client.delete(loose).status_code == 204
        assert _pool(emu)["UsedMiB"] == 9216


def test_concurrent_creates_never_carve_more_than_the_domain_has(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        # 48 requests of 8 GiB race for 256 GiB: exactly 32 fit
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(lambda _: _create(emu.client(), 8 * 1024).status_code, range(48)))
        assert sorted(set(answers)) == [201, 409]
        assert answers.count(201) == 32
        state = _pool(emu)
        assert state["UsedMiB"] == POOL_MIB and len(state["Chunks"]) == 32
        # and their ranges of the domain never overlap
        ranges = sorted(tuple(e) for c in state["Chunks"] for e in c["Extents"])
        assert all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(ranges))
        assert len(client.get(CHUNKS).json()["Members"]) == 32


def test_events_for_created_and_removed_chunks_and_connections(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        chunk = _create(client, 1024).headers["Location"]
        connection = _connect(client, "kind-worker", chunk).headers["Location"]
        assert client.delete(connection).status_code == 204
        assert client.delete(chunk).status_code == 204
        events: list[tuple[str, str]] = []
        with client.stream(
            "GET", "/redfish/v1/EventService/SSE", headers={"Last-Event-ID": "0"}, timeout=10
        ) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    record = yaml.safe_load(line[6:])["Events"][0]
                    events.append(
                        (record["MessageId"], record.get("OriginOfCondition", {}).get("@odata.id", ""))
                    )
                    if (record["MessageId"], events[-1][1]) == ("ResourceEvent.1.4.ResourceRemoved", chunk):
                        break
        assert ("ResourceEvent.1.4.ResourceCreated", chunk) in events
        assert ("ResourceEvent.1.4.ResourceCreated", connection) in events
        assert ("ResourceEvent.1.4.ResourceRemoved", connection) in events
        assert ("Fabric.1.0.ConnectionCreated", connection) in events


def test_release_sanitizes_as_a_task_and_a_crash_in_it_keeps_the_chunk(tmp_path: Path) -> None:
    with run_emulator(tmp_path, latency="realistic") as emu:
        client = emu.client()
        chunk = _create(client, 2048)
        assert chunk.status_code == 201  # carving is at once; only a release takes time
        uri = chunk.headers["Location"]
        target = f"cxlpool0-chunk{chunk.json()['Id']}"
        release = client.delete(uri)
        assert release.status_code == 202
        monitor = release.headers["Location"]
        # while the memory is sanitized the chunk is there, offline, and still counted
        during = client.get(uri).json()
        assert (during["Status"]["State"], during["RequestedOperationalState"]) == ("Disabled", "Offline")
        assert _pool(emu)["UsedMiB"] == 2048
        assert _error(client.delete(uri))[0] == "Base.1.22.ResourceInUse"
        _wait("the release", lambda: client.get(monitor).status_code == 204)
        assert client.get(uri).status_code == 404 and _pool(emu)["UsedMiB"] == 0

        # a crash when the sanitize is done but not yet recorded: after the restart the chunk is
        # still there (the release never completed) and its task says so
        again = _create(client, 2048).headers["Location"]
        emu.stop()
        emu.restart(crash_at=["emulator.task.before-complete"])
        client = emu.client()
        assert client.delete(again).status_code == 202
        _wait("the crash", lambda: not emu.process.alive())
        emu.restart()
        client = emu.client()
        assert client.get(again).json()["Status"]["State"] == "Enabled"
        tasks = [
            client.get(m["@odata.id"]).json()
            for m in client.get("/redfish/v1/TaskService/Tasks").json()["Members"]
        ]
        interrupted = [t for t in tasks if t["TaskState"] == "Interrupted"]
        assert len(interrupted) == 1 and "was not deleted" in str(interrupted[0]["Messages"])
        assert _pool(emu)["UsedMiB"] == 2048
        assert target not in emu.bound_hosts()


def test_a_service_without_chunk_creation_shows_the_pool_as_one_chunk(tmp_path: Path) -> None:
    data = yaml.safe_load(default_topology_path().read_text())
    data["behaviour"] = {"memoryChunks": "fixed"}
    topology = tmp_path / "fixed.yaml"
    topology.write_text(yaml.safe_dump(data))
    with run_emulator(tmp_path, topology=topology) as emu:
        client = emu.client()
        domain = client.get(DOMAIN).json()
        assert domain["AllowsMemoryChunkCreation"] is False and "MinMemoryChunkSizeMiB" not in domain
        assert client.post(CHUNKS, json={"MemoryChunkSizeMiB": 1024}).status_code == 405
        members = client.get(CHUNKS).json()["Members"]
        assert members == [{"@odata.id": f"{CHUNKS}/0"}]
        whole = client.get(f"{CHUNKS}/0").json()
        assert whole["MemoryChunkSizeMiB"] == POOL_MIB
        # today's whole-chunk binding: connect it, see it, and it cannot be deleted
        assert _connect(client, "kind-worker", f"{CHUNKS}/0").status_code == 201
        assert emu.bound_hosts()["cxlpool0-chunk0"] == "kind-worker"
        assert client.delete(f"{CHUNKS}/0").status_code == 405
