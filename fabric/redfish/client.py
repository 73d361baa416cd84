"""A Redfish client with safe defaults, built on DMTF's ``redfish`` library.

The library (``redfish.rest.v1``) is blocking and its defaults suit scripts, not a service that must
never bind a device twice. Read in its source (3.4): it retries *every* method, POST included, up to
10 times on any exception; it turns TLS verification off unless a CA file is given; it has no timeout
unless one is passed; it never logs in again when a session expires; and at DEBUG it logs request
headers with ``X-Auth-Token`` unmasked. This module wraps it so that:

* TLS is verified by default (``ca_file``, else the certifi bundle); ``insecure`` turns it off with
  a warning.
* Every request has a connect and a read timeout.
* The library never retries (``max_retry=0``). GETs are retried here with exponential backoff and
  jitter, honouring ``Retry-After``; POST/PATCH/DELETE are sent exactly once. When a mutation was
  sent but no answer came back, :class:`OutcomeUnknown` says so, and the caller reads the fabric to
  find out what happened instead of sending it again.
* Session login (``SessionService/Sessions``) happens on first use; a 401 triggers one new login
  and one resend (a 401 means the service did not act on the request, DSP0266 "Authentication").
* 202 responses are followed through their task monitor (:meth:`RedfishClient.follow`).
* Mutations carry ``If-Match`` when the caller has an ETag.
* Errors are :mod:`manager_api.errors` classes mapped by :mod:`fabric.redfish.error_mapping`.

Blocking calls run in a dedicated thread pool, never on the event loop; the client is safe to share
between any number of concurrent tasks.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import functools
import json
import logging
import random
import ssl
import threading
import time
import warnings
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import certifi
import requests
import requests.adapters
import urllib3
from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from redfish.rest.v1 import HttpClient, RetriesExhaustedError, redfish_client

from fabric.redfish.error_mapping import error_for_response, error_for_task, one_line
from fabric.redfish.tasks import EVENTED_POLL_SECONDS, TaskWatch
from manager_api.errors import AttachTimeout, FabricError, FabricUnavailable
from plumbing.logs import get_logger

__all__ = [
    "OutcomeUnknown",
    "RedfishClient",
    "RedfishResponse",
    "RedfishSettings",
    "RequestObserver",
    "resource_kind",
]

log = get_logger(__name__)

# The library logs login response bodies at INFO and auth headers at DEBUG: never let them through.
logging.getLogger("redfish").setLevel(logging.WARNING)

SERVICE_ROOT = "/redfish/v1/"
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_TERMINAL_TASK_STATES = frozenset({"Completed", "Killed", "Exception", "Cancelled"})
_FAILED_TASK_STATES = frozenset({"Killed", "Exception", "Cancelled"})

T = TypeVar("T")
#: ``observer(method, resource_kind, outcome, seconds)``: outcome is the HTTP status or an error kind.
RequestObserver = Callable[[str, str, str, float], None]


class OutcomeUnknown(FabricUnavailable):
    """A mutation was sent but no answer came back (connection lost, read timeout, task monitor gone).

    The service may or may not have acted on it. Never resend blindly: read the fabric and decide.
    """


class RedfishSettings(BaseModel):
    """How to reach and authenticate to one Redfish service."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="scheme://host[:port] of the Redfish service")
    username: str | None = None
    password: SecretStr | None = None
    auth: Literal["session", "basic", "none"] = "session"
    ca_file: str | None = Field(default=None, description="PEM bundle that signs the service certificate")
    insecure: bool = Field(default=False, description="skip TLS verification (development only)")
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=30.0, gt=0)
    get_attempts: int = Field(default=4, ge=1, description="tries per GET, counting the first")
    backoff_initial: float = Field(default=0.2, gt=0)
    backoff_max: float = Field(default=5.0, gt=0)
    max_workers: int = Field(default=32, ge=1, description="concurrent Redfish requests")
    max_response_bytes: int = Field(default=64 << 20, ge=1024, description="largest answer accepted")
    response_deadline: float | None = Field(
        default=None,
        gt=0,
        description="longest a whole answer may take to arrive (default: 4 times read_timeout)",
    )

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s)://host[:port] URL")
        if parts.username or parts.password:
            raise ValueError("put Redfish credentials in the credentials file, not in the URL")
        return f"{parts.scheme}://{parts.netloc}"


