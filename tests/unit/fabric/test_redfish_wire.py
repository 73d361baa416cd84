"""The Redfish client's HTTP/1.1 (plumbing/http1.py) against a real socket server whose bytes
each test writes by hand: framings, kept-alive and closed connections, interim answers, heads no
service should send, and fields that must never be sent."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fabric.redfish import OutcomeUnknown, RedfishClient, RedfishSettings
from manager_api.errors import FabricError, FabricUnavailable

#: writes the answer to one request (its head and body as received) on the socket; False: close
Script = Callable[[socket.socket, bytes], bool | None]


def answer(body: object, *extra: str, status: str = "200 OK") -> bytes:
    payload = json.dumps(body).encode()
    head = [f"HTTP/1.1 {status}", "Content-Type: application/json", f"Content-Length: {len(payload)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + payload


class RawServer:
    """Reads each request's head (and its Content-Length body), hands it to the script."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        #: set at the first request
        self.received = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._open: list[socket.socket] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            self._open.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        buffered = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(buffered) < length:
                    buffered += sock.recv(65536)
                request, buffered = head + b"\r\n\r\n" + buffered[:length], buffered[length:]
                self.requests.append(request)
                self.received.set()
                if self.script(sock, request) is False:
                    sock.close()
                    return
        except OSError:
            return

    def __enter__(self) -> RawServer:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._listener.close()
        for sock in self._open:
            sock.close()


@pytest.fixture
def settings() -> Callable[..., RedfishSettings]:
    def make(url: str, **extra: object) -> RedfishSettings:
        values: dict[str, object] = {
            "base_url": url,
            "auth": "none",
            "read_timeout": 5.0,
            "get_attempts": 1,
            "backoff_initial": 0.01,
            "backoff_max": 0.02,
        }
        values.update(extra)
        return RedfishSettings.model_validate(values)

    return make


@pytest.fixture
def served() -> Iterator[Callable[[Script], RawServer]]:
    servers: list[RawServer] = []

    def start(script: Script) -> RawServer:
        server = RawServer(script).__enter__()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.__exit__()


