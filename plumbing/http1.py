"""HTTP/1.1 to one origin over asyncio streams: the wire under the Redfish transport
(:mod:`fabric.redfish.transport`), the fabric manager's client (:mod:`manager_api.client`) and
the Kubernetes client (:mod:`plumbing.kube.client`).

Both need little of HTTP and must be sure of all of it: one origin, requests it builds
itself, answers read raw (the bounded reader, :mod:`fabric.redfish.reader`, undoes their
``Content-Encoding``), never a redirect followed, never a request sent twice, and to know whether
a request may have reached the service when it fails. This client does that and nothing else, on
the event loop: no thread, no look at the environment per request. Measured per GET of a 1.1 KB
resource of the ``instant`` emulator (CPU of the client process, concurrency 8, body read raw and
parsed): httpx 1.1 ms, aiohttp 0.12 to 0.15 ms, a bare client over asyncio streams 0.045 to
0.065 ms (what this module grew from). The whole Redfish client over it, bounded reader and
retries included, costs 0.08 ms; over DMTF's ``redfish`` library and requests in worker threads,
which it replaces, 0.66 to 0.70 ms (``bench/redfish_bench.py``, docs/performance.md).

What it speaks (RFC 9112):

* **Connections** to the service, or through the ``http://`` proxy the environment names for it
  (``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``, ``NO_PROXY``; read once, when the client is
  made): a ``CONNECT`` tunnel for ``https``, the absolute form of the target for ``http``. TLS with
  the transport's context, the server's name checked. A connection is kept alive after an answer
  read to its end that does not say ``Connection: close``, and reused (the last one returned
  first); one the service has closed meanwhile, or idle longer than ``keepalive_expiry``, is
  dropped before use (a server closes an idle connection without warning: a request sent into it
  at that moment is lost, and a POST cannot be resent blindly). At most ``max_connections``
  requests are in flight at once; more wait for a free one.
* **Requests**: method, target, ``Host``, the caller's fields (a value with a control character is
  refused: it could smuggle a header), ``Content-Length`` with a body.
* **Answers**: interim (1xx) answers are skipped; the head (status line and fields) may be at most
  :data:`HEAD_LIMIT` bytes, its lines ending CRLF; repeated fields are joined with ``, ``. The body
  is framed by the chunked transfer coding (no other transfer coding is decoded: refused),
  ``Content-Length`` (one value, or equal ones), or the end of the connection, and handed over raw
  as it arrives, at most :data:`PIECE` bytes at a time (:meth:`Answer.read`), or whole up to a
  size the caller gives and only in the identity coding (:meth:`Answer.whole`). The stream reader's
  buffer stops reading from the socket beyond twice :data:`HEAD_LIMIT`: what the service sends
  faster than the caller takes waits in the kernel, not in memory.
* **Time**: connecting (TCP, the tunnel and the TLS handshake together) is bounded by the connect
  timeout; then the answer must make progress within the read timeout and arrive whole before the
  deadline (the client's, or the request's own). One timer per request watches both and cuts the
  connection when either passes, so the read in progress fails at once, saying which.
* :meth:`Wire.abort` cuts every connection, reads in flight included (shutdown); a read it cut
  never passes for the end of an answer.

Every failure is a :class:`TransportError` that says whether the request may have reached the
service (``sent``) and whether the service answered at all (``answered``); one that failed to
connect keeps the OS or TLS error as its ``__cause__``, and ``tls`` tells a refused handshake. A
client may be used from one event loop after another (not from two at once): connections of a
loop that ended are dropped.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ipaddress
import re
import ssl
import time
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit

from plumbing.errors import PlumbingError
from plumbing.terminal import one_line

__all__ = ["HEAD_LIMIT", "PIECE", "Answer", "Proxy", "TransportError", "Wire", "proxy_for"]

#: most bytes of an answer's head (status line and fields), and of a chunk-size line
HEAD_LIMIT = 64 << 10
#: most bytes one :meth:`Answer.read` returns
PIECE = 64 << 10
#: interim (1xx) answers skipped before the final one; more is a service that never answers
_MAX_INTERIM = 8
#: trailer fields after a chunked body, skipped
_MAX_TRAILERS = 64
_DEFAULT_PORTS = {"http": 80, "https": 443}
#: control characters but horizontal tab: never in a field value (RFC 9110 §5.5)
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
#: characters a request target carries as they are; others are percent-encoded, as requests does
_TARGET_SAFE = "!#$%&'()*+,/:;=?@[]~"
_PLAIN_TARGET = re.compile(r"[A-Za-z0-9\-._~!#$%&'()*+,/:;=?@\[\]]*")
_HEX = frozenset(b"0123456789abcdefABCDEF")


class TransportError(PlumbingError):
    """One HTTP exchange failed below HTTP (or its answer was unusable); ``sent`` tells whether
    the request may have arrived, ``answered`` whether the service answered at all, ``tls``
    whether the TLS handshake was refused."""

    def __init__(self, message: str, *, sent: bool, answered: bool = False, tls: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.answered = answered
        self.tls = tls


def _size(count: int) -> str:
    if count >= 1 << 20 and not count & 0xFFFFF:
        return f"{count >> 20} MiB"
    return f"{count >> 10} KiB" if count >= 1 << 10 else f"{count} bytes"


# -- the proxy ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy between this client and the service."""

    host: str
    port: int
    #: ``Proxy-Authorization`` value, from the proxy URL's user information
    authorization: str | None
    #: the proxy as a message shows it (no credentials)
    shown: str
    #: why this proxy cannot be used (a scheme other than http), or None
    unusable: str | None = None


