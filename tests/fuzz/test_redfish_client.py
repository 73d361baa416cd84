"""The Redfish client (fabric/redfish/) fed malformed and adversarial payloads through a real HTTP
server: truncated and invalid JSON, wrong types, deep nesting, huge and endless bodies, hostile
strings, wrong Content-Types, bad ETags, Retry-After and Location values, redirect loops, error
bodies without ``@Message.ExtendedInfo`` and with unknown MessageIds, odd status codes, task
monitors that never finish, event streams full of garbage.

Every request ends, within a bound, in a result (a JSON object) or a :class:`FabricError` — never
another exception and never a hang.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.redfish.client import RedfishClient, RedfishResponse, RedfishSettings
from fabric.redfish.events import EventStream
from fabric.redfish.reader import EventReader, Refused
from manager_api.errors import FabricError
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.strategies import header_text, hostile_text, json_values
from tests.support.fabric_http import Reply, Request, ScriptedServer

#: An operation that takes longer than this is a hang (the client's own bounds are far below it).
# Deeply nested bodies make Hypothesis warn that their repr is large; that is the point.
pytestmark = [
    pytest.mark.slow(seconds=19),
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning"),
]

HANG = 20.0
MONITOR = "/redfish/v1/TaskService/TaskMonitors/7"
KNOWN_IDS = [
    "Base.1.22.0.ResourceInUse",
    "Base.1.22.0.ResourceNotFound",
    "Base.1.22.0.ServiceTemporarilyUnavailable",
    "Base.1.22.0.OperationTimeout",
    "Base.1.22.0.NoValidSession",
    "Base.1.22.0.PreconditionFailed",
    "Base.1.22.0.Success",
    "TaskEvent.1.0.TaskCompletedOK",
    "ResourceEvent.1.3.ResourceStatusChangedCritical",
    "Composition.1.2.ResourceBlockInUse",
]


class Script:
    """What the server answers; each example replaces it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handler: Callable[[Request], Reply] = lambda _request: Reply(200, {})

    def __call__(self, request: Request) -> Reply:
        with self.lock:
            handler = self.handler
        return handler(request)


@pytest.fixture(scope="module")
def script() -> Script:
    return Script()


@pytest.fixture(scope="module")
def server(script: Script) -> Iterator[ScriptedServer]:
    with ScriptedServer(script) as running:
        yield running


def _client(url: str, **overrides: Any) -> RedfishClient:
    settings: dict[str, Any] = {
        "base_url": url,
        "auth": "none",
        "connect_timeout": 1.0,
        "read_timeout": 1.0,
        "get_attempts": 2,
        "backoff_initial": 0.01,
        "backoff_max": 0.05,
        "max_workers": 4,
    }
    settings.update(overrides)
    return RedfishClient(RedfishSettings(**settings))


def _ends_well(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    """Run one client operation: it must return or raise a FabricError, within HANG seconds."""

    async def bounded() -> Any:
        return await asyncio.wait_for(make(), HANG)

    started = time.monotonic()
    try:
        result = asyncio.run(bounded())
    except FabricError as err:
        assert err.message and len(err.message) < 4000, err.message
        assert "\n" not in err.message and "\r" not in err.message, repr(err.message)
        return err
    except TimeoutError:  # pragma: no cover - a failure
        pytest.fail(f"the client hung for {time.monotonic() - started:.0f} s")
    if isinstance(result, RedfishResponse):
        assert isinstance(result.body, dict)
    return result


# -- strategies --------------------------------------------------------------------------------

messages = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "MessageId": st.one_of(
                st.sampled_from([*KNOWN_IDS, "Vendor.9.9.Weird", "", "NoDots"]), json_values
            ),
            "Message": st.one_of(hostile_text, json_values),
            "Resolution": hostile_text,
            "MessageArgs": json_values,
        },
    ),
    max_size=3,
)
error_bodies = st.fixed_dictionaries(
    {
        "error": st.one_of(
            json_values,
            st.fixed_dictionaries(
                {},
                optional={
                    "code": st.one_of(st.sampled_from(KNOWN_IDS), json_values),
                    "message": st.one_of(hostile_text, json_values),
                    "@Message.ExtendedInfo": st.one_of(messages, json_values),
                },
            ),
        )
    }
).map(lambda v: json.dumps(v).encode())


def _truncated(text: str) -> st.SearchStrategy[bytes]:
    return st.integers(0, max(0, len(text) - 1)).map(lambda n: text[:n].encode())


