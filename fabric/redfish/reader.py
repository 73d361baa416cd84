"""The one bounded reader for everything a Redfish service sends: answers, task monitors, event streams.

A hostile or compromised service — or anyone on a plain-HTTP path to it — decides what bytes
arrive. This module turns them into JSON without letting them decide how much memory or CPU that
takes. It knows no HTTP library: raw bytes of a body go in (as they arrive, with the
``Content-Encoding`` they came with), bounded decoded bytes and parsed JSON come out. The transport
(:mod:`fabric.redfish.transport`, for answers and task monitors) and the event stream
(:mod:`fabric.redfish.events`) both read through it.

**Content codings** (:class:`Decoder`). Only ``gzip`` (and ``x-gzip``) and ``deflate`` are
decoded — the only ones :data:`ACCEPT_ENCODING` asks for — at most :data:`MAX_CODINGS` of them
stacked; ``br``, ``zstd`` and anything else are refused with an error naming the coding (neither
is asked for, and a Brotli or Zstandard decoder would need its own output and window bounds).
Each layer is decoded here, incrementally, with zlib's ``max_length``: no single call produces
more than :data:`PIECE` bytes or more than the room left, and every layer's output counts against
the limit, so 596 bytes of ``gzip, gzip`` stop at the limit instead of growing to 256 MiB. An
answer's limit is fixed (``max_response_bytes``); an event stream has no end, so each layer of it
may produce at most :data:`EVENT_BYTES` plus :data:`STREAM_EXPANSION` times the bytes that arrived.

**Event streams** (:class:`EventReader`): ``text/event-stream`` framing (WHATWG HTML "Server-sent
events": lines end with CRLF, LF or CR; a blank line dispatches the event) with one bound,
:data:`EVENT_BYTES`, for a line and for an event's data.

**JSON** (:func:`parse`). Before ``json.loads`` builds a single object, a pre-pass over the
decoded bytes at C speed (``bytes.translate``/``replace``/``count``; a regular expression only for
strings that hold ``[]{},``, which Redfish rarely has) counts the structure outside strings and
refuses a body beyond its :class:`Budget`: more JSON values than ``values`` (every comma and
opening bracket outside strings, plus one: a member or element counts one, every object or array
one more) or nesting deeper than ``depth``. The count is exact for valid JSON and never lower
for invalid JSON up to where ``json.loads`` stops. Strings longer than ``string`` characters are
cut in the bytes, also before parsing, to their first characters and a marker, ``…(cut from N
bytes, sha256 H)``, that holds the length and a hash of the whole string as sent: two long
strings that differ anywhere stay different, so a cut ``Id``, ``SerialNumber`` or ``Name`` never
collides with another, and the marker shows what happened. A cut link (``@odata.id``...) holds
spaces, so it is no URI reference: it is never followed, and the read that needs it fails naming
it (:func:`fabric.redfish.links.resolve`). A cut string is at most ``string`` characters, marker
included.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from fabric.errors import ManagerError

__all__ = [
    "ACCEPT_ENCODING",
    "ANSWER_BUDGET",
    "EVENT_BUDGET",
    "EVENT_BYTES",
    "MAX_CODINGS",
    "PIECE",
    "STREAM_EXPANSION",
    "Budget",
    "Decoder",
    "Event",
    "EventReader",
    "NotJson",
    "Parsed",
    "Refused",
    "parse",
]

#: what every request asks for in ``Accept-Encoding``: the codings :class:`Decoder` decodes
ACCEPT_ENCODING = "gzip, deflate"
#: most content codings stacked on one body (HTTP allows several; a service has no reason for more)
MAX_CODINGS = 2
#: most bytes one decompression call produces
PIECE = 64 << 10
#: longest line, and most data of one event, of an event stream
EVENT_BYTES = 1 << 20
#: each layer of an event stream may produce this many times the bytes that arrived (plus
#: :data:`EVENT_BYTES`): a stream of JSON events compresses by far less than 100:1, a bomb by
#: over 1000:1 per layer, and without this bound 587 bytes would cost the CPU of 256 MiB
STREAM_EXPANSION = 100


class Refused(ManagerError):
    """What the service sent is beyond a bound, or in a coding this reader does not decode. The
    message is one line that says which bound."""


class NotJson(ManagerError, ValueError):
    """The body is no JSON (empty, truncated, not UTF-8, not JSON at all)."""


class _TooLarge(ManagerError):
    """A layer produced more than it may; :class:`Decoder` says so as :class:`Refused`."""


@dataclass(frozen=True, slots=True)
class Budget:
    """What one JSON document may cost: see the module docstring for how each is counted."""

    #: JSON values (commas and opening brackets outside strings, plus one)
    values: int
    #: nesting of objects and arrays
    depth: int
    #: characters of one string (keys included); longer ones are cut with a marker
    string: int


#: An answer: 2^20 values. The largest answer of a 8,600-device fabric (its Endpoints collection,
#: expanded: 13.9 MB) holds 490,407; the most a value costs in Python is about 100 bytes (an
#: object with one member), so the worst answer within budget costs about 100 MiB.
ANSWER_BUDGET = Budget(values=1 << 20, depth=32, string=1024)
#: One event's data: at most :data:`EVENT_BYTES`, and a fraction of an answer's values.
EVENT_BUDGET = Budget(values=1 << 16, depth=32, string=1024)


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 and count % (1 << 20) == 0 else f"{count:,} bytes"


# -- content codings ---------------------------------------------------------------------------

_CODINGS = {"gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}  # RFC 9110 §8.4.1


def _codings(header: str | None) -> list[str]:
    """The codings of a ``Content-Encoding`` value, in the order they were applied."""
    names = [name.strip().lower() for name in (header or "").split(",")]
    codings: list[str] = []
    for name in names:
        if name in ("", "identity"):
            continue
        coding = _CODINGS.get(name)
        if coding is None:
            shown = repr(name[:40]) if name.isprintable() else "an unprintable name"
            raise Refused(
                f"the body is encoded as {shown} (Content-Encoding); fabric-dra decodes gzip and "
                "deflate only, and asks for nothing else"
            )
        codings.append(coding)
    if len(codings) > MAX_CODINGS:
        raise Refused(
            f"the body is encoded {len(codings)} times over (Content-Encoding); at most {MAX_CODINGS}"
        )
    return codings


class _Inflate:
    """One gzip or deflate layer, decoded a piece at a time."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        #: bytes this layer has produced
        self.produced = 0
        self._z = self._new()
        self._started = False
        #: the last member ended and no other has begun
        self._complete = False
        #: bytes after the end that are no gzip member: ignored, as urllib3 does
        self._ignore = False

    def _new(self) -> Any:
        # gzip: wbits 16 + 15 takes the gzip header; deflate is the zlib format (RFC 9110 §8.4.1.2)
        return zlib.decompressobj(31 if self.coding == "gzip" else 15)

    def feed(self, data: bytes, allowed: int) -> Iterator[bytes]:
        while data or not self._complete:
            if self._ignore or (self._complete and self.coding == "deflate"):
                return
            if self._complete:  # another gzip member begins (RFC 1952 §2.2)
                self._z, self._complete = self._new(), False
            cap = max(1, min(PIECE, allowed - self.produced + 1))
            try:
                out = self._z.decompress(data, cap)
            except zlib.error as err:
                if self.coding == "deflate" and not self._started:
                    # raw deflate without the zlib header, as some servers send it (urllib3's
                    # DeflateDecoder accepts both)
                    self._z, self._started = zlib.decompressobj(-zlib.MAX_WBITS), True
                    continue
                if self.coding == "gzip" and self.produced and not self._started:
                    self._ignore = True  # garbage after a whole member
                    return
                raise Refused(f"the body's {self.coding} coding is corrupt ({err})") from None
            self._started = True
            self.produced += len(out)
            if self.produced > allowed:
                raise _TooLarge(self.coding)
            if out:
                yield out
            if self._z.eof:
                self._complete, self._started = True, False
                data = self._z.unused_data
            elif self._z.unconsumed_tail:
                data = self._z.unconsumed_tail
            elif len(out) == cap:
                data = b""  # the output was cut at the cap: zlib may hold more for this input
            else:
                return

    def finish(self) -> None:
        if self._started and not self._complete:
            raise Refused(f"the body's {self.coding} data is cut short (no end of stream)")


