"""The ASGI application: HTTP details of DSP0266 around the resource tree.

Per request: injected faults (unavailable, slow) except on the OEM admin API; authentication
(``X-Auth-Token`` or Basic; the service root, ``/redfish``, the OData documents and login are
open); method dispatch with ``Allow`` on every answer and 405 otherwise; ``If-Match`` (412) on
changes and ``If-None-Match`` (304) on reads; ETags on every resource; Redfish error bodies;
Server-Sent Events on the EventService's ``ServerSentEventUri``; ``Link: <schema>;
rel=describedby`` on every resource read. ``$expand`` and ``$select`` are served on resources
(:mod:`emulator.redfish.tree.expand`); other ``$`` query options get 501 (DSP0266 "Query
parameters"), and so does a method outside DSP0266's method table (:data:`REDFISH_METHODS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

from emulator.errors import EmulatorError, FabricError
from emulator.redfish.engine.events import EventFilter, Subscription
from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError, error_body, redfish_error
from emulator.redfish.model.latency import LatencyProfile
from emulator.redfish.model.registries import message
from emulator.redfish.service.expanded import ExpandedAnswers
from emulator.redfish.tree.expand import Expand, Select, expand_served
from emulator.redfish.tree.http import Reply, Request
from emulator.redfish.tree.nodes import ActionNode, Context, Node, not_allowed
from emulator.redfish.tree.render import none_match
from emulator.redfish.views import EventStreamNode, MetadataNode, resolve, resolve_under
from emulator.redfish.views.services import ServiceRootNode, described_by
from plumbing.logs import get_logger

__all__ = ["COMMON_HEADERS", "REDFISH_METHODS", "RedfishApp", "method_not_implemented"]

log = get_logger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MAX_BODY = 1 << 20
_KEEPALIVE_SECONDS = 15.0
_JSON = b"application/json; charset=utf-8"
#: on every answer, including those the HTTP layer gives itself (emulator.redfish.service.server)
COMMON_HEADERS = [
    (b"odata-version", b"4.0"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-cache"),
]
#: The methods of DSP0266 v1.20.0's "HTTP methods" table. One of them that a resource does not
#: take is 405 with ``Allow`` (DSP0266 "Status codes": "not supported for this request URI");
#: any other method — OPTIONS, TRACE, PROPFIND, or a token the HTTP parser does not know at all —
#: is 501, which that table gives for a method the service "does not recognize and is not
#: capable of supporting for any resource" (and the "HTTP methods" clause allows 405 or 501 for
#: "unsupported and undocumented methods").
REDFISH_METHODS = ("GET", "HEAD", "POST", "PATCH", "PUT", "DELETE")


def method_not_implemented(method: str | None) -> RedfishError:
    """501 for a method outside :data:`REDFISH_METHODS` (``None``: one the parser could not read)."""
    what = f"{method} is not" if method else "The request method is not"
    return RedfishError.of(
        501,
        "OperationNotAllowed",
        detail=f"{what} an HTTP method of this service; each resource's Allow header lists "
        f"those it takes (of {', '.join(REDFISH_METHODS)}).",
    )


_REDFISH_VERSIONS = json.dumps({"v1": f"{uris.ROOT}/"}, separators=(",", ":")).encode()


class _Disconnected(EmulatorError):
    """The client went away while its request body was read: nothing is answered."""


def _error_reply(err: RedfishError) -> Reply:
    return Reply(err.status, error_body(err), dict(err.headers))


class RedfishApp:
    def __init__(self, ctx: Context, root: ServiceRootNode, latency: LatencyProfile) -> None:
        self.ctx = ctx
        self.root = root
        self.latency = latency
        self.realm = f'Basic realm="{ctx.product}", charset="UTF-8"'
        self.expanded = ExpandedAnswers(
            ctx,
            lambda base, uri, made: resolve_under(root, base, uri, made),
            lambda node: node.is_resource and not isinstance(node, MetadataNode),
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client")
        request = Request(
            method=scope["method"],
            path=scope["path"],
            query=dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)),
            headers=headers,
            body=b"",
            client=client[0] if client else None,
        )
        try:
            reply = await self._handle(request, receive, send)
        except RedfishError as err:
            reply = _error_reply(err)
        except FabricError as err:
            reply = _error_reply(redfish_error(err))
        except _Disconnected:
            return
        except Exception:
            log.exception("request failed", method=request.method, path=request.path)
            reply = Reply(500, error_body(RedfishError.of(500, "InternalError")))
        if reply is not None:
            await self._send(send, request, reply)

    async def _read_body(self, receive: Receive) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                raise _Disconnected
            chunk = event.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                raise RedfishError.of(413, "PayloadTooLarge")
            chunks.append(chunk)
            if not event.get("more_body", False):
                return b"".join(chunks)

    # --- dispatch ------------------------------------------------------------------------------

    async def _handle(self, request: Request, receive: Receive, send: Send) -> Reply | None:
        path = request.path
        admin = path.startswith(uris.OEM)
        if not admin:
            await self._apply_service_faults()
        if request.method not in REDFISH_METHODS:
            # before authentication: it says nothing about which resources exist
            raise method_not_implemented(request.method)
        version = request.header("odata-version")
        if version is not None and version.strip() != "4.0":
            # DSP0266 "Request headers": a service that does not support the requested OData
            # version answers 412 (DMTF's protocol validator checks 4.1)
            raise RedfishError.of(
                412,
                "PreconditionFailed",
                detail=f"OData-Version {version} is not supported; this service speaks 4.0.",
            )
        if path.rstrip("/") == "/redfish":
            return Reply(200, raw=_REDFISH_VERSIONS)
        node = resolve(self.root, path)
        found = node is not None and bool(node.allow)  # else a path segment that is no resource
        # Authentication comes first, found or not (DSP0266 §13.3 "Authentication": every URI but
        # /redfish, the service root, $metadata, the OData service document and the login POST
        # needs it): a 404 for a missing resource would tell a client without credentials what the
        # service has. The body is read only after.
        if node is None or not found or not self._is_public(request, node):
            await self._authenticate(request)
        request.body = await self._read_body(receive)
        if node is None or not found:
            segments = path.rstrip("/").split("/")
            raise RedfishError.of(
                404,
                "ResourceNotFound",
                "Resource",
                segments[-1] if segments else path,
                detail=f"{path} is not a resource of this service.",
            )
        method = request.method
        if method not in node.allow and not (method == "HEAD" and "GET" in node.allow):
            raise not_allowed(node, method)
        if method in ("GET", "HEAD"):
            return await self._read(request, node, receive, send)
        self._check_mutation_query(request)
        if method == "POST":
            target = node.owner if isinstance(node, ActionNode) else node
            if target.is_resource:
                self.ctx.renderer.check_if_match(target, request.header("if-match"))
            return await node.post(request)
        if node.is_resource:
            self.ctx.renderer.check_if_match(node, request.header("if-match"))
        if method == "PATCH":
            return await node.patch(request)
        if method == "DELETE":
            return await node.delete(request)
        raise not_allowed(node, method)

    async def _apply_service_faults(self) -> None:
        conditions = self.ctx.engine.conditions
        unavailable = conditions.unavailable()
        if unavailable is not None:
            retry = unavailable.RetryAfterSeconds
            raise RedfishError.of(
                503, "ServiceTemporarilyUnavailable", retry, headers={"Retry-After": str(retry)}
            )
        slow = conditions.slow_seconds()
        if slow:
            await asyncio.sleep(slow)

    def _is_public(self, request: Request, node: Node) -> bool:
        if self.ctx.account is None or node.public:
            return True
        return request.method == "POST" and request.path.rstrip("/") in (  # login
            uris.SESSIONS,
            f"{uris.SESSIONS}/Members",
        )

    async def _authenticate(self, request: Request) -> None:
        account = self.ctx.account
        if account is None:
            return
        token = request.header("x-auth-token")
        if token:
            info = self.ctx.sessions.authenticate(token)
            if info is not None:
                request.username, request.session_id = info.username, info.id
                return
        basic = request.header("authorization") or ""
        if basic and await self.ctx.sessions.throttle.check(
            request.client, lambda: account.check_basic(basic)
        ):
            request.username = account.username
            return
        raise RedfishError.of(
            401,
            "NoValidSession",
            detail="Authentication required: log in at the Sessions collection or use Basic authentication.",
            headers={"WWW-Authenticate": self.realm},
        )

    def _check_mutation_query(self, request: Request) -> None:
        """A query this service serves on reads (``$expand``, ``$select``) sent with a change is
        400 ``QueryNotSupportedOnOperation`` (Base 1.22: "such as when the $expand query is
        attempted with a PATCH operation"); any other ``$`` option 501, as on a read."""
        served = ("$expand", "$select") if expand_served(self.ctx) else ()
        self._check_query(request, allowed=served)
        if any(key in served for key in request.query):
            raise RedfishError.of(400, "QueryNotSupportedOnOperation")

    def _check_query(self, request: Request, allowed: tuple[str, ...]) -> None:
        for key in request.query:
            if key.startswith("$") and key not in allowed:
                raise RedfishError.of(501, "QueryParameterUnsupported", key)

    async def _read(self, request: Request, node: Node, receive: Receive, send: Send) -> Reply | None:
        if isinstance(node, EventStreamNode):
            self._check_query(request, allowed=("$filter",))
            if request.method == "HEAD":
                return Reply(200, content_type="text/event-stream; charset=utf-8")
            await self._stream_events(request, receive, send)
            return None
        if isinstance(node, MetadataNode) or not node.is_resource:
            self._check_query(request, allowed=())
            if isinstance(node, MetadataNode):
                return Reply(200, raw=node.document, content_type="application/xml")
            return await node.get(request)
        self._check_query(request, allowed=("$expand", "$select") if expand_served(self.ctx) else ())
        query = request.query.get("$expand")
        chosen = request.query.get("$select")
        delay = self.latency.read.sample(self.ctx.engine.rng)
        if delay:
            await asyncio.sleep(delay)
        if query is not None or chosen is not None:
            body, etag = self.expanded.answer(
                node,
                Expand.parse(query) if query is not None else None,
                Select.parse(chosen) if chosen is not None else None,
            )
        else:
            body, etag = self.ctx.renderer.render(node)
        if not self.ctx.renderer.etags:
            etag = ""  # behaviour.etags "omitted": none sent, If-None-Match never matches
        headers = {"ETag": etag, "Allow": ", ".join(node.allow)} if etag else {"Allow": ", ".join(node.allow)}
        link = described_by(body)
        if link is not None:
            headers["Link"] = link
        if none_match(request.header("if-none-match"), etag):
            return Reply(304, None, headers)
        return Reply(200, None, headers, raw=body)

    # --- responses -----------------------------------------------------------------------------

    async def _send(self, send: Send, request: Request, reply: Reply) -> None:
        content_type = reply.content_type
        if reply.raw is not None:
            body = reply.raw
        elif reply.body is not None:
            body = json.dumps(reply.body, separators=(",", ":"), ensure_ascii=False).encode()
        else:
            body = b""
        if reply.status in (204, 304):
            body = b""
        headers = list(COMMON_HEADERS)
        if body:
            headers.append((b"content-type", content_type.encode() if content_type else _JSON))
        for name, value in reply.headers.items():
            headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if request.method == "HEAD" else body})

    async def _stream_events(self, request: Request, receive: Receive, send: Send) -> None:
        """Server-Sent Events (DSP0266 "Server-sent events"): ``id:`` is the EventId."""
        event_filter = _event_filter(request)
        last_id: int | None = None
        raw_last = request.header("last-event-id")
        if raw_last and raw_last.strip().isdigit():
            last_id = int(raw_last.strip())
        sub, complete = self.ctx.events.subscribe(event_filter, last_id)
        headers = [*COMMON_HEADERS, (b"content-type", b"text/event-stream; charset=utf-8")]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            if not complete:
                await self._send_event(send, self.ctx.events.seq, _events_lost(self.ctx.events.seq))
            disconnected = asyncio.ensure_future(self._wait_disconnect(receive))
            try:
                await self._pump(sub, disconnected, send)
            finally:
                disconnected.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await disconnected
            with contextlib.suppress(OSError):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            sub.close()

    async def _pump(self, sub: Subscription, disconnected: asyncio.Task[None], send: Send) -> None:
        """Send the subscription's events as they come, a keep-alive comment when none comes for a
        while, until the client goes, the service closes the stream, or the client falls behind."""
        while not disconnected.done():
            getter = asyncio.ensure_future(sub.queue.get())
            done, _ = await asyncio.wait(
                {getter, disconnected},
                timeout=_KEEPALIVE_SECONDS,
                return_when=asyncio.FIRST_COMPLETED,
            )
            if getter not in done:
                getter.cancel()
                if not disconnected.done():
                    await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
                continue
            # The events already queued go out in one write (a bind makes several): the same
            # bytes as one write each, a fraction of the sends.
            batch = [getter.result()]
            while batch[-1] is not None and not sub.overflowed and not sub.queue.empty():
                batch.append(sub.queue.get_nowait())
            closed = batch[-1] is None
            events = [event for event in batch if event is not None]
            if events:
                body = b"".join(_event_bytes(event.seq, event.payload()) for event in events)
                await send({"type": "http.response.body", "body": body, "more_body": True})
            if closed or sub.overflowed:
                # closed by the service, or the client could not keep up (it reconnects with
                # Last-Event-ID)
                break

    async def _send_event(self, send: Send, seq: int, payload: dict[str, Any]) -> None:
        await send({"type": "http.response.body", "body": _event_bytes(seq, payload), "more_body": True})

    @staticmethod
    async def _wait_disconnect(receive: Receive) -> None:
        while True:
            event = await receive()
            if event["type"] == "http.disconnect":
                return


