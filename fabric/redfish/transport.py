"""The Redfish transport: HTTP to one service, with safe defaults, on the event loop.

Built on :mod:`plumbing.http1` (HTTP/1.1 over asyncio streams) and the bounded reader
(:mod:`fabric.redfish.reader`). :class:`Transport` guarantees:

* TLS is verified by default (``ca_file``, else the certifi bundle); ``insecure`` turns it off with
  a warning.
* Every request has a connect and a read timeout, and every answer a size limit and a deadline for
  its whole body. Bodies are read raw, as they arrive, and decoded and parsed by
  :mod:`fabric.redfish.reader` — the limit counts decoded bytes, every content-coding layer
  included, and JSON is parsed within a budget of values, depth and string length. The bytes of
  all answers being read at once have a budget too (:class:`_ByteBudget`).
* GETs are retried with backoff and jitter, honouring ``Retry-After``; POST/PATCH/DELETE are sent
  exactly once. When a mutation was sent but no answer came back, :class:`OutcomeUnknown` says so,
  and the caller reads the fabric to find out what happened instead of sending it again.
* No redirect is followed: one to another host would carry the session token there.
* Mutations carry ``If-Match`` when the caller has an ETag (a malformed one is never sent).
* Errors are :mod:`manager_api.errors` classes mapped by :mod:`fabric.redfish.error_mapping`.
* A 401 makes the :class:`Authentication` (:mod:`fabric.redfish.sessions`) log in again, and the
  request is resent once: a 401 means the service did not act on it (DSP0266 "Authentication").

Every request this client makes, logins, task-monitor reads and the event stream included, leaves
through :meth:`Transport.send` or :meth:`Transport.stream`: the one place that puts a URI on the
wire. A transport is safe to share between any number of tasks of one event loop.

DMTF's ``redfish`` library, which this transport was first built on, no longer fits anywhere: its
requests block (with the worker threads they need, a GET cost the manager 0.66 to 0.70 ms of CPU
against 0.08 ms here: ``bench/redfish_bench.py``), it follows redirects and retries POSTs unless
told not to, its login appends ``Links.Sessions`` to the base URL (the trap
:mod:`fabric.redfish.links` exists for), and reading an answer raw, bounded, took its private
attributes (docs/manager.md, "The Redfish client").
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlsplit

import certifi

from fabric.errors import ManagerError
from fabric.redfish.error_mapping import OutcomeUnknown, error_for_response, one_line
from fabric.redfish.links import SERVICE_ROOT, resolve
from fabric.redfish.reader import ACCEPT_ENCODING, ANSWER_BUDGET, Decoder, NotJson, Refused, parse
from fabric.redfish.settings import RedfishSettings
from manager_api.errors import FabricError, FabricUnavailable
from plumbing.backoff import Backoff
from plumbing.http1 import Answer, TransportError, Wire, proxy_for
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

#: answers after which a GET is tried again (and a task monitor read counts as unclear)
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

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


class _ByteBudget:
    """Bytes of answers in flight, all reads of a transport together: a cap per answer alone
    lets 32 concurrent 60 MB answers take 2 GB. A read that cannot get more waits a little for
    others to finish, then fails (and gives back what it held), so no two reads hold each other
    up for ever."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        #: reads waiting for room, woken by every :meth:`give`
        self._waiters: list[asyncio.Future[None]] = []

    def take_now(self, size: int) -> bool:
        """Take ``size`` bytes if they are free now (no waiting, no coroutine)."""
        if self.free >= size:
            self.free -= size
            return True
        return False

    async def take(self, size: int, wait: float) -> bool:
        """Take ``size`` bytes, waiting up to ``wait`` seconds for others to give some back."""
        if self.take_now(size):
            return True
        loop = asyncio.get_running_loop()
        give_up = loop.time() + wait
        while self.free < size:
            left = give_up - loop.time()
            if left <= 0:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, left)
            except TimeoutError:
                if self.free < size:
                    return False
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        self.free -= size
        return True

    def give(self, size: int) -> None:
        if size:
            self.free += size
            waiters, self._waiters = self._waiters, []
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)


#: longest a read waits for room in the budget before it fails
_BUDGET_WAIT = 2.0
#: fields of every request unless the caller gives its own
_ACCEPT = {"Accept": "application/json", "Accept-Encoding": ACCEPT_ENCODING}


class _AnswerRefused(ManagerError):
    """The service answered, but not with something this client accepts (too large, too slow)."""


def _size(count: int) -> str:
    return f"{count >> 20} MiB" if count >= 1 << 20 else f"{count} bytes"