class Decoder:
    """A body's ``Content-Encoding`` undone incrementally, every layer's output bounded.

    ``limit``: most bytes any layer may produce, the decoded body included. With ``expansion``
    (an event stream), the bound grows with the bytes that arrived: ``limit + expansion * wire``.
    """

    def __init__(self, content_encoding: str | None, *, limit: int, expansion: int = 0) -> None:
        self._layers = [_Inflate(c) for c in reversed(_codings(content_encoding))]
        self.limit = limit
        self.expansion = expansion
        #: bytes that arrived (encoded)
        self.wire = 0
        #: bytes decoded
        self.decoded = 0

    @property
    def allowed(self) -> int:
        return self.limit + self.expansion * self.wire

    def feed(self, wire: bytes) -> Iterator[bytes]:
        """The decoded pieces of ``wire`` (at most :data:`PIECE` bytes each where a layer decodes);
        raises :class:`Refused` past a bound. Consume it before feeding the next bytes."""
        self.wire += len(wire)
        if not wire:
            return
        try:
            yield from self._through(0, wire)
        except _TooLarge as err:
            coding = f", once its {err.args[0]} coding is undone" if err.args else ""
            if self.expansion:
                raise Refused(
                    f"the stream is larger than {self.expansion} times its {self.wire:,} bytes on the "
                    f"wire plus {_size(self.limit)}{coding}"
                ) from None
            raise Refused(f"the body is larger than {_size(self.limit)}{coding}") from None

    def _through(self, index: int, data: bytes) -> Iterator[bytes]:
        if index == len(self._layers):
            self.decoded += len(data)
            if self.decoded > self.allowed:
                raise _TooLarge()
            yield data
            return
        for piece in self._layers[index].feed(data, self.allowed):
            yield from self._through(index + 1, piece)

    def finish(self) -> None:
        """The body ended: refuses one whose coded data stops short of its end."""
        for layer in self._layers:
            layer.finish()


