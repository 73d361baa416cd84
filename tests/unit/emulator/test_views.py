"""The resource views and binding rules, driven in process through the ASGI application (the same
code the server runs, without a socket): every view agrees with the binding table, requests that
can never work are refused with the property named."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.latency import INSTANT
from emulator.redfish.service.server import ServeConfig, build_service
from emulator.redfish.tree.auth import Credentials
from emulator.redfish.tree.expand import Select
from emulator.topology import default_topology_path, parse_topology
from tests.support.emulator import (
    BLOCKS,
    CONNECTIONS,
    ENDPOINTS,
    ZONES,
    block_action,
    connection_body,
    zone_add,
)

Client = httpx.AsyncClient


def _topology(cabling: dict[str, list[str]] | None = None) -> Any:
    data = yaml.safe_load(default_topology_path().read_text())
    for switch in data["pcie"]["switches"] + data["cxl"]["switches"]:
        if cabling and switch["id"] in cabling:
            switch["hosts"] = cabling[switch["id"]]
    return parse_topology(data)


def _run(
    tmp_path: Path, body: Callable[[Client], Awaitable[None]], cabling: dict[str, list[str]] | None = None
) -> None:
    async def main() -> None:
        service = build_service(
            ServeConfig(
                index=_topology(cabling),
                state_dir=tmp_path / "state",
                latency=INSTANT,
                credentials=Credentials(username="admin", password="secret-password"),
            )
        )
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://emulator", auth=("admin", "secret-password")
        ) as client:
            await body(client)
        service.engine.close()

    asyncio.run(main())


async def _json(client: Client, uri: str) -> dict[str, Any]:
    response = await client.get(uri)
    assert response.status_code == 200, (uri, response.text)
    data: dict[str, Any] = response.json()
    return data


def _error(response: httpx.Response) -> tuple[str, str]:
    error = response.json()["error"]
    return error["code"], error["message"]


def test_every_view_agrees_with_one_binding(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        uri, request = zone_add("kind-worker2", "gpu4")
        assert (await client.post(uri, json=request)).status_code == 204
        block = await _json(client, f"{BLOCKS}/gpu4")
        assert block["CompositionStatus"]["CompositionState"] == "Composed"
        assert block["Links"]["ComputerSystems"] == [{"@odata.id": "/redfish/v1/Systems/kind-worker2"}]
        system = await _json(client, "/redfish/v1/Systems/kind-worker2")
        assert {"@odata.id": f"{BLOCKS}/gpu4"} in system["Links"]["ResourceBlocks"]
        assert {"@odata.id": "/redfish/v1/Chassis/switch1/PCIeDevices/gpu4"} in system["PCIeDevices"]
        assert system["ProcessorSummary"]["Count"] == 2
        processor = await _json(client, "/redfish/v1/Systems/kind-worker2/Processors/gpu4")
        assert processor["ProcessorType"] == "GPU" and processor["Model"] == "NVIDIA L40S"
        endpoint = await _json(client, f"{ENDPOINTS}/gpu4")
        assert endpoint["Links"]["Zones"] == [{"@odata.id": f"{ZONES}/kind-worker2"}]
        zone = await _json(client, f"{ZONES}/kind-worker2")
        assert zone["Links"]["InvolvedSwitches"] == [
            {"@odata.id": "/redfish/v1/Fabrics/PCIe/Switches/switch1"}
        ]
        # unbinding through the other style empties every view again
        uri, request = block_action("kind-worker2", "gpu4", "RemoveResourceBlock")
        assert (await client.post(uri, json=request)).status_code == 204
        assert (await _json(client, f"{ENDPOINTS}/gpu4"))["Links"]["Zones"] == []
        assert (await client.get("/redfish/v1/Systems/kind-worker2/Processors/gpu4")).status_code == 404

    _run(tmp_path, body)


def test_chunks_of_one_device_go_to_different_hosts(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        first = await client.post(CONNECTIONS, json=connection_body("kind-worker", "cxlmem1", 0, 1))
        second = await client.post(CONNECTIONS, json=connection_body("kind-worker3", "cxlmem1", 2))
        assert first.status_code == second.status_code == 201
        again = await client.post(CONNECTIONS, json=connection_body("kind-worker4", "cxlmem1", 1))
        assert again.status_code == 409 and _error(again)[0] == "Base.1.22.ResourceInUse"
        endpoint = await _json(client, "/redfish/v1/Fabrics/CXL/Endpoints/cxlmem1")
        assert len(endpoint["Links"]["Connections"]) == 2
        domain = await _json(client, "/redfish/v1/Systems/kind-worker/MemoryDomains/CXL")
        assert domain["MemorySizeMiB"] == 2 * 16 * 1024
        chunks = await _json(client, "/redfish/v1/Systems/kind-worker/MemoryDomains/CXL/MemoryChunks")
        assert [m["@odata.id"].rsplit("/", 1)[-1] for m in chunks["Members"]] == [
            "cxlmem1-chunk0",
            "cxlmem1-chunk1",
        ]
        host_initiator = await _json(client, "/redfish/v1/Fabrics/CXL/Endpoints/kind-worker3")
        assert host_initiator["Links"]["Connections"] == [{"@odata.id": second.headers["Location"]}]
        assert (await client.delete(first.headers["Location"])).status_code == 204
        assert (await _json(client, "/redfish/v1/Systems/kind-worker/MemoryDomains/CXL"))[
            "MemorySizeMiB"
        ] == 0

    _run(tmp_path, body)


def test_unreachable_hosts_and_bad_links_are_refused(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        uri, request = zone_add("kind-worker", "gpu4")
        refused = await client.post(uri, json=request)
        assert refused.status_code == 400
        assert _error(refused) == (
            "Base.1.22.ActionParameterValueError",
            "gpu4 hangs off switch1, which is not cabled to kind-worker.",
        )
        uri, request = block_action("kind-worker", "gpu4")
        assert (await client.post(uri, json=request)).status_code == 400
        zones = await _json(client, ZONES)
        assert f"{ZONES}/kind-worker" in {m["@odata.id"] for m in zones["Members"]}
        # a zone whose endpoints are two hosts, or a target of the other fabric
        two_hosts = {
            "Links": {
                "Endpoints": [
                    {"@odata.id": f"{ENDPOINTS}/kind-worker3"},
                    {"@odata.id": f"{ENDPOINTS}/kind-worker4"},
                ]
            }
        }
        assert (await client.post(ZONES, json=two_hosts)).status_code == 400
        cxl_target = {
            "Links": {
                "Endpoints": [
                    {"@odata.id": f"{ENDPOINTS}/kind-worker3"},
                    {"@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/cxlmem0"},
                ]
            }
        }
        wrong_fabric = await client.post(ZONES, json=cxl_target)
        assert wrong_fabric.status_code == 400 and _error(wrong_fabric)[0] == "Base.1.22.ResourceNotFound"
        # connections: the initiator must be a host, the chunk must exist, no chunk twice
        as_target = connection_body("kind-worker", "cxlmem0", 0)
        as_target["Links"]["InitiatorEndpoints"] = [
            {"@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/cxlmem0"}
        ]
        assert (await client.post(CONNECTIONS, json=as_target)).status_code == 400
        no_chunk = connection_body("kind-worker", "cxlmem0", 9)
        assert _error(await client.post(CONNECTIONS, json=no_chunk))[0] == "Base.1.22.ResourceNotFound"
        twice = connection_body("kind-worker", "cxlmem0", 1, 1)
        assert "listed twice" in _error(await client.post(CONNECTIONS, json=twice))[1]
        bad_access = connection_body("kind-worker", "cxlmem0", 1)
        bad_access["MemoryChunkInfo"][0]["AccessCapabilities"] = ["Execute"]
        assert (
            _error(await client.post(CONNECTIONS, json=bad_access))[0] == "Base.1.22.PropertyValueNotInList"
        )
        # removing what is not there
        uri, request = block_action("kind-worker3", "gpu0", "RemoveResourceBlock")
        assert "not composed into kind-worker3" in _error(await client.post(uri, json=request))[1]
        remove = await client.post(
            f"{ZONES}/kind-worker3/Actions/Zone.RemoveEndpoint",
            json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/gpu0"}},
        )
        assert "not in zone kind-worker3" in _error(remove)[1]
        as_host = await client.post(
            f"{ZONES}/kind-worker3/Actions/Zone.AddEndpoint",
            json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/kind-worker4"}},
        )
        assert as_host.status_code == 400 and "host initiator" in _error(as_host)[1]

    _run(tmp_path, body, cabling={"switch1": ["kind-worker3", "kind-worker4"]})


def test_client_zones_lifecycle(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        empty = await client.post(
            ZONES,
            json={"Name": "staging", "Links": {"Endpoints": [{"@odata.id": f"{ENDPOINTS}/kind-worker"}]}},
        )
        assert empty.status_code == 201
        location = empty.headers["Location"]
        zone_id = location.rsplit("/", 1)[-1]
        assert empty.json()["Name"] == "staging"
        add = f"{location}/Actions/Zone.AddEndpoint"
        for device in ("gpu0", "gpu1"):
            assert (
                await client.post(add, json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/{device}"}})
            ).status_code == 204
        for device in ("gpu0", "gpu1"):
            zones = (await _json(client, f"{ENDPOINTS}/{device}"))["Links"]["Zones"]
            assert zones == [{"@odata.id": location}]
        host = await _json(client, f"{ENDPOINTS}/kind-worker")
        assert {"@odata.id": location} in host["Links"]["Zones"]
        assert (await client.delete(location)).status_code == 204
        assert (await client.get(location)).status_code == 404
        assert (await _json(client, f"{ENDPOINTS}/gpu0"))["Links"]["Zones"] == []
        assert zone_id not in {
            m["@odata.id"].rsplit("/", 1)[-1] for m in (await _json(client, ZONES))["Members"]
        }

    _run(tmp_path, body)


def test_path_segments_that_are_no_resources_are_not_found(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        for uri in (
            "/redfish/v1/TaskService/TaskMonitors",
            "/redfish/v1/Oem",
            "/redfish/v1/Systems/kind-worker/Actions",
            "/redfish/v1/CompositionService/ResourceBlocks/nic0/NetworkInterfaces",
            "/redfish/v1/Fabrics/PCIe/Connections",
            "/redfish/v1/Fabrics/CXL/Zones",
        ):
            response = await client.get(uri)
            assert response.status_code == 404, uri
            assert _error(response)[0] == "Base.1.22.ResourceNotFound"
        stream = await client.head("/redfish/v1/EventService/SSE")
        assert stream.status_code == 200 and stream.content == b""

    _run(tmp_path, body)


def test_a_zone_with_an_operation_in_flight_is_not_deleted(tmp_path: Path) -> None:
    async def body(client: Client) -> None:
        zone = await client.post(
            ZONES, json={"Links": {"Endpoints": [{"@odata.id": f"{ENDPOINTS}/kind-worker"}]}}
        )
        location = zone.headers["Location"]
        fault = await client.post(
            "/redfish/v1/Oem/FabricDRA/Faults", json={"Kind": "HangTasks", "Target": "gpu2"}
        )
        assert fault.status_code == 201
        adding = await client.post(
            f"{location}/Actions/Zone.AddEndpoint", json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/gpu2"}}
        )
        assert adding.status_code == 202
        refused = await client.delete(location)
        assert refused.status_code == 409 and "operations in progress (gpu2)" in _error(refused)[1]
        resumed = await client.delete("/redfish/v1/Oem/FabricDRA/Faults")
        assert resumed.json() == {"Removed": 0, "ResumedTasks": 1}
        monitor = adding.headers["Location"]
        final = await client.get(monitor)
        while final.status_code == 202:
            await asyncio.sleep(0.01)
            final = await client.get(monitor)
        assert final.status_code == 204
        assert (await client.delete(location)).status_code == 204
        bindings = await _json(client, "/redfish/v1/Oem/FabricDRA/Bindings")
        assert bindings["Bindings"] == [] and bindings["InFlight"] == []

    _run(tmp_path, body)


def test_task_times_have_milliseconds(tmp_path: Path) -> None:
    """StartTime/EndTime of a task say when it ran to the millisecond (benchmarks subtract the
    fabric's own time from attach-to-ready with them)."""
    from datetime import datetime

    from emulator.redfish.model.latency import Delay, LatencyProfile

    profile = LatencyProfile(name="tasks", tasks=True, bind={"gpu": Delay(seconds=0.02)})

    async def main() -> None:
        service = build_service(
            ServeConfig(index=_topology(), state_dir=tmp_path / "state", latency=profile, credentials=None)
        )
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as client:
            uri, body = zone_add("kind-worker", "gpu0")
            accepted = await client.post(uri, json=body)
            assert accepted.status_code == 202
            task_uri = accepted.json()["@odata.id"]
            for _ in range(500):  # until the monitor gives the final answer
                if (await client.get(accepted.headers["Location"])).status_code != 202:
                    break
                await asyncio.sleep(0.01)
            task = await _json(client, task_uri)
        service.engine.close()
        assert task["TaskState"] == "Completed"
        start, end = task["StartTime"], task["EndTime"]
        assert start.endswith("Z") and end.endswith("Z")
        assert len(start.split(".")[1]) == len("123Z"), start  # whole milliseconds
        assert datetime.fromisoformat(end) >= datetime.fromisoformat(start)

    asyncio.run(main())


def test_select_keeps_what_it_names_and_the_annotations() -> None:
    """``$select`` (emulator.redfish.tree.expand.Select): named properties and ``/`` paths, every
    ``@odata`` annotation; on a collection, each inlined member is selected and the collection
    keeps its Members."""
    zone = {
        "@odata.id": "/z/1",
        "@odata.type": "#Zone.v1_6_3.Zone",
        "@odata.etag": 'W/"1"',
        "Id": "1",
        "Name": "one",
        "Links": {"Endpoints": [{"@odata.id": "/e/1"}], "InvolvedSwitches": []},
    }
    assert Select.parse("Id").apply(zone) == {
        k: zone[k] for k in ("@odata.id", "@odata.type", "@odata.etag", "Id")
    }
    picked = Select.parse("Name,Links/Endpoints").apply(zone)
    assert picked["Links"] == {"Endpoints": [{"@odata.id": "/e/1"}]} and picked["Name"] == "one"
    assert Select.parse("Links,Links/Endpoints").apply(zone)["Links"] == zone["Links"]
    collection = {
        "@odata.id": "/z",
        "Name": "zones",
        "Members@odata.count": 2,
        "Members": [zone, {"@odata.id": "/z/2"}],
    }
    listed = Select.parse("Id").apply(collection)
    assert set(listed) == {"@odata.id", "Members@odata.count", "Members"}
    assert listed["Members"] == [Select.parse("Id").apply(zone), {"@odata.id": "/z/2"}]
    with pytest.raises(RedfishError):
        Select.parse("Id;Name")


def _small_pool(tmp_path: Path, body: Callable[[Client], Awaitable[None]]) -> None:
    """``_run`` against the default topology with the pool cut to 8 GiB (chunks of 1 GiB and up)."""
    data = yaml.safe_load(default_topology_path().read_text())
    data["models"]["cxl-256g"]["memory"] = "8GiB"

    async def main() -> None:
        service = build_service(
            ServeConfig(
                index=parse_topology(data),
                state_dir=tmp_path / "state",
                latency=INSTANT,
                credentials=Credentials(username="admin", password="secret-password"),
            )
        )
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://emulator", auth=("admin", "secret-password")
        ) as client:
            await body(client)
        service.engine.close()

    asyncio.run(main())