def proxy_for(base_url: str) -> Proxy | None:
    """The proxy the environment names for ``base_url``, as curl and requests read it: the
    ``<scheme>_proxy`` variable (lower case first, :func:`urllib.request.getproxies`) or
    ``all_proxy``, unless ``no_proxy`` names the host. Read once: the process's environment does
    not change."""
    parts = urlsplit(base_url)
    proxies = urllib.request.getproxies()
    url = proxies.get(parts.scheme) or proxies.get("all")
    if not url or _bypassed(parts.hostname or "", parts.port, proxies.get("no", "")):
        return None
    if "://" not in url:
        url = f"http://{url}"  # "proxy:3128", as requests reads it
    proxy = urlsplit(url)
    shown = f"{proxy.scheme}://{proxy.hostname}" + (f":{proxy.port}" if proxy.port else "")
    authorization = None
    if proxy.username is not None:
        pair = f"{unquote(proxy.username)}:{unquote(proxy.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode()
    unusable = None
    if proxy.scheme != "http" or not proxy.hostname:
        unusable = (
            f"the proxy {shown} the environment names for {parts.scheme} is no http:// proxy; "
            "fabric-dra reaches the service directly or through an http:// proxy only "
            "(name the service in NO_PROXY to go direct)"
        )
    return Proxy(proxy.hostname or "", proxy.port or 80, authorization, shown, unusable)


def _bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether ``no_proxy`` names ``host``: ``*``; the host or a domain it is in (``example.com``
    and ``.example.com`` both cover ``bmc.example.com``), optionally with its port; or, for an
    address, a network that holds it (``10.0.0.0/8``), as requests reads it."""
    host = host.lower().strip("[]")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        name, _, entry_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if entry_port and entry_port != str(port):
            continue
        name = name.strip("[]").lstrip(".")
        if not name:
            continue
        if address is not None:
            with contextlib.suppress(ValueError):
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            continue
        if host == name or host.endswith("." + name):
            return True
    return False


# -- connections -------------------------------------------------------------------------------


class _Connection:
    __slots__ = ("cut", "idle_since", "loop", "reader", "writer")

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.loop = loop
        #: cut by :meth:`Wire.abort` or a timer: whatever a read returns now is no whole answer
        self.cut = False
        #: monotonic time it was last put back idle
        self.idle_since = 0.0

    def usable(self, expiry: float | None = None) -> bool:
        if expiry is not None and time.monotonic() - self.idle_since > expiry:
            return False
        return not (self.cut or self.writer.is_closing() or self.reader.at_eof())

    def abort(self) -> None:
        self.cut = True
        with contextlib.suppress(Exception):  # a transport of an event loop that has ended
            self.writer.transport.abort()


class _Loop:
    """What belongs to one event loop: its connections and the request slots."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None, slots: int) -> None:
        self.loop = loop
        self.slots = asyncio.Semaphore(slots)
        #: idle connections, the most recently used last
        self.idle: list[_Connection] = []