# -- JSON within a budget ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Parsed:
    value: Any
    #: JSON values counted by the pre-pass (see :class:`Budget`)
    values: int
    #: strings cut to the budget
    cut: int


def _all_but(keep: bytes) -> bytes:
    return bytes(c for c in range(256) if c not in keep)


#: what decides structure outside strings
_STRUCTURE = b'"[]{},'
#: what may follow a backslash in a JSON string (RFC 8259 §7): kept while escapes are resolved
_ESCAPABLE = b'\\/"bfnrtu'
_NOT_STRUCTURE = _all_but(_STRUCTURE)
_NOT_STRUCTURE_OR_ESCAPE = _all_but(_STRUCTURE + _ESCAPABLE)
#: objects and arrays alike, for the depth
_SQUARE = bytes.maketrans(b"{}", b"[]")
#: a string of the reduced structure (only structural characters are left in it)
_STRING = re.compile(rb'"[^"]*"')
#: an escaped backslash or quote; matched left to right, so backslash runs pair up as in the string
_QUOTING_ESCAPE = re.compile(rb'\\[\\"]')
#: a piece of the reduced structure stripped at a time (bounds the regular expression's list)
_STRIP_PIECE = 256 << 10


def _structure(data: bytes | bytearray, budget: Budget) -> bytes:
    """The structural characters of ``data`` outside strings, in order.

    Keeping only ``"[]{},`` (and what escapes need) shrinks a Redfish answer about seven-fold at
    C speed. Escaped backslashes and quotes are resolved first; every other escape's second
    character is kept too, so no backslash meets a character it does not escape. When every
    quote then has its partner next to it — strings with no structural character, nearly always —
    the quotes are all there is to drop. Otherwise adjacent quotes go: removing two quotes next to
    each other leaves every other character's quote parity as it was, so the quotes left still
    pair up as strings, and what they enclose (structure inside strings) is removed."""
    if b"\\" in data:
        reduced = data.translate(None, _NOT_STRUCTURE_OR_ESCAPE)
        reduced = _unescape(reduced).translate(None, _NOT_STRUCTURE)
    else:
        reduced = data.translate(None, _NOT_STRUCTURE)
    if 2 * reduced.count(b'""') == reduced.count(b'"'):
        # the leftmost quote pairs with the next one, and so on: no string holds structure
        return bytes(reduced.translate(None, b'"'))
    reduced = reduced.replace(b'""', b"")
    # Every string left holds structure; each is a value or a member's name, and each of those
    # counts at least one value: more than 4 * values quotes is over budget for sure.
    if reduced.count(b'"') > 4 * budget.values:
        raise Refused(f"the JSON holds more than {budget.values:,} values")
    return _strip_strings(bytes(reduced))