bodies = st.one_of(
    st.just(b""),
    json_values.map(lambda v: json.dumps(v).encode()),
    json_values.map(json.dumps).flatmap(_truncated),
    st.binary(max_size=300),
    st.integers(500, 100_000).map(lambda n: b"[" * n + b"]" * n),
    st.integers(500, 100_000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),
    error_bodies,
    st.just(b"<html><body>502 Bad Gateway</body></html>"),
)
statuses = st.one_of(
    st.sampled_from([200, 201, 202, 204, 301, 302, 303, 307, 308, 400, 401, 403, 404, 405, 409, 412, 428])
    | st.sampled_from([429, 500, 501, 502, 503, 504]),
    st.integers(200, 599),
)
optional_header = st.one_of(st.none(), header_text)


@st.composite
def replies(draw: st.DrawFn, *, self_uri: str = "/redfish/v1/Fabrics") -> Reply:
    headers: dict[str, str] = {}
    content_type = draw(
        st.one_of(
            st.none(),
            st.sampled_from(
                ["application/json", "application/json;charset=utf-8", "text/html", "text/plain"]
            ),
            header_text,
        )
    )
    if content_type is not None:
        headers["Content-Type"] = content_type
    for name, values in (
        ("ETag", st.one_of(optional_header, st.sampled_from(['W/"1"', '"a b"', 'W/"', "*", '"\\"x"']))),
        (
            "Retry-After",
            st.one_of(
                optional_header, st.integers(-5, 10**9).map(str), st.just("Fri, 31 Dec 9999 23:59:59 GMT")
            ),
        ),
        (
            "Location",
            st.one_of(
                optional_header,
                st.sampled_from(
                    [self_uri, MONITOR, "http://169.254.169.254/latest/meta-data", "//evil/x", "::"]
                ),
            ),
        ),
    ):
        value = draw(values)
        if value is not None:
            headers[name] = value
    return Reply(draw(statuses), draw(bodies), headers)


# -- requests ----------------------------------------------------------------------------------


@given(
    reply=replies(),
    method=st.sampled_from(["GET", "POST", "PATCH", "DELETE"]),
    etag=st.one_of(optional_header, hostile_text),  # ETags come back from bodies (@odata.etag) too
)
@fuzz_settings(150)
def test_any_answer_to_any_request_ends_in_a_result_or_a_fabric_error(
    server: ScriptedServer, script: Script, reply: Reply, method: str, etag: str | None
) -> None:
    script.handler = lambda _request: reply
    client = _client(server.url)
    try:
        _ends_well(
            lambda: client.request(
                method,
                "/redfish/v1/Fabrics",
                body={"a": 1} if method in ("POST", "PATCH") else None,
                etag=etag,
            )
        )
    finally:
        asyncio.run(client.aclose())


@given(monitor_replies=st.lists(replies(self_uri=MONITOR), min_size=1, max_size=4), first=replies())
@fuzz_settings(25)
def test_any_task_monitor_ends_in_a_result_or_a_fabric_error(
    server: ScriptedServer, script: Script, monitor_replies: list[Reply], first: Reply
) -> None:
    """A 202 is followed through its monitor whatever the monitor says; past the deadline the
    client stops (AttachTimeout) rather than waiting for ever."""
    accepted = Reply(202, first.body, {**first.headers, "Location": MONITOR})
    answers = iter(monitor_replies)
    last = monitor_replies[-1]

    def handler(request: Request) -> Reply:
        if request.method == "POST":
            return accepted
        return next(answers, last)

    script.handler = handler
    client = _client(server.url)

    async def operation() -> RedfishResponse:
        response = await client.post("/redfish/v1/Fabrics/PCIe/Zones/h/Actions/Zone.AddEndpoint", {"a": 1})
        return await client.follow(response, action="bind", deadline=time.monotonic() + 0.4, poll_max=0.1)

    try:
        _ends_well(operation)
    finally:
        asyncio.run(client.aclose())


@given(login=replies(self_uri="/redfish/v1/SessionService/Sessions"), root=replies(self_uri="/redfish/v1/"))
@fuzz_settings(40)
def test_a_hostile_login_ends_in_a_fabric_error(
    server: ScriptedServer, script: Script, login: Reply, root: Reply
) -> None:
    def handler(request: Request) -> Reply:
        if request.method == "POST":
            return login
        if request.path.rstrip("/") == "/redfish/v1":
            return root
        return Reply(200, {"@odata.id": "/redfish/v1/Fabrics", "Members": []})

    script.handler = handler
    client = _client(server.url, auth="session", username="admin", password="secret-password")
    try:
        _ends_well(lambda: client.get_json("/redfish/v1/Fabrics"))
    finally:
        asyncio.run(client.aclose())


# -- what no generator finds quickly ------------------------------------------------------------


