"""The manager's HTTP API (FastAPI): the contract of :mod:`manager_api.models`, plus health and metrics.

Every ``/api/v1`` request needs a bearer token whose role grants what it does (:mod:`fabric.api.auth`,
``GRANTS``) and a leader: a follower answers 503 NotLeader with ``Retry-After`` (its ``/readyz``
fails too, so a Service sends traffic to the leader only). ``/metrics`` needs a token too (the
operator or metrics role), on every replica. Errors are :class:`manager_api.models.ErrorBody` with
the status of their :mod:`manager_api.errors` class; a malformed request is 422 InvalidRequest
naming the field. The token is checked, and the body's size bounded, before the body is read
(:mod:`fabric.api.request_guard`).

The OpenAPI document is served at ``/openapi.json``; no page renders it here (``/docs`` and
``/redoc`` would run a third-party script on the origin where ``/ui`` keeps an operator's token:
docs/manager.md, "The API's documentation pages").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from fabric.api.auth import Access, Chain, Identity
from fabric.api.openapi import install_openapi
from fabric.api.request_guard import IDENTITY_STATE, RequestGuard, error_response
from fabric.api.ui import router as ui_router
from fabric.bindings.attachments import Attachments
from fabric.bindings.usage import UsageMeter
from fabric.state.inventory import Inventory
from fabric.state.metrics import ManagerMetrics
from fabric.state.operation_log import OperationLog
from fabric.state.reports import PluginReports
from manager_api import models as api
from manager_api.errors import (
    BindRefused,
    DeviceNotFound,
    FabricError,
    FabricUnavailable,
    InvalidRequest,
    NotFoundError,
    NotLeader,
)
from plumbing import __version__
from plumbing.logs import get_logger
from plumbing.names import (
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    DNS1123_SUBDOMAIN_PATTERN,
    UID_MAX_LENGTH,
    UID_PATTERN,
)

__all__ = ["AppContext", "build_app"]

#: ``GET /api/v1/usage?since=``: an RFC 3339 date-time is at most 35 characters
#: (``2026-03-01T09:00:00.123456789+01:00``); a few more for longer fractions.
_SINCE_MAX_LENGTH = 64

log = get_logger(__name__)


@dataclass
class AppContext:
    inventory: Inventory
    attachments: Attachments
    operations: OperationLog
    #: what each node's plugin reports as prepared (``PUT /api/v1/nodes/{node}/claims``)
    reports: PluginReports
    auth: Chain
    metrics: ManagerMetrics
    is_leader: Callable[[], bool]
    #: None when ready to serve, else why not
    not_ready: Callable[[], str | None]
    #: the device-seconds accounting (``GET /api/v1/usage``); None: not served
    usage: UsageMeter | None = None


def _field(loc: tuple[int | str, ...]) -> str:
    """``("body", "claimUid")`` → ``body.claimUid``: where the bad value is and what it is called."""
    return ".".join(str(p) for p in loc) or "request"


async def _identity(request: Request, authorization: Annotated[str | None, Header()] = None) -> Identity:
    # The RequestGuard authenticated the caller from the head, before any body was read.
    identity = getattr(request.state, IDENTITY_STATE, None)
    if isinstance(identity, Identity):
        return identity
    ctx: AppContext = request.app.state.ctx
    client = request.client.host if request.client else None
    return await ctx.auth.require(authorization, client=client)


async def _leader(request: Request, caller: Annotated[Identity, Depends(_identity)]) -> Identity:
    ctx: AppContext = request.app.state.ctx
    if not ctx.is_leader():
        raise NotLeader(
            "this fabric manager replica is a follower; retry (the Service routes to the leader)",
            retry_after=2.0,
        )
    return caller


def _needs(access: Access) -> Callable[..., Awaitable[Identity]]:
    """A dependency: the leader's caller, whose role grants ``access`` (else 403)."""

    async def granted(caller: Annotated[Identity, Depends(_leader)]) -> Identity:
        caller.check(access)
        return caller

    return granted


