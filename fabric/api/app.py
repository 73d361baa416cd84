"""The manager's HTTP API (FastAPI): the contract of :mod:`manager_api.models`, plus health and metrics.

Every ``/api/v1`` request needs a bearer token whose role grants what it does (:mod:`fabric.api.auth`,
``GRANTS``) and a leader: a follower answers 503 NotLeader with ``Retry-After`` (its ``/readyz``
fails too, so a Service sends traffic to the leader only). ``/metrics`` needs a token too (the
operator or metrics role), on every replica. Errors are :class:`manager_api.models.ErrorBody` with
the status of their :mod:`manager_api.errors` class (:func:`fabric.errors.error_body`, answered by
:func:`fabric.api.request_guard.error_response`); a malformed request is 422 InvalidRequest naming
the field. The token is checked, and the body's size bounded, before the body is read
(:mod:`fabric.api.request_guard`). The routes are :mod:`fabric.api.routes`; the three calls
every claim makes (attach, detach, its node's change poll) are answered in front of FastAPI's
router by :mod:`fabric.api.claim_calls`, which hands FastAPI every request it would refuse.

The OpenAPI document is served at ``/openapi.json``; no page renders it here (``/docs`` and
``/redoc`` would run a third-party script on the origin where ``/ui`` keeps an operator's token:
docs/manager.md, "The API's documentation pages").
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from fabric.api.claim_calls import ClaimCalls
from fabric.api.context import AppContext
from fabric.api.openapi import install_openapi
from fabric.api.request_guard import RequestGuard, error_response
from fabric.api.routes import ROUTERS
from fabric.api.ui import router as ui_router
from manager_api import models as api
from manager_api.errors import BindRefused, FabricError, InvalidRequest
from plumbing import __version__

__all__ = ["AppContext", "build_app"]


def build_app(ctx: AppContext) -> FastAPI:
    app = FastAPI(
        title="fabric-dra fabric manager",
        version=__version__,
        # No /docs or /redoc: the OpenAPI document alone (the module's docstring says why).
        docs_url=None,
        redoc_url=None,
        description=(
            "Binds composable PCIe/CXL devices to Kubernetes nodes over Redfish. Attach and detach "
            "are idempotent per claim UID + device. Authenticate with a bearer token."
        ),
    )
    app.state.ctx = ctx
    install_openapi(app)
    app.include_router(ui_router)
    # Added first, so it runs inside the guard (which authenticates and bounds the body first).
    app.add_middleware(ClaimCalls, ctx=ctx, error_answer=fabric_error_answer)
    app.add_middleware(RequestGuard, auth=ctx.auth)
    app.exception_handler(FabricError)(_fabric_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(StarletteHTTPException)(_refused)
    for router in ROUTERS:
        app.include_router(router)
    return app


async def _fabric_error(request: Request, err: FabricError) -> JSONResponse:
    return fabric_error_answer(request.app.state.ctx, request.method, err)


def fabric_error_answer(ctx: AppContext, method: str, err: FabricError) -> JSONResponse:
    """The answer to a route's :class:`FabricError` (an attach the fabric or the manager refused
    counted by who refused it)."""
    if isinstance(err, BindRefused) and method == "POST":
        ctx.metrics.attach_refused.labels("fabric" if err.message_id else "manager").inc()
    return error_response(err)


async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
    problems = [f"{_field(tuple(e['loc']))}: {e['msg']}" for e in err.errors()]
    return error_response(InvalidRequest("malformed request: " + "; ".join(problems)))


async def _refused(request: Request, err: StarletteHTTPException) -> JSONResponse:
    # The framework's own refusals (a body that is not JSON, an unknown path, a method the
    # path does not take) get the same ErrorBody as every other error.
    if err.status_code == 400:
        return error_response(InvalidRequest(f"malformed request: {err.detail}; send a JSON body"))
    code = {404: "NotFound", 405: "MethodNotAllowed", 413: "PayloadTooLarge"}.get(
        err.status_code, "HTTPError"
    )
    body = api.ErrorBody(code=code, message=f"{request.method} {request.url.path}: {err.detail}")
    headers = dict(err.headers or {})
    if err.status_code == 405:
        # Starlette names the methods of the first route of the path only; a path served by
        # several routes (GET, POST and DELETE /api/v1/drains) takes them all (RFC 9110, 15.5.6).
        headers["Allow"] = ", ".join(_methods_of(request)) or headers.get("Allow", "")
    return JSONResponse(
        status_code=err.status_code,
        content=body.model_dump(mode="json", by_alias=True, exclude_none=True),
        headers=headers,
    )


def _methods_of(request: Request) -> list[str]:
    """Every method some route of the API serves at the request's path."""
    methods: set[str] = set()
    for router in ROUTERS:
        for route in router.routes:
            if isinstance(route, APIRoute) and route.path_regex.match(request.url.path):
                methods |= route.methods or set()
    return sorted(methods)


def _field(loc: tuple[int | str, ...]) -> str:
    """``("body", "claimUid")`` → ``body.claimUid``: where the bad value is and what it is called."""
    return ".".join(str(p) for p in loc) or "request"