def _unescape(reduced: bytes | bytearray) -> bytearray:
    """``reduced`` without escaped backslashes and quotes, a piece at a time (as
    :func:`_strip_strings`); a piece never ends inside an escape."""
    out = bytearray()
    start, size = 0, len(reduced)
    while start < size:
        end = min(size, start + _STRIP_PIECE)
        piece = reduced[start:end]
        if (len(piece) - len(piece.rstrip(b"\\"))) % 2:
            end += 1  # the last backslash escapes the next byte: take it along
            piece = reduced[start:end]
        out += _QUOTING_ESCAPE.sub(b"", piece)
        start = end
    return out


def _strip_strings(reduced: bytes) -> bytes:
    """``reduced`` without its strings, a piece at a time: a list of every piece between strings
    at once would cost more than the budget it enforces."""
    out = bytearray()
    start, size = 0, len(reduced)
    while start < size:
        end = min(size, start + _STRIP_PIECE)
        if reduced.count(b'"', start, end) % 2:  # a string open at the cut: up to its end
            close = reduced.find(b'"', end)
            end = size if close < 0 else close + 1
        out += _STRING.sub(b"", reduced[start:end])
        start = end
    return bytes(out)


def _depth(brackets: bytes, limit: int) -> int:
    """Nesting of a bracket sequence: each pass removes the innermost pairs, one level."""
    depth = 0
    while brackets:
        if depth == limit:
            raise Refused(f"the JSON nests deeper than {limit} levels")
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            break  # unbalanced: no JSON, and json.loads says so
        brackets, depth = shorter, depth + 1
    return depth


def _count(data: bytes | bytearray, budget: Budget) -> int:
    """The values of ``data``, refused beyond the budget (values, then depth)."""
    reduced = _structure(data, budget)
    values = reduced.count(b",") + reduced.count(b"[") + reduced.count(b"{") + 1
    if values > budget.values:
        raise Refused(f"the JSON holds more than {budget.values:,} values ({values:,})")
    _depth(reduced.translate(_SQUARE, b',"'), budget.depth)
    return values


