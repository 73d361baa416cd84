"""The Redfish transport: HTTP to one service over DMTF's ``redfish`` library, with safe defaults.

The library (``redfish.rest.v1``) is blocking and its defaults suit scripts, not a service that must
never bind a device twice. Read in its source (3.4): it retries *every* method, POST included, up to
10 times on any exception; it turns TLS verification off unless a CA file is given; it has no timeout
unless one is passed; it never logs in again when a session expires; and at DEBUG it logs request
headers with ``X-Auth-Token`` unmasked. :class:`Transport` wraps it so that:

* TLS is verified by default (``ca_file``, else the certifi bundle); ``insecure`` turns it off with
  a warning.
* Every request has a connect and a read timeout, and every answer a size limit and a deadline for
  its whole body (:class:`_BoundedAdapter`). Bodies are read raw and decoded and parsed by
  :mod:`fabric.redfish.reader` — the limit counts decoded bytes, every content-coding layer
  included, and JSON is parsed within a budget of values, depth and string length.
* The library never retries (``max_retry=0``). GETs are retried here with backoff and jitter,
  honouring ``Retry-After``; POST/PATCH/DELETE are sent exactly once. When a mutation was sent but
  no answer came back, :class:`OutcomeUnknown` says so, and the caller reads the fabric to find out
  what happened instead of sending it again.
* No redirect is followed: one to another host would carry the session token there.
* Mutations carry ``If-Match`` when the caller has an ETag (a malformed one is never sent).
* Errors are :mod:`manager_api.errors` classes mapped by :mod:`fabric.redfish.error_mapping`.
* A 401 makes the :class:`Authentication` (:mod:`fabric.redfish.sessions`) log in again, and the
  request is resent once: a 401 means the service did not act on it (DSP0266 "Authentication").

Every request this client makes, logins and task-monitor reads included, leaves through
:meth:`Transport.send`: the one place that puts a URI on the wire. Blocking calls run in a dedicated
thread pool, never on the event loop; a transport is safe to share between any number of tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import email.utils
import functools
import logging
import socket
import ssl
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import certifi
import requests
import requests.adapters
import urllib3
from redfish.rest.v1 import HttpClient, RetriesExhaustedError, redfish_client

from fabric.redfish.error_mapping import OutcomeUnknown, error_for_response, one_line
from fabric.redfish.links import SERVICE_ROOT, resolve
from fabric.redfish.reader import ACCEPT_ENCODING, ANSWER_BUDGET, Decoder, NotJson, Refused, parse
from fabric.redfish.settings import RedfishSettings
from manager_api.errors import FabricError, FabricUnavailable
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = [
    "RETRY_STATUSES",
    "SERVICE_ROOT",
    "Authentication",
    "RedfishResponse",
    "RequestObserver",
    "Transport",
    "TransportError",
    "resource_kind",
]

log = get_logger(__name__)

# The library logs login response bodies at INFO and auth headers at DEBUG: never let them through.
logging.getLogger("redfish").setLevel(logging.WARNING)

#: answers after which a GET is tried again (and a task monitor read counts as unclear)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

T = TypeVar("T")
#: ``observer(method, resource_kind, outcome, seconds)``: outcome is the HTTP status or an error kind.
RequestObserver = Callable[[str, str, str, float], None]


@dataclass(frozen=True, slots=True)
class RedfishResponse:
    method: str
    uri: str
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    body: dict[str, Any] = field(default_factory=dict)
    #: why ``body`` is empty although a resource was expected: the answer had no body, one that
    #: is no JSON object, or one beyond the parse budget (``{}`` stands in for it)
    unreadable: str | None = None
    #: bytes of the answer's body, decoded
    size: int = 0
    #: JSON values of the body (:class:`fabric.redfish.reader.Budget`)
    values: int = 0

    @property
    def etag(self) -> str | None:
        tag = self.headers.get("etag") or self.body.get("@odata.etag")
        return str(tag) if tag else None

    @property
    def location(self) -> str | None:
        """The ``Location`` header as sent: a URI reference, resolved (and refused when it names
        another origin) by :func:`fabric.redfish.links.resolve` before anything follows it."""
        return self.headers.get("location") or None

    @property
    def retry_after(self) -> float | None:
        return _parse_retry_after(self.headers.get("retry-after"))

    @property
    def is_task(self) -> bool:
        return "TaskState" in self.body or str(self.body.get("@odata.type", "")).startswith("#Task.")


def _parse_retry_after(value: str | None) -> float | None:
    """``Retry-After`` is delay-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# Resources of the service root that are singletons, not collections: the segment after one is
