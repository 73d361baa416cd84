"""The bounded reader (fabric/redfish/reader.py): content codings undone a bounded piece at a time,
JSON refused beyond its budget before a single object is built, long strings cut with a marker,
event streams framed within their bounds. The transport and the event stream read through it: the
end of this module drives both against a real HTTP server."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.redfish import RedfishClient, RedfishSettings
from fabric.redfish.events import EventStream
from fabric.redfish.links import ForeignLink, same_service
from fabric.redfish.reader import (
    ANSWER_BUDGET,
    PIECE,
    Budget,
    Decoder,
    EventReader,
    NotJson,
    Refused,
    parse,
)
from manager_api.errors import FabricUnavailable
from tests.fuzz.budget import fuzz_settings
from tests.support.fabric_http import Reply, Request, ScriptedServer

BODY = json.dumps(
    {"Members": [{"@odata.id": f"/redfish/v1/Fabrics/PCIe/Zones/{i}"} for i in range(200)]}
).encode()


def _gzip_bomb(decoded: int, layers: int = 2) -> bytes:
    """``decoded`` bytes of spaces inside ``{"a": …}``, gzipped ``layers`` times, never whole in memory."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    inner = packer.compress(b'{"a": "')
    block = b" " * (1 << 20)
    inner += b"".join(packer.compress(block) for _ in range(decoded >> 20)) + packer.compress(b'"}')
    inner += packer.flush()
    for _ in range(layers - 1):
        inner = gzip.compress(inner, 9)
    return inner


def _decode(content_encoding: str | None, wire: bytes, *, limit: int = 1 << 20, step: int = 7) -> bytes:
    decoder = Decoder(content_encoding, limit=limit)
    out = b"".join(p for i in range(0, len(wire), step) for p in decoder.feed(wire[i : i + step]))
    decoder.finish()
    return out