def test_a_pool_hands_out_its_free_memory_even_when_it_is_in_pieces(tmp_path: Path) -> None:
    """The domain counts its free memory by the total: a chunk may be made of several ranges (as a
    CXL dynamic-capacity device hands out extents), so 3 GiB free in three holes is 3 GiB."""
    chunks = "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0/MemoryChunks"

    async def body(client: Client) -> None:
        made = [
            (await client.post(chunks, json={"MemoryChunkSizeMiB": 1024})).headers["Location"]
            for _ in range(8)
        ]
        assert (await client.post(chunks, json={"MemoryChunkSizeMiB": 1024})).status_code == 409
        for uri in made[1::2][:3]:  # holes at 1, 3 and 5 GiB
            assert (await client.delete(uri)).status_code == 204
        spread = await client.post(chunks, json={"MemoryChunkSizeMiB": 3072})
        assert spread.status_code == 201, spread.text
        assert spread.json()["AddressRangeOffsetMiB"] == 1024  # its first range
        pools = (await _json(client, "/redfish/v1/Oem/FabricDRA/Bindings"))["Pools"]
        extents = next(c["Extents"] for c in pools[0]["Chunks"] if c["SizeMiB"] == 3072)
        assert extents == [[1024, 1024], [3072, 1024], [5120, 1024]]
        assert pools[0]["FreeMiB"] == 0
        domain = await _json(client, "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0")
        assert "8192 MiB: 8192 MiB in 6 chunks, 0 MiB free" in domain["Description"]

    _small_pool(tmp_path, body)


