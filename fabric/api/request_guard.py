"""What every request to the manager passes before FastAPI reads a byte of its body.

FastAPI reads and parses a request's body before it resolves the route's dependencies, the bearer
token check among them: an unauthenticated client could make the manager buffer and parse any body
it liked (one 100 MB body peaked at 341 MB RSS). :class:`RequestGuard` is an ASGI middleware in
front of the application that, from the head alone:

1. authenticates every ``/api/v1`` request (:meth:`fabric.api.auth.Chain.require`) and hands the
   identity on in the request's state, so the route's dependency does not ask again;
2. refuses a body larger than :data:`MAX_REQUEST_BODY` with 413 — at once from ``Content-Length``,
   or as soon as a chunked body grows past it;
3. admits a body only while the bodies being read at once stay within :data:`BODIES_IN_FLIGHT`
   bytes (else 503 with ``Retry-After``), so even authenticated callers cannot pile up memory.

A refusal that leaves a body unread closes the connection (``Connection: close``): nothing of it
is read. Header size and read deadlines are :class:`plumbing.httpserve.ConnectionLimits`.

On the way out, every answer gets :data:`DEFAULT_HEADERS` unless it set its own (the fabric map's
page has a policy of its own): no answer of the API is a document a browser may run or frame. An
exception no handler took becomes a 500 ``InternalError`` :class:`~manager_api.models.ErrorBody`
and one structured log event, not a plain-text answer and a traceback on stderr.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from http import HTTPStatus
from typing import Any

from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from fabric.api.auth import Chain
from fabric.errors import ManagerError, error_body
from manager_api import models as api
from manager_api.errors import FabricError, FabricUnavailable
from plumbing.logs import get_logger
from plumbing.names import DNS1123_LABEL_MAX_LENGTH

__all__ = [
    "BODIES_IN_FLIGHT",
    "DEFAULT_HEADERS",
    "IDENTITY_STATE",
    "MAX_DEVICES_PER_NODE",
    "MAX_REQUEST_BODY",
    "BodyTooLarge",
    "RequestGuard",
    "error_response",
    "largest_claim_report",
    "server_refusal",
]

log = get_logger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: the key of ``request.state`` (``scope["state"]``) that carries the caller's identity
IDENTITY_STATE = "fabric_dra_identity"

#: Fabric devices one node can hold at once. A host's PCIe hierarchy has 256 buses, and a CXL
#: memory device is cut in chunks; 1,024 is several times any composable system's per-host limit.
MAX_DEVICES_PER_NODE = 1024


def largest_claim_report() -> bytes:
    """The largest legitimate request body: a node's claim report (``PUT /nodes/{node}/claims``)
    with :data:`MAX_DEVICES_PER_NODE` devices, each in a claim of its own (the most claims, so the
    most claim UIDs), every UID and device name as long as the contract allows, encoded as the
    clients encode JSON (with spaces after separators)."""
    uid_length = _max_length(api.PreparedClaim, "claim_uid")
    report = api.NodeClaims(
        claims=[
            api.PreparedClaim(
                claim_uid=(str(uuid.UUID(int=n)) + "0" * uid_length)[:uid_length],
                devices=[f"d{n:04d}".ljust(DNS1123_LABEL_MAX_LENGTH, "d")],
            )
            for n in range(MAX_DEVICES_PER_NODE)
        ]
    )
    return json.dumps(report.model_dump(mode="json", by_alias=True)).encode()


def _max_length(model: type[api.PreparedClaim], field: str) -> int:
    for rule in model.model_fields[field].metadata:
        limit = getattr(rule, "max_length", None)
        if isinstance(limit, int):
            return limit
    raise TypeError(f"{model.__name__}.{field} has no max_length")


#: The cap on a request body: the largest claim report rounded up to whole KiB (135 KiB).
MAX_REQUEST_BODY = math.ceil(len(largest_claim_report()) / 1024) * 1024

#: Bytes of request bodies being read at once, over all connections (128 bodies at the cap).
BODIES_IN_FLIGHT = 128 * MAX_REQUEST_BODY


#: Set on every answer that does not set them itself: JSON and text are never run as a page, framed
#: or sniffed into one.
DEFAULT_HEADERS: dict[str, str] = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
}
_DEFAULT_HEADERS = [(k.lower().encode(), v.encode()) for k, v in DEFAULT_HEADERS.items()]


class BodyTooLarge(HTTPException, ManagerError):
    """A chunked body grew past the cap while FastAPI read it (an HTTPException, so FastAPI passes
    it on as it is instead of calling it a parse error)."""

    def __init__(self) -> None:
        # The rest of the body stays unread: the connection ends with this answer.
        super().__init__(
            413, f"the request body is larger than {MAX_REQUEST_BODY} bytes", headers={"Connection": "close"}
        )


class RequestGuard:
    def __init__(self, app: ASGIApp, *, auth: Chain) -> None:
        self.app = app
        self.auth = auth
        self._in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def answer(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {name.lower() for name, _ in message.get("headers", [])}
                missing = [(k, v) for k, v in _DEFAULT_HEADERS if k not in present]
                if missing:
                    message = {**message, "headers": [*message.get("headers", []), *missing]}
            await send(message)

        try:
            await self._guarded(scope, receive, answer)
        except Exception as err:  # what no handler took: one log event, an ErrorBody if still possible
            log.exception(
                "unexpected error answering a request",
                method=scope.get("method"),
                path=scope.get("path"),
                error_type=type(err).__name__,
            )
            if started:
                return  # the answer is under way: the server ends the connection
            body = api.ErrorBody(
                code="InternalError",
                message=f"the fabric manager failed to answer {scope.get('method')} {scope.get('path')} "
                f"({type(err).__name__}); its log has the details",
            )
            await JSONResponse(
                status_code=500, content=body.model_dump(mode="json", by_alias=True, exclude_none=True)
            )(scope, receive, answer)

    async def _guarded(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        length_header = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        has_body = chunked or (length_header not in (None, "0"))
        if scope["path"].startswith(api.API_PREFIX):
            client = scope.get("client")
            try:
                identity = await self.auth.require(
                    headers.get("authorization"), client=client[0] if client else None
                )
            except FabricError as err:
                await _answer(scope, receive, send, error_response(err), close=has_body)
                return
            scope.setdefault("state", {})[IDENTITY_STATE] = identity
        if not has_body:
            await self.app(scope, receive, send)
            return
        try:
            length = int(length_header) if length_header is not None and not chunked else None
        except ValueError:
            length = None
        if length is not None and not 0 <= length <= MAX_REQUEST_BODY:
            await _answer(scope, receive, send, _too_large(), close=True)
            return
        reserved = length if length is not None else MAX_REQUEST_BODY
        if self._in_flight + reserved > BODIES_IN_FLIGHT:
            busy = FabricUnavailable(
                "the fabric manager is reading too many request bodies at once; retry shortly",
                retry_after=1.0,
            )
            await _answer(scope, receive, send, error_response(busy), close=True)
            return
        self._in_flight += reserved
        try:
            await self.app(scope, _capped(receive), send)
        finally:
            self._in_flight -= reserved


def _capped(receive: Receive) -> Receive:
    """``receive`` that raises :class:`BodyTooLarge` once the body passed the cap."""
    seen = 0

    async def read() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > MAX_REQUEST_BODY:
                raise BodyTooLarge
        return message

    return read


def _too_large() -> JSONResponse:
    body = api.ErrorBody(
        code="PayloadTooLarge",
        message=(
            f"the request body is larger than {MAX_REQUEST_BODY} bytes, more than the largest claim "
            "report of a node"
        ),
    )
    return JSONResponse(
        status_code=413, content=body.model_dump(mode="json", by_alias=True, exclude_none=True)
    )


def server_refusal(status: int, message: str, retry_after: float | None) -> dict[str, Any]:
    """The body of a refusal the HTTP server answers itself (:class:`plumbing.httpserve.ConnectionLimits`):
    an ErrorBody, 503 as ``FabricUnavailable`` so clients retry it."""
    if status == 503:
        err: FabricError = FabricUnavailable(message, retry_after=retry_after)
        return error_body(err).model_dump(mode="json", by_alias=True, exclude_none=True)
    body = api.ErrorBody(code=HTTPStatus(status).phrase.replace(" ", ""), message=message)
    return body.model_dump(mode="json", by_alias=True, exclude_none=True)


def error_response(err: FabricError) -> JSONResponse:
    """The answer to ``err``: its status, an :class:`~manager_api.models.ErrorBody`, and
    ``Retry-After`` when retrying may help."""
    headers = {}
    if err.retriable:
        headers["Retry-After"] = str(max(1, math.ceil(err.retry_after or 1.0)))
    body = error_body(err).model_dump(mode="json", by_alias=True, exclude_none=True)
    return JSONResponse(status_code=err.http_status, content=body, headers=headers)


async def _answer(scope: Scope, receive: Receive, send: Send, response: JSONResponse, *, close: bool) -> None:
    if close:
        # The body stays unread: uvicorn closes the connection after an answer that says so.
        response.headers["Connection"] = "close"
    await response(scope, receive, send)