# -- content codings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "encode"),
    [
        (None, lambda b: b),
        ("identity", lambda b: b),
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("GZIP", gzip.compress),
        ("deflate", zlib.compress),  # the zlib format, as RFC 9110 says
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some servers send it
        ("gzip, gzip", lambda b: gzip.compress(gzip.compress(b))),
        ("deflate, gzip", lambda b: gzip.compress(zlib.compress(b))),
        ("gzip", lambda b: gzip.compress(b[:500]) + gzip.compress(b[500:])),  # two members
        ("gzip", lambda b: gzip.compress(b) + b"\0\0\0"),  # padding after the member
    ],
)
def test_supported_codings_decode_however_the_bytes_arrive(encoding: str | None, encode: Any) -> None:
    assert _decode(encoding, encode(BODY)) == BODY


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br", "gzip, gzip, gzip", "\x1b[2J"])
def test_codings_it_does_not_decode_are_refused_naming_them(encoding: str) -> None:
    with pytest.raises(Refused) as refused:
        Decoder(encoding, limit=1 << 20)
    message = str(refused.value)
    assert "Content-Encoding" in message and "\x1b" not in message
    if encoding in ("br", "zstd", "compress"):
        assert repr(encoding) in message


def test_a_truncated_or_corrupt_coding_is_refused() -> None:
    with pytest.raises(Refused, match="cut short"):
        _decode("gzip", gzip.compress(BODY)[:-9])
    with pytest.raises(Refused, match="corrupt"):
        _decode("gzip", b"\x1f\x8b" + b"garbage" * 10)


def test_a_bomb_never_decodes_past_its_limit_in_one_call() -> None:
    """596 bytes of gzip, gzip that decode to 256 MiB: each piece is at most PIECE bytes, the
    pieces stop at the limit, and every layer counts (the inner one alone is ~256 KiB)."""
    bomb = _gzip_bomb(256 << 20)
    assert len(bomb) < 1000
    decoder = Decoder("gzip, gzip", limit=4 << 20)
    sizes: list[int] = []
    with pytest.raises(Refused, match="larger than 4 MiB, once its gzip coding is undone"):
        sizes.extend(len(p) for p in decoder.feed(bomb))
    assert sizes and max(sizes) <= PIECE
    assert sum(sizes) <= 4 << 20


def test_a_stream_decodes_at_most_100_times_what_arrived() -> None:
    """An event stream has no end, so its bound grows with the wire: a layer that makes more than
    100 times the bytes that arrived (plus the event bound) is a bomb, even of valid events."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    event = b'data: {"Events": []}\n\n'
    wire = packer.compress(event * 500_000) + packer.flush()  # 11 MB decoded
    reader = EventReader("gzip")
    seen = 0
    with pytest.raises(Refused, match="100 times its"):
        for fed in range(0, len(wire), 1000):
            seen += sum(1 for _ in reader.feed(wire[fed : fed + 1000]))
    assert 0 < seen * len(event) <= 100 * len(wire) + (1 << 20)


# -- JSON within a budget ----------------------------------------------------------------------


def _values(value: Any) -> int:
    """What the budget counts: every value, and one more for every empty object or array."""
    if isinstance(value, dict):
        return 1 + (not value) + sum(_values(v) for v in value.values())
    if isinstance(value, list):
        return 1 + (not value) + sum(_values(v) for v in value)
    return 1


def _depth(value: Any) -> int:
    if isinstance(value, dict | list):
        items = value.values() if isinstance(value, dict) else value
        return 1 + max((_depth(v) for v in items), default=0)
    return 0


# strings full of what the pre-pass looks at: quotes, backslashes, structure, line ends, non-ASCII
tricky_text = st.text(alphabet=st.sampled_from('ab"\\/,:[]{}\n\r\t\u00e9\u2028\U0001f600 '), max_size=12)
json_documents = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=False) | tricky_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky_text, inner, max_size=4),
    max_leaves=30,
)


@given(document=json_documents, ascii_only=st.booleans())
@fuzz_settings(300)
def test_the_pre_pass_counts_exactly_what_json_loads_builds(document: Any, ascii_only: bool) -> None:
    data = json.dumps(document, ensure_ascii=ascii_only).encode()
    parsed = parse(data, ANSWER_BUDGET)
    assert parsed.value == document
    assert parsed.values == _values(document)
    budget = Budget(values=_values(document), depth=_depth(document), string=1024)
    assert parse(data, budget).value == document  # exactly at the budget: accepted
    if _depth(document) > 0:
        with pytest.raises(Refused, match="deeper"):
            parse(data, Budget(values=budget.values, depth=_depth(document) - 1, string=1024))
    with pytest.raises(Refused, match="values"):
        parse(data, Budget(values=_values(document) - 1, depth=64, string=1024))


@given(document=json_documents, cut=st.integers(0, 400))
@fuzz_settings(200)
def test_a_truncated_document_never_counts_less_than_json_loads_would_build(document: Any, cut: int) -> None:
    """json.loads builds every object before the point where it fails: the count of a broken
    document must cover them, or a bomb with a broken end would pass."""
    data = json.dumps({"Members": [document, document]}).encode()[:cut]
    try:
        counted = parse(data, Budget(values=10**9, depth=10**6, string=1024)).values
    except NotJson:
        return  # the pre-pass passed it on; json.loads refused it, having built at most the prefix
    assert counted >= _values(json.loads(data))


@pytest.mark.parametrize(
    ("data", "refusal"),
    [
        (b'{"Members": [' + b"{}," * 600_000 + b"{}]}", "more than 1,048,576 values"),
        (b"[" + b"[]," * 600_000 + b"[]]", "more than 1,048,576 values"),
        (b"[" + b'"",' * 1_100_000 + b'""]', "more than 1,048,576 values"),
        (b"[" + b"0," * 1_100_000 + b"0]", "more than 1,048,576 values"),
        (b"[" + b'"[",' * 1_100_000 + b'"["]', "more than 1,048,576 values"),  # structure in strings
        (b"[" * 33 + b"]" * 33, "deeper than 32"),
        (b'{"a":' * 33 + b"1" + b"}" * 33, "deeper than 32"),
        (b"[" * 100_000 + b"]" * 100_000, "deeper than 32"),
    ],
)
def test_answers_beyond_the_budget_are_refused_before_parsing(data: bytes, refusal: str) -> None:
    with pytest.raises(Refused, match=refusal):
        parse(data, ANSWER_BUDGET)


def test_strings_inside_the_depth_are_not_counted_as_depth() -> None:
    """Brackets and quotes inside strings (escaped or not) are no structure."""
    tricky = '"[[[[{{{{\\"]]]],,,,'
    document = {"a": [tricky * 40, {"b": tricky}], tricky: 1}
    parsed = parse(json.dumps(document).encode(), Budget(values=8, depth=3, string=1024))
    assert parsed.value == document


def test_long_strings_are_cut_with_a_marker_that_keeps_them_apart() -> None:
    long_a = "S" * 199_990 + "serial-a"
    long_b = "S" * 199_990 + "serial-b"
    escaped = '\\"' * 5_000  # no bare quote for 10,000 bytes
    document = {
        "SerialNumber": long_a,
        "Other": long_b,
        "Esc": escaped,
        "Emoji": "\U0001f600" * 3000,
        "Id": "7",
    }
    for data in (json.dumps(document).encode(), json.dumps(document, ensure_ascii=False).encode()):
        parsed = parse(data, ANSWER_BUDGET)
        value = parsed.value
        assert parsed.cut == 4
        assert value["Id"] == "7"
        for key in ("SerialNumber", "Other", "Esc", "Emoji"):
            assert len(value[key]) <= 1024
            assert "…(cut from " in value[key] and "sha256 " in value[key]
            assert document[key].startswith(value[key].split("…(cut from ")[0])
        assert value["SerialNumber"] != value["Other"]  # the hash of the whole string differs


def test_a_cut_link_is_never_followed() -> None:
    """A link cut with its marker names no resource of the service: it holds spaces, so it is no
    URI reference and the read that needs it fails naming it, instead of asking for another one."""
    link = "/redfish/v1/Fabrics/PCIe/Endpoints/" + "e" * 2000
    cut = parse(json.dumps({"@odata.id": link}).encode(), ANSWER_BUDGET).value["@odata.id"]
    with pytest.raises(ForeignLink, match="no URI reference"):
        same_service("https://bmc.example", cut, link="@odata.id")


def test_a_string_of_exactly_the_bound_is_kept() -> None:
    for text in ("x" * 1024, "\u00e9" * 1024, "\\" * 1024, "\U0001f600" * 1024):
        assert parse(json.dumps([text]).encode(), ANSWER_BUDGET).value == [text]
        assert "cut from" in parse(json.dumps([text + "y"]).encode(), ANSWER_BUDGET).value[0]


def test_a_long_run_of_structure_is_not_a_long_string() -> None:
    document = {"a": "x", "numbers": list(range(3000)), "b": "y"}
    parsed = parse(json.dumps(document).encode(), ANSWER_BUDGET)
    assert parsed.value == document and parsed.cut == 0


@pytest.mark.parametrize("data", [b"", b"   ", b"{", b'{"a": "\xff"}', b"\xef\xbb\xbf{", b'{"a": 1} x'])
def test_what_is_no_json_says_so(data: bytes) -> None:
    with pytest.raises(NotJson):
        parse(data, ANSWER_BUDGET)


def test_a_byte_order_mark_is_tolerated() -> None:
    assert parse(b'\xef\xbb\xbf{"a": 1}', ANSWER_BUDGET).value == {"a": 1}


# -- through the real transport and event stream -------------------------------------------------


@pytest.fixture
def server() -> Iterator[tuple[ScriptedServer, dict[str, Reply]]]:
    replies: dict[str, Reply] = {}

    def handle(request: Request) -> Reply:
        return replies.get(request.path.split("?", 1)[0].rstrip("/"), Reply(404, {}))

    with ScriptedServer(handle) as running:
        yield running, replies


def _client(url: str) -> RedfishClient:
    return RedfishClient(
        RedfishSettings(base_url=url, auth="none", get_attempts=2, backoff_initial=0.01, backoff_max=0.05)
    )


async def test_the_transport_decodes_gzip_and_refuses_a_bomb_and_br(
    server: tuple[ScriptedServer, dict[str, Reply]],
) -> None:
    """The main client reads raw: a doubly gzipped answer that decodes to 256 MiB stops at the
    32 MiB cap, whatever urllib3 would do (before 2.6 it decoded all that one read brought);
    ``br`` is refused by name."""
    running, replies = server
    replies["/ok"] = Reply(200, gzip.compress(BODY), {"Content-Encoding": "gzip"})
    replies["/bomb"] = Reply(200, _gzip_bomb(256 << 20), {"Content-Encoding": "gzip, gzip"})
    replies["/br"] = Reply(200, b"\x8b\x02\x80{}\x03", {"Content-Encoding": "br"})
    replies["/values"] = Reply(
        200, gzip.compress(b'{"Members": [' + b"{}," * 2_000_000 + b"{}]}"), {"Content-Encoding": "gzip"}
    )
    client = _client(running.url)
    try:
        response = await client.get("/ok")
        assert response.body == json.loads(BODY) and response.size == len(BODY)
        assert response.values == _values(json.loads(BODY))
        with pytest.raises(FabricUnavailable, match="larger than 32 MiB, once its gzip coding is undone"):
            await client.get("/bomb")
        with pytest.raises(FabricUnavailable, match="'br'"):
            await client.get("/br")
        with pytest.raises(FabricUnavailable, match="more than 1,048,576 values"):
            await client.get("/values")
    finally:
        await client.aclose()
    asked = {r.headers.get("accept-encoding") for r in running.requests}
    assert asked == {"gzip, deflate"}  # only what the reader decodes (requests would add zstd)


async def test_an_event_stream_bomb_ends_the_connection_and_backs_off(
    server: tuple[ScriptedServer, dict[str, Reply]],
) -> None:
    running, replies = server
    replies["/redfish/v1"] = Reply(200, {"EventService": {"@odata.id": "/redfish/v1/EventService"}})
    replies["/redfish/v1/EventService"] = Reply(200, {"ServerSentEventUri": "/sse"})
    line = gzip.compress(gzip.compress(b"data: " + b"x" * (64 << 20) + b"\n\n"))
    replies["/sse"] = Reply(
        200, line, {"Content-Type": "text/event-stream", "Content-Encoding": "gzip, gzip"}
    )
    client = _client(running.url)
    stream = EventStream(client, lambda _events: None, backoff_initial=0.05, backoff_max=0.4)
    task = asyncio.create_task(stream.run())
    try:
        await asyncio.sleep(1.5)
        assert not task.done()
        opened = running.count("GET", "/sse")
        # pauses of 0.05, 0.1, 0.2, 0.4, 0.4 … s: about six in 1.5 s, not a loop
        assert 2 <= opened <= 10, opened
        with pytest.raises(Refused, match="1 MiB"):
            await stream._follow("/sse")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()


async def test_a_task_monitor_read_goes_through_the_reader() -> None:
    """A task monitor answering a bomb is a read that failed (the monitor is read again), neither
    a 256 MiB body nor the operation's end; its next, sane answer ends the wait."""
    action = "/redfish/v1/Fabrics/PCIe/Zones/h/Actions/Zone.AddEndpoint"
    monitor = "/redfish/v1/TaskService/TaskMonitors/7"
    answers = iter(
        [
            Reply(200, _gzip_bomb(256 << 20), {"Content-Encoding": "gzip, gzip"}),
            Reply(200, gzip.compress(b'{"TaskState": "Completed"}'), {"Content-Encoding": "gzip"}),
        ]
    )

    def handle(request: Request) -> Reply:
        if request.path == action:
            return Reply(202, b"", {"Location": monitor, "Retry-After": "0"})
        return next(answers, Reply(500, {}))

    with ScriptedServer(handle) as running:
        client = _client(running.url)
        try:
            accepted = await client.post(action, {})
            done = await client.follow(accepted, action="bind", deadline=time.monotonic() + 30)
        finally:
            await client.aclose()
        assert done.body == {"TaskState": "Completed"}
        assert running.count("GET", monitor) == 2
