"""The routes of the manager's API, grouped as the API document lists them: probes and metrics, the
fabric's inventory, attachments, operations, the plugins' claim reports, usage. Each route checks
its caller and its names, then hands the request to the part that owns it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from fabric.api.auth import Access
from fabric.api.context import (
    Anyone,
    AppContext,
    Caller,
    ClaimUidQuery,
    Ctx,
    DeviceName,
    Drainer,
    EpochQuery,
    NodeName,
    NodeQuery,
    OperationIdPath,
    OptionalNodeQuery,
    PollSeconds,
    Reader,
    ShareIdQuery,
    SinceQuery,
    UsageReader,
    Wait,
    require_loaded,
)
from fabric.bindings.attribution import LABEL_KEY_MAX_LENGTH
from fabric.bindings.budget_status import report_of
from fabric.bindings.focus import focus_csv, focus_rows
from fabric.bindings.usage import BUCKET, UsageMeter
from fabric.state.drains import DrainBook
from fabric.state.inventory import wait_changes
from manager_api import models as api
from manager_api.errors import DeviceNotFound, FabricUnavailable, InvalidRequest, NotFoundError

__all__ = ["ROUTERS", "attachment_answer"]

#: ``GET /api/v1/usage?since=``: an RFC 3339 date-time is at most 35 characters
#: (``2026-03-01T09:00:00.123456789+01:00``); a few more for longer fractions.
_SINCE_MAX_LENGTH = 64

PROBES = APIRouter()
FABRIC = APIRouter()
ATTACHMENTS = APIRouter()
OPERATIONS = APIRouter()
REPORTS = APIRouter()
USAGE = APIRouter()
DRAINS = APIRouter()
TREES = APIRouter()

#: in the order the API document lists them
ROUTERS = (PROBES, FABRIC, ATTACHMENTS, OPERATIONS, REPORTS, USAGE, DRAINS, TREES)


@PROBES.get("/healthz", include_in_schema=False)
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@PROBES.get("/readyz", include_in_schema=False)
async def readyz(ctx: Ctx) -> JSONResponse:
    reason = ctx.not_ready()
    if reason:
        return JSONResponse(status_code=503, content={"status": "not ready", "reason": reason})
    # Ready, yet the fabric may have devices it cannot offer: say so rather than look empty.
    notices = ctx.inventory.notices
    return JSONResponse(
        status_code=200, content={"status": "ready", **({"detail": notices} if notices else {})}
    )


@PROBES.get("/metrics", include_in_schema=False)
async def metrics(caller: Anyone, ctx: Ctx) -> Response:
    # Every replica serves it (a follower's process metrics too), to the roles that may read
    # tenants' namespaces: operators and the metrics scraper.
    caller.check(Access.METRICS)
    return Response(ctx.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")


@FABRIC.get(f"{api.API_PREFIX}/inventory", response_model=api.Inventory, response_model_by_alias=True)
async def inventory(
    caller: Reader,
    ctx: Ctx,
    after: Annotated[int | None, Query(description="wait until the version differs from this")] = None,
    timeout_seconds: PollSeconds = 30.0,
) -> Response:
    require_loaded(ctx)
    if after is not None:
        await ctx.inventory.wait_past(after, timeout_seconds)
    # The JSON of each version is encoded once (the model above documents it): every plugin's
    # long poll that a change wakes gets the same bytes.
    return Response(ctx.inventory.snapshot_json(), media_type="application/json")


@FABRIC.get(
    f"{api.API_PREFIX}/inventory/changes", response_model=api.InventoryChanges, response_model_by_alias=True
)
async def inventory_changes(
    caller: Reader,
    ctx: Ctx,
    epoch: EpochQuery,
    since: SinceQuery,
    timeout_seconds: PollSeconds = 30.0,
    node: OptionalNodeQuery = None,
) -> Response:
    """The devices changed, added and removed after version ``since``, once there are any (a long
    poll, as ``GET /inventory?after=`` is); ``410 ResyncRequired`` when they are no longer known.
    With ``node``, only the devices bound or attached to that node or leaving it, and only their
    changes answer the poll; a plugin's caller may ask for its own node only (403 otherwise)."""
    if node is not None:
        caller.check_node(node)
    require_loaded(ctx)
    return Response(
        await wait_changes(ctx.inventory, epoch, since, timeout_seconds, node), media_type="application/json"
    )


