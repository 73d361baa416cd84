"""The three calls every claim makes — attach, detach and its node's change poll — answered without
FastAPI's routing and dependency resolution, which cost about as much CPU as the calls' own work in
the manager (docs/performance.md, "The calls of every claim, answered by the manager's own path").

The rule that keeps this one API: this path answers only a request FastAPI would accept, and
answers it exactly as the route would. It checks each parameter with the very annotation the route
declares (:mod:`fabric.api.context`: the same pydantic constraints, in the same lax mode), reads
the body as FastAPI does (``json.loads``, then the model), and runs the route's own checks in the
route's order. Anything else — a parameter that fails, one given twice, a body that is not plain
JSON, a follower, a path or method it does not serve — is handed to FastAPI unchanged (the body it
read is replayed), so every refusal is FastAPI's own answer. ``tests/unit/fabric/test_claim_calls.py``
sends the same requests both ways and compares the answers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.datastructures import QueryParams
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fabric.api.auth import Identity
from fabric.api.context import (
    AppContext,
    ClaimUidQuery,
    DeviceName,
    EpochQuery,
    NodeQuery,
    OptionalNodeQuery,
    PollSeconds,
    ShareIdQuery,
    SinceQuery,
    Wait,
    require_loaded,
)
from fabric.api.request_guard import IDENTITY_STATE
from fabric.api.routes import attachment_answer
from fabric.errors import ManagerError
from fabric.state.inventory import wait_changes
from manager_api import models as api
from manager_api.errors import FabricError

__all__ = ["ClaimCalls"]

#: what a refused call is answered with: the app's own FabricError handler
ErrorAnswer = Callable[[AppContext, str, FabricError], Response]

_ATTACHMENTS = f"{api.API_PREFIX}/attachments"
_CHANGES = f"{api.API_PREFIX}/inventory/changes"
#: Starlette's ``{device}``: one path segment (``[^/]+``), as the route matches it
_ONE_ATTACHMENT = re.compile(re.escape(_ATTACHMENTS) + r"/([^/]+)")

_WAIT: TypeAdapter[float] = TypeAdapter(Wait)
_POLL: TypeAdapter[float] = TypeAdapter(PollSeconds)
_DEVICE: TypeAdapter[str] = TypeAdapter(DeviceName)
_NODE: TypeAdapter[str] = TypeAdapter(NodeQuery)
_OPTIONAL_NODE: TypeAdapter[str | None] = TypeAdapter(OptionalNodeQuery)
_CLAIM_UID: TypeAdapter[str] = TypeAdapter(ClaimUidQuery)
_SHARE_ID: TypeAdapter[str | None] = TypeAdapter(ShareIdQuery)
_EPOCH: TypeAdapter[int] = TypeAdapter(EpochQuery)
_SINCE: TypeAdapter[int] = TypeAdapter(SinceQuery)


class _Refer(ManagerError):
    """The request is FastAPI's to answer (never leaves this module)."""


