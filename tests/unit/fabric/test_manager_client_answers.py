"""What the manager client sends and how it reads answers, on a real socket: a small HTTP/1.1
server writes each answer's bytes by hand and keeps every request head it received."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest

import manager_api.client as client_module
from manager_api.client import ManagerClient, ManagerUnreachable
from manager_api.errors import DeviceBusy, FabricError

CLAIM = "8f2e8c3a-52cf-4b6e-9d0a-0c1b2d3e4f50"
Call = Callable[[ManagerClient], Awaitable[object]]


def _answer(status: str, body: bytes, *fields: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", *fields]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def _exchange(reply: bytes, call: Call, *, prefix: str = "") -> tuple[list[bytes], object]:
    """Serve ``reply`` to every request, run ``call`` against it; the heads and bodies received,
    and what the call returned or raised."""
    heard: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                heard.append(head + (await reader.readexactly(length) if length else b""))
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}{prefix}"
    try:
        async with ManagerClient(url, token="secret-token") as client:
            try:
                outcome: object = await call(client)
            except Exception as err:  # the test looks at what was raised
                outcome = err
    finally:
        server.close()
        await server.wait_closed()
    return heard, outcome


def test_a_request_carries_the_token_the_query_and_the_json_body_under_the_urls_path() -> None:
    attachment = {
        "device": {
            "name": "gpu0",
            "pool": "p",
            "fabric": "PCIe",
            "type": "gpu",
            "bindingStyle": "zone",
            "redfishUri": "/x",
        },
        "node": "node-a",
        "claimUid": CLAIM,
        "state": "attached",
    }
    reply = _answer("200 OK", json.dumps(attachment).encode(), "content-type: application/json")
    heard, outcome = asyncio.run(
        _exchange(reply, lambda c: c.attach("gpu0", "node-a", CLAIM, wait_seconds=2.5), prefix="/fabric/")
    )
    assert not isinstance(outcome, Exception), outcome
    head, _, body = heard[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /fabric/api/v1/attachments?waitSeconds=2.5 HTTP/1.1"
    assert "Authorization: Bearer secret-token" in lines
    assert "Content-Type: application/json" in lines
    assert json.loads(body) == {"device": "gpu0", "node": "node-a", "claimUid": CLAIM}


def test_an_error_body_becomes_its_class_with_the_retry_after_field() -> None:
    body = json.dumps({"code": "DeviceBusy", "message": "held", "device": "gpu0", "heldBy": "n/c"}).encode()
    _, outcome = asyncio.run(
        _exchange(_answer("409 Conflict", body, "retry-after: 7"), lambda c: c.devices())
    )
    assert isinstance(outcome, DeviceBusy), outcome
    assert (outcome.message, outcome.device, outcome.held_by, outcome.retry_after) == (
        "held",
        "gpu0",
        "n/c",
        7.0,
    )


def test_a_stranger_at_the_url_is_named_as_such() -> None:
    reply = _answer("404 Not Found", b'{"error": {"@Message.ExtendedInfo": []}}', "odata-version: 4.0")
    heard, outcome = asyncio.run(_exchange(reply, lambda c: c.devices()))
    assert type(outcome) is FabricError, outcome
    host = next(line for line in heard[0].decode().split("\r\n") if line.startswith("Host: "))
    assert outcome.message == (
        f"http://{host.removeprefix('Host: ')} is not a fabric-dra manager: it answered GET "
        "/api/v1/devices with HTTP 404 Not Found and no fabric-dra error body (it looks like a "
        "Redfish service: the fabric itself, not its manager)"
    )


def test_an_answer_past_the_cap_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "MAX_ANSWER_BYTES", 1 << 20)
    reply = _answer("200 OK", b"[" + b" " * (2 << 20) + b"]")
    _, outcome = asyncio.run(_exchange(reply, lambda c: c.devices()))
    assert isinstance(outcome, ManagerUnreachable), outcome
    assert outcome.message.endswith(": the answer is larger than 1 MiB"), outcome.message


def test_a_body_in_a_coding_not_asked_for_is_refused() -> None:
    heard, outcome = asyncio.run(
        _exchange(_answer("200 OK", b"\x1f\x8b", "content-encoding: gzip"), lambda c: c.devices())
    )
    assert b"accept-encoding" not in heard[0].lower()
    assert isinstance(outcome, ManagerUnreachable), outcome
    assert "Content-Encoding 'gzip', which was not asked for" in outcome.message