# a property or collection name, never a member id (Redfish Specification DSP0266 1.20, 6.1).
_SINGLETONS = frozenset(
    {
        "AccountService",
        "CertificateService",
        "CompositionService",
        "EventService",
        "SessionService",
        "TaskService",
        "TelemetryService",
        "UpdateService",
    }
)


def resource_kind(uri: str) -> str:
    """A low-cardinality label for a URI: the collection or action it addresses, never a
    member's id (ids are unbounded: one label value per device would grow without end)."""
    path = urlsplit(uri).path.rstrip("/")
    segments = [s for s in path.split("/") if s]
    if "Actions" in segments:
        index = segments.index("Actions")
        if index + 1 < len(segments):
            return segments[index + 1]
    if len(segments) <= 2:
        return "ServiceRoot"
    tail = segments[2:]
    if tail[0] in _SINGLETONS:
        if len(tail) == 1:
            return tail[0]
        tail = tail[1:]
    elif tail[0] == "Oem":
        # /redfish/v1/Oem/<Vendor>/<Collection>[/<Id>...]
        if len(tail) <= 2:
            return "Oem"
        tail = tail[2:]
    # <Collection>/<Id>/<Collection>/<Id>...: the last collection name
    return tail[-1] if len(tail) % 2 == 1 else tail[-2]


