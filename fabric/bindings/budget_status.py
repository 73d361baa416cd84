"""Each DeviceBudget's ``status``, written by the leader through the ``/status`` subresource when it
changes — at most every :data:`INTERVAL_SECONDS` — and the rows of the budget gauges
(docs/budgets.md, "Status").

The status says, per tree, what it holds against each limit (``used``), the last claim refused and
why (``lastRefused``), the generation it was computed for (``observedGeneration``) and a
``LimitReached`` condition: True while any tree holds as much as a limit allows. At most
:data:`MAX_TREES` trees are written, those holding most first: a budget over every root of a kind
may have thousands, and an object is at most 1.5 MiB (the API server's etcd limit).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fabric.bindings.budgets import BudgetGate, TreeReport
from fabric.state.budgets import DeviceBudget
from fabric.state.metrics import BudgetRow
from manager_api import models as api
from plumbing.kube.client import ApiError, KubeClient, NotFound
from plumbing.kube.resources import DEVICE_BUDGETS
from plumbing.logs import get_logger

__all__ = ["INTERVAL_SECONDS", "MAX_TREES", "BudgetStatus", "status_of"]

log = get_logger(__name__)

#: how often the leader looks again (and writes what changed): a status is for people and alerts
INTERVAL_SECONDS = 3.0
#: the most trees one status lists
MAX_TREES = 100


def _quantity_bytes(n: float) -> str:
    """Bytes as a quantity the way Kubernetes writes whole GiB and MiB (``160Gi``), else plain."""
    whole = int(n)
    for suffix, unit in (("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20)):
        if whole >= unit and whole % unit == 0:
            return f"{whole // unit}{suffix}"
    return str(whole)


def _tree_status(tree: TreeReport) -> dict[str, Any]:
    used: dict[str, Any] = {}
    for row in tree.limits:
        kind, _, what = row.limit.partition(":")
        if kind == "devices":
            used.setdefault("devices", []).append({"name": what, "used": int(row.used), "max": int(row.max)})
        elif row.limit == "gpuMemoryBytes":
            used["gpuMemory"] = _quantity_bytes(row.used)
        elif row.limit == "cxlMemoryBytes":
            used["cxlMemory"] = _quantity_bytes(row.used)
        elif row.limit == "deviceHours" and row.known:
            used["deviceHours"] = f"{row.used:g}"
    status: dict[str, Any] = {"tree": tree.tree, "used": used}
    if tree.refused is not None:
        status["lastRefused"] = {
            "time": tree.refused.time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "claim": tree.refused.claim,
            "limit": tree.refused.limit,
        }
    return status


def _device_names(budget: DeviceBudget, entry: dict[str, Any]) -> None:
    """Each devices row named as its limit is (``deviceClassName`` or ``model``), in place."""
    by_name = {limit.device_class_name or limit.model: limit for limit in budget.spec.limits.devices}
    for row in entry["used"].get("devices", []):
        limit = by_name.get(row.pop("name"))
        if limit is not None and limit.device_class_name is not None:
            row["deviceClassName"] = limit.device_class_name
        elif limit is not None:
            row["model"] = limit.model


def status_of(budget: DeviceBudget, trees: list[TreeReport], now: datetime) -> dict[str, Any]:
    """The ``status`` of ``budget`` with ``trees`` (``lastTransitionTime`` kept from the status it
    has when the condition did not change)."""
    ranked = sorted(trees, key=lambda t: (-sum(u.used / u.max for u in t.limits if u.max), t.tree))
    entries = []
    for tree in sorted(ranked[:MAX_TREES], key=lambda t: t.tree):
        entry = _tree_status(tree)
        _device_names(budget, entry)
        entries.append(entry)
    reached = [(t.tree, u) for t in trees if (u := t.reached()) is not None]
    condition: dict[str, Any]
    if reached:
        first, row = reached[0]
        condition = {
            "type": "LimitReached",
            "status": "True",
            "reason": "LimitReached",
            "message": f"tree {first} holds {row.used:g} of {row.max:g} ({row.limit})"
            + (f"; {len(reached) - 1} more tree(s) at a limit" if len(reached) > 1 else ""),
        }
    else:
        condition = {
            "type": "LimitReached",
            "status": "False",
            "reason": "WithinLimits",
            "message": "every tree holds less than each limit allows",
        }
    previous = next(
        (
            c
            for c in budget.status.get("conditions") or []
            if isinstance(c, dict) and c.get("type") == "LimitReached"
        ),
        None,
    )
    same = previous is not None and previous.get("status") == condition["status"]
    condition["lastTransitionTime"] = (
        previous.get("lastTransitionTime") if same and previous is not None else None
    ) or now.strftime("%Y-%m-%dT%H:%M:%SZ")
    condition["observedGeneration"] = budget.generation
    return {"observedGeneration": budget.generation, "trees": entries, "conditions": [condition]}


class BudgetStatus:
    """The leader's loop: counts every budget's trees, writes each status that changed."""

    def __init__(self, gate: BudgetGate, kube: KubeClient, *, interval: float = INTERVAL_SECONDS) -> None:
        self.gate = gate
        self.kube = kube
        self.interval = interval
        #: budget key → the status last written (or found)
        self._written: dict[str, dict[str, Any]] = {}
        self._rows: list[BudgetRow] = []
        self._failed: set[str] = set()

    def rows(self) -> list[BudgetRow]:
        """The budget gauges as last counted."""
        return self._rows

    async def run(self, is_leader: Callable[[], bool]) -> None:
        while True:
            await asyncio.sleep(self.interval)
            if is_leader():
                await self.refresh()

    async def refresh(self) -> None:
        """Count every budget's trees; write the status of each that changed."""
        rows: list[BudgetRow] = []
        now = datetime.now(UTC)
        for budget in self.gate.view.all():
            trees = await self.gate.report(budget)
            for tree in trees:
                rows.extend(
                    (budget.namespace, budget.name, tree.tree, u.limit, u.used, u.max)
                    for u in tree.limits
                    if u.known
                )
            await self._write(budget, status_of(budget, trees, now))
        self._rows = rows
        self.gate.forget_gone()

    async def _write(self, budget: DeviceBudget, status: dict[str, Any]) -> None:
        last = self._written.get(budget.key, budget.status)
        if _comparable(last) == _comparable(status):
            return
        try:
            await self.kube.patch(
                DEVICE_BUDGETS, budget.name, {"status": status}, budget.namespace, subresource="status"
            )
        except NotFound:
            return  # deleted meanwhile
        except ApiError as err:
            if budget.key not in self._failed:
                self._failed.add(budget.key)
                log.warning(
                    "cannot write a DeviceBudget's status", budget=budget.key, error=str(err).splitlines()[0]
                )
            return
        self._failed.discard(budget.key)
        self._written[budget.key] = status


def _comparable(status: dict[str, Any]) -> Any:
    """The status without the times that change with every write."""
    conditions = [
        {k: v for k, v in c.items() if k != "lastTransitionTime"}
        for c in status.get("conditions") or []
        if isinstance(c, dict)
    ]
    return (status.get("observedGeneration"), status.get("trees"), conditions)


def report_of(budget: DeviceBudget, trees: list[TreeReport]) -> api.BudgetUse:
    """The REST API's view of ``budget`` (``GET /api/v1/budgets``)."""
    return api.BudgetUse(
        namespace=budget.namespace,
        name=budget.name,
        enforcement=budget.spec.enforcement,
        selects=budget.selects,
        trees=[
            api.BudgetTreeUse(
                tree=t.tree,
                limits=t.limits,
                last_refused=f"{t.refused.claim} ({t.refused.limit})" if t.refused is not None else None,
            )
            for t in trees
        ],
    )