@FABRIC.get(f"{api.API_PREFIX}/devices", response_model=list[api.Device], response_model_by_alias=True)
async def devices(caller: Reader, ctx: Ctx) -> list[api.Device]:
    require_loaded(ctx)
    return ctx.inventory.snapshot().devices


@FABRIC.get(f"{api.API_PREFIX}/devices/{{device}}", response_model=api.Device, response_model_by_alias=True)
async def device(caller: Reader, device: DeviceName, ctx: Ctx) -> api.Device:
    require_loaded(ctx)
    record = ctx.inventory.device(device)
    if record is None:
        raise DeviceNotFound(f"device {device} is not in the fabric inventory", device=device)
    return ctx.inventory.render_device(record)


@FABRIC.get(f"{api.API_PREFIX}/nodes", response_model=list[api.FabricNode], response_model_by_alias=True)
async def nodes(caller: Reader, ctx: Ctx) -> list[api.FabricNode]:
    require_loaded(ctx)
    return ctx.inventory.snapshot().nodes


def attachment_answer(answer: tuple[api.Attachment, int]) -> Response:
    """An attachment with the status the front chose (200 done, 202 ask again), encoded by pydantic
    in one step (not to a dict, then by ``json.dumps``: every attach and detach answers so)."""
    attachment, status = answer
    return Response(
        attachment.model_dump_json(by_alias=True), status_code=status, media_type="application/json"
    )


@ATTACHMENTS.post(
    f"{api.API_PREFIX}/attachments",
    response_model=api.Attachment,
    response_model_by_alias=True,
    responses={202: {"model": api.Attachment, "description": "still attaching: ask again"}},
)
async def attach(caller: Caller, request: api.AttachRequest, ctx: Ctx, wait: Wait = 0.0) -> Response:
    caller.check_bind(request.node)
    require_loaded(ctx)
    return attachment_answer(await ctx.attachments.attach(request, wait))


@ATTACHMENTS.post(
    f"{api.API_PREFIX}/devices/{{device}}/reset",
    response_model=api.Attachment,
    response_model_by_alias=True,
    responses={202: {"model": api.Attachment, "description": "being power-cycled: attach again"}},
    summary="a node's plugin reports the reset of a device its claim got resetRequired",
)
async def report_reset(
    caller: Caller, device: DeviceName, report: api.ResetReport, ctx: Ctx, wait: Wait = 0.0
) -> Response:
    caller.check_bind(report.node)  # a plugin's token reports only for its own node
    require_loaded(ctx)
    return attachment_answer(await ctx.attachments.report_reset(device, report, wait))


@ATTACHMENTS.delete(
    f"{api.API_PREFIX}/attachments/{{device}}",
    response_model=api.Attachment,
    response_model_by_alias=True,
    responses={202: {"model": api.Attachment, "description": "still detaching: ask again"}},
)
async def detach(
    caller: Caller,
    device: DeviceName,
    claim_uid: ClaimUidQuery,
    node: NodeQuery,
    ctx: Ctx,
    wait: Wait = 0.0,
    share_id: ShareIdQuery = None,
) -> Response:
    caller.check_bind(node)
    require_loaded(ctx)
    return attachment_answer(await ctx.attachments.detach(device, claim_uid, node, wait, share_id=share_id))


@OPERATIONS.get(
    f"{api.API_PREFIX}/operations", response_model=list[api.Operation], response_model_by_alias=True
)
async def operations(caller: Reader, ctx: Ctx) -> list[api.Operation]:
    return ctx.operations.all()


@OPERATIONS.get(
    f"{api.API_PREFIX}/operations/{{operation_id}}",
    response_model=api.Operation,
    response_model_by_alias=True,
)
async def operation(caller: Reader, operation_id: OperationIdPath, ctx: Ctx) -> api.Operation:
    found = ctx.operations.get(operation_id)
    if found is None:
        raise NotFoundError(
            f"operation {operation_id} is not known (finished long ago, or another replica's)"
        )
    return found


@REPORTS.put(
    f"{api.API_PREFIX}/nodes/{{node}}/claims",
    status_code=204,
    responses={204: {"description": "recorded"}},
    summary="the claims a node's plugin has prepared",
)
async def node_claims(caller: Caller, node: NodeName, report: api.NodeClaims, ctx: Ctx) -> Response:
    caller.check_bind(node)
    ctx.reports.record(node, {c.claim_uid: c.devices for c in report.claims})
    return Response(status_code=204)