class TransportError(Exception):
    """One HTTP exchange failed below HTTP (or its answer was unusable); ``sent`` tells whether
    the request may have arrived, ``answered`` whether the service answered at all."""

    def __init__(self, message: str, *, sent: bool, answered: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.answered = answered


class _AnswerRefused(requests.exceptions.RequestException):
    """The service answered, but not with something this client accepts (too large, too slow)."""


class _ByteBudget:
    """Bytes of answers in flight, all reads of a transport together: a cap per answer alone
    lets 32 concurrent 60 MB answers take 2 GB. A read that cannot get more waits a little for
    others to finish, then fails (and gives back what it held), so no two reads hold each other
    up for ever."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._free = total
        self._cond = threading.Condition()

    def take(self, size: int, wait: float) -> bool:
        with self._cond:
            if self._cond.wait_for(lambda: self._free >= size, timeout=max(0.0, wait)):
                self._free -= size
                return True
            return False

    def give(self, size: int) -> None:
        if size:
            with self._cond:
                self._free += size
                self._cond.notify_all()


#: attribute of a ``requests.Response`` with the budget bytes its body holds until parsed
_HELD = "_fabric_dra_budget_held"
#: longest a read waits for room in the budget before it fails
_BUDGET_WAIT = 2.0


class _BoundedAdapter(requests.adapters.HTTPAdapter):
    """Reads every answer itself, with a size limit, a deadline for the whole body and a budget of
    bytes in flight across concurrent reads; :meth:`abort` cuts every open connection.

    A read timeout bounds each read, not the answer: a service that trickles a byte a second
    would otherwise hold a worker thread for ever, and one that sends gigabytes — one answer
    without ``Content-Length`` or many at once — would exhaust memory. The body is read here as
    it arrives (chunked answers too), so the limits hold while streaming. It is read raw: the
    :class:`fabric.redfish.reader.Decoder` undoes its ``Content-Encoding`` a bounded piece at a
    time (urllib3 before 2.6, which requests allows, decoded all that one read brought:
    CVE-2025-66471)."""

    def __init__(self, *, max_bytes: int, deadline: float, budget: _ByteBudget, **kwargs: Any) -> None:
        self.max_bytes = max_bytes
        self.deadline = deadline
        self.budget = budget
        #: how many times :meth:`abort` ran: a read it cut short must not pass for a whole answer
        self.aborts = 0
        #: connections that ever connected; :meth:`abort` shuts their sockets
        self._connections: weakref.WeakSet[urllib3.connection.HTTPConnection] = weakref.WeakSet()
        super().__init__(**kwargs)

    def init_poolmanager(
        self, connections: int, maxsize: int, block: bool = False, **pool_kwargs: Any
    ) -> None:
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        opened = self._connections

        class _Http(urllib3.connection.HTTPConnection):
            def connect(self) -> None:
                super().connect()
                opened.add(self)

        class _Https(urllib3.connection.HTTPSConnection):
            def connect(self) -> None:
                super().connect()
                opened.add(self)

        class _HttpPool(urllib3.HTTPConnectionPool):
            ConnectionCls = _Http

        class _HttpsPool(urllib3.HTTPSConnectionPool):
            ConnectionCls = _Https

        self.poolmanager.pool_classes_by_scheme = {"http": _HttpPool, "https": _HttpsPool}

    def abort(self) -> None:
        """Cut every connection, those a worker thread is blocked reading on included: the read
        fails at once (a thread cannot be cancelled, its socket can)."""
        self.aborts += 1
        for connection in list(self._connections):
            sock = connection.sock
            if sock is not None:
                with contextlib.suppress(OSError):
                    # the plain socket's shutdown also for TLS: no TLS close alert from this thread
                    socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        aborts = self.aborts
        response = super().send(
            request, stream=True, timeout=timeout, verify=verify, cert=cert, proxies=proxies
        )
        if stream:
            return response
        limit = _size(self.max_bytes)
        held = 0
        # One growing buffer, not a list of chunks joined at the end: the join held the answer
        # twice at its peak. The reader parses a bytearray as it parses bytes.
        chunks = bytearray()
        try:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise _AnswerRefused(f"the answer is larger than {limit} (Content-Length {declared})")
            give_up = time.monotonic() + self.deadline
            wire = 0
            try:
                decoder = Decoder(response.headers.get("Content-Encoding"), limit=self.max_bytes)
                while chunk := response.raw.read1(64 << 10, decode_content=False):  # what has arrived
                    wire += len(chunk)
                    if wire > self.max_bytes:
                        raise _AnswerRefused(f"the answer is larger than {limit}")
                    for piece in decoder.feed(chunk):
                        if time.monotonic() > give_up:
                            raise _AnswerRefused(f"the answer did not arrive within {self.deadline:.0f} s")
                        if not self.budget.take(len(piece), min(_BUDGET_WAIT, give_up - time.monotonic())):
                            raise _AnswerRefused(
                                f"more than {_size(self.budget.total)} of answers in flight at once; "
                                f"this one ({_size(len(chunks))} so far) was given up"
                            )
                        held += len(piece)
                        chunks += piece
                    if time.monotonic() > give_up:
                        raise _AnswerRefused(f"the answer did not arrive within {self.deadline:.0f} s")
                decoder.finish()
            except Refused as err:
                raise _AnswerRefused(str(err)) from None
            if self.aborts != aborts:
                raise _AnswerRefused("the read was cut short: the client is shutting down")
        except BaseException:
            # The exception's traceback keeps this frame alive (errors are kept: the inventory's
            # last error, retries' causes): it must not keep what was read along with it.
            chunks.clear()
            self.budget.give(held)
            response.close()
            raise
        response._content = chunks  # type: ignore[assignment]  # bytes-like; every reader accepts it
        response._content_consumed = True
        setattr(response, _HELD, held)  # given back by Transport.send once parsed
        return response


#: glibc's mallopt parameters (malloc.h): the number of malloc arenas, the mmap threshold
_M_ARENA_MAX = -8
_M_MMAP_THRESHOLD = -3
_MALLOC_ARENAS = 2
#: blocks at least this large are mappings of their own, returned to the kernel when freed
_MMAP_THRESHOLD = 256 << 10


def _malloc_for_large_answers() -> None:
    """Shape glibc's malloc for answer buffers of up to :data:`max_response_bytes`, for the whole
    process; no-op without glibc.

    * :data:`_MALLOC_ARENAS` arenas: glibc gives each thread that allocates its own arena (up to 8
      per core), and an arena keeps the memory its thread once held: 16 worker threads that each
      read one 60 MB answer in turn leave ~1 GB resident although never more than the in-flight
      budget was alive at once (measured: 470 MiB peak for 48 refused answers, 198 MiB with two
      arenas). Worker threads spend their time waiting for the network, so sharing two arenas
      costs nothing measurable.
    * a fixed mmap threshold: by default glibc raises the threshold to the size of every mapped
      block freed, up to 32 MiB (mallopt(3), M_MMAP_THRESHOLD), so after the first refused answer
      the next buffers of 1-32 MiB grow inside the arenas, whose free space fragments and stays
      resident: endless chunked answers to every read took the manager from 98 to 335-409 MiB,
      depending on how the reads interleaved. Setting the threshold turns that off: every buffer
      above it is a mapping of its own (grown by mremap, given back when freed)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_ARENA_MAX, _MALLOC_ARENAS)
        libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count} bytes"


