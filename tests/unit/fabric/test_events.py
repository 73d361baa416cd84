"""The SSE follower against a real HTTP server: filters, refused filters, reconnects."""

from __future__ import annotations

import asyncio
import json

from fabric.redfish import RedfishClient, RedfishSettings
from fabric.redfish.events import EventStream
from tests.support.fabric_http import Reply, Request, ScriptedServer


def event_payload(n: int) -> str:
    body = {
        "Events": [{"MessageId": "Fabric.1.0.ZoneModified", "OriginOfCondition": {"@odata.id": f"/z/{n}"}}]
    }
    return f"id: {n}\ndata: {json.dumps(body)}\n\n"


class SseService:
    def __init__(self) -> None:
        self.streams: list[str] = []

    def __call__(self, request: Request) -> Reply:
        if request.path.rstrip("/") == "/redfish/v1":
            return Reply(200, {"EventService": {"@odata.id": "/redfish/v1/EventService"}})
        if request.path == "/redfish/v1/EventService":
            return Reply(
                200,
                {"ServerSentEventUri": "/sse", "SSEFilterPropertiesSupported": {"RegistryPrefix": True}},
            )
        self.streams.append(request.path)
        if "$filter" in request.path:
            return Reply(400, {"error": {"code": "Base.1.22.PropertyValueFormatError"}})
        raw = "".join(event_payload(n) for n in (len(self.streams), len(self.streams) + 100))
        return Reply(200, raw, {"Content-Type": "text/event-stream"})


async def test_refused_filter_falls_back_and_events_flow() -> None:
    service = SseService()
    with ScriptedServer(service) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        received: list[str] = []
        connects: list[int] = []
        drops: list[int] = []
        stream = EventStream(
            client,
            lambda events: received.extend(str(e["OriginOfCondition"]["@odata.id"]) for e in events),
            on_connect=lambda: connects.append(1),
            on_disconnect=lambda: drops.append(1),
            backoff_initial=0.01,
            backoff_max=0.05,
        )
        task = asyncio.create_task(stream.run())
        try:
            for _ in range(200):
                if len(connects) >= 2:
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()
    assert "$filter=RegistryPrefix%20eq%20%27ResourceEvent%27" in service.streams[0]
    assert all("$filter" not in path for path in service.streams[1:])
    assert received[:2] == ["/z/2", "/z/102"]
    assert len(connects) >= 2  # every (re)connect asks the owner to read everything again
    # each stream that was up and ended was reported (the refused one never connected)
    assert len(connects) - 1 <= len(drops) <= len(connects)


async def test_a_stream_that_ends_at_once_keeps_backing_off() -> None:
    """Each connect asks the owner to read the whole fabric: a service whose stream ends as soon
    as it begins must not get a reconnect (and a full pass) every initial pause."""
    opened: list[str] = []

    def service(request: Request) -> Reply:
        if request.path.rstrip("/") == "/redfish/v1":
            return Reply(200, {"EventService": {"@odata.id": "/redfish/v1/EventService"}})
        if request.path == "/redfish/v1/EventService":
            return Reply(200, {"ServerSentEventUri": "/sse"})
        opened.append(request.path)
        return Reply(200, ": nothing\n\n", {"Content-Type": "text/event-stream"})

    with ScriptedServer(service) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        connects: list[int] = []
        stream = EventStream(
            client,
            lambda _events: None,
            on_connect=lambda: connects.append(1),
            backoff_initial=0.02,
            backoff_max=0.4,
        )
        task = asyncio.create_task(stream.run())
        try:
            await asyncio.sleep(1.5)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await client.aclose()
    # pauses of 0.02, 0.04, ... 0.4 s (± 20 %): about eight in 1.5 s; a reset after each would be ~40
    assert 3 <= len(opened) <= 14, len(opened)
    # every stream that answered was reported; the one the service had just opened when the task
    # was cancelled may not have reached the client yet
    assert len(opened) - 1 <= len(connects) <= len(opened), (len(connects), len(opened))
