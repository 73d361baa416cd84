"""DeviceBudgets enforced at the one place a claim gets a device: the manager's attach
(docs/budgets.md, "Enforcement").

Before an attach gives a claim a device it does not hold yet — a cold bind, a warm device taken, a
partition placed, a memory share made — :meth:`BudgetGate.admit` finds, for every DeviceBudget of
the claim's namespace that selects the claim, the claim's tree (by label, or the root of its owner
chain: :mod:`fabric.bindings.trees`) and checks every limit against what the tree holds now. What
the tree holds is counted from the ledger's attaching and bound entries (:func:`holders`), which
are durable before the fabric is asked, so an attach in flight counts, and a crash between the
check and the ledger write leaves no phantom hold behind.

**One at a time per namespace.** The check and the ledger write of the intent run under one lock
per namespace (a budget caps trees of one namespace: owner references never cross one), taken
inside the device's own lock, so two attaches of one tree cannot both take its last slot. The lock
is held only for the check and one ledger write.

A refusal is :class:`manager_api.errors.BudgetExceeded` (409); ``enforcement: Warn`` refuses
nothing. Either way the claim gets a Warning Event ``BudgetExceeded`` at most once a minute per
budget, and the refusal is counted (``fabric_dra_budget_refusals_total``, Enforce only).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from fabric.bindings.attribution import label_values
from fabric.bindings.budget_use import Holder, Holding, TreeUse, budget_applies, holders, holding_of
from fabric.bindings.trees import OwnerChains, label_tree
from fabric.bindings.usage import PARTITION, UsageMeter, hour_of
from fabric.state.budgets import BudgetView, DeviceBudget
from fabric.state.claims import ClaimView
from fabric.state.inventory import Inventory
from fabric.state.ledger import Ledger
from fabric.state.metrics import ManagerMetrics
from manager_api import models as api
from manager_api.errors import BudgetExceeded, FabricUnavailable
from manager_api.partitions import PartitionDevice, size_text
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.events import EventRecorder, ObjectRef
from plumbing.logs import get_logger

__all__ = ["EVENT_INTERVAL_SECONDS", "BudgetGate", "Refusal", "TreeReport", "within_budget"]

log = get_logger(__name__)

#: at most one BudgetExceeded Event per claim and budget in this many seconds: a claim the kubelet
#: or the scheduler retries every few seconds must not flood its namespace's Events
EVENT_INTERVAL_SECONDS = 60.0
#: device-seconds states a tree is charged device-hours for (warm and outside are no claim's)
_DEVICE_STATES = ("bound", "attaching", "detaching")


@dataclass(frozen=True)
class Refusal:
    """The last claim a tree was refused (or, with Warn, would have been)."""

    time: datetime
    claim: str
    limit: str


@dataclass
class TreeReport:
    """One tree of one budget: each limit as (name, used, max, known)."""

    tree: str
    limits: list[api.BudgetLimitUse] = field(default_factory=list)
    refused: Refusal | None = None

    def reached(self) -> api.BudgetLimitUse | None:
        return next((u for u in self.limits if u.known and u.used >= u.max), None)


class BudgetGate:
    def __init__(
        self,
        view: BudgetView,
        claims: ClaimView,
        ledger: Ledger,
        inventory: Inventory,
        *,
        partition: Callable[[str], PartitionDevice | None],
        roots: OwnerChains | None = None,
        usage: UsageMeter | None = None,
        events: EventRecorder | None = None,
        metrics: ManagerMetrics | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.view = view
        self.claims = claims
        self.ledger = ledger
        self.inventory = inventory
        self.partition = partition
        #: walks owner chains; None: owner-chain budgets select nothing (no API access to walk)
        self.roots = roots
        self.usage = usage
        self.events = events
        self.metrics = metrics
        self.clock = clock
        #: how long a new hold waits for the budgets' first list before it is refused (retriable)
        self.sync_wait = 5.0
        self._locks: dict[str, asyncio.Lock] = {}
        #: (budget key, claim UID) → the claim's tree ("" for none), kept while the claim holds a
        #: device: a deleted claim's device still counts for its tree until it is detached
        self._trees: dict[tuple[str, str], str] = {}
        #: (budget key, tree) → the last refusal
        self.refusals: dict[tuple[str, str], Refusal] = {}
        self._evented: dict[tuple[str, str], float] = {}
        #: (claim UID, device, share ID) → what that hold takes, while it lasts
        self._holdings: dict[tuple[str, str, str | None], Holding] = {}
        self._side_tasks: set[asyncio.Task[bool]] = set()

    # -- which tree ------------------------------------------------------------------------------

    async def tree_of(self, budget: DeviceBudget, claim: ResourceClaim) -> str | None:
        """The tree of ``budget`` that ``claim`` is in; None when the budget does not select it."""
        memo = (budget.key, claim.metadata.uid)
        if memo in self._trees:
            return self._trees[memo] or None
        tree, final = await self._find_tree(budget, claim)
        if final:
            self._trees[memo] = tree or ""
        return tree

    async def _find_tree(self, budget: DeviceBudget, claim: ResourceClaim) -> tuple[str | None, bool]:
        """(the claim's tree, whether that answer holds for good); a chain that cannot be read now
        is asked again at the claim's next use."""
        if claim.metadata.namespace != budget.namespace:
            return None, True
        label, owner = budget.spec.tree.label, budget.spec.tree.owner
        if label is not None:
            tree = label_tree(claim, label.key)
            return (tree if tree is not None and label.value in (None, tree) else None), True
        if owner is None or self.roots is None:
            return None, True
        found = await self.roots.root_of(budget.namespace, claim.metadata.owner_references)
        if found.unknown or found.gone:
            # A chain that cannot be read now, or whose root is gone (an orphan: the orphan check
            # reports it), is not guessed into a tree.
            return None, False
        root = found.root
        if root is None or root.kind_key != owner.kind_key or owner.name not in (None, root.name):
            return None, True
        return f"{root.kind}/{root.name}", True

    # -- what a tree holds -----------------------------------------------------------------------

    def _holders(self) -> list[Holder]:
        return list(holders(self.ledger, self.inventory.device, self.partition))

    def _holding(self, holder: Holder) -> Holding:
        """What ``holder`` takes, worked out once per hold: a check walks every hold of the
        namespace, and a hold's class, model and memory do not change while it lasts (and its
        class stays known after its claim is deleted)."""
        key = (holder.claim_uid, holder.device, holder.share_id)
        known = self._holdings.get(key)
        if known is None:
            known = self._holdings[key] = holding_of(
                self.claims.get(holder.claim_uid),
                holder.device,
                holder.record,
                partition=holder.partition,
                share_bytes=holder.share_bytes,
                share_id=holder.share_id,
            )
        return known

    async def _tree_of_holder(self, budget: DeviceBudget, holder: Holder) -> str | None:
        claim = self.claims.get(holder.claim_uid)
        if claim is None:  # gone: what it was found in while it existed
            return self._trees.get((budget.key, holder.claim_uid)) or None
        return await self.tree_of(budget, claim)

    async def use_of(self, budget: DeviceBudget, tree: str) -> TreeUse:
        """What ``tree`` of ``budget`` holds now, attaches in flight included."""
        use = TreeUse()
        for holder in self._holders():
            if await self._tree_of_holder(budget, holder) == tree:
                use.add(self._holding(holder))
        return use

    def device_hours(self, budget: DeviceBudget, tree: str) -> float | None:
        """The tree's device-hours in the budget's window, from the usage record; None when the
        accounting does not count by the tree (see docs/budgets.md, "Device-hours")."""
        limit, label = budget.spec.limits.device_hours, budget.spec.tree.label
        if limit is None or label is None or self.usage is None or not self.usage.counting:
            return None
        if label.key not in self.usage.attribution.keys:
            return None
        since = hour_of(self.clock() - timedelta(seconds=limit.window_seconds))
        seconds = 0.0
        for hour, rows in self.usage.book().hours.items():
            if hour < since:
                continue
            for key, value in rows.items():
                if key.namespace != budget.namespace or key.state not in (*_DEVICE_STATES, PARTITION):
                    continue
                if label_values(key.labels).get(label.key) == tree:
                    seconds += value
        return seconds / 3600.0

    # -- the check -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit(
        self, claim_uid: str, device: str, *, share_id: str | None = None, share_bytes: int | None = None
    ) -> AsyncIterator[None]:
        """Hold the namespace's lock while the caller records the claim's new hold of ``device``,
        once every budget selecting the claim allows it; :class:`BudgetExceeded` when one does not."""
        if not self.view.synced.is_set():
            # Not read yet (the first seconds of a leader): an attach now could pass a budget.
            # Waited for as the claim check waits for its first list, then refused for a retry.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.view.synced.wait(), self.sync_wait)
        if not self.view.synced.is_set():
            raise FabricUnavailable(
                "the fabric manager has not read the DeviceBudgets from the API server yet; retry",
                retry_after=2.0,
            )
        claim = self.claims.get(claim_uid)
        budgets = self.view.in_namespace(claim.metadata.namespace or "") if claim is not None else []
        if claim is None or not budgets:
            yield
            return
        partition = self.partition(device)
        record = self.inventory.device(partition.gpu if partition is not None else device)
        new = holding_of(
            claim, device, record, partition=partition, share_bytes=share_bytes, share_id=share_id
        )
        selected = [
            (budget, tree)
            for budget in budgets
            if budget_applies(budget, new) and (tree := await self.tree_of(budget, claim)) is not None
        ]
        if not selected:
            yield
            return
        async with self._locks.setdefault(claim.metadata.namespace or "", asyncio.Lock()):
            for budget, tree in selected:
                over = self._over(budget, tree, await self.use_of(budget, tree), new)
                if over is not None:
                    self._refused(budget, tree, claim, *over)
            yield

    def _over(self, budget: DeviceBudget, tree: str, use: TreeUse, new: Holding) -> tuple[str, str] | None:
        """(limit, why) of the first limit ``new`` would pass; None when all allow it."""
        limits = budget.spec.limits
        for limit in limits.devices:
            held = use.devices(limit)
            if new.matches(limit) and held + 1 > limit.max:
                what = limit.device_class_name or limit.model
                return limit.name, f"holds {held} of {limit.max} {what} devices"
        for name, held, more, cap in (
            ("gpuMemoryBytes", use.gpu_memory, new.gpu_memory, limits.gpu_memory),
            ("cxlMemoryBytes", use.cxl_memory, new.cxl_memory, limits.cxl_memory),
        ):
            if cap is not None and more > 0 and held + more > cap:
                kind = "GPU" if name.startswith("gpu") else "CXL"
                return name, (
                    f"holds {size_text(held)} of {size_text(int(cap))} of {kind} memory; this device "
                    f"needs {size_text(more)}"
                )
        hours = self.device_hours(budget, tree)
        if limits.device_hours is not None and hours is not None and hours >= limits.device_hours.max:
            return "deviceHours", (
                f"used {hours:.2f} of {float(limits.device_hours.max):g} device-hours in the last "
                f"{limits.device_hours.window}"
            )
        return None

    def _refused(self, budget: DeviceBudget, tree: str, claim: ResourceClaim, limit: str, why: str) -> None:
        name = f"{claim.metadata.namespace}/{claim.metadata.name}"
        message = f"DeviceBudget {budget.key}: tree {tree} {why}"
        self.refusals[(budget.key, tree)] = Refusal(self.clock(), name, limit)
        if budget.enforced:
            note = f"{message}; claim {name} waits until the tree releases enough"
        else:
            note = f"{message}; claim {name} is let through (enforcement: Warn)"
        if self._first_in_a_while(budget, claim):  # a retried claim: one line and one Event a minute
            self._event(budget, claim, note)
            log.warning(
                "budget exceeded", budget=budget.key, tree=tree, limit=limit, claim=claim.metadata.uid,
                enforced=budget.enforced, reason=why,
            )  # fmt: skip
        if not budget.enforced:
            return
        if self.metrics is not None:
            self.metrics.budget_refusals.labels(budget.namespace, budget.name, limit).inc()
        raise BudgetExceeded(message + f"; claim {name} is admitted once the tree releases enough")

    def _first_in_a_while(self, budget: DeviceBudget, claim: ResourceClaim) -> bool:
        """Whether this claim's refusal by ``budget`` is the first in :data:`EVENT_INTERVAL_SECONDS`."""
        key, now = (budget.key, claim.metadata.uid), time.monotonic()
        if now - self._evented.get(key, -EVENT_INTERVAL_SECONDS) < EVENT_INTERVAL_SECONDS:
            return False
        self._evented[key] = now
        if len(self._evented) > 10_000:  # bounded: old marks are only a rate limit
            self._evented = {k: t for k, t in self._evented.items() if now - t < EVENT_INTERVAL_SECONDS}
        return True

    def _event(self, budget: DeviceBudget, claim: ResourceClaim, note: str) -> None:
        """A Warning Event on the claim."""
        if self.events is None:
            return
        regarding = ObjectRef(
            "ResourceClaim",
            claim.metadata.name,
            claim.metadata.namespace or "",
            claim.api_version,
            claim.metadata.uid,
        )
        task = asyncio.create_task(
            self.events.record(
                regarding,
                reason="BudgetExceeded",
                action="Attach" if budget.enforced else "Warn",
                note=note,
                event_type="Warning",
            )
        )
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # -- every tree, for the status, the metrics and the API --------------------------------------

    async def report(self, budget: DeviceBudget) -> list[TreeReport]:
        """Every tree of ``budget`` that holds something or was refused, and the one tree a budget
        naming its tree's value or root always has; in order of tree."""
        uses: dict[str, TreeUse] = {}
        for holder in self._holders():
            tree = await self._tree_of_holder(budget, holder)
            if tree is not None:
                uses.setdefault(tree, TreeUse()).add(self._holding(holder))
        named = _named_tree(budget)
        if named is not None:
            uses.setdefault(named, TreeUse())
        for key, tree in self.refusals:
            if key == budget.key:
                uses.setdefault(tree, TreeUse())
        return [self._tree_report(budget, tree, use) for tree, use in sorted(uses.items())]

    def _tree_report(self, budget: DeviceBudget, tree: str, use: TreeUse) -> TreeReport:
        limits = budget.spec.limits
        rows = [
            api.BudgetLimitUse(limit=limit.name, used=use.devices(limit), max=limit.max)
            for limit in limits.devices
        ]
        for name, used, cap in (
            ("gpuMemoryBytes", use.gpu_memory, limits.gpu_memory),
            ("cxlMemoryBytes", use.cxl_memory, limits.cxl_memory),
        ):
            if cap is not None:
                rows.append(api.BudgetLimitUse(limit=name, used=used, max=float(cap)))
        if limits.device_hours is not None:
            hours = self.device_hours(budget, tree)
            rows.append(
                api.BudgetLimitUse(
                    limit="deviceHours",
                    used=round(hours or 0.0, 3),
                    max=float(limits.device_hours.max),
                    known=hours is not None,
                )
            )
        return TreeReport(tree, rows, self.refusals.get((budget.key, tree)))

    def forget_gone(self) -> None:
        """Drop the trees of claims that hold nothing and no longer exist. Nothing to walk while
        nothing is remembered (no budget has been checked): the ledger is not walked every
        refresh for that, and the holds are walked without their devices' records."""
        if not self._trees and not self._holdings:
            return
        held_now = list(holders(self.ledger, lambda _: None, lambda _: None))
        held = {h.claim_uid for h in held_now}
        for memo in [m for m in self._trees if m[1] not in held and self.claims.get(m[1]) is None]:
            del self._trees[memo]
        holds = {(h.claim_uid, h.device, h.share_id) for h in held_now}
        for key in [k for k in self._holdings if k not in holds]:
            del self._holdings[key]


def _named_tree(budget: DeviceBudget) -> str | None:
    """The one tree a budget names outright (a label value, an owner's name), else None."""
    label, owner = budget.spec.tree.label, budget.spec.tree.owner
    if label is not None:
        return label.value
    if owner is not None and owner.name:
        return f"{owner.kind}/{owner.name}"
    return None


def within_budget(
    gate: BudgetGate | None,
    claim_uid: str,
    device: str,
    *,
    share_id: str | None = None,
    share_bytes: int | None = None,
) -> contextlib.AbstractAsyncContextManager[None]:
    """:meth:`BudgetGate.admit`, or nothing to check without budgets (no Kubernetes API access)."""
    if gate is None:
        return contextlib.nullcontext()
    return gate.admit(claim_uid, device, share_id=share_id, share_bytes=share_bytes)