class Authentication(Protocol):
    """What the transport asks of the credentials it sends (:class:`fabric.redfish.sessions.Sessions`)."""

    async def ensure(self) -> int:
        """Log in unless logged in; the generation of the credentials now in use."""
        ...

    async def rejected(self, generation: int) -> bool:
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
        if not https and settings.auth != "none" and settings.username:
            log.warning("Redfish credentials are sent without TLS", url=settings.base_url)
        self.max_bytes = settings.max_response_bytes
        self.deadline = settings.response_deadline or 4 * settings.read_timeout
        self.budget = _ByteBudget(max(settings.max_inflight_bytes, settings.max_response_bytes))
        # The proxy is taken from the environment once: it does not change while the process runs.
        self._wire = Wire(
            settings.base_url,
            tls=self._tls_context(),
            proxy=proxy_for(settings.base_url),
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            deadline=self.deadline,
            max_connections=settings.max_workers,
            tls_advice=_tls_reason,
        )
        #: the fields that carry the credentials now in use
        self._credentials: dict[str, str] = {}
        self.closed = False

    @property
    def base_url(self) -> str:
        return self.settings.base_url

    @property
    def proxy(self) -> str | None:
        """The proxy requests go through (no credentials), or None."""
        return self._wire.proxy.shown if self._wire.proxy is not None else None

    def _tls_context(self) -> ssl.SSLContext | None:
        if not self.base_url.startswith("https://"):
            return None
        if self.settings.insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        return ssl.create_default_context(cafile=str(self.settings.ca_file or certifi.where()))

    # -- credentials (set by the authentication) -------------------------------------------------

    def use_credentials(self, *, session_key: str | None = None, authorization: str | None = None) -> None:
        """Send ``X-Auth-Token: session_key`` or ``Authorization: authorization`` from now on (or
        nothing, with neither)."""
        if session_key:
            self._credentials = {"X-Auth-Token": session_key}
        elif authorization:
            self._credentials = {"Authorization": authorization}
        else:
            self._credentials = {}

    def credential_headers(self) -> dict[str, str]:
        """The headers that carry the credentials now in use."""
        return dict(self._credentials)

    # -- the wire --------------------------------------------------------------------------------

    async def send(
        self,
        method: str,
        uri: str,
        *,
        body: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        http_timeout: tuple[float, float] | None = None,
    ) -> RedfishResponse:
        """One request as given, with the credentials in use and nothing else: every request of
        this client but the event stream leaves through here. ``uri`` is resolved against the
        service root and refused (:class:`fabric.redfish.links.ForeignLink`) unless it names this
        service. Never follows a redirect: a redirect to another host would carry the session
        token (``X-Auth-Token``) there. Raises :class:`TransportError` when no usable answer came."""
        if self.closed:
            raise FabricUnavailable("the Redfish client is closed")
        path = resolve(self.base_url, uri)
        started = time.perf_counter()
        fields = {**_ACCEPT, **self._credentials, **(headers or {})}
        payload = None
        if body is not None:
            fields["Content-Type"] = "application/json"
            payload = json.dumps(body, separators=(",", ":")).encode()
        try:
            answer = await self._wire.open(method, path, fields, payload, http_timeout=http_timeout)
            try:
                content, held = await self._read(answer)
            finally:
                answer.close()
        except TransportError:
            self._observe(method, uri, "transport", started)
            raise
        except _AnswerRefused as err:
            self._observe(method, uri, "transport", started)
            raise TransportError(str(err), sent=True, answered=True) from None
        self._observe(method, uri, str(answer.status), started)
        resource: dict[str, Any] = {}
        unreadable: str | None = None
        values = 0
        try:
            parsed = parse(content, ANSWER_BUDGET)
        except NotJson:
            unreadable = _what_body(content, answer.headers)
        except Refused as err:
            unreadable = f"a body beyond what fabric-dra parses: {err}"
        else:
            values = parsed.values
            if isinstance(parsed.value, dict):
                resource = parsed.value
            else:
                unreadable = _what_body(content, answer.headers)
        finally:
            # the answer's bytes count against the budget until parsed, then are dropped here
            self.budget.give(held)
        return RedfishResponse(
            method=method,
            uri=uri,
            status=answer.status,
            headers=answer.headers,
            body=resource,
            unreadable=unreadable,
            size=len(content),
            values=values,
        )

    async def _read(self, answer: Answer) -> tuple[bytearray, int]:
        """The body of ``answer``, decoded, and the budget bytes it holds (the caller gives them
        back once it is parsed). The limits hold while it arrives: its size on the wire and
        decoded (every content-coding layer), and the budget of bytes in flight."""
        limit = self.max_bytes
        declared = answer.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise _AnswerRefused(f"the answer is larger than {_size(limit)} (Content-Length {declared})")
        held = 0
        # One growing buffer, not a list of chunks joined at the end: the join held the answer
        # twice at its peak. The reader parses a bytearray as it parses bytes.
        content = bytearray()
        try:
            coding = answer.headers.get("content-encoding")
            # no coding (most answers): the bytes as they came, the wire's size limit is the limit
            decoder = Decoder(coding, limit=limit) if coding else None
            wire = 0
            while chunk := await answer.read():
                wire += len(chunk)
                if wire > limit:
                    raise _AnswerRefused(f"the answer is larger than {_size(limit)}")
                for piece in decoder.feed(chunk) if decoder is not None else (chunk,):
                    size = len(piece)
                    if not (self.budget.take_now(size) or await self.budget.take(size, _BUDGET_WAIT)):
                        raise _AnswerRefused(
                            f"more than {_size(self.budget.total)} of answers in flight at once; "
                            f"this one ({_size(len(content))} so far) was given up"
                        )
                    held += size
                    content += piece
            if decoder is not None:
                decoder.finish()
        except Refused as err:
            content.clear()
            self.budget.give(held)
            raise _AnswerRefused(str(err)) from None
        except BaseException:
            # The exception's traceback keeps this frame alive (errors are kept: the inventory's
            # last error, retries' causes): it must not keep what was read along with it.
            content.clear()
            self.budget.give(held)
            raise
        return content, held

    async def stream(self, uri: str, headers: Mapping[str, str]) -> Answer:
        """Open an answer without end (the event stream): the credentials in use, no read timeout,
        no deadline, its own connection. The caller reads it raw and closes it; bounding what it
        sends is the caller's (:class:`fabric.redfish.reader.EventReader`)."""
        if self.closed:
            raise FabricUnavailable("the Redfish client is closed")
        path = resolve(self.base_url, uri)
        fields = {**_ACCEPT, **self._credentials, **headers}
        return await self._wire.open("GET", path, fields, stream=True)

    async def exchange(
        self,
        method: str,
        uri: str,
        body: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        http_timeout: tuple[float, float] | None,
    ) -> RedfishResponse:
        """One authenticated request: after a 401, one new login and one resend."""
        auth = self.auth
        for attempt in (1, 2):
            generation = await auth.ensure() if auth is not None else 0
            response = await self.send(
                method,
                uri,
                body=None if method in ("GET", "DELETE") else dict(body or {}),
                headers=headers,
                http_timeout=http_timeout,
            )
            if (
                response.status == 401
                and attempt == 1
                and auth is not None
                and await auth.rejected(generation)
            ):
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def _observe(self, method: str, uri: str, outcome: str, started: float) -> None:
        if self._observer is not None:
            self._observer(method, resource_kind(uri), outcome, time.perf_counter() - started)

    # -- requests --------------------------------------------------------------------------------

    async def fetch(self, uri: str) -> RedfishResponse:
        """One authenticated GET, answered as the service answered: no retry, no error mapping
        (a task monitor's answers mean more than their status). Raises :class:`TransportError`."""
        return await self.exchange("GET", uri, None, None, None)

    async def request(
        self,
        method: str,
        uri: str,
        *,
        body: Mapping[str, Any] | None = None,
        etag: str | None = None,
        http_timeout: tuple[float, float] | None = None,
        if_none_match: str | None = None,
    ) -> RedfishResponse:
        """One request; GETs are retried, mutations are not. Raises on HTTP ≥ 300 — but for a GET
        with ``if_none_match`` (an ETag this client read before), whose 304 Not Modified (RFC 9110
        §13.1.2) comes back as it is, without a body: what was read with that ETag still holds."""
        if method == "GET" and if_none_match is not None:
            if not _valid_etag(if_none_match):
                if_none_match = None  # read again in full rather than send a header it could smuggle
            return await self._get_with_retries(uri, http_timeout, if_none_match)
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
            response = await self.exchange(method, uri, body, headers, http_timeout)
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

    async def _get_with_retries(
        self, uri: str, http_timeout: tuple[float, float] | None, if_none_match: str | None = None
    ) -> RedfishResponse:
        attempts = self.settings.get_attempts
        headers = {"If-None-Match": if_none_match} if if_none_match else None
        backoff = Backoff(self.settings.backoff_initial, self.settings.backoff_max)
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            last = attempt == attempts
            try:
                response = await self.exchange("GET", uri, None, headers, http_timeout)
            except TransportError as err:
                if last:
                    what = "answered badly" if err.answered else "unreachable"
                    raise FabricUnavailable(f"Redfish service at {self.base_url} {what}: {err}") from None
            else:
                if response.status == 304 and headers is not None:
                    return response
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

    def abort(self) -> None:
        """Cut every connection, in-flight reads included (they fail at once); later requests
        open new connections."""
        self._wire.abort()

    def close(self) -> None:
        """Cut every connection, reads still in flight included; later requests fail as
        unavailable."""
        self.closed = True
        self._wire.abort()


def _valid_etag(value: str) -> bool:
    """An ETag fit to go back in ``If-Match``: visible ASCII or obs-text (RFC 9110 §8.8.3, also
    unquoted ones, which services send), of sane length."""
    return 0 < len(value) <= 1024 and all(0x21 <= ord(c) <= 0x7E or 0x80 <= ord(c) <= 0xFF for c in value)


def _what_body(content: bytes | bytearray | None, headers: Mapping[str, str]) -> str:
    if not content:
        return "an empty body"
    kind = headers.get("content-type") or "no Content-Type"
    return f"{len(content)} bytes of {one_line(kind, 60)}, not a JSON object"


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