def test_concurrent_creates_in_one_event_loop_never_over_carve(tmp_path: Path) -> None:
    chunks = "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0/MemoryChunks"

    async def body(client: Client) -> None:
        answers = await asyncio.gather(
            *(client.post(chunks, json={"MemoryChunkSizeMiB": 3072}) for _ in range(10))
        )
        assert sorted(a.status_code for a in answers) == [201, 201] + [409] * 8
        listed = await _json(client, chunks)
        assert listed["Members@odata.count"] == 2

    _small_pool(tmp_path, body)


def test_pool_domain_chunk_and_connection_have_the_schemas_shapes(tmp_path: Path) -> None:
    """The bodies a client reads, against bodies written by hand from DMTF's CSDL (MemoryDomain
    v1_5_1: AllowsMemoryChunkCreation, MinMemoryChunkSizeMiB, MemoryChunkIncrementMiB,
    MemorySizeMiB v1_5_0; MemoryChunks v1_6_2: AddressRangeType Redfish.Required,
    RequestedOperationalState and Links.CXLLogicalDevices v1_5_0; Connection v1_4_0:
    MemoryChunkInfo v1_1_0), not from a mockup."""
    chassis = "/redfish/v1/Chassis/cxlpool0"
    logical = f"{chassis}/PCIeDevices/cxlpool0/CXLLogicalDevices/0"

    def plain(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in ("@odata.etag", "Description")}

    async def body(client: Client) -> None:
        made = await client.post(f"{chassis}/MemoryDomains/0/MemoryChunks", json={"MemoryChunkSizeMiB": 2048})
        chunk = made.headers["Location"]
        ident = chunk.rsplit("/", 1)[-1]
        connected = await client.post(
            CONNECTIONS, json=connection_body("kind-worker2", "cxlpool0", int(ident))
        )
        assert connected.status_code == 201, connected.text
        assert plain(await _json(client, f"{chassis}/MemoryDomains/0")) == {
            "@odata.type": "#MemoryDomain.v1_5_1.MemoryDomain",
            "@odata.id": f"{chassis}/MemoryDomains/0",
            "Id": "0",
            "Name": "Memory of cxlpool0",
            "Status": {"State": "Enabled", "Health": "OK"},
            "MemoryChunks": {"@odata.id": f"{chassis}/MemoryDomains/0/MemoryChunks"},
            "AllowsMemoryChunkCreation": True,
            "MinMemoryChunkSizeMiB": 1024,
            "MemoryChunkIncrementMiB": 1024,
            "MemorySizeMiB": 262144,
            "Links": {
                "CXLLogicalDevices": [{"@odata.id": logical}],
                "PCIeFunctions": [{"@odata.id": f"{chassis}/PCIeDevices/cxlpool0/PCIeFunctions/0"}],
            },
        }
        assert plain(await _json(client, chunk)) == {
            "@odata.type": "#MemoryChunks.v1_6_2.MemoryChunks",
            "@odata.id": chunk,
            "Id": ident,
            "Name": f"cxlpool0-chunk{ident}",
            "Status": {"State": "Enabled", "Health": "OK"},
            "MemoryChunkSizeMiB": 2048,
            "AddressRangeOffsetMiB": 0,
            "AddressRangeType": "Volatile",
            "MediaLocation": "Local",
            "RequestedOperationalState": "Online",
            "Links": {
                "CXLLogicalDevices": [{"@odata.id": logical}],
                "Endpoints": [{"@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/cxlpool0"}],
            },
        }
        connection = connected.headers["Location"]
        assert plain(await _json(client, connection)) == {
            "@odata.type": "#Connection.v1_4_0.Connection",
            "@odata.id": connection,
            "Id": connection.rsplit("/", 1)[-1],
            "Name": f"Connection {connection.rsplit('/', 1)[-1]} to kind-worker2",
            "ConnectionType": "Memory",
            "Status": {"State": "Enabled", "Health": "OK"},
            "MemoryChunkInfo": [
                {
                    "AccessCapabilities": ["Read", "Write"],
                    "AccessState": "Optimized",
                    "MemoryChunk": {"@odata.id": chunk},
                }
            ],
            "Links": {
                "InitiatorEndpoints": [{"@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/kind-worker2"}],
                "TargetEndpoints": [{"@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/cxlpool0"}],
            },
        }

    _run(tmp_path, body)