def _may_hold_long_strings(data: bytes | bytearray, limit: int) -> bool:
    """Whether some run of more than ``limit`` bytes has no quote that ends a string — cheaply:
    such a run holds a whole aligned block of half that size, and a block is cleared by one quote
    not preceded by a backslash. Long runs of structure (arrays of numbers) pass as candidates."""
    block = max(1, (limit + 1) // 2)
    find = data.find
    for start in range(0, len(data), block):
        end = start + block
        found = find(b'"', start, end)
        while found > 0 and data[found - 1] == 0x5C:  # an escaped quote, or one after "\\"
            found = find(b'"', found + 1, end)
        if found < 0:
            return True
    return False


@lru_cache(maxsize=4)
def _long_run(limit: int) -> re.Pattern[bytes]:
    return re.compile(rb'"[^"]{%d}' % (limit + 1))


def _cut_one(data: bytes | bytearray, start: int, end: int, limit: int) -> bytes | None:
    """The JSON text (no quotes) that stands for the string ``data[start:end]`` cut to ``limit``
    characters, or None when it is no longer than that (or no valid string: json.loads refuses)."""
    span = end - start
    take = min(span, 12 * (limit + 1))  # 12 bytes (a surrogate pair) per character at most
    for trim in range(12):  # a cut inside an escape or a UTF-8 sequence: back up to its start
        if take - trim < 0:
            return None
        try:
            text = json.loads(b'"' + bytes(data[start : start + take - trim]) + b'"')
        except ValueError:
            continue
        break
    else:
        return None
    if take == span and len(text) <= limit:
        return None
    digest = hashlib.sha256(memoryview(data)[start:end]).hexdigest()[:16]
    marker = f"…(cut from {span} bytes, sha256 {digest})"
    kept = text[: max(0, limit - len(marker))]
    if kept and 0xD800 <= ord(kept[-1]) <= 0xDBFF:
        kept = kept[:-1]  # half a surrogate pair
    return json.dumps(kept + marker)[1:-1].encode()


def _cut_long_strings(data: bytes | bytearray, limit: int) -> tuple[bytes | bytearray, int]:
    """``data`` with every string longer than ``limit`` characters cut (see :func:`_cut_one`)."""
    # Same length, and every quote left delimits a string (backslash runs pair up left to right).
    masked = data.replace(b"\\\\", b"__").replace(b'\\"', b"__") if b"\\" in data else data
    pieces: list[bytes | bytearray] = []
    copied = quotes = counted = 0
    for match in _long_run(limit).finditer(masked):
        start = match.start()
        quotes += masked.count(b'"', counted, start)
        counted = start
        if quotes % 2:
            continue  # a string's closing quote, then a long run of structure
        end = masked.find(b'"', start + 1)
        if end < 0:
            break  # never closed: json.loads refuses it
        cut = _cut_one(data, start + 1, end, limit)
        if cut is not None:
            pieces += [data[copied : start + 1], cut]
            copied = end
    if not pieces:
        return data, 0
    cuts = len(pieces) // 2
    pieces.append(data[copied:])
    return b"".join(pieces), cuts


def parse(data: bytes | bytearray, budget: Budget) -> Parsed:
    """The JSON value of ``data`` (UTF-8), within ``budget``: :class:`Refused` beyond it,
    :class:`NotJson` when it is no JSON."""
    if not data:
        raise NotJson("an empty body")
    values = _count(data, budget)
    cuts = 0
    if _may_hold_long_strings(data, budget.string):
        data, cuts = _cut_long_strings(data, budget.string)
    try:
        text = data.decode("utf-8-sig")  # DSP0266: UTF-8; a byte-order mark is tolerated
    except UnicodeDecodeError:
        raise NotJson("a body that is no UTF-8") from None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise NotJson("a body that is no JSON") from None
    return Parsed(value, values, cuts)


# -- event streams -------------------------------------------------------------------------------

_EOL = re.compile(rb"\r\n|\r|\n")


@dataclass(frozen=True, slots=True)
class Event:
    #: the stream's last event ID when the event was dispatched (``id:``), or None
    id: str | None
    #: the event's data parsed as JSON within :data:`EVENT_BUDGET`; None when it is no JSON
    payload: Any


class EventReader:
    """The events of one ``text/event-stream`` body: raw bytes in (with the body's
    ``Content-Encoding``), :class:`Event` out; a line or an event's data longer than
    :data:`EVENT_BYTES`, an event beyond :data:`EVENT_BUDGET` or a stream that decodes beyond
    :data:`STREAM_EXPANSION` is :class:`Refused` (the caller ends the connection)."""

    def __init__(self, content_encoding: str | None, *, max_event: int = EVENT_BYTES) -> None:
        self._decoder = Decoder(content_encoding, limit=max_event, expansion=STREAM_EXPANSION)
        self.max_event = max_event
        #: bytes of a line not ended yet
        self._rest = b""
        #: the last piece ended with CR: a LF that begins the next one is the rest of a CRLF
        self._after_cr = False
        self._data = bytearray()
        self._has_data = False
        self._last_id: str | None = None

    def feed(self, wire: bytes) -> Iterator[Event]:
        """The events ``wire`` completes; consume them before feeding the next bytes."""
        for piece in self._decoder.feed(wire):
            yield from self._lines(piece)

    def finish(self) -> None:
        """The stream ended: an event not ended by a blank line is dropped (the format says so)."""
        self._decoder.finish()

    def _lines(self, piece: bytes) -> Iterator[Event]:
        if self._after_cr:
            self._after_cr = False
            if piece.startswith(b"\n"):
                piece = piece[1:]
        buffer = self._rest + piece
        start = 0
        for end in _EOL.finditer(buffer):
            yield from self._line(buffer[start : end.start()])
            start = end.end()
        self._after_cr = start == len(buffer) and start > 0 and buffer[start - 1] == 0x0D
        self._rest = buffer[start:]
        if len(self._rest) > self.max_event:
            raise Refused(f"a line of the event stream is longer than {_size(self.max_event)}")

    def _line(self, line: bytes) -> Iterator[Event]:
        if not line:
            if self._has_data:
                data, self._data, self._has_data = bytes(self._data), bytearray(), False
                try:
                    payload = parse(data, EVENT_BUDGET).value
                except NotJson:
                    payload = None
                yield Event(self._last_id, payload)
            return
        if line.startswith(b":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            if self._has_data:
                self._data += b"\n"
            self._data += value
            self._has_data = True
            if len(self._data) > self.max_event:
                raise Refused(f"an event of the event stream is larger than {_size(self.max_event)}")
        elif name == b"id" and b"\0" not in value:
            self._last_id = value.decode("utf-8", "replace")
