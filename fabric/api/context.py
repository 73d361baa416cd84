"""What every route of the API is handed: the manager's parts (:class:`AppContext`), the caller —
authenticated, the leader's, granted what the route does — and the names and waits it takes, each
with the Kubernetes rule that bounds it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Path, Query, Request

from fabric.api.auth import Access, Chain, Identity
from fabric.api.request_guard import IDENTITY_STATE
from fabric.bindings.attachments import Attachments
from fabric.bindings.budget_status import BudgetStatus
from fabric.bindings.usage import UsageMeter
from fabric.state.drains import DrainBook
from fabric.state.inventory import Inventory
from fabric.state.metrics import ManagerMetrics
from fabric.state.operation_log import OperationLog
from fabric.state.reports import PluginReports
from manager_api import models as api
from manager_api.errors import FabricUnavailable, NotLeader
from plumbing.names import (
    DNS1123_LABEL_MAX_LENGTH,
    DNS1123_LABEL_PATTERN,
    DNS1123_SUBDOMAIN_MAX_LENGTH,
    DNS1123_SUBDOMAIN_PATTERN,
    UID_MAX_LENGTH,
    UID_PATTERN,
)

__all__ = [
    "AppContext",
    "Caller",
    "ClaimUidQuery",
    "Ctx",
    "DeviceName",
    "Drainer",
    "EpochQuery",
    "NodeName",
    "NodeQuery",
    "OperationIdPath",
    "OptionalNodeQuery",
    "PollSeconds",
    "Reader",
    "ShareIdQuery",
    "SinceQuery",
    "UsageReader",
    "Wait",
    "require_loaded",
]


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
    #: the operators' drains (``/api/v1/drains``); None: not served
    drains: DrainBook | None = None
    #: claims of orphaned agent trees (``/api/v1/trees/orphaned``); None: not looked for here
    orphaned_trees: Callable[[], api.OrphanedTreeClaims] | None = None
    #: the DeviceBudgets (``GET /api/v1/budgets``); None without Kubernetes API access: none
    budgets: BudgetStatus | None = None


async def _context(request: Request) -> AppContext:
    # async: FastAPI runs a plain ``def`` dependency in its thread pool, a thread hop per request
    ctx: AppContext = request.app.state.ctx
    return ctx


Ctx = Annotated[AppContext, Depends(_context)]


def require_loaded(ctx: AppContext) -> None:
    """Refuse (503, retriable) while the first discovery pass has not loaded the inventory."""
    if not ctx.inventory.loaded.is_set():
        err = ctx.inventory.last_error
        cause = f": {err.message}" if err else ""
        raise FabricUnavailable(f"the fabric inventory is not loaded yet{cause}", retry_after=2.0)


async def _identity(request: Request) -> Identity:
    # The RequestGuard authenticated the caller from the head, before any body was read. The
    # header is read here only when it did not (a route outside /api/v1): declaring it a Header
    # parameter would have FastAPI extract and validate it on every request.
    identity = request.scope.get("state", {}).get(IDENTITY_STATE)
    if isinstance(identity, Identity):
        return identity
    ctx: AppContext = request.app.state.ctx
    client = request.client.host if request.client else None
    return await ctx.auth.require(request.headers.get("authorization"), client=client)


async def _leader(request: Request) -> Identity:
    """The caller, on the leader (else 503 NotLeader): one dependency, not one on another, as each
    costs FastAPI a resolution per request on the attach and detach path."""
    caller = await _identity(request)
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


#: any authenticated caller (``/metrics`` checks its role itself, on every replica)
Anyone = Annotated[Identity, Depends(_identity)]
#: attach, detach and reports: each route checks the node too (``Identity.check_bind``)
Caller = Annotated[Identity, Depends(_leader)]
Reader = Annotated[Identity, Depends(_needs(Access.READ))]
UsageReader = Annotated[Identity, Depends(_needs(Access.USAGE))]
Drainer = Annotated[Identity, Depends(_needs(Access.DRAIN))]
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
#: the claim a detach is for
ClaimUidQuery = Annotated[str, Query(alias="claimUid", pattern=UID_PATTERN, max_length=UID_MAX_LENGTH)]
#: the memory share a detach gives back (a share of a CXL memory pool)
ShareIdQuery = Annotated[str | None, Query(alias="shareId", pattern=api.SHARE_ID_PATTERN, max_length=36)]
#: how long a long poll of the inventory waits for a change
PollSeconds = Annotated[float, Query(alias="timeoutSeconds", ge=0, le=300)]
EpochQuery = Annotated[int, Query(description="the epoch of the inventory or change answer read last")]
SinceQuery = Annotated[int, Query(description="the version read last: answer what changed after it")]
OptionalNodeQuery = Annotated[
    str | None,
    Query(
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        max_length=DNS1123_SUBDOMAIN_MAX_LENGTH,
        description="only the devices concerning this node (its plugin's view); the answer names it",
    ),
]