class ClaimCalls:
    """ASGI middleware in front of FastAPI's router (inside :class:`~fabric.api.request_guard.RequestGuard`,
    which authenticated the caller and bounded the body)."""

    def __init__(self, app: ASGIApp, *, ctx: AppContext, error_answer: ErrorAnswer) -> None:
        self.app = app
        self.ctx = ctx
        self.error_answer = error_answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        if method == "POST" and path == _ATTACHMENTS:
            call = self._attach
        elif method == "DELETE" and path.startswith(_ATTACHMENTS):
            call = self._detach
        elif method == "GET" and path == _CHANGES:
            call = self._changes
        else:
            await self.app(scope, receive, send)
            return
        caller = scope.get("state", {}).get(IDENTITY_STATE)
        if not isinstance(caller, Identity) or not self.ctx.is_leader():
            await self.app(scope, receive, send)  # FastAPI's dependencies answer these
            return
        received: list[Message] = []
        body = b""
        if method == "POST":
            read, received = await _body(scope, receive)
            if read is None:  # chunked, or the client went away: FastAPI reads it as it does
                await self.app(scope, _replay(received, receive), send)
                return
            body = read
        try:
            answer = await call(scope, caller, body)
        except _Refer:
            await self.app(scope, _replay(received, receive), send)
            return
        except FabricError as err:
            answer = self.error_answer(self.ctx, method, err)
        await answer(scope, receive, send)

    async def _attach(self, scope: Scope, caller: Identity, body: bytes) -> Response:
        query = _query(scope, "waitSeconds")
        wait = _checked(_WAIT, query.get("waitSeconds"), 0.0)
        request = _attach_request(scope, body)
        caller.check_bind(request.node)
        require_loaded(self.ctx)
        return attachment_answer(await self.ctx.attachments.attach(request, wait))

    async def _detach(self, scope: Scope, caller: Identity, body: bytes) -> Response:
        matched = _ONE_ATTACHMENT.fullmatch(scope["path"])
        if matched is None:
            raise _Refer
        query = _query(scope, "claimUid", "node", "waitSeconds", "shareId")
        device = _checked(_DEVICE, matched.group(1))
        claim_uid = _checked(_CLAIM_UID, query.get("claimUid"))
        node = _checked(_NODE, query.get("node"))
        wait = _checked(_WAIT, query.get("waitSeconds"), 0.0)
        share_id = _checked(_SHARE_ID, query.get("shareId"), None)
        caller.check_bind(node)
        require_loaded(self.ctx)
        answer = await self.ctx.attachments.detach(device, claim_uid, node, wait, share_id=share_id)
        return attachment_answer(answer)

    async def _changes(self, scope: Scope, caller: Identity, body: bytes) -> Response:
        query = _query(scope, "epoch", "since", "timeoutSeconds", "node")
        epoch = _checked(_EPOCH, query.get("epoch"))
        since = _checked(_SINCE, query.get("since"))
        timeout = _checked(_POLL, query.get("timeoutSeconds"), 30.0)
        node = _checked(_OPTIONAL_NODE, query.get("node"), None)
        # the route's own checks, in its order (fabric.api.routes.inventory_changes)
        if node is not None:
            caller.check_node(node)
        require_loaded(self.ctx)
        changes = await wait_changes(self.ctx.inventory, epoch, since, timeout, node)
        return Response(changes, media_type="application/json")


def _query(scope: Scope, *names: str) -> dict[str, str]:
    """The query parameters ``names``, parsed by Starlette's own ``QueryParams`` as FastAPI's
    routes read them; a name given twice is FastAPI's to settle."""
    params = QueryParams(scope["query_string"])
    found: dict[str, str] = {}
    for name in names:
        values = params.getlist(name)
        if len(values) > 1:
            raise _Refer
        if values:
            found[name] = values[0]
    return found


_MISSING = object()


def _checked(adapter: TypeAdapter[Any], value: str | None, default: Any = _MISSING) -> Any:
    """``value`` validated by the route's own annotation; absent, its default (a required one
    absent, and any value that fails, is FastAPI's to refuse)."""
    if value is None:
        if default is _MISSING:
            raise _Refer
        return default
    try:
        return adapter.validate_python(value)
    except ValidationError:
        raise _Refer from None


def _attach_request(scope: Scope, body: bytes) -> api.AttachRequest:
    """The body as FastAPI reads a JSON body: ``application/json`` or no content type (anything
    else, FastAPI's), ``json.loads``, then the model in Python mode."""
    content_type = None
    for name, value in scope["headers"]:
        if name.lower() == b"content-type":
            if content_type is not None:
                raise _Refer
            content_type = value.decode("latin-1").strip().lower()
    if content_type not in (None, "application/json") or not body:
        raise _Refer
    try:
        return api.AttachRequest.model_validate(json.loads(body))
    except (ValueError, ValidationError):  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise _Refer from None


async def _body(scope: Scope, receive: Receive) -> tuple[bytes | None, list[Message]]:
    """The whole body of a request that declares its ``Content-Length`` (the guard has bounded
    it), and the messages it came in; None for a chunked one (nothing read), or when the client
    went away before its end (what came, to be replayed)."""
    if not any(name.lower() == b"content-length" for name, _ in scope["headers"]):
        return None, []
    received: list[Message] = []
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":
            return None, received
        if not message.get("more_body", False):
            return b"".join(m.get("body", b"") for m in received), received


def _replay(received: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives the messages already read first, then the server's own."""
    pending = list(received)

    async def again() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return again
