"""plumbing.httpserve on the wire: each answer written in one send (head and body together), a
stream's head sent before its first event, HEAD and pipelined answers whole and in order, and the
connection limits (header and body deadlines, 503 beyond the connection limit) as before the head
was held for its body and the deadlines' timers armed only when a read leaves a phase unfinished.

Real sockets on 127.0.0.1; the server runs in the test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from plumbing.httpserve import ConnectionLimits, HttpServer

_SHORT = ConnectionLimits(header_timeout=0.5, body_timeout=0.5, keep_alive_timeout=30)
#: what every connection of the recording server wrote, one entry per transport.write
_WRITES: list[list[bytes]] = []
_STREAM_GO = asyncio.Event()


class _RecordingTransport:
    """The connection's transport, noting each write (what the kernel is handed in one send)."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        self._transport = transport
        self._writes = writes

    def write(self, data: bytes) -> None:
        self._writes.append(bytes(data))
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class _Recording(HttpToolsProtocol):
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        writes: list[bytes] = []
        _WRITES.append(writes)
        self.transport = _RecordingTransport(transport, writes)  # type: ignore[assignment]


async def _app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    body = b""
    more = True
    while more:
        event = await receive()
        if event["type"] == "http.disconnect":
            return
        body += event.get("body", b"")
        more = event.get("more_body", False)
    if scope["path"] == "/stream":
        plain = [(b"content-type", b"text/plain")]
        await send({"type": "http.response.start", "status": 200, "headers": plain})
        await _STREAM_GO.wait()
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    answer = b"echo:" + scope["path"].encode() + b":" + body
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(answer)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


@pytest.fixture
async def server() -> AsyncIterator[HttpServer]:
    _WRITES.clear()
    _STREAM_GO.clear()
    running = HttpServer(
        _app,
        host="127.0.0.1",
        port=0,
        handle_signals=False,
        lifespan="off",
        limits=_SHORT,
        http=_Recording,
    )
    await running.start()
    try:
        yield running
    finally:
        await running.close()


async def _connect(server: HttpServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", server.port)


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:] if line)}
    size = int(headers.get("content-length", "0"))
    body = await asyncio.wait_for(reader.readexactly(size), 10) if size else b""
    return int(lines[0].split()[1]), headers, body


def _request(method: str, path: str, body: bytes = b"") -> bytes:
    return f"{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n".encode() + body


async def test_an_answer_goes_out_in_one_write_head_and_body(server: HttpServer) -> None:
    reader, writer = await _connect(server)
    try:
        writer.write(_request("PUT", "/a", b"payload"))
        status, headers, body = await _answer(reader)
        assert (status, body) == (200, b"echo:/a:payload")
        assert headers["content-length"] == str(len(body))
        writer.write(_request("GET", "/b"))
        assert (await _answer(reader))[2] == b"echo:/b:"
    finally:
        writer.close()
    (writes,) = _WRITES
    assert len(writes) == 2, writes  # one send per answer, not one for the head and one for the body
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\necho:/a:payload")
    assert writes[1].endswith(b"\r\n\r\necho:/b:")


async def test_a_head_answer_and_pipelined_requests_come_whole_and_in_order(server: HttpServer) -> None:
    reader, writer = await _connect(server)
    try:
        # HEAD: uvicorn writes no body, so the held head must go out when the answer completes.
        writer.write(_request("HEAD", "/h"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        # Three requests in one send: three answers, in order, after the HEAD answer's head.
        writer.write(_request("GET", "/1") + _request("PUT", "/2", b"x") + _request("GET", "/3"))
        answers = [await _answer(reader) for _ in range(3)]
        assert [body for _, _, body in answers] == [b"echo:/1:", b"echo:/2:x", b"echo:/3:"]
    finally:
        writer.close()


async def test_a_stream_sends_its_head_before_its_first_event(server: HttpServer) -> None:
    reader, writer = await _connect(server)
    try:
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        # The application holds its first body bytes until the client has the head: a head kept
        # back for the body would never come (the wait fails the test).
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
        _STREAM_GO.set()
        assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10) == b"5\r\nfirst\r\n0\r\n\r\n"
    finally:
        writer.close()


async def test_a_head_unfinished_after_whole_requests_is_still_timed_out(server: HttpServer) -> None:
    reader, writer = await _connect(server)
    try:
        # Whole requests arm no timer; the partial head after them must still get its 408.
        for n in range(3):
            writer.write(_request("GET", f"/{n}"))
            assert (await _answer(reader))[0] == 200
        writer.write(b"GET /late HTTP/1.1\r\nhost: x\r\n")
        status, headers, body = await _answer(reader)
        assert status == 408 and headers["connection"] == "close"
        assert b"did not arrive within 0.5s" in body
        assert await asyncio.wait_for(reader.read(), 10) == b""  # closed after
    finally:
        writer.close()


async def test_a_body_unfinished_is_timed_out_and_the_connection_closed(server: HttpServer) -> None:
    reader, writer = await _connect(server)
    try:
        writer.write(_request("PUT", "/whole", b"abc"))
        assert (await _answer(reader))[2] == b"echo:/whole:abc"
        writer.write(b"PUT /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 10\r\n\r\nabc")
        # no answer: the application reads a disconnect, the connection is closed
        assert await asyncio.wait_for(reader.read(), 10) == b""
    finally:
        writer.close()


async def test_a_connection_beyond_the_limit_is_answered_503_with_retry_after() -> None:
    limits = ConnectionLimits(max_connections=1, retry_after=2.0)
    running = HttpServer(_app, host="127.0.0.1", port=0, handle_signals=False, lifespan="off", limits=limits)
    await running.start()
    held_reader, held = await asyncio.open_connection("127.0.0.1", running.port)
    held.write(_request("GET", "/held"))
    assert (await _answer(held_reader))[0] == 200  # alone: served
    reader, writer = await asyncio.open_connection("127.0.0.1", running.port)
    try:
        writer.write(_request("GET", "/over"))
        status, headers, body = await _answer(reader)
        assert status == 503 and headers["retry-after"] == "2" and headers["connection"] == "close"
        assert b"its limit is 1" in body
    finally:
        writer.close()
        held.close()
        await running.close()
