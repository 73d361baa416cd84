"""The warm pool: devices kept bound to a node with no claim, so a claim there starts without a
hot-add.

* **Warm up, cool down.** Every ``interval_seconds`` the leader compares each covered node's warm
  devices with the policy's target (:mod:`fabric.bindings.warm_policy`) and attaches free matching devices
  (ledger entries held by :data:`fabric.state.ledger.WARM_HOLDER`, ending ``warm``), or detaches the
  extra ones. Attaches and detaches go through the operation driver like a claim's: intent before
  action, one operation per device, rolled back when they fail.
* **Taken, given back.** A claim allocated a device warm on its own node gets it with one ledger
  write (:meth:`fabric.driver.records.OperationRecords.take_warm`: a *hit*). Warm on another
  node, it is detached there and attached to the claim's node (a *miss*: never refused, never bound
  twice). A released device stays bound as warm when its node's pool is below target
  (:meth:`wants_back`) and it can be reset (Redfish ``Reset``, or its node): before another claim uses it.
* **Leaves when unfit.** A warm device the fabric reports unavailable or Critical is detached.
* **Device-seconds.** What warmth costs next to what claims use is counted by
  :mod:`fabric.bindings.usage`, whether a warm policy runs or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from fabric.bindings.warm_policy import DemandTracker, NodeGroup, WarmSettings, model_of, sized_as
from fabric.driver.operations import OperationDriver
from fabric.driver.resets import resettable
from fabric.errors import ConfigError
from fabric.state.inventory import Inventory
from fabric.state.ledger import WARM_HOLDER, Ledger, LedgerEntry, LedgerState
from fabric.state.metrics import ManagerMetrics
from fabric.state.model import DeviceRecord
from manager_api.errors import FabricError
from plumbing.logs import get_logger

__all__ = ["WarmPolicyRefused", "WarmPool"]

log = get_logger(__name__)

#: how a claim met the warm pool (the ``outcome`` label of ``fabric_dra_warm_claims_total``)
HIT, MISS, COLD = "hit", "miss", "cold"


class WarmPolicyRefused(ConfigError):
    """The policy can match no device of the fabric (a model it lacks): the manager does not start."""


class WarmPool:
    def __init__(
        self,
        settings: WarmSettings,
        inventory: Inventory,
        ledger: Ledger,
        driver: OperationDriver,
        *,
        metrics: ManagerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.inventory = inventory
        self.ledger = ledger
        self.driver = driver
        self.metrics = metrics
        self.clock = clock
        self.demand = DemandTracker(settings)
        self._targets: dict[tuple[str, str], int] = {}
        #: (node, model) → the nodes of its reachability group (auto, scope group), itself included
        self._groups: dict[tuple[str, str], NodeGroup] = {}
        self._seeded = False

    # -- what the pool wants -------------------------------------------------------------------------

    def _group(self, record: DeviceRecord) -> str:
        """Fixed: one pool per node, of whatever the policy matches; auto: one per node and model."""
        return self._sized_as(record) if self.settings.mode == "auto" else ""

    def _sized_as(self, record: DeviceRecord) -> str:
        """The pool (auto) a device's demand and size belong to: its model, or its type."""
        return sized_as(record, self.settings.size_by)

    def target(self, node: str, record: DeviceRecord) -> int:
        s = self.settings
        if not s.enabled or not s.covers_node(node) or not s.covers_device(record):
            return 0
        if s.mode == "fixed":
            return s.size
        return self._targets.get((node, self._sized_as(record)), 0)

    def held(self, node: str, group: str) -> list[LedgerEntry]:
        """The node's warm entries of ``group`` (warm, or being attached to be), oldest first."""
        found = []
        for entry in self.ledger.warm_held_on(node):
            if entry.state is LedgerState.DETACHING:
                continue
            record = self.inventory.device(entry.device)
            if record is not None and self._group(record) == group:
                found.append(entry)
        return sorted(found, key=lambda e: e.updated_at)

    def wants_back(self, entry: LedgerEntry) -> bool:
        """Keep the device of ``entry`` (released by its claim) warm on its node: its pool there is
        below target. The caller holds the device's lock."""
        record = self.inventory.device(entry.device)
        if record is None or not self.driver.is_leader():
            return False
        if not resettable(record):
            return False  # it could not be reset before the next claim: unbound (hot-removed) instead
        target = self.target(entry.node, record)
        if target > 0 and len(self.held(entry.node, self._group(record))) < target:
            return True
        # Pooled over a reachability group, a device freed on a node above its share still saves
        # the hot-add of the group's next warm device; the pass places the group's devices by
        # share only when it has to attach or detach anyway.
        pooled = self._pooled_slack(entry.node, self._group(record))
        return target > 0 and pooled is not None and pooled > 0

    def _nodes_with(self, node: str, group: str) -> NodeGroup:
        """The nodes whose warm devices of ``group`` are sized together with ``node``'s."""
        return self._groups.get((node, group), (node,))

    def claimed(self, record: DeviceRecord, node: str, outcome: str) -> None:
        """A claim asked for ``record`` on ``node``: count the outcome and the arrival."""
        self.demand.arrival(node, self._sized_as(record), self.clock())
        if self.metrics is not None:
            self.metrics.warm_claims.labels(model_of(record), outcome).inc()

    def attached(self, record: DeviceRecord, seconds: float) -> None:
        """An attach succeeded after ``seconds``: the hot-add time T of the auto size."""
        self.demand.attached(self._sized_as(record), seconds)

    # -- the loop ------------------------------------------------------------------------------------

    async def run(self) -> None:
        await self.inventory.loaded.wait()
        if self.settings.enabled and (why := self.settings.unknown_model(self.inventory.devices())):
            raise WarmPolicyRefused(why)
        while True:
            await asyncio.sleep(self.settings.interval_seconds)
            with contextlib.suppress(FabricError):
                await self.step()

    async def step(self) -> None:
        """One pass: bring every covered node's pool to target."""
        now = self.clock()
        if not self.driver.is_leader() or not self.inventory.loaded.is_set():
            return
        records = self.inventory.devices()
        if self.settings.mode == "auto":
            if not self._seeded:
                self._seeded = True
                self._seed_from_ledger(now)
            reach = self._reach_groups(records)
            # Scope node sizes every node alone; the groups still say where --warm-min-per-model
            # may place its floor.
            self._groups = reach if self.settings.scope == "group" else {}
            groups: dict[str, list[NodeGroup]] = {}
            for (_, model), nodes_of in reach.items():
                if nodes_of not in groups.setdefault(model, []):
                    groups[model].append(nodes_of)
            self._targets = self.demand.targets(now, groups)
            self.demand.forget_idle(now)
        # Off, the nodes that still hold warm devices are balanced to zero: warmth left by an
        # earlier policy is given back.
        nodes = set(self.ledger.warm_nodes())
        if self.settings.enabled:
            nodes.update(n.name for n in self.inventory.nodes() if self.settings.covers_node(n.name))
        for node in sorted(nodes):
            await self._balance(node, records)
        if self.metrics is not None:
            self._publish_sizes(self.metrics, records)

    def _seed_from_ledger(self, now: float) -> None:
        """Start λ from the claims the ledger holds (each counted at its entry's last change, its
        attach) instead of from zero: a new leader, or a restarted manager, sizes the pool from
        the demand already bound. Claims that ended before are not in the ledger, so this is a
        lower bound that live arrivals complete."""
        self.demand.observe_from(now)
        wall = datetime.now(UTC)
        for entry in self.ledger.entries():
            record = self.inventory.device(entry.device)
            if entry.warm_held or entry.state is not LedgerState.BOUND or record is None:
                continue
            if not self.settings.matches_kind(record) or not self.settings.covers_node(entry.node):
                continue
            age = (wall - entry.updated_at).total_seconds()
            if 0 <= age <= self.settings.idle_ttl_seconds:
                self.demand.arrival(entry.node, self._sized_as(record), now - age)

    def _reach_groups(self, records: list[DeviceRecord]) -> dict[tuple[str, str], NodeGroup]:
        """(node, model) → the covered nodes that reach the same devices of the model."""
        reach: dict[tuple[str, str], set[str]] = {}
        for known in self.inventory.nodes():
            host = self.inventory.host_for_node(known.name)
            if host is None or not self.settings.covers_node(known.name):
                continue
            for record in records:
                if host.id in record.reachable_hosts and self.settings.matches_kind(record):
                    reach.setdefault((known.name, self._sized_as(record)), set()).add(record.name)
        members: dict[tuple[str, frozenset[str]], list[str]] = {}
        for (node, model), devices in reach.items():
            members.setdefault((model, frozenset(devices)), []).append(node)
        return {
            (node, model): tuple(sorted(nodes)) for (model, _), nodes in members.items() for node in nodes
        }

    def _publish_sizes(self, metrics: ManagerMetrics, records: list[DeviceRecord]) -> None:
        # the held entries from the ledger's index, not every entry (10,000 at fleet scale, on
        # every pass of the pool, with the pool off too)
        warm: Counter[str] = Counter()
        for node in self.ledger.warm_nodes():
            for entry in self.ledger.warm_held_on(node):
                record = self.inventory.device(entry.device)
                if entry.state is LedgerState.WARM and record is not None:
                    warm[model_of(record)] += 1
        for model in {model_of(r) for r in records if self.settings.covers_device(r)} | set(warm):
            metrics.warm_devices.labels(model).set(warm[model])

    async def _balance(self, node: str, records: list[DeviceRecord]) -> None:
        host = self.inventory.host_for_node(node)
        if host is None:
            return
        reachable = [r for r in records if host.id in r.reachable_hosts]
        targets: dict[str, int] = {}
        for record in reachable:
            group = self._group(record)
            targets[group] = max(targets.get(group, 0), self.target(node, record))
        for entry in self.ledger.warm_held_on(node):
            known = self.inventory.device(entry.device)
            if known is not None:  # warm devices of a group no device matches now
                targets.setdefault(self._group(known), 0)
            if entry.state is LedgerState.WARM and not entry.clean:
                self.driver.kick(entry.device)  # a reset still due (after a restart, say)
        for group, target in sorted(targets.items()):
            for entry in self.held(node, group):  # unfit devices leave the pool first
                fit = self.inventory.device(entry.device)
                if entry.state is LedgerState.WARM and (fit is None or not self.settings.covers_device(fit)):
                    await self._cool(entry, "unfit")
            held = self.held(node, group)
            # A node off its share while its group is at its size stays as it is: moving warmth
            # between nodes costs an unbind and a hot-add for nothing the pool's size asked for.
            pooled = self._pooled_slack(node, group)
            if len(held) > target:
                extra = len(held) - target if pooled is None else min(len(held) - target, -pooled)
                for entry in [e for e in held if e.state is LedgerState.WARM][: max(0, extra)]:
                    await self._cool(entry, "above target")
                continue
            free = [
                r
                for r in reachable
                if self._group(r) == group
                and self.settings.covers_device(r)
                and not r.bound_hosts
                and self.ledger.get(r.name) is None
            ]
            missing = target - len(held) if pooled is None else min(target - len(held), pooled)
            # From the end of the name order: the allocator's first fit takes a shared slice's
            # devices from its front, so a device being warmed here is seldom the one a pending
            # claim was just allocated — which would be moved to that claim's node, a miss.
            for candidate in sorted(free, key=lambda r: r.name, reverse=True)[: max(0, missing)]:
                await self._warm(candidate, node)

    def _pooled_slack(self, node: str, group: str) -> int | None:
        """The target minus the holdings of the reachability group ``node`` is sized with, or
        None when the node is sized alone (fixed, scope ``node``, no group known)."""
        nodes = self._nodes_with(node, group)
        if len(nodes) < 2:
            return None
        return sum(self._targets.get((n, group), 0) - len(self.held(n, group)) for n in nodes)

    async def _warm(self, record: DeviceRecord, node: str) -> None:
        host = self.inventory.host_for_node(node)
        if host is None:
            return
        async with self.driver.slot(record.name).lock:
            current = self.inventory.device(record.name)
            if self.ledger.get(record.name) is not None or current is None or current.bound_hosts:
                return  # taken meanwhile
            if self.ledger.entries_of(node) >= self.ledger.max_entries_per_node:
                return
            await self.driver.records.start_attach(current, host, node, WARM_HOLDER)
            self.driver.kick(record.name)
        log.info("warming a device", device=record.name, node=node)

    async def _cool(self, entry: LedgerEntry, why: str) -> None:
        async with self.driver.slot(entry.device).lock:
            if self.ledger.get(entry.device) is not entry or entry.state is not LedgerState.WARM:
                return
            await self.driver.records.start_detach(entry)
            self.driver.kick(entry.device)
        log.info("warm device leaves the pool", device=entry.device, node=entry.node, reason=why)