def _describe_transport(cause: BaseException | None) -> tuple[str, bool]:
    """(what went wrong, whether the request may have reached the service)."""
    if isinstance(cause, _AnswerRefused):
        return str(cause), True
    if isinstance(cause, requests.exceptions.SSLError):
        return _tls_reason(_root_reason(cause)), False
    if isinstance(cause, requests.exceptions.ConnectTimeout):
        return "connection timed out", False
    if isinstance(cause, requests.exceptions.ReadTimeout):
        return "no answer within the read timeout", True
    if isinstance(cause, requests.exceptions.ConnectionError):
        reason = _root_reason(cause)
        refused = any(s in reason for s in ("NewConnectionError", "Connection refused", "Name or service"))
        return (f"cannot connect ({reason})", False) if refused else (f"connection lost ({reason})", True)
    if cause is None:
        return "request failed", True
    return one_line(f"{type(cause).__name__}: {cause}", 300), True


def _tls_reason(reason: str) -> str:
    """A refused TLS handshake, with what to change: the name, the CA, or the service."""
    if "mismatch" in reason:
        step = (
            "the service's certificate does not name the host of --redfish-url: give it a certificate "
            "for that name, or use a name the certificate has"
        )
    elif "certificate verify failed" in reason:
        step = "give the CA that signed the service's certificate with --redfish-ca-file"
    else:
        step = "check the service's TLS setup and --redfish-ca-file"
    return f"TLS handshake failed ({reason}); {step}"


def _root_reason(err: BaseException) -> str:
    seen: BaseException = err
    for _ in range(6):
        nxt = seen.__cause__ or seen.__context__
        if nxt is None:
            break
        seen = nxt
    return one_line(str(seen) or type(seen).__name__, 200)


class Authentication(Protocol):
    """What the transport asks of the credentials it sends (:class:`fabric.redfish.sessions.Sessions`).
    Both run in worker threads."""

    def ensure(self) -> int:
        """Log in unless logged in; the generation of the credentials now in use."""
        ...

    def rejected(self, generation: int) -> bool:
        """The service answered 401 to the credentials of ``generation``: log in again (unless
        another request did already) and say whether resending may succeed."""
        ...