# Module level, not inside build_app: FastAPI resolves these annotations by name.
#: attach, detach and reports: each route checks the node too (``Identity.check_bind``)
Caller = Annotated[Identity, Depends(_leader)]
Reader = Annotated[Identity, Depends(_needs(Access.READ))]
UsageReader = Annotated[Identity, Depends(_needs(Access.USAGE))]
Wait = Annotated[
    float,
    Query(alias="waitSeconds", ge=0, le=api.MAX_WAIT_SECONDS, description="wait this long for the fabric"),
]
DeviceName = Annotated[
    str, Path(pattern=DNS1123_LABEL_PATTERN, max_length=DNS1123_LABEL_MAX_LENGTH, description="device name")
]
NodeName = Annotated[
    str,
    Path(
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        max_length=DNS1123_SUBDOMAIN_MAX_LENGTH,
        description="Kubernetes node name",
    ),
]
OperationIdPath = Annotated[
    str, Path(pattern=DNS1123_LABEL_PATTERN, max_length=DNS1123_LABEL_MAX_LENGTH, description="operation id")
]
NodeQuery = Annotated[
    str,
    Query(pattern=DNS1123_SUBDOMAIN_PATTERN, max_length=DNS1123_SUBDOMAIN_MAX_LENGTH),
]


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
    app.add_middleware(RequestGuard, auth=ctx.auth)

    @app.exception_handler(FabricError)
    async def _fabric_error(request: Request, err: FabricError) -> JSONResponse:
        if isinstance(err, BindRefused) and request.method == "POST":
            ctx.metrics.attach_refused.labels("fabric" if err.message_id else "manager").inc()
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        problems = [f"{_field(tuple(e['loc']))}: {e['msg']}" for e in err.errors()]
        return error_response(InvalidRequest("malformed request: " + "; ".join(problems)))

    @app.exception_handler(StarletteHTTPException)
    async def _refused(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # The framework's own refusals (a body that is not JSON, an unknown path, a method the
        # path does not take) get the same ErrorBody as every other error.
        if err.status_code == 400:
            return error_response(InvalidRequest(f"malformed request: {err.detail}; send a JSON body"))
        code = {404: "NotFound", 405: "MethodNotAllowed", 413: "PayloadTooLarge"}.get(
            err.status_code, "HTTPError"
        )
        body = api.ErrorBody(code=code, message=f"{request.method} {request.url.path}: {err.detail}")
        return JSONResponse(
            status_code=err.status_code,
            content=body.model_dump(mode="json", by_alias=True, exclude_none=True),
            headers=err.headers,
        )

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        reason = ctx.not_ready()
        if reason:
            return JSONResponse(status_code=503, content={"status": "not ready", "reason": reason})
        # Ready, yet the fabric may have devices it cannot offer: say so rather than look empty.
        notices = ctx.inventory.notices
        return JSONResponse(
            status_code=200, content={"status": "ready", **({"detail": notices} if notices else {})}
        )

    @app.get("/metrics", include_in_schema=False)
    async def metrics(caller: Annotated[Identity, Depends(_identity)]) -> Response:
        # Every replica serves it (a follower's process metrics too), to the roles that may read
        # tenants' namespaces: operators and the metrics scraper.
        caller.check(Access.METRICS)
        return Response(ctx.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    def _loaded() -> None:
        if not ctx.inventory.loaded.is_set():
            err = ctx.inventory.last_error
            cause = f": {err.message}" if err else ""
            raise FabricUnavailable(f"the fabric inventory is not loaded yet{cause}", retry_after=2.0)

    @app.get(f"{api.API_PREFIX}/inventory", response_model=api.Inventory, response_model_by_alias=True)
    async def inventory(
        caller: Reader,
        after: Annotated[int | None, Query(description="wait until the version differs from this")] = None,
        timeout_seconds: Annotated[float, Query(alias="timeoutSeconds", ge=0, le=300)] = 30.0,
    ) -> Response:
        _loaded()
        if after is not None:
            await ctx.inventory.wait_newer(after, timeout_seconds)
        # The JSON of each version is encoded once (the model above documents it): every plugin's
        # long poll that a change wakes gets the same bytes.
        return Response(ctx.inventory.snapshot_json(), media_type="application/json")

    @app.get(f"{api.API_PREFIX}/devices", response_model=list[api.Device], response_model_by_alias=True)
    async def devices(caller: Reader) -> list[api.Device]:
        _loaded()
        return ctx.inventory.snapshot().devices

    @app.get(f"{api.API_PREFIX}/devices/{{device}}", response_model=api.Device, response_model_by_alias=True)
    async def device(caller: Reader, device: DeviceName) -> api.Device:
        _loaded()
        record = ctx.inventory.device(device)
        if record is None:
            raise DeviceNotFound(f"device {device} is not in the fabric inventory", device=device)
        return ctx.inventory.render_device(record)

    @app.get(f"{api.API_PREFIX}/nodes", response_model=list[api.FabricNode], response_model_by_alias=True)
    async def nodes(caller: Reader) -> list[api.FabricNode]:
        _loaded()
        return ctx.inventory.snapshot().nodes

    @app.post(
        f"{api.API_PREFIX}/attachments",
        response_model=api.Attachment,
        response_model_by_alias=True,
        responses={202: {"model": api.Attachment, "description": "still attaching: ask again"}},
    )
    async def attach(caller: Caller, request: api.AttachRequest, wait: Wait = 0.0) -> JSONResponse:
        caller.check_bind(request.node)
        _loaded()
        attachment, status = await ctx.attachments.attach(request, wait)
        return JSONResponse(status_code=status, content=attachment.model_dump(mode="json", by_alias=True))

    @app.post(
        f"{api.API_PREFIX}/devices/{{device}}/reset",
        response_model=api.Attachment,
        response_model_by_alias=True,
        responses={202: {"model": api.Attachment, "description": "being power-cycled: attach again"}},
        summary="a node's plugin reports the reset of a device its claim got resetRequired",
    )
    async def report_reset(
        caller: Caller, device: DeviceName, report: api.ResetReport, wait: Wait = 0.0
    ) -> JSONResponse:
        caller.check_bind(report.node)  # a plugin's token reports only for its own node
        _loaded()
        attachment, status = await ctx.attachments.report_reset(device, report, wait)
        return JSONResponse(status_code=status, content=attachment.model_dump(mode="json", by_alias=True))

    @app.delete(
        f"{api.API_PREFIX}/attachments/{{device}}",
        response_model=api.Attachment,
        response_model_by_alias=True,
        responses={202: {"model": api.Attachment, "description": "still detaching: ask again"}},
    )
    async def detach(
        caller: Caller,
        device: DeviceName,
        claim_uid: Annotated[str, Query(alias="claimUid", pattern=UID_PATTERN, max_length=UID_MAX_LENGTH)],
        node: NodeQuery,
        wait: Wait = 0.0,
    ) -> JSONResponse:
        caller.check_bind(node)
        _loaded()
        attachment, status = await ctx.attachments.detach(device, claim_uid, node, wait)
        return JSONResponse(status_code=status, content=attachment.model_dump(mode="json", by_alias=True))

    @app.get(f"{api.API_PREFIX}/operations", response_model=list[api.Operation], response_model_by_alias=True)
    async def operations(caller: Reader) -> list[api.Operation]:
        return ctx.operations.all()

    @app.get(
        f"{api.API_PREFIX}/operations/{{operation_id}}",
        response_model=api.Operation,
        response_model_by_alias=True,
    )
    async def operation(caller: Reader, operation_id: OperationIdPath) -> api.Operation:
        found = ctx.operations.get(operation_id)
        if found is None:
            raise NotFoundError(
                f"operation {operation_id} is not known (finished long ago, or another replica's)"
            )
        return found

    @app.put(
        f"{api.API_PREFIX}/nodes/{{node}}/claims",
        status_code=204,
        responses={204: {"description": "recorded"}},
        summary="the claims a node's plugin has prepared",
    )
    async def node_claims(caller: Caller, node: NodeName, report: api.NodeClaims) -> Response:
        caller.check_bind(node)
        ctx.reports.record(node, {c.claim_uid: c.devices for c in report.claims})
        return Response(status_code=204)

    @app.get(
        f"{api.API_PREFIX}/usage",
        response_model=api.UsageReport,
        response_model_by_alias=True,
        summary="device-seconds by namespace, model or workload since a time",
    )
    async def usage(
        caller: UsageReader,
        since: Annotated[
            str,
            Query(
                max_length=_SINCE_MAX_LENGTH,
                description="RFC 3339 with a zone; counted from the start of its hour",
                json_schema_extra={"format": "date-time"},
            ),
        ],
        by: Annotated[api.UsageGrouping, Query(description="what the seconds are grouped by")] = (
            api.UsageGrouping.NAMESPACE
        ),
    ) -> api.UsageReport:
        start = api.parse_rfc3339(since)
        if start is None:
            raise InvalidRequest(
                f"malformed request: query.since: {since[:40]!r} is no RFC 3339 time with a zone "
                "(e.g. 2026-12-01T00:00:00Z)"
            )
        if not _in_utc_range(start):
            # 0001-01-01T00:00:00+23:59 is a valid RFC 3339 time whose UTC is before the year 1.
            raise InvalidRequest(
                f"malformed request: query.since: {since!r} is before 0001-01-01 or after 9999-12-31 "
                "in UTC; give a time within the years 1 to 9999"
            )
        if ctx.usage is None or not ctx.usage.counting:
            raise FabricUnavailable("the usage record is not loaded yet", retry_after=2.0)
        return ctx.usage.report(start, by)

    return app


def _in_utc_range(moment: datetime) -> bool:
    """Whether ``moment`` has a UTC time (a zone offset can push 0001-01-01 or 9999-12-31 past it)."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        return False
    return True