_SINCE = Query(
    max_length=_SINCE_MAX_LENGTH,
    description="RFC 3339 with a zone; counted from the start of its hour",
    json_schema_extra={"format": "date-time"},
)


@USAGE.get(
    f"{api.API_PREFIX}/usage",
    response_model=api.UsageReport,
    response_model_by_alias=True,
    summary="device-seconds by namespace, model, workload or an attribution label since a time",
)
async def usage(
    caller: UsageReader,
    since: Annotated[str, _SINCE],
    ctx: Ctx,
    by: Annotated[api.UsageGrouping, Query(description="what the seconds are grouped by")] = (
        api.UsageGrouping.NAMESPACE
    ),
    label: Annotated[
        str | None,
        Query(
            max_length=LABEL_KEY_MAX_LENGTH,
            description="by label: the attribution label key (the manager's --attribution-label)",
        ),
    ] = None,
) -> api.UsageReport:
    start = _moment("since", since)
    meter = _meter(ctx)
    if by is not api.UsageGrouping.LABEL:
        return meter.report(start, by)  # a label is read with by=label only
    if label is None or label not in meter.attribution.keys:
        # Schema-valid, and no such grouping here: not found, as a device the fabric lacks.
        keys = ", ".join(meter.attribution.keys) or "none"
        named = f"{label[:80]!r} is" if label is not None else "by=label needs label=KEY:"
        raise NotFoundError(
            f"{named} no attribution label of this manager (its --attribution-label keys: {keys})"
        )
    return meter.report(start, by, label)