class Wire:
    """HTTP/1.1 to the origin of ``base_url``; see the module docstring."""

    def __init__(
        self,
        base_url: str,
        *,
        tls: ssl.SSLContext | None,
        proxy: Proxy | None,
        connect_timeout: float,
        read_timeout: float,
        deadline: float,
        max_connections: int,
        keepalive_expiry: float | None = None,
        tls_advice: Callable[[str], str] | None = None,
        user_agent: str = "fabric-dra",
    ) -> None:
        """``keepalive_expiry``: seconds an idle connection may be reused (None: while it is
        open). ``tls_advice``: the words of a refused handshake, given its reason (what to
        change, in the caller's flags). ``user_agent``: the ``User-Agent`` of every request (the
        API server's audit log and metrics name clients by it)."""
        parts = urlsplit(base_url)
        self.host = parts.hostname or ""
        self.port = parts.port or _DEFAULT_PORTS[parts.scheme]
        self.tls = tls if parts.scheme == "https" else None
        self.proxy = proxy
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.deadline = deadline
        self.max_connections = max_connections
        self.keepalive_expiry = keepalive_expiry
        self._tls_advice = tls_advice or (lambda reason: f"TLS handshake failed ({reason})")
        # The absolute form only for plain HTTP through a proxy; in a tunnel the origin form.
        prefix = f"http://{parts.netloc}" if proxy is not None and self.tls is None else ""
        self._prefix = prefix
        fixed = f"Host: {parts.netloc}\r\nUser-Agent: {user_agent}\r\n"
        if _BAD_VALUE.search(user_agent):
            raise ValueError("a User-Agent with a control character")
        if prefix and proxy is not None and proxy.authorization:
            fixed += f"Proxy-Authorization: {proxy.authorization}\r\n"
        self._fixed = fixed
        self._state = _Loop(None, max_connections)
        #: every connection open now, idle or reading
        self._open: set[_Connection] = set()

    # -- requests --------------------------------------------------------------------------------

    async def open(
        self,
        method: str,
        target: str,
        fields: Mapping[str, str],
        body: bytes | None = None,
        *,
        http_timeout: tuple[float, float] | None = None,
        deadline: float | None = None,
        stream: bool = False,
    ) -> Answer:
        """Send one request and read the head of its answer. The caller reads the body
        (:meth:`Answer.read`) and always closes the answer (:meth:`Answer.close`), which frees
        its connection. ``stream``: an answer without end (an event stream) — its own connection,
        not counted against ``max_connections``, and no read timeout or deadline unless
        ``http_timeout`` is given (a Kubernetes watch: the server ends it, the client bounds it).
        ``deadline``: this request's, instead of the client's (a long poll's)."""
        head = self._head(method, target, fields, body)
        state = self._loop_state()
        connect, read = http_timeout or (self.connect_timeout, self.read_timeout)
        timed = not stream or http_timeout is not None
        if not stream:
            await state.slots.acquire()
        try:
            connection = await self._connection(state, connect)
        except BaseException:
            if not stream:
                state.slots.release()
            raise
        answer = Answer(
            self,
            connection,
            state if not stream else None,
            read if timed else None,
            deadline or self.deadline,
        )
        try:
            connection.writer.write(head if body is None else head + body)
            if body is not None and len(body) > PIECE:
                await connection.writer.drain()
            await answer.start()
        except BaseException:
            answer.close()
            raise
        return answer

    def _head(self, method: str, target: str, fields: Mapping[str, str], body: bytes | None) -> bytes:
        if not _PLAIN_TARGET.fullmatch(target):
            target = quote(target, safe=_TARGET_SAFE)
        lines = [f"{method} {self._prefix}{target} HTTP/1.1\r\n{self._fixed}"]
        for name, value in fields.items():
            if _BAD_VALUE.search(value):
                raise TransportError(
                    f"the request's {name} field holds a control character; not sent", sent=False
                )
            lines.append(f"{name}: {value}\r\n")
        if body is not None:
            lines.append(f"Content-Length: {len(body)}\r\n")
        lines.append("\r\n")
        try:
            return "".join(lines).encode("latin-1")
        except UnicodeEncodeError:
            raise TransportError("a field of the request is no Latin-1 text; not sent", sent=False) from None

    def _loop_state(self) -> _Loop:
        loop = asyncio.get_running_loop()
        state = self._state
        if state.loop is not loop:
            if state.loop is not None:
                # The loop these connections belong to has ended (or is another one): their
                # transports cannot be used from here.
                for connection in [c for c in self._open if c.loop is state.loop]:
                    self._forget(connection)
            state = self._state = _Loop(loop, self.max_connections)
        return state

    async def _connection(self, state: _Loop, connect_timeout: float) -> _Connection:
        while state.idle:
            connection = state.idle.pop()
            if connection.usable(self.keepalive_expiry):
                return connection
            self._forget(connection)
        if self.proxy is not None and self.proxy.unusable:
            raise TransportError(self.proxy.unusable, sent=False)
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await self._connect(connect_timeout)
        except TimeoutError:
            raise TransportError("connection timed out", sent=False) from None
        except ssl.SSLError as err:
            raise TransportError(self._tls_advice(one_line(str(err), 200)), sent=False, tls=True) from err
        except OSError as err:
            reason = one_line(str(err) or type(err).__name__, 200)
            raise TransportError(f"cannot connect ({reason})", sent=False) from err
        connection = _Connection(reader, writer, state.loop or asyncio.get_running_loop())
        self._open.add(connection)
        return connection

    async def _connect(self, connect_timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        proxy = self.proxy
        if proxy is None:
            return await asyncio.open_connection(
                self.host,
                self.port,
                ssl=self.tls,
                ssl_handshake_timeout=connect_timeout if self.tls is not None else None,
                limit=HEAD_LIMIT,
            )
        reader, writer = await asyncio.open_connection(proxy.host, proxy.port, limit=HEAD_LIMIT)
        try:
            if self.tls is not None:
                await self._tunnel(reader, writer, proxy)
                await writer.start_tls(
                    self.tls, server_hostname=self.host, ssl_handshake_timeout=connect_timeout
                )
        except BaseException:
            writer.transport.abort()
            raise
        return reader, writer

    async def _tunnel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proxy: Proxy) -> None:
        """``CONNECT`` through the proxy (RFC 9110 §9.3.6): a 2xx opens the tunnel."""
        authority = f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"
        request = f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n"
        if proxy.authorization:
            request += f"Proxy-Authorization: {proxy.authorization}\r\n"
        writer.write((request + "\r\n").encode("latin-1"))
        try:
            block = await reader.readuntil(b"\n\r\n")
            status, _version, _fields = _parse_head(block)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            raise OSError(f"the proxy {proxy.shown} answered no HTTP to CONNECT") from None
        if not 200 <= status < 300:
            raise OSError(f"the proxy {proxy.shown} refused the tunnel to {authority} (HTTP {status})")

    def _forget(self, connection: _Connection) -> None:
        connection.abort()
        self._open.discard(connection)

    def _idle(self, connection: _Connection, state: _Loop) -> None:
        if connection.usable() and state is self._state:
            connection.idle_since = time.monotonic()
            state.idle.append(connection)
        else:
            self._forget(connection)

    # -- lifecycle -------------------------------------------------------------------------------

    def abort(self) -> None:
        """Cut every connection, those a read is waiting on included: the read fails at once.
        Later requests open new connections."""
        for connection in list(self._open):
            self._forget(connection)
        self._state.idle.clear()


