"""The EventService's Server-Sent Events stream, read over real HTTP while the fabric changes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.emulator import (
    RunningEmulator,
    block_action,
    connection_body,
    run_emulator,
    zone_add,
    zone_remove,
)

SSE = "/redfish/v1/EventService/SSE"


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with run_emulator(tmp_path_factory.mktemp("events")) as running:
        yield running


async def _collect(
    emu: RunningEmulator,
    until: str,
    *,
    origin: str | None = None,
    params: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    action: Any = None,
) -> list[tuple[int, dict[str, Any]]]:
    """Events of one stream until one with MessageId ending in ``until`` (from ``origin``) arrives."""
    events: list[tuple[int, dict[str, Any]]] = []
    async with (
        emu.async_client() as client,
        client.stream("GET", SSE, params=params, headers=headers) as stream,
    ):
        assert stream.status_code == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        if action is not None:
            await action()
        event_id = None
        async for line in stream.aiter_lines():
            if line.startswith("id: "):
                event_id = int(line[4:])
            elif line.startswith("data: "):
                payload = json.loads(line[6:])
                assert event_id is not None
                events.append((event_id, payload))
                record = payload["Events"][0]
                if record["MessageId"].endswith(until) and (
                    origin is None or record.get("OriginOfCondition", {}).get("@odata.id") == origin
                ):
                    return events
    return events


def _ids(events: list[tuple[int, dict[str, Any]]]) -> list[str]:
    return [p["Events"][0]["MessageId"] for _, p in events]


def test_a_bind_is_announced(emu: RunningEmulator) -> None:
    async def bind() -> None:
        async with emu.async_client() as client:
            uri, body = zone_add("kind-worker", "gpu0")
            assert (await client.post(uri, json=body)).status_code == 204

    events = asyncio.run(
        asyncio.wait_for(
            _collect(emu, "ResourceChanged", origin="/redfish/v1/Systems/kind-worker", action=bind), 30
        )
    )
    ids = _ids(events)
    assert "Fabric.1.0.ZoneModified" in ids
    assert "Composition.1.1.ResourceBlockCompositionStateChanged" in ids
    origins = {p["Events"][0].get("OriginOfCondition", {}).get("@odata.id") for _, p in events}
    assert "/redfish/v1/Fabrics/PCIe/Endpoints/gpu0" in origins
    assert all(p["@odata.type"] == "#Event.v1_13_0.Event" for _, p in events)
    seqs = [seq for seq, _ in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_filter_and_replay_with_last_event_id(emu: RunningEmulator) -> None:
    client = emu.client()
    last = emu.get("/redfish/v1/Oem/FabricDRA/Bindings")["StateVersion"]
    assert last > 0
    # remember where the stream is, then make a change nobody is listening to
    before = asyncio.run(
        asyncio.wait_for(
            _collect(
                emu,
                "ConnectionCreated",
                action=lambda: asyncio.to_thread(
                    client.post,
                    "/redfish/v1/Fabrics/CXL/Connections",
                    json=connection_body("kind-worker2", "cxlmem1", 0),
                ),
            ),
            30,
        )
    )
    mark = before[-1][0]
    uri, body = block_action("kind-worker3", "nvme1")
    assert client.post(uri, json=body, headers={"Prefer": "respond-async"}).status_code == 202
    # a client that reconnects with Last-Event-ID gets what it missed, filtered
    replayed = asyncio.run(
        asyncio.wait_for(
            _collect(
                emu,
                "TaskCompletedOK",
                params={"$filter": "RegistryPrefix eq 'TaskEvent'"},
                headers={"Last-Event-ID": str(mark)},
            ),
            30,
        )
    )
    assert replayed and all(seq > mark for seq, _ in replayed)
    assert {i.split(".")[0] for i in _ids(replayed)} == {"TaskEvent"}
    assert "TaskEvent.1.0.TaskStarted" in _ids(replayed)


def test_a_bad_filter_is_refused(emu: RunningEmulator) -> None:
    response = emu.client().get(SSE, params={"$filter": "Color eq 'red'"})
    assert response.status_code == 400
    assert "Color" in response.json()["error"]["message"]


def test_health_changes_are_events(emu: RunningEmulator) -> None:
    async def sick() -> None:
        await asyncio.to_thread(emu.inject, {"Kind": "DeviceHealth", "Device": "gpu3", "Health": "Critical"})

    events = asyncio.run(asyncio.wait_for(_collect(emu, "ResourceStatusChangedCritical", action=sick), 30))
    record = events[-1][1]["Events"][0]
    assert record["MessageArgs"] == ["gpu3", "Critical"]
    assert record["OriginOfCondition"]["@odata.id"] == "/redfish/v1/Chassis/switch0/PCIeDevices/gpu3"
    emu.reset_faults()


def test_events_of_concurrent_changes_come_each_once_in_order_without_gaps(emu: RunningEmulator) -> None:
    """Events already queued when the stream sends go out together; none may be lost, repeated or
    reordered — every event of the bus, numbered consecutively, in an unfiltered stream."""
    pairs = [
        ("kind-worker", "gpu4"),
        ("kind-worker2", "gpu5"),
        ("kind-worker3", "gpu6"),
        ("kind-worker4", "gpu7"),
    ]

    async def changes() -> None:
        async with emu.async_client() as client:
            for build in (zone_add, zone_remove):
                answers = await asyncio.gather(
                    *(client.post(build(h, d)[0], json=build(h, d)[1]) for h, d in pairs)
                )
                assert [a.status_code for a in answers] == [204] * len(pairs)

    async def collect() -> list[tuple[int, dict[str, Any]]]:
        events: list[tuple[int, dict[str, Any]]] = []
        async with emu.async_client() as client, client.stream("GET", SSE) as stream:
            assert stream.status_code == 200
            acting = asyncio.ensure_future(changes())
            event_id = None
            async for line in stream.aiter_lines():
                if line.startswith("id: "):
                    event_id = int(line[4:])
                elif line.startswith("data: "):
                    assert event_id is not None
                    events.append((event_id, json.loads(line[6:])))
                    if _ids(events).count("Fabric.1.0.ZoneModified") == 2 * len(pairs):
                        break
            await acting
        return events

    events = asyncio.run(asyncio.wait_for(collect(), 60))
    seqs = [seq for seq, _ in events]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    assert [int(p["Id"]) for _, p in events] == seqs