class Transport:
    """HTTP to one Redfish service; see the module docstring for what it guarantees."""

    def __init__(self, settings: RedfishSettings, *, observer: RequestObserver | None = None) -> None:
        self.settings = settings
        self._observer = observer
        #: who supplies the credentials; None: requests go without any
        self.auth: Authentication | None = None
        https = settings.base_url.startswith("https://")
        if https and settings.insecure:
            log.warning(
                "TLS verification of the Redfish service is OFF (--redfish-insecure)", url=settings.base_url
            )
            # said once, above; urllib3 would repeat it on every request
            warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
        if not https and settings.auth != "none" and settings.username:
            log.warning("Redfish credentials are sent without TLS", url=settings.base_url)
        cafile: str | None = None
        if https and not settings.insecure:
            cafile = str(settings.ca_file) if settings.ca_file else certifi.where()
        self._rf: HttpClient = redfish_client(
            base_url=settings.base_url,
            cafile=cafile,
            timeout=(settings.connect_timeout, settings.read_timeout),
            max_retry=0,
            check_connectivity=False,
        )
        # The library's pool keeps 10 connections; size it to our worker count so concurrent requests
        # reuse connections instead of opening and discarding them. No transport-level retries either.
        self._adapter = adapter = _BoundedAdapter(
            max_bytes=settings.max_response_bytes,
            deadline=settings.response_deadline or 4 * settings.read_timeout,
            budget=_ByteBudget(max(settings.max_inflight_bytes, settings.max_response_bytes)),
            pool_connections=2,
            pool_maxsize=settings.max_workers,
            max_retries=0,
        )
        self._rf._session.mount("https://", adapter)
        self._rf._session.mount("http://", adapter)
        # requests reads the environment on every request (proxy variables, ~/.netrc, CA bundle
        # variables) — a tenth of a request's CPU. The process environment does not change: take
        # the proxies for this service once; verification is always set explicitly above.
        self._rf._session.proxies.update(requests.utils.get_environ_proxies(settings.base_url))
        self._rf._session.trust_env = False
        _malloc_for_large_answers()  # before the worker threads start
        self._executor = ThreadPoolExecutor(max_workers=settings.max_workers, thread_name_prefix="redfish")
        self.closed = False

    @property
    def base_url(self) -> str:
        return self.settings.base_url

    # -- credentials (set by the authentication, worker threads) ---------------------------------

    def use_credentials(self, *, session_key: str | None = None, authorization: str | None = None) -> None:
        """Send ``X-Auth-Token: session_key`` or ``Authorization: authorization`` from now on (or
        nothing, with neither)."""
        self._rf.set_session_key(session_key)
        self._rf.set_authorization_key(authorization)

    def credential_headers(self) -> dict[str, str]:
        """The headers that carry the credentials now in use."""
        key = self._rf.get_session_key()
        if key:
            return {"X-Auth-Token": key}
        authorization = self._rf.get_authorization_key()
        return {"Authorization": authorization} if authorization else {}

    # -- the wire (worker threads) ---------------------------------------------------------------

    def send(
        self,
        method: str,
        uri: str,
        *,
        body: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: tuple[float, float] | None = None,
    ) -> RedfishResponse:
        """One request as given, with the credentials in use and nothing else: every request of
        this client leaves through here. ``uri`` is resolved against the service root and refused
        (:class:`fabric.redfish.links.ForeignLink`) unless it names this service: the library
        appends it to the base URL, and ``@host:port/x`` appended is another host. Never follows a
        redirect: a redirect to another host would carry the session token (``X-Auth-Token``)
        there. Raises :class:`TransportError` when no usable answer came."""
        path = resolve(self.base_url, uri)
        started = time.perf_counter()
        # Only the codings the reader decodes (requests would also offer zstd when a decoder for
        # it happens to be installed).
        request_headers = {"Accept-Encoding": ACCEPT_ENCODING, **(headers or {})}
        try:
            raw = self._rf._rest_request(
                path,
                method=method,
                body=body,
                headers=request_headers,
                allow_redirects=False,
                timeout=timeout,
                max_retry=0,
            )
        except RetriesExhaustedError as err:
            reason, sent = _describe_transport(err.__cause__)
            self._observe(method, uri, "transport", started)
            raise TransportError(
                reason, sent=sent, answered=isinstance(err.__cause__, _AnswerRefused)
            ) from None
        self._observe(method, uri, str(raw.status), started)
        answer_headers = {k.lower(): v for k, v in raw._http_response.headers.items()}
        content = raw._http_response.content
        resource: dict[str, Any] = {}
        unreadable: str | None = None
        values = 0
        try:
            parsed = parse(content, ANSWER_BUDGET)
        except NotJson:
            unreadable = _what_body(content, answer_headers)
        except Refused as err:
            unreadable = f"a body beyond what fabric-dra parses: {err}"
        else:
            values = parsed.values
            if isinstance(parsed.value, dict):
                resource = parsed.value
            else:
                unreadable = _what_body(content, answer_headers)
        finally:
            # the answer's bytes count against the budget until parsed, then are dropped here
            self._adapter.budget.give(getattr(raw._http_response, _HELD, 0))
        return RedfishResponse(
            method=method,
            uri=uri,
            status=int(raw.status),
            headers=answer_headers,
            body=resource,
            unreadable=unreadable,
            size=len(content or b""),
            values=values,
        )

    def exchange(
        self,
        method: str,
        uri: str,
        body: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        timeout: tuple[float, float] | None,
    ) -> RedfishResponse:
        """One authenticated request: after a 401, one new login and one resend."""
        auth = self.auth
        for attempt in (1, 2):
            generation = auth.ensure() if auth is not None else 0
            call_headers = dict(headers or {})
            call_headers.setdefault("Accept", "application/json")
            response = self.send(
                method,
                uri,
                body=None if method in ("GET", "DELETE") else dict(body or {}),
                headers=call_headers,
                timeout=timeout,
            )
            if response.status == 401 and attempt == 1 and auth is not None and auth.rejected(generation):
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _observe(self, method: str, uri: str, outcome: str, started: float) -> None:
        if self._observer is not None:
            self._observer(method, resource_kind(uri), outcome, time.perf_counter() - started)

    # -- async API -------------------------------------------------------------------------------

    async def in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self.closed:
            raise FabricUnavailable("the Redfish client is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def fetch(self, uri: str) -> RedfishResponse:
        """One authenticated GET, answered as the service answered: no retry, no error mapping
        (a task monitor's answers mean more than their status). Raises :class:`TransportError`."""
        return await self.in_thread(self.exchange, "GET", uri, None, None, None)

    async def request(
        self,
        method: str,
        uri: str,
        *,
        body: Mapping[str, Any] | None = None,
        etag: str | None = None,
        http_timeout: tuple[float, float] | None = None,
    ) -> RedfishResponse:
        """One request; GETs are retried, mutations are not. Raises on HTTP ≥ 300."""
        headers = {"If-Match": etag} if etag and method in ("PATCH", "PUT", "DELETE") else None
        if headers is not None and not _valid_etag(etag or ""):
            # A header value with line breaks or control characters: never sent (it could smuggle
            # headers); nothing happened, so the caller reads again and decides.
            raise FabricUnavailable(
                f"Redfish {method} {uri} at {self.base_url}: the service's ETag "
                f"{one_line(repr(etag), 80)} is no valid entity-tag; not sent"
            )
        if method == "GET":
            return await self._get_with_retries(uri, http_timeout)
        try:
            response = await self.in_thread(self.exchange, method, uri, body, headers, http_timeout)
        except TransportError as err:
            message = f"Redfish {method} {uri} at {self.base_url}: {err}"
            if err.sent:
                raise OutcomeUnknown(message + "; the fabric may or may not have acted on it") from None
            raise FabricUnavailable(message) from None
        if 300 <= response.status < 400:
            raise self._refuse_redirect(response)
        if response.status >= 400:
            raise error_for_response(
                response.status, response.body, method=method, uri=uri, retry_after=response.retry_after
            )
        return response

    def _refuse_redirect(self, response: RedfishResponse) -> FabricError:
        where = one_line(response.headers.get("location") or "nowhere", 200)
        return FabricUnavailable(
            f"Redfish {response.method} {response.uri} at {self.base_url} answered {response.status}, a "
            f"redirect to {where}; fabric-dra follows no redirects (the session token would go along): "
            "point --redfish-url at the service itself"
        )

    async def _get_with_retries(self, uri: str, http_timeout: tuple[float, float] | None) -> RedfishResponse:
        attempts = self.settings.get_attempts
        backoff = Backoff(self.settings.backoff_initial, self.settings.backoff_max)
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            last = attempt == attempts
            try:
                response = await self.in_thread(self.exchange, "GET", uri, None, None, http_timeout)
            except TransportError as err:
                if last:
                    what = "answered badly" if err.answered else "unreachable"
                    raise FabricUnavailable(f"Redfish service at {self.base_url} {what}: {err}") from None
            else:
                if response.status < 300 and response.unreadable is None:
                    return response
                if response.status < 300:
                    # An empty or unreadable resource must not read as an empty one (an empty
                    # Zones collection would say that nothing is bound): a failed read.
                    if last:
                        raise FabricUnavailable(
                            f"Redfish service at {self.base_url} answered badly: GET {uri} answered "
                            f"{response.status} with {response.unreadable}"
                        )
                elif response.status < 400:
                    raise self._refuse_redirect(response)
                elif response.status not in RETRY_STATUSES or last:
                    raise error_for_response(
                        response.status,
                        response.body,
                        method="GET",
                        uri=uri,
                        retry_after=response.retry_after,
                    )
                wait = response.retry_after
            # The backoff moves on with every attempt, also those whose pause the service named.
            delay = backoff.next()
            await asyncio.sleep(min(wait if wait is not None else delay, self.settings.backoff_max))
        raise AssertionError("unreachable")  # pragma: no cover

    # -- lifecycle -------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The TLS settings of this transport, for requests made with another HTTP library."""
        if not self.base_url.startswith("https://"):
            return False
        if self.settings.insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        return ssl.create_default_context(cafile=str(self.settings.ca_file or certifi.where()))

    def abort(self) -> None:
        """Cut every connection, in-flight reads included (they fail at once), so that no worker
        thread holds the process's exit; later requests open new connections."""
        self._adapter.abort()

    def close(self) -> None:
        """Release the thread pool and the connections, cutting reads still in flight; later
        requests fail as unavailable."""
        self.closed = True
        self._adapter.abort()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._rf._session.close()


def _valid_etag(value: str) -> bool:
    """An ETag fit to go back in ``If-Match``: visible ASCII or obs-text (RFC 9110 §8.8.3, also
    unquoted ones, which services send), of sane length."""
    return 0 < len(value) <= 1024 and all(0x21 <= ord(c) <= 0x7E or 0x80 <= ord(c) <= 0xFF for c in value)


def _what_body(content: bytes | None, headers: Mapping[str, str]) -> str:
    if not content:
        return "an empty body"
    kind = headers.get("content-type") or "no Content-Type"
    return f"{len(content)} bytes of {one_line(kind, 60)}, not a JSON object"