def test_a_redirect_is_not_followed_and_the_session_token_stays_home(
    server: ScriptedServer, script: Script
) -> None:
    """A redirect to another host would carry X-Auth-Token there (requests only strips
    Authorization); the client follows no redirect at all, and a loop ends at once."""
    seen: list[str] = []

    def handler(request: Request) -> Reply:
        seen.append(f"{request.method} {request.path}")
        if request.method == "POST":
            return Reply(
                201, {"@odata.id": "/redfish/v1/SessionService/Sessions/1"}, {"X-Auth-Token": "tok-123"}
            )
        if request.path.rstrip("/") == "/redfish/v1":
            return Reply(200, {"Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}}})
        return Reply(302, b"", {"Location": request.path})  # to itself, for ever

    script.handler = handler
    client = _client(server.url, auth="session", username="admin", password="secret-password")
    try:
        error = _ends_well(lambda: client.get_json("/redfish/v1/Fabrics"))
        assert isinstance(error, FabricError)
        assert "redirect" in error.message
    finally:
        asyncio.run(client.aclose())
    assert seen.count("GET /redfish/v1/Fabrics") <= 2  # one per attempt, no loop


def test_a_huge_body_is_refused(server: ScriptedServer, script: Script) -> None:
    huge = b'{"Members": [' + b'{"@odata.id": "/redfish/v1/x"},' * 2_500_000 + b"{}]}"  # ~80 MB
    script.handler = lambda _request: Reply(200, huge)
    client = _client(server.url, read_timeout=10.0)
    try:
        error = _ends_well(lambda: client.get_json("/redfish/v1/Fabrics"))
        assert isinstance(error, FabricError) and "larger than" in error.message
    finally:
        asyncio.run(client.aclose())


def test_a_body_that_trickles_in_is_given_up(server: ScriptedServer, script: Script) -> None:
    """One byte every 0.2 s never trips a read timeout of 1 s; the whole answer has a deadline."""
    body = json.dumps({"Members": [], "Padding": "x" * 400}).encode()
    script.handler = lambda _request: Reply(200, body, chunk_delay=0.2, chunk_size=1)
    client = _client(server.url, get_attempts=1, response_deadline=1.0)
    started = time.monotonic()
    try:
        error = _ends_well(lambda: client.get_json("/redfish/v1/Fabrics"))
        assert isinstance(error, FabricError)
    finally:
        asyncio.run(client.aclose())
    assert time.monotonic() - started < HANG


def test_a_body_shorter_than_its_content_length_is_a_fabric_error(
    server: ScriptedServer, script: Script
) -> None:
    script.handler = lambda _request: Reply(200, b'{"Members": []', {"Content-Length": "5000"})
    client = _client(server.url, get_attempts=1)
    try:
        assert isinstance(_ends_well(lambda: client.get_json("/redfish/v1/Fabrics")), FabricError)
    finally:
        asyncio.run(client.aclose())


@pytest.mark.parametrize(
    "body",
    [b"", b"not json", b"[1, 2]", b'"a string"', b"null", b'{"Members": [', b"[" * 100_000 + b"]" * 100_000],
)
def test_a_successful_read_without_a_json_object_is_a_fabric_error(
    server: ScriptedServer, script: Script, body: bytes
) -> None:
    """An empty or unreadable 200 must not read as an empty resource (an empty Zones collection
    would say nothing is bound)."""
    script.handler = lambda _request: Reply(200, body)
    client = _client(server.url)
    try:
        error = _ends_well(lambda: client.get_json("/redfish/v1/Fabrics/PCIe/Zones"))
        assert isinstance(error, FabricError), error
    finally:
        asyncio.run(client.aclose())


# -- event streams -----------------------------------------------------------------------------

sse_lines = st.lists(
    st.one_of(
        st.just(""),
        st.just(": keep-alive"),
        hostile_text.map(lambda t: "data: " + t.replace("\n", " ").replace("\r", " ")),
        json_values.map(lambda v: "data: " + json.dumps(v)),
        st.integers(500, 50_000).map(lambda n: "data: " + "[" * n + "]" * n),
        st.just('data: {"Events": [{"MessageId": "ResourceEvent.1.3.ResourceChanged"}, 7, null]}'),
        st.just('data: {"Events": "all"}'),
        header_text.map(lambda t: "id: " + t),
        st.just("retry: -1"),
        header_text,
    ),
    max_size=12,
)


@given(lines=sse_lines, service=json_values, root_link=json_values)
@fuzz_settings(25)
def test_a_hostile_event_service_never_kills_the_event_stream(
    server: ScriptedServer, script: Script, lines: list[str], service: Any, root_link: Any
) -> None:
    """Whatever the root, the EventService and the stream say, the stream reader ends a
    connection with an error it handles (and reconnects) — it never dies — and only lists of
    event objects reach the inventory."""
    stream_body = "\n".join(lines) + "\n\n"

    def handler(request: Request) -> Reply:
        path = request.path.split("?", 1)[0].rstrip("/")
        if path == "/redfish/v1":
            return Reply(200, {"EventService": root_link})
        if path == "/redfish/v1/EventService":
            return Reply(200, service if isinstance(service, dict) else {"ServerSentEventUri": service})
        return Reply(200, stream_body, {"Content-Type": "text/event-stream"})

    script.handler = handler
    client = _client(server.url)
    received: list[Any] = []

    async def scenario() -> None:
        stream = EventStream(client, received.append, backoff_initial=0.01, backoff_max=0.05)
        task = asyncio.create_task(stream.run())
        await asyncio.sleep(0.15)
        assert not task.done(), task.exception()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(client.aclose())
    for batch in received:
        assert isinstance(batch, list) and all(isinstance(e, dict) for e in batch)


def test_an_event_stream_that_sends_one_endless_line_is_cut(server: ScriptedServer, script: Script) -> None:
    """No newline for megabytes: the reader must not buffer it for ever."""
    endless = "data: " + "x" * 20_000_000

    def handler(request: Request) -> Reply:
        path = request.path.split("?", 1)[0].rstrip("/")
        if path == "/redfish/v1":
            return Reply(200, {"EventService": {"@odata.id": "/redfish/v1/EventService"}})
        if path == "/redfish/v1/EventService":
            return Reply(200, {"ServerSentEventUri": "/redfish/v1/EventService/SSE"})
        return Reply(200, endless, {"Content-Type": "text/event-stream"})

    script.handler = handler
    client = _client(server.url)

    async def scenario() -> None:
        stream = EventStream(client, lambda _events: None, backoff_initial=0.01, backoff_max=0.05)
        with pytest.raises(Refused, match="longer than 1 MiB"):
            await asyncio.wait_for(stream._follow("/redfish/v1/EventService/SSE"), HANG)

    try:
        asyncio.run(scenario())
    finally:
        asyncio.run(client.aclose())


@given(
    texts=st.lists(st.text(max_size=20), max_size=8),
    # a line ends with CRLF, LF or CR; two ends (a blank line) dispatch the event
    ends=st.lists(
        st.sampled_from(["\n\n", "\r\r", "\r\n\r\n", "\n\r\n", "\r\n\n", "\n\r", "\r\n\r"]),
        min_size=8,
        max_size=8,
    ),
    cuts=st.lists(st.integers(0, 300), max_size=6),
)
@fuzz_settings(100)
def test_events_come_out_however_the_bytes_arrive(texts: list[str], ends: list[str], cuts: list[int]) -> None:
    """Lines and events come out the same wherever the bytes are cut (inside a CRLF, inside a
    UTF-8 sequence): the reader keeps what it has not seen the end of."""
    stream = "".join(
        f"id: {n}\ndata: {json.dumps(text, ensure_ascii=False)}{end}"
        for n, (text, end) in enumerate(zip(texts, ends, strict=False))
    ).encode()
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    reader = EventReader(None)
    events = [event for a, b in itertools.pairwise(points) for event in reader.feed(stream[a:b])]
    reader.finish()
    assert [(e.id, e.payload) for e in events] == [(str(n), text) for n, text in enumerate(texts)]


def test_an_event_stream_line_longer_than_the_limit_ends_the_stream() -> None:
    reader = EventReader(None, max_event=150)
    assert list(reader.feed(b"data: " + b"x" * 100)) == []
    with pytest.raises(Refused, match="longer than 150"):
        list(reader.feed(b"x" * 100))


def test_an_event_longer_than_the_limit_ends_the_stream() -> None:
    """Many short data lines without a blank line add up to one event: bounded as a whole."""
    reader = EventReader(None, max_event=150)
    with pytest.raises(Refused, match="event of the event stream is larger than 150"):
        list(reader.feed(b"data: xxxxxxxxxx\n" * 20))


def test_an_etag_that_is_no_header_value_is_never_sent(server: ScriptedServer, script: Script) -> None:
    script.handler = lambda _request: Reply(204, b"")
    client = _client(server.url)
    before = server.count("DELETE")
    try:
        error = _ends_well(
            lambda: client.delete("/redfish/v1/Fabrics/PCIe/Zones/7", etag='W/"1"\r\nX-Evil: 1')
        )
        assert isinstance(error, FabricError) and "no valid entity-tag" in error.message
        assert server.count("DELETE") == before
        assert (
            _ends_well(lambda: client.delete("/redfish/v1/Fabrics/PCIe/Zones/7", etag='W/"1"')).status == 204
        )
    finally:
        asyncio.run(client.aclose())