@USAGE.get(
    f"{api.API_PREFIX}/usage/focus",
    response_class=Response,
    responses={200: {"content": {"text/csv": {}}, "description": "a FOCUS 1.0 CSV dataset"}},
    summary="the usage since a time as a FOCUS 1.0 cost and usage dataset (CSV)",
)
async def usage_focus(
    caller: UsageReader,
    since: Annotated[str, _SINCE],
    ctx: Ctx,
    until: Annotated[
        str | None,
        Query(
            max_length=_SINCE_MAX_LENGTH,
            description="RFC 3339 with a zone: the hours before it (default: all counted)",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
) -> Response:
    start = _moment("since", since)
    end = _moment("until", until) if until is not None else None
    meter = _meter(ctx)
    book = meter.book()
    stop = end if end is not None else (book.counted_until or start) + BUCKET
    # A week of 800 workloads an hour is ~114,000 rows, seconds to render: off the event loop, on the
    # book's copy (docs/manager.md, "Attribution and the FOCUS export").
    body = await asyncio.to_thread(lambda: focus_csv(focus_rows(book, start, stop, meter.attribution)))
    return Response(content=body, media_type="text/csv; charset=utf-8")


@USAGE.get(
    f"{api.API_PREFIX}/budgets",
    response_model=api.BudgetList,
    response_model_by_alias=True,
    summary="every DeviceBudget with each tree's use against each limit (docs/budgets.md)",
)
async def budgets(
    caller: UsageReader,
    ctx: Ctx,
    namespace: Annotated[
        api.NamespaceName | None, Query(description="only the budgets of this namespace")
    ] = None,
) -> api.BudgetList:
    # What each tree of a tenant holds is the operators' business, as usage is ("Who may read what").
    if ctx.budgets is None:
        return api.BudgetList(budgets=[])  # no Kubernetes API access: no budgets
    gate = ctx.budgets.gate
    found = [b for b in gate.view.all() if namespace is None or b.namespace == namespace]
    return api.BudgetList(budgets=[report_of(b, await gate.report(b)) for b in found])


def _moment(name: str, text: str) -> datetime:
    moment = api.parse_rfc3339(text)
    if moment is None:
        raise InvalidRequest(
            f"malformed request: query.{name}: {text[:40]!r} is no RFC 3339 time with a zone "
            "(e.g. 2026-12-01T00:00:00Z)"
        )
    if not _in_utc_range(moment):
        # 0001-01-01T00:00:00+23:59 is a valid RFC 3339 time whose UTC is before the year 1.
        raise InvalidRequest(
            f"malformed request: query.{name}: {text!r} is before 0001-01-01 or after 9999-12-31 "
            "in UTC; give a time within the years 1 to 9999"
        )
    return moment


def _meter(ctx: AppContext) -> UsageMeter:
    if ctx.usage is None or not ctx.usage.counting:
        raise FabricUnavailable("the usage record is not loaded yet", retry_after=2.0)
    return ctx.usage


def _in_utc_range(moment: datetime) -> bool:
    """Whether ``moment`` has a UTC time (a zone offset can push 0001-01-01 or 9999-12-31 past it)."""
    try:
        moment.astimezone(UTC)
    except OverflowError:
        return False
    return True


def _drain_book(ctx: AppContext) -> DrainBook:
    if ctx.drains is None:
        raise FabricUnavailable("drains are not served by this manager", retry_after=2.0)
    return ctx.drains


def _known(ctx: AppContext, target: api.DrainTarget, name: str) -> None:
    """Refuse (404) a device, switch or node the fabric does not have: a typo must not drain nothing."""
    inventory = ctx.inventory.snapshot()
    if target is api.DrainTarget.DEVICE:
        if ctx.inventory.device(name) is None:
            raise DeviceNotFound(f"device {name} is not in the fabric inventory", device=name)
        return
    if target is api.DrainTarget.SWITCH:
        switches = {d.switch for d in inventory.devices} | {f"{d.pool}/{d.switch}" for d in inventory.devices}
        if name not in switches - {None}:
            known = sorted({d.switch for d in inventory.devices if d.switch})
            raise NotFoundError(
                f"switch {name} has no device in the fabric inventory; switches: {', '.join(known) or 'none'}"
            )
        return
    if name not in {n.name for n in inventory.nodes}:
        raise NotFoundError(f"node {name} is not a node any fabric reaches", node=name)


@DRAINS.get(f"{api.API_PREFIX}/drains", response_model=api.DrainList, response_model_by_alias=True)
async def drains(caller: Reader, ctx: Ctx) -> api.DrainList:
    book = _drain_book(ctx)
    devices = ctx.inventory.snapshot().devices
    return api.DrainList(drains=[book.with_devices(d, devices) for d in book.all()])


@DRAINS.post(
    f"{api.API_PREFIX}/drains",
    response_model=api.DrainAnswer,
    response_model_by_alias=True,
    status_code=201,
    responses={200: {"model": api.DrainAnswer, "description": "already drained so: nothing changed"}},
    summary="drain a device, a switch or a node's devices: their taint keeps new claims off them",
)
async def drain(caller: Drainer, request: api.DrainRequest, ctx: Ctx) -> JSONResponse:
    book = _drain_book(ctx)
    require_loaded(ctx)
    if book.get(request.target, request.name) is None:
        _known(ctx, request.target, request.name)
    found, changed = await book.put(request, caller.user)
    answer = api.DrainAnswer(
        drain=book.with_devices(found, ctx.inventory.snapshot().devices), changed=changed
    )
    return JSONResponse(
        status_code=201 if changed else 200, content=answer.model_dump(mode="json", by_alias=True)
    )


@DRAINS.delete(f"{api.API_PREFIX}/drains", response_model=api.DrainAnswer, response_model_by_alias=True)
async def undrain(
    caller: Drainer,
    target: api.DrainTarget,
    name: Annotated[str, Query(pattern=api.DRAIN_NAME_PATTERN, max_length=api.DRAIN_NAME_MAX_LENGTH)],
    ctx: Ctx,
) -> api.DrainAnswer:
    book = _drain_book(ctx)
    require_loaded(ctx)
    ended = await book.remove(target, name, caller.user)
    if ended is not None:
        return api.DrainAnswer(drain=book.with_devices(ended, ctx.inventory.snapshot().devices), changed=True)
    _known(ctx, target, name)  # not drained: a name the fabric has is fine (idempotent), a typo is not
    now = datetime.now(UTC)
    effect = api.DrainEffect.NO_SCHEDULE
    return api.DrainAnswer(
        drain=api.Drain(target=target, name=name, reason="", effect=effect, since=now, by=caller.user),
        changed=False,
    )


@TREES.get(
    f"{api.API_PREFIX}/trees/orphaned",
    response_model=api.OrphanedTreeClaims,
    response_model_by_alias=True,
    summary="claims holding devices whose agent tree's root is gone and that no pod uses",
)
async def orphaned_trees(caller: Reader, ctx: Ctx) -> api.OrphanedTreeClaims:
    if ctx.orphaned_trees is None:
        # No Kubernetes API access, or --orphaned-trees off: nothing is looked for, so nothing found.
        return api.OrphanedTreeClaims(policy="off", claims=[])
    return ctx.orphaned_trees()