class Answer:
    """The answer to one request: its status and fields, and its body as it arrives."""

    __slots__ = (
        "_chunk",
        "_chunked",
        "_connection",
        "_deadline",
        "_done",
        "_expired",
        "_give_up",
        "_keep",
        "_last",
        "_loop",
        "_read_timeout",
        "_remaining",
        "_state",
        "_timer",
        "_until_close",
        "_wire",
        "headers",
        "status",
    )

    def __init__(
        self,
        wire: Wire,
        connection: _Connection,
        state: _Loop | None,
        read_timeout: float | None,
        deadline: float,
    ) -> None:
        self._wire = wire
        self._connection = connection
        #: the loop state whose slot this answer holds (None: a stream, no slot)
        self._state = state
        self._read_timeout = read_timeout
        self.status = 0
        #: field names in lower case
        self.headers: dict[str, str] = {}
        self._done = False
        self._keep = False
        self._chunked = False
        self._until_close = False
        #: bytes left of the body (Content-Length) or of the current chunk
        self._remaining = 0
        #: the chunk's data has been read; its CRLF not yet
        self._chunk = False
        #: why the timer cut the connection, and whether the service had answered by then
        self._expired: tuple[str, bool] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._loop = connection.loop
        now = self._loop.time()
        self._last = now
        self._deadline = deadline
        self._give_up = now + deadline
        if read_timeout is not None:
            self._timer = self._loop.call_at(min(now + read_timeout, self._give_up), self._tick)

    # -- time --------------------------------------------------------------------------------

    def _tick(self) -> None:
        """The timer: cut the connection once the answer is late, else look again when it may be."""
        now = self._loop.time()
        timeout = self._read_timeout or 0.0
        if now >= self._give_up:
            self._expired = (f"the answer did not arrive within {self._deadline:.0f} s", True)
        elif now < self._last + timeout:
            self._timer = self._loop.call_at(min(self._last + timeout, self._give_up), self._tick)
            return
        else:
            self._expired = ("no answer within the read timeout", False)
        self._timer = None
        self._connection.abort()

    def _lost(self, err: BaseException | None, when: str) -> TransportError:
        """Why a read failed: the timer, :meth:`Wire.abort`, or the service."""
        if self._expired is not None:
            reason, answered = self._expired
            return TransportError(reason, sent=True, answered=answered)
        if self._connection.cut:
            return TransportError(
                "the read was cut short: the client is shutting down", sent=True, answered=True
            )
        reason = f" ({one_line(str(err), 200)})" if err is not None and str(err) else ""
        return TransportError(
            f"connection lost {when}{reason}", sent=True, answered=when != "before an answer"
        )

    @staticmethod
    def _bad(what: str) -> TransportError:
        return TransportError(f"the service answered no valid HTTP: {what}", sent=True, answered=True)

    # -- the head ----------------------------------------------------------------------------

    async def start(self) -> None:
        reader = self._connection.reader
        for _ in range(_MAX_INTERIM + 1):
            try:
                block = await reader.readuntil(b"\n\r\n")
            except asyncio.IncompleteReadError as err:
                raise self._lost(
                    None, "before an answer" if not err.partial else "in an answer's head"
                ) from None
            except asyncio.LimitOverrunError:
                raise self._bad(f"a head larger than {_size(HEAD_LIMIT)}") from None
            except OSError as err:
                raise self._lost(err, "before an answer") from None
            self._last = self._loop.time()
            try:
                status, version, fields = _parse_head(block)
            except ValueError as err:
                raise self._bad(str(err)) from None
            if status >= 200:
                break
            if status == 101:
                raise self._bad("101 Switching Protocols to a request that asked for no switch")
        else:
            raise self._bad(f"more than {_MAX_INTERIM} interim (1xx) answers")
        self.status = status
        self.headers = fields
        self._frame(version)

    def _frame(self, version: str) -> None:
        """How the body ends (RFC 9112 §6.3), and whether the connection may be used again."""
        fields = self.headers
        connection = fields.get("connection", "").lower()
        self._keep = version == "HTTP/1.1" and "close" not in connection
        coding = fields.get("transfer-encoding")
        length = fields.get("content-length")
        if self.status in (204, 304):
            self._finish()
        elif coding is not None:
            codings = [c.strip().lower() for c in coding.split(",")]
            if codings != ["chunked"]:
                raise self._bad(f"Transfer-Encoding {one_line(coding, 60)!r}; only chunked is read")
            self._chunked = True
            if length is not None:
                self._keep = False  # both framings: chunked wins, the connection is not trusted again
        elif length is not None:
            values = {v.strip() for v in length.split(",")}
            value = values.pop() if len(values) == 1 else ""
            if not value.isdigit() or not value.isascii():
                raise self._bad(f"Content-Length {one_line(length, 60)!r}")
            self._remaining = int(value)
            if not self._remaining:
                self._finish()
        else:
            self._until_close = True
            self._keep = False

    # -- the body ----------------------------------------------------------------------------

    async def read(self) -> bytes:
        """The next piece of the body as it came over the wire (at most :data:`PIECE` bytes,
        still in its content coding); ``b""`` once all of it has arrived."""
        if self._done:
            return b""
        reader = self._connection.reader
        try:
            if self._chunked and not self._remaining:
                if self._chunk:
                    if await reader.readexactly(2) != b"\r\n":
                        raise self._bad("a chunk's data does not end where its size says")
                    self._chunk = False
                if not await self._next_chunk():
                    self._finish()
                    return b""
            if self._until_close:
                data = await reader.read(PIECE)
                if not data:
                    if self._connection.cut:
                        raise self._lost(None, "in an answer's body")
                    self._finish()
                self._last = self._loop.time()
                return data
            data = await reader.read(min(self._remaining, PIECE))
        except asyncio.IncompleteReadError:
            raise self._lost(None, "in an answer's body") from None
        except asyncio.LimitOverrunError:
            raise self._bad(f"a chunk-size line longer than {_size(HEAD_LIMIT)}") from None
        except OSError as err:
            raise self._lost(err, "in an answer's body") from None
        if not data:
            if self._connection.cut:
                raise self._lost(None, "in an answer's body")
            what = "chunk" if self._chunked else "Content-Length"
            raise TransportError(
                f"the answer ended {self._remaining} bytes short of its {what}", sent=True, answered=True
            )
        self._last = self._loop.time()
        self._remaining -= len(data)
        if self._chunked:
            self._chunk = True
        elif not self._remaining:
            self._finish()
        return data

    async def whole(self, limit: int) -> bytes:
        """The whole body, at most ``limit`` bytes, refused in any ``Content-Encoding``: none was
        asked for (no ``Accept-Encoding``), so a coded body is no answer to this request."""
        coding = self.headers.get("content-encoding", "identity").lower()
        if coding != "identity":
            raise TransportError(
                f"the answer came in Content-Encoding {one_line(coding, 40)!r}, which was not asked for",
                sent=True,
                answered=True,
            )
        too_large = TransportError(f"the answer is larger than {_size(limit)}", sent=True, answered=True)
        if not self._chunked and not self._until_close and self._remaining > limit:
            raise too_large  # said up front: not read at all
        pieces: list[bytes] = []
        size = 0
        while piece := await self.read():
            size += len(piece)
            if size > limit:
                raise too_large
            pieces.append(piece)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    async def _next_chunk(self) -> int:
        """The size of the next chunk; after the last (0), its trailer fields are skipped."""
        reader = self._connection.reader
        line = await reader.readuntil(b"\n")
        size = line.split(b";", 1)[0].strip()
        if not size or len(size) > 16 or not _HEX.issuperset(size):
            raise self._bad(f"a chunk size {one_line(line[:40].decode('latin-1'), 40)!r}")
        self._remaining = int(size, 16)
        if self._remaining:
            return self._remaining
        for _ in range(_MAX_TRAILERS):
            if not (await reader.readuntil(b"\n")).strip():
                return 0
        raise self._bad(f"more than {_MAX_TRAILERS} trailer fields")

    def _finish(self) -> None:
        """The body has arrived whole: the connection goes back to the pool if it may."""
        if self._done:
            return
        self._done = True
        self._release(keep=self._keep and not self._connection.cut)

    def close(self) -> None:
        """Done with this answer: a body not read to its end costs its connection."""
        if not self._done:
            self._done = True
            self._release(keep=False)

    def _release(self, *, keep: bool) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        state = self._state
        if keep and state is not None:
            self._wire._idle(self._connection, state)
        else:
            self._wire._forget(self._connection)
        if state is not None:
            self._state = None
            state.slots.release()