@dataclass(frozen=True, slots=True)
class RedfishResponse:
    method: str
    uri: str
    status: int
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names
    body: dict[str, Any] = field(default_factory=dict)
    #: why ``body`` is empty although a resource was expected: the answer had no body, or one
    #: that is no JSON object (``{}`` stands in for it)
    unreadable: str | None = None

    @property
    def etag(self) -> str | None:
        tag = self.headers.get("etag") or self.body.get("@odata.etag")
        return str(tag) if tag else None

    @property
    def location(self) -> str | None:
        value = self.headers.get("location")
        if not value:
            return None
        parts = urlsplit(value)
        return parts.path + (f"?{parts.query}" if parts.query else "") if parts.scheme else value

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


class _Transport(Exception):
    """One HTTP exchange failed below HTTP (or its answer was unusable); ``sent`` tells whether
    the request may have arrived, ``answered`` whether the service answered at all."""

    def __init__(self, message: str, *, sent: bool, answered: bool = False) -> None:
        super().__init__(message)
        self.sent = sent
        self.answered = answered


class _AnswerRefused(requests.exceptions.RequestException):
    """The service answered, but not with something this client accepts (too large, too slow)."""


class _BoundedAdapter(requests.adapters.HTTPAdapter):
    """Reads every answer itself, with a size limit and a deadline for the whole body.

    A read timeout bounds each read, not the answer: a service that trickles a byte a second
    would otherwise hold a worker thread for ever, and one that sends gigabytes would exhaust
    memory."""

    def __init__(self, *, max_bytes: int, deadline: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_bytes = max_bytes
        self.deadline = deadline

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: dict[str, str] | None = None,
    ) -> requests.Response:
        response = super().send(
            request, stream=True, timeout=timeout, verify=verify, cert=cert, proxies=proxies
        )
        if stream:
            return response
        limit = f"{self.max_bytes >> 20} MiB" if self.max_bytes >= 1 << 20 else f"{self.max_bytes} bytes"
        try:
            declared = response.headers.get("Content-Length", "")
            if declared.isdigit() and int(declared) > self.max_bytes:
                raise _AnswerRefused(f"the answer is larger than {limit} (Content-Length {declared})")
            give_up = time.monotonic() + self.deadline
            chunks: list[bytes] = []
            size = 0
            while chunk := response.raw.read1(64 << 10, decode_content=True):  # what has arrived
                size += len(chunk)
                if size > self.max_bytes:
                    raise _AnswerRefused(f"the answer is larger than {limit}")
                if time.monotonic() > give_up:
                    raise _AnswerRefused(f"the answer did not arrive within {self.deadline:.0f} s")
                chunks.append(chunk)
        except BaseException:
            response.close()
            raise
        response._content = b"".join(chunks)
        response._content_consumed = True
        return response


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