def _event_bytes(seq: int, payload: dict[str, Any]) -> bytes:
    """One Server-Sent Event: ``id:`` is the EventId, ``data:`` the Event resource."""
    data = json.dumps(payload, separators=(",", ":"))
    return f"id: {seq}\ndata: {data}\n\n".encode()


def _event_filter(request: Request) -> EventFilter:
    """The stream's ``$filter``; 400 PropertyValueFormatError naming what is wrong with it."""
    try:
        return EventFilter.parse(request.query.get("$filter", ""))
    except ValueError as err:
        raise RedfishError.of(
            400,
            "PropertyValueFormatError",
            request.query.get("$filter", ""),
            "$filter",
            detail=f"$filter: {err}",
        ) from None


def _events_lost(seq: int) -> dict[str, Any]:
    """The event that tells a reconnecting client the events it missed are gone (Base
    EventBufferExceeded): it re-reads the resources it cares about."""
    lost = message("EventBufferExceeded")
    return {
        "@odata.type": "#Event.v1_13_0.Event",
        "Id": str(seq),
        "Name": "Fabric event",
        "Events": [
            {
                "MemberId": "0",
                "EventId": str(seq),
                "MessageId": lost["MessageId"],
                "Message": lost["Message"],
                "MessageArgs": [],
                "MessageSeverity": lost["MessageSeverity"],
            }
        ],
    }