async def test_connections_are_kept_alive_and_reused(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    server = served(lambda sock, _request: sock.sendall(answer({"Id": "x"})))
    client = RedfishClient(settings(server.url, max_workers=4))
    try:
        for _ in range(5):
            await client.get_json("/redfish/v1/Systems/x")
        await asyncio.gather(*(client.get_json("/redfish/v1/Systems/x") for _ in range(12)))
        for _ in range(5):
            await client.get_json("/redfish/v1/Systems/x")
    finally:
        await client.aclose()
    assert len(server.requests) == 22
    assert 1 <= server.connections <= 4  # at most max_workers requests at once, each connection reused


async def test_a_connection_the_service_closed_while_idle_does_not_lose_a_mutation(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    """A service closes kept-alive connections after a while (nginx: 75 s, uvicorn: 5 s). The next
    POST must go on a new connection, not be written into the closed one and reported as "may or
    may not have acted" (OutcomeUnknown)."""

    def script(sock: socket.socket, _request: bytes) -> bool:
        sock.sendall(answer({"Id": "z"}, status="201 Created"))
        return False  # and close, without saying Connection: close

    server = served(script)
    client = RedfishClient(settings(server.url))
    try:
        for _ in range(3):
            await client.post("/redfish/v1/Fabrics/PCIe/Zones", {"Name": "z"})
            await asyncio.sleep(0.2)  # the close arrives while the connection is idle
    finally:
        await client.aclose()
    assert server.connections == 3


async def test_an_answer_that_says_close_ends_its_connection(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    # the service says close but keeps the socket open: reusing it would wait for ever
    server = served(lambda sock, _request: sock.sendall(answer({"Id": "x"}, "Connection: close")))
    client = RedfishClient(settings(server.url, read_timeout=2.0))
    try:
        for _ in range(3):
            await client.get_json("/redfish/v1/Systems/x")
    finally:
        await client.aclose()
    assert server.connections == 3


async def test_chunked_answers_with_extensions_and_trailers(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    body = json.dumps({"Id": "x", "Members": list(range(100))}).encode()
    pieces = [body[:7], body[7:100], body[100:]]

    def script(sock: socket.socket, _request: bytes) -> None:
        out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"
        for piece in pieces:
            out += f"{len(piece):x};note=1\r\n".encode() + piece + b"\r\n"
        sock.sendall(out + b"0\r\nX-Checksum: abc\r\n\r\n")

    server = served(script)
    client = RedfishClient(settings(server.url))
    try:
        first = await client.get_json("/redfish/v1/Systems/x")
        second = await client.get_json("/redfish/v1/Systems/x")  # the framing ended exactly
    finally:
        await client.aclose()
    assert first == second == {"Id": "x", "Members": list(range(100))}
    assert server.connections == 1


async def test_interim_answers_and_http_1_0_without_length(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    def script(sock: socket.socket, _request: bytes) -> bool:
        sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n")
        sock.sendall(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"Id": "old"}')
        return False  # the end of the connection ends the body

    server = served(script)
    client = RedfishClient(settings(server.url))
    try:
        assert await client.get_json("/redfish/v1/Systems/x") == {"Id": "old"}
        assert await client.get_json("/redfish/v1/Systems/x") == {"Id": "old"}
    finally:
        await client.aclose()
    assert server.connections == 2


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\n{}", "a status line 'HTTP/2 200 OK'"),
        (b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\n{}", "a status line"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "only chunked is read"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2, 3\r\n\r\n{}", "Content-Length '2, 3'"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\n{}", "Content-Length '-2'"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", "a chunk size 'zz"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX0\r\n\r\n",
            "does not end where its size",
        ),
        (b"HTTP/1.1 200 OK\r\nX-A: 1\nContent-Length: 2\r\n\r\n{}", "does not end with CRLF"),
        (b"HTTP/1.1 200 OK\r\nBad Name: 1\r\nContent-Length: 2\r\n\r\n{}", "a field line 'Bad Name: 1'"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * (70 << 10) + b"\r\n\r\n", "a head larger than 64 KiB"),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", "101 Switching Protocols"),
        (b"HTTP/1.1 100 Continue\r\n\r\n" * 9, "more than 8 interim"),
    ],
)
async def test_answers_that_are_no_http_are_refused_naming_what(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings], raw: bytes, says: str
) -> None:
    server = served(lambda sock, _request: sock.sendall(raw))
    client = RedfishClient(settings(server.url, get_attempts=2))
    try:
        with pytest.raises(
            FabricUnavailable, match="answered badly: the service answered no valid HTTP"
        ) as caught:
            await client.get_json("/redfish/v1/Systems/x")
    finally:
        await client.aclose()
    assert says in caught.value.message, caught.value.message
    assert len(server.requests) == 2  # a GET is tried again


async def test_a_token_that_is_no_header_value_is_never_sent(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    """A session token with a line break would add a header of the service's choosing to every
    request: the login fails instead, naming why (and never the token)."""

    def script(sock: socket.socket, request: bytes) -> None:
        if request.startswith(b"POST"):
            sock.sendall(
                answer(
                    {}, "X-Auth-Token: tok\x0bX-Evil: 1", "Location: /redfish/v1/S/1", status="201 Created"
                )
            )
        else:
            sock.sendall(answer({"Links": {"Sessions": {"@odata.id": "/redfish/v1/S"}}}))

    server = served(script)
    client = RedfishClient(settings(server.url, auth="session", username="admin", password="pw-123456"))
    try:
        with pytest.raises(FabricUnavailable, match="X-Auth-Token that is no header value") as caught:
            await client.get_json("/redfish/v1/Systems/x")
    finally:
        await client.aclose()
    assert "X-Evil" not in caught.value.message
    assert [r.split(b" ", 1)[0] for r in server.requests] == [b"GET", b"POST"]


async def test_a_field_with_a_line_break_is_not_sent(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    server = served(lambda sock, _request: sock.sendall(answer({})))
    client = RedfishClient(settings(server.url))
    try:
        client.transport.use_credentials(session_key="abc\r\nX-Evil: 1")
        with pytest.raises(FabricUnavailable, match="X-Auth-Token field holds a control character; not sent"):
            await client.post("/redfish/v1/Fabrics/PCIe/Zones", {})  # not sent: no OutcomeUnknown
    finally:
        await client.aclose()
    assert server.requests == []


async def test_a_target_beyond_ascii_is_percent_encoded(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    server = served(lambda sock, _request: sock.sendall(answer({})))
    client = RedfishClient(settings(server.url))
    try:
        await client.get_json("/redfish/v1/Systems/gpü|1?$filter=a")
    finally:
        await client.aclose()
    assert server.requests[0].startswith(b"GET /redfish/v1/Systems/gp%C3%BC%7C1?$filter=a HTTP/1.1\r\n")


async def test_abort_cuts_a_read_in_flight(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    """Shutdown cuts reads the service never answers: the read fails at once, saying so (with a
    read timeout of a minute, only the cut can end it)."""
    server = served(lambda _sock, _request: None)  # never answers
    client = RedfishClient(settings(server.url, read_timeout=60.0))
    try:
        post = asyncio.ensure_future(client.post("/redfish/v1/Fabrics/PCIe/Zones", {}))
        assert await asyncio.to_thread(server.received.wait, 10)
        client.transport.abort()
        with pytest.raises(OutcomeUnknown, match="cut short: the client is shutting down"):
            await asyncio.wait_for(post, 10)
    finally:
        await client.aclose()


async def test_a_service_that_never_accepts_times_out_and_nothing_was_sent(
    settings: Callable[..., RedfishSettings],
) -> None:
    """A listener whose accept queue is full drops the SYN: the connect timeout ends the wait, and
    a mutation that never left is FabricUnavailable, not OutcomeUnknown."""
    with socket.create_server(("127.0.0.1", 0), backlog=0) as listener:
        port = listener.getsockname()[1]
        queued = []
        for _ in range(4):  # fill the accept queue (never accepted)
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            queued.append(sock)
        client = RedfishClient(settings(f"http://127.0.0.1:{port}", connect_timeout=0.5))
        try:
            with pytest.raises(FabricUnavailable, match="unreachable: connection timed out"):
                await client.get_json("/redfish/v1/")
            with pytest.raises(FabricUnavailable, match="connection timed out") as caught:
                await client.post("/redfish/v1/Fabrics/PCIe/Zones", {})
            assert not isinstance(caught.value, OutcomeUnknown)
        finally:
            await client.aclose()
            for sock in queued:
                sock.close()


async def test_every_exchange_is_observed_with_its_outcome(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    def script(sock: socket.socket, request: bytes) -> bool | None:
        if b"/Gone" in request.split(b"\r\n", 1)[0]:
            return False  # no answer
        sock.sendall(answer({}, status="404 Not Found" if b"/Missing" in request else "200 OK"))
        return None

    server = served(script)
    seen: list[tuple[str, str, str]] = []
    client = RedfishClient(
        settings(server.url),
        observer=lambda method, kind, outcome, _seconds: seen.append((method, kind, outcome)),
    )
    try:
        await client.get_json("/redfish/v1/Systems/node-1")
        with pytest.raises(FabricUnavailable):
            await client.get_json("/redfish/v1/Chassis/Gone")
        with pytest.raises(FabricError):
            await client.delete("/redfish/v1/Fabrics/PCIe/Zones/Missing")
    finally:
        await client.aclose()
    assert seen == [
        ("GET", "Systems", "200"),
        ("GET", "Chassis", "transport"),
        ("DELETE", "Zones", "404"),
    ]


async def test_answers_in_flight_share_one_budget_and_give_it_back(
    served: Callable[[Script], RawServer], settings: Callable[..., RedfishSettings]
) -> None:
    """Three 400 KB answers at once against 1 MB of answers in flight: two hold their bytes while
    their last ones take 3 s to come; the third finds no room within 2 s and fails naming the
    budget. Whatever ended how, every byte is given back."""
    payload = json.dumps({"Padding": "x" * 400_000}).encode()

    def script(sock: socket.socket, _request: bytes) -> None:
        sock.sendall(f"HTTP/1.1 200 OK\r\nContent-Length: {len(payload)}\r\n\r\n".encode() + payload[:-10])
        time.sleep(3)
        sock.sendall(payload[-10:])

    server = served(script)
    client = RedfishClient(settings(server.url, max_response_bytes=600_000, max_inflight_bytes=1_000_000))
    budget = client.transport.budget
    try:
        results = await asyncio.gather(
            *(client.get_json(f"/redfish/v1/Systems/{n}") for n in range(3)), return_exceptions=True
        )
    finally:
        await client.aclose()
    failed = [r for r in results if isinstance(r, BaseException)]
    assert len(failed) == 1, results
    assert isinstance(failed[0], FabricUnavailable)
    assert "more than 1000000 bytes of answers in flight at once" in failed[0].message, failed[0].message
    assert budget.free == budget.total == 1_000_000