def _parse_head(block: bytes) -> tuple[int, str, dict[str, str]]:
    """Status, HTTP version and fields (lower-case names, repeated ones joined) of a head."""
    lines = block.decode("latin-1").split("\r\n")
    status_line = lines[0]
    version, _, rest = status_line.partition(" ")
    code = rest[:3]
    if (
        version not in ("HTTP/1.1", "HTTP/1.0")
        or len(code) != 3
        or not code.isdigit()
        or rest[3:4] not in ("", " ")
    ):
        raise ValueError(f"a status line {one_line(status_line, 60)!r}")
    fields: dict[str, str] = {}
    last = ""
    for line in lines[1:]:
        if not line:
            continue
        if "\n" in line or "\r" in line:
            raise ValueError("a line that does not end with CRLF")
        if line[0] in " \t":
            if not last:
                raise ValueError("a continuation line before any field")
            # obsolete line folding: replaced by a space (RFC 9112 §5.2)
            fields[last] = f"{fields[last]} {line.strip()}"
            continue
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip() or " " in name:
            raise ValueError(f"a field line {one_line(line, 60)!r}")
        name = name.lower()
        value = value.strip(" \t")
        fields[name] = f"{fields[name]}, {value}" if name in fields else value
        last = name
    return int(code), version, fields