class RedfishClient:
    """Shared by every task of the manager. See the module docstring for what it guarantees."""

    def __init__(self, settings: RedfishSettings, *, observer: RequestObserver | None = None) -> None:
        self.settings = settings
        self._observer = observer
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
            cafile = settings.ca_file or certifi.where()
        self._rf: HttpClient = redfish_client(
            base_url=settings.base_url,
            cafile=cafile,
            timeout=(settings.connect_timeout, settings.read_timeout),
            max_retry=0,
            check_connectivity=False,
        )
        # The library's pool keeps 10 connections; size it to our worker count so concurrent requests
        # reuse connections instead of opening and discarding them. No transport-level retries either.
        adapter = _BoundedAdapter(
            max_bytes=settings.max_response_bytes,
            deadline=settings.response_deadline or 4 * settings.read_timeout,
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
        self._executor = ThreadPoolExecutor(max_workers=settings.max_workers, thread_name_prefix="redfish")
        #: task followers wait here; the event stream wakes them (see :meth:`follow`)
        self.tasks = TaskWatch()
        self._auth_lock = threading.Lock()
        self._auth_generation = 0
        self._auth_mode = settings.auth if settings.username else "none"
        self._session_uri: str | None = None
        self._closed = False

    @property
    def base_url(self) -> str:
        return self.settings.base_url

    # -- authentication (worker threads) ------------------------------------------------------

    def _ensure_auth(self) -> int:
        with self._auth_lock:
            if self._auth_generation == 0:
                self._login_locked()
            return self._auth_generation

    def _reauth(self, failed_generation: int) -> None:
        with self._auth_lock:
            if failed_generation == self._auth_generation:  # nobody logged in again meanwhile
                log.info("Redfish session rejected, logging in again", url=self.base_url)
                self._login_locked()

    def _login_locked(self) -> None:
        if self._auth_mode == "none":
            self._auth_generation += 1
            return
        password = self.settings.password.get_secret_value() if self.settings.password else ""
        if self._auth_mode == "session":
            self._rf.set_session_key(None)
            self._rf.set_authorization_key(None)
            sessions_uri = self._sessions_uri()
            started = time.perf_counter()
            try:
                raw = self._send(
                    "POST", sessions_uri, body={"UserName": self.settings.username, "Password": password}
                )
            except RetriesExhaustedError as err:
                reason, _ = _describe_transport(err.__cause__)
                self._observe("POST", sessions_uri, "transport", started)
                raise FabricUnavailable(f"Redfish service at {self.base_url} unreachable: {reason}") from None
            self._observe("POST", sessions_uri, str(raw.status), started)
            token = raw.getheader("x-auth-token")
            if raw.status in (200, 201) and token:
                self._rf.set_session_key(token)
                location = raw.getheader("location") or (_json_object(raw.read) or {}).get("@odata.id")
                self._session_uri = urlsplit(str(location)).path if isinstance(location, str) else None
                self._auth_generation += 1
                log.info("Redfish session created", url=self.base_url)
                return
            if raw.status in (404, 405, 501):
                log.warning(
                    "Redfish service has no session service, using HTTP Basic authentication",
                    url=self.base_url,
                    status=raw.status,
                )
                self._auth_mode = "basic"
            elif raw.status in (401, 403):
                raise FabricUnavailable(
                    f"Redfish login at {self.base_url} was refused (HTTP {raw.status}): "
                    "check the credentials file given with --redfish-credentials-file"
                )
            else:
                error = error_for_response(
                    raw.status, _json_object(raw.read) or {}, method="POST", uri=sessions_uri
                )
                raise FabricUnavailable(f"Redfish login at {self.base_url} failed: {error.message}")
        token = base64.b64encode(f"{self.settings.username}:{password}".encode()).decode()
        self._rf.set_authorization_key(f"Basic {token}")
        self._auth_generation += 1

    def _sessions_uri(self) -> str:
        started = time.perf_counter()
        try:
            raw = self._send("GET", SERVICE_ROOT)
        except RetriesExhaustedError as err:
            reason, _ = _describe_transport(err.__cause__)
            self._observe("GET", SERVICE_ROOT, "transport", started)
            raise FabricUnavailable(f"Redfish service at {self.base_url} unreachable: {reason}") from None
        self._observe("GET", SERVICE_ROOT, str(raw.status), started)
        root = (_json_object(raw.read) or {}) if raw.status == 200 else {}
        links = root.get("Links") if isinstance(root.get("Links"), dict) else {}
        sessions = (links or {}).get("Sessions")
        if isinstance(sessions, dict) and sessions.get("@odata.id"):
            return str(sessions["@odata.id"])
        return "/redfish/v1/SessionService/Sessions"  # fixed by DSP0266 1.6 when Links is missing

    def auth_headers(self) -> dict[str, str]:
        """Headers that authenticate a request made outside this client (the SSE stream)."""
        self._ensure_auth()
        key = self._rf.get_session_key()
        if key:
            return {"X-Auth-Token": key}
        authorization = self._rf.get_authorization_key()
        return {"Authorization": authorization} if authorization else {}

    def reauthenticate(self) -> None:
        """Log in again (e.g. after the SSE stream got 401)."""
        self._reauth(self._auth_generation)

    # -- one exchange (worker threads) ---------------------------------------------------------

    def _exchange(
        self,
        method: str,
        uri: str,
        body: Mapping[str, Any] | None,
        headers: Mapping[str, str] | None,
        timeout: tuple[float, float] | None,
    ) -> RedfishResponse:
        for attempt in (1, 2):
            generation = self._ensure_auth()
            started = time.perf_counter()
            call_headers = dict(headers or {})
            call_headers.setdefault("Accept", "application/json")
            try:
                raw = self._send(
                    method,
                    uri,
                    body=None if method in ("GET", "DELETE") else dict(body or {}),
                    headers=call_headers,
                    timeout=timeout,
                )
            except RetriesExhaustedError as err:
                reason, sent = _describe_transport(err.__cause__)
                self._observe(method, uri, "transport", started)
                raise _Transport(
                    reason, sent=sent, answered=isinstance(err.__cause__, _AnswerRefused)
                ) from None
            self._observe(method, uri, str(raw.status), started)
            if raw.status == 401 and self._auth_mode != "none" and attempt == 1:
                self._reauth(generation)
                continue
            status = int(raw.status)
            headers = {k.lower(): v for k, v in raw._http_response.headers.items()}
            content = raw._http_response.content
            body = _json_object(content)
            return RedfishResponse(
                method=method,
                uri=uri,
                status=status,
                headers=headers,
                body=body if body is not None else {},
                unreadable=None if body is not None else _what_body(content, headers),
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _send(
        self,
        method: str,
        uri: str,
        *,
        body: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: tuple[float, float] | None = None,
    ) -> Any:
        """One request through the library, never following a redirect: a redirect to another
        host would carry the session token (``X-Auth-Token``) there."""
        return self._rf._rest_request(
            uri,
            method=method,
            body=body,
            headers=dict(headers) if headers else None,
            allow_redirects=False,
            timeout=timeout,
            max_retry=0,
        )

    def _observe(self, method: str, uri: str, outcome: str, started: float) -> None:
        if self._observer is not None:
            self._observer(method, resource_kind(uri), outcome, time.perf_counter() - started)

    # -- async API -----------------------------------------------------------------------------

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise FabricUnavailable("the Redfish client is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args))

    async def request(
        self,
        method: str,
        uri: str,
        *,
        body: Mapping[str, Any] | None = None,
        etag: str | None = None,
        http_timeout: tuple[float, float] | None = None,
    ) -> RedfishResponse:
        """One request; GETs are retried, mutations are not. Raises on HTTP ≥ 400."""
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
            response = await self._in_thread(self._exchange, method, uri, body, headers, http_timeout)
        except _Transport as err:
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
        delay = self.settings.backoff_initial
        for attempt in range(1, attempts + 1):
            wait: float | None = None
            last = attempt == attempts
            try:
                response = await self._in_thread(self._exchange, "GET", uri, None, None, http_timeout)
            except _Transport as err:
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
                            f"{response.status} with {response.unreadable}, not a JSON object"
                        )
                elif response.status < 400:
                    raise self._refuse_redirect(response)
                elif response.status not in _RETRY_STATUSES or last:
                    raise error_for_response(
                        response.status,
                        response.body,
                        method="GET",
                        uri=uri,
                        retry_after=response.retry_after,
                    )
                wait = response.retry_after
            jitter = random.uniform(delay / 2, delay)  # noqa: S311 - spreads retries, not a secret
            pause = min(wait if wait is not None else jitter, self.settings.backoff_max)
            await asyncio.sleep(pause)
            delay = min(delay * 2, self.settings.backoff_max)
        raise AssertionError("unreachable")  # pragma: no cover

    async def get(self, uri: str) -> RedfishResponse:
        return await self.request("GET", uri)

    async def get_json(self, uri: str) -> dict[str, Any]:
        return (await self.request("GET", uri)).body

    async def post(self, uri: str, body: Mapping[str, Any]) -> RedfishResponse:
        return await self.request("POST", uri, body=body)

    async def patch(self, uri: str, body: Mapping[str, Any], *, etag: str | None) -> RedfishResponse:
        return await self.request("PATCH", uri, body=body, etag=etag)

    async def delete(self, uri: str, *, etag: str | None = None) -> RedfishResponse:
        return await self.request("DELETE", uri, etag=etag)

    # -- asynchronous operations ----------------------------------------------------------------

    async def follow(
        self,
        response: RedfishResponse,
        *,
        action: str,
        deadline: float,
        on_task: Callable[[str], Awaitable[None] | None] | None = None,
        poll_initial: float = 0.1,
        poll_max: float = 2.0,
    ) -> RedfishResponse:
        """Wait for the operation behind a 202 to end and return its final response.

        DSP0266 "Asynchronous operations": the service answers 202 with the task monitor in
        ``Location`` (and maybe ``Retry-After``); GET on the monitor answers 202 while the task runs
        and the operation's own response once it is done. Some services answer the Task resource
        instead; its ``TaskState``/``TaskStatus`` decide then. ``deadline`` is a ``time.monotonic()``
        value: past it, :class:`AttachTimeout` is raised and the task keeps running on the fabric.
        """
        if response.status != 202:
            return response
        monitor = response.location or response.body.get("TaskMonitor") or response.body.get("@odata.id")
        if not monitor:
            raise OutcomeUnknown(f"Redfish {action}: 202 Accepted without a task monitor")
        monitor = str(monitor)
        # The service's task events wake the wait below (TaskWatch); polls stay the fallback.
        since = time.monotonic()
        watched = [monitor]
        if response.is_task and response.body.get("@odata.id"):
            watched.append(str(response.body["@odata.id"]))
        if on_task is not None:
            result = on_task(monitor)
            if result is not None:
                await result
        self.tasks.follow(watched)
        try:
            return await self._poll_task(
                response,
                monitor,
                watched,
                action=action,
                deadline=deadline,
                since=since,
                poll_initial=poll_initial,
                poll_max=poll_max,
            )
        finally:
            self.tasks.unfollow(watched)

    async def _poll_task(
        self,
        response: RedfishResponse,
        monitor: str,
        watched: list[str],
        *,
        action: str,
        deadline: float,
        since: float,
        poll_initial: float,
        poll_max: float,
    ) -> RedfishResponse:
        """The polling loop of :meth:`follow`."""
        wait = response.retry_after
        delay = poll_initial
        unreachable = 0
        refusals = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AttachTimeout(
                    f"the fabric did not finish {action} in time; its task {monitor} is still running",
                    retry_after=1.0,
                )
            # Poll when the service says (Retry-After), but once more right at the deadline, and at
            # once when the service sends an event about the task. While its task events are known
            # to arrive, the poll only covers a lost event: every EVENTED_POLL_SECONDS.
            if self.tasks.evented:
                interval = EVENTED_POLL_SECONDS
            else:
                interval = min(wait if wait is not None else delay, poll_max)
            await self.tasks.pause(watched, min(interval, remaining), since=since)
            delay = min(delay * 2, poll_max)
            since = time.monotonic()
            try:
                polled = await self._in_thread(self._exchange, "GET", monitor, None, None, None)
            except _Transport as err:
                unreachable += 1
                if unreachable == 1:
                    log.warning("task monitor unreachable, still waiting", task=monitor, error=str(err))
                wait = None
                continue
            unreachable = 0
            wait = polled.retry_after
            if polled.status == 202:
                refusals = 0
                continue
            if polled.status in (404, 410):
                raise OutcomeUnknown(f"Redfish task monitor {monitor} for {action} disappeared")
            if 300 <= polled.status < 400:
                raise OutcomeUnknown(
                    f"Redfish task monitor {monitor} for {action} answered {polled.status}, a redirect, "
                    "which fabric-dra does not follow"
                )
            if polled.status in _RETRY_STATUSES:
                # Busy now (it says when to come back), or the task's own final answer (a task cut
                # short by a restart of the service ends 503): whether it acted is unknown — read.
                refusals += 1
                if polled.retry_after is not None and refusals < 3:
                    continue
                cause = error_for_response(polled.status, polled.body, method="GET", uri=monitor)
                raise OutcomeUnknown(f"Redfish task {monitor} for {action} ended unclear: {cause.message}")
            if polled.status >= 400:
                raise error_for_response(polled.status, polled.body, method=response.method, uri=response.uri)
            if polled.is_task:
                state = str(polled.body.get("TaskState") or "")
                if state not in _TERMINAL_TASK_STATES:
                    continue
                if state in _FAILED_TASK_STATES or polled.body.get("TaskStatus") == "Critical":
                    raise error_for_task(polled.body, uri=monitor, action=action)
            return polled

    async def task_running(self, monitor: str) -> bool:
        """Whether the task behind ``monitor`` still runs; False once it ended or is gone."""
        try:
            polled = await self._in_thread(self._exchange, "GET", monitor, None, None, None)
        except _Transport as err:
            raise FabricUnavailable(f"Redfish service at {self.base_url} unreachable: {err}") from None
        if polled.status == 202:
            return True
        if polled.status in _RETRY_STATUSES and polled.retry_after is not None:
            raise error_for_response(polled.status, polled.body, method="GET", uri=monitor)
        if polled.status >= 400:
            return False  # gone (404), or ended with the operation's own error response
        return polled.is_task and str(polled.body.get("TaskState") or "") not in _TERMINAL_TASK_STATES

    async def cancel_task(self, monitor: str) -> None:
        """Ask the service to stop a task (DELETE on its monitor, DSP0266); best effort."""
        with contextlib.suppress(FabricError):
            await self.request("DELETE", monitor)

    # -- lifecycle ------------------------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext | bool:
        """The TLS settings of this client, for requests made with another HTTP library."""
        if not self.base_url.startswith("https://"):
            return False
        if self.settings.insecure:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        return ssl.create_default_context(cafile=self.settings.ca_file or certifi.where())

    async def aclose(self) -> None:
        """Delete our session on the service and release the thread pool."""
        if self._closed:
            return
        if self._session_uri and self._auth_mode == "session":
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    self._in_thread(self._exchange, "DELETE", self._session_uri, None, None, (2.0, 2.0)), 5.0
                )
        self._closed = True
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._rf._session.close()


def _valid_etag(value: str) -> bool:
    """An ETag fit to go back in ``If-Match``: visible ASCII or obs-text (RFC 9110 §8.8.3, also
    unquoted ones, which services send), of sane length."""
    return 0 < len(value) <= 1024 and all(0x21 <= ord(c) <= 0x7E or 0x80 <= ord(c) <= 0xFF for c in value)


def _json_object(content: bytes | str | None) -> dict[str, Any] | None:
    """The JSON object ``content`` holds; None when it is empty, not JSON, nested too deeply to
    decode, or another JSON value."""
    if not content:
        return None
    try:
        value = json.loads(content)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _what_body(content: bytes | None, headers: Mapping[str, str]) -> str:
    if not content:
        return "an empty body"
    kind = headers.get("content-type") or "no Content-Type"
    return f"{len(content)} bytes of {one_line(kind, 60)}"
