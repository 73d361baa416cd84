"""Keeps the ResourceSlices of every fabric pool equal to the manager's inventory.

Triggers: a new inventory version (long poll), a change to one of our slices made by someone
else (watch), and a periodic resync. Each pass compares the desired slices with the stored
ones semantically (:mod:`.slices`) and writes only what differs — an unchanged pool costs no
write at all. Updates are compare-and-swap on ``resourceVersion``; any conflict, a missing or
unexpected slice, or an API error makes the next pass re-list before it plans again, so the
publisher converges after API-server errors, restarts and concurrent edits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_driver.controller.delta import device_delta
from dra_driver.controller.devices import PublishPolicy, WithheldReason
from dra_driver.controller.dropped import DroppedFields
from dra_driver.controller.layout import stored_layouts
from dra_driver.controller.linktaints import LinkTaints
from dra_driver.controller.metrics import POOL_DEVICES, POOL_GENERATION, SLICE_RECONCILE_SECONDS, SLICE_WRITES
from dra_driver.controller.patch import Patched, patch_pools
from dra_driver.controller.quarantine import Quarantine
from dra_driver.controller.reconciler import Reconciler
from dra_driver.controller.render_memo import RenderMemo
from dra_driver.controller.slicediff import differences
from dra_driver.controller.slices import (
    DesiredPool,
    DeviceMarks,
    NormalCache,
    PoolPlan,
    SliceInvalid,
    SliceWrite,
    check_slice,
    desired_pools,
    plan_pool,
    slice_selector,
)
from dra_driver.errors import ControllerError
from manager_api.feed import InventorySource
from manager_api.models import Inventory
from plumbing.backoff import Backoff
from plumbing.kube import AlreadyExists, ApiError, Conflict, KubeClient, NotFound
from plumbing.kube.informer import Change, Informer, Origin
from plumbing.kube.resources import RESOURCE_SLICES
from plumbing.logs import get_logger

__all__ = ["PublishResult", "SlicePublisher"]


log = get_logger(__name__)


def _log_rewrite(
    write: SliceWrite,
    stored_slices: Mapping[str, dict[str, Any]],
    normal_of: Callable[[dict[str, Any]], dict[str, Any]],
    synced_version: int | None,
) -> None:
    """Log what a rewrite of a stored slice changes, in the first pass only (nothing synced yet):
    a restart over an unchanged inventory should write nothing, and where a server stores a field
    differently from how it was rendered, this line names the field and both values."""
    stored = stored_slices.get(write.name)
    if synced_version is not None or stored is None or write.normal is None or write.resource_version is None:
        return
    differs = "; ".join(differences(normal_of(stored), write.normal))
    log.info("rewriting a stored resource slice", slice=write.name, differs=differs)


#: a change of at most this many devices (or a sixteenth of the inventory) is patched into the
#: last pass's slices on the event loop; a larger one is built whole in a worker thread
PATCH_MAX_DEVICES = 64


@dataclass
class PublishResult:
    """What one pass did."""

    writes: int = 0
    deletes: int = 0
    pools_changed: list[str] = field(default_factory=list)


class _Stale(ControllerError):
    """The stored slices are not what we thought; re-list and plan again."""


class SlicePublisher:
    def __init__(
        self,
        kube: KubeClient,
        policy: PublishPolicy,
        *,
        write_concurrency: int = 16,
        debounce: float = 0.05,
        quarantine: Quarantine | None = None,
        link_taints: LinkTaints | None = None,
    ) -> None:
        self._kube = kube
        #: devices out of allocation after failed attaches: tainted or withheld
        self.quarantine = quarantine
        #: devices whose PCIe link errs past the thresholds: tainted or withheld
        self.link_taints = link_taints
        self._requested_policy = policy
        #: the gated fields this API server showed it drops on write
        self.dropped = DroppedFields()
        self._sem = asyncio.Semaphore(write_concurrency)
        #: our slices by name, as last listed or written
        self._slices: dict[str, dict[str, Any]] = {}
        self._stale = True
        #: resourceVersions produced by our own writes (name → recent versions), to tell our
        #: watch events from other writers'
        self._own: dict[str, list[str]] = defaultdict(list)
        self._deleted: set[str] = set()
        #: names with a write in flight: their watch event may arrive before the response
        self._writing: set[str] = set()
        self._loop = Reconciler(
            self.sync,
            retried=(ApiError, _Stale, SliceInvalid),
            on_failure=self._failed,
            debounce=debounce,
            backoff=Backoff(initial=0.1, maximum=30.0),
        )
        self._desired_key: tuple[int, PublishPolicy, int, int] | None = None
        self._desired: dict[str, DesiredPool] = {}
        #: the inventory ``_desired`` shows, and per pool the slices its last patch changed (None:
        #: built whole)
        self._built_from: Inventory | None = None
        self._changed: dict[str, set[int]] | None = None
        #: the desired pools the last pass that succeeded brought the stored slices to
        self._last_synced: dict[str, DesiredPool] | None = None
        self._normal = NormalCache()
        #: conversions and normal forms of the devices that did not change since the last pass
        self._memo = RenderMemo()
        self.last_result: PublishResult | None = None
        self.synced_version: int | None = None
        self.on_synced: Callable[[int], None] | None = None
        #: the inventory the stored slices show, once a pass has written it: what the node labels
        #: describe, so a node is never labelled warm before its node-local slice exists
        self.published = InventorySource()

    # -- policy ---------------------------------------------------------------------------

    @property
    def policy(self) -> PublishPolicy:
        """The requested policy, less what the API server showed it drops."""
        return self.dropped.applied_to(self._requested_policy)

    @property
    def label_selector(self) -> str:
        return slice_selector(self._requested_policy.driver, self._requested_policy.publisher)

    @property
    def field_selector(self) -> str:
        return f"spec.driver={self._requested_policy.driver}"

    # -- running --------------------------------------------------------------------------

    def set_fabric_available(self, available: bool) -> None:
        """Whether the manager of these pools can be read (:mod:`.managers`): while not, every
        device is published tainted fabric-unavailable, or withheld."""
        if self._requested_policy.fabric_unavailable == (not available):
            return
        self._requested_policy = dataclasses.replace(self._requested_policy, fabric_unavailable=not available)
        self.trigger()

    def refresh(self) -> None:
        """Plan again from the latest inventory although its version has not moved (what it holds
        was filtered anew: a pool another manager keeps, :mod:`.managers`)."""
        self._desired_key = None
        self.trigger()

    def trigger(self, *, relist: bool = False) -> None:
        if relist:
            self._stale = True
        self._loop.trigger()

    async def run(self, feed: InventorySource, *, resync_period: float) -> None:
        """Publish until cancelled (leadership lost or shutdown)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._loop.follow(feed))
            tasks.create_task(self._watcher().run())
            tasks.create_task(self._resync(resync_period))
            tasks.create_task(self._loop.run(feed))

    async def _resync(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            log.debug("periodic resync of resource slices")
            self.trigger(relist=True)

    def _failed(self, err: Exception, retry_in: float) -> None:
        if isinstance(err, SliceInvalid):
            # A bug or an inventory value this code cannot make fit: never write it; retry
            # slowly in case the inventory changes.
            log.error("refusing to write an invalid resource slice", error=str(err))
            return
        log.warning(
            "publishing resource slices failed; retrying",
            error=str(err).splitlines()[0],
            retry_in=round(retry_in, 2),
        )
        self._stale = True

    def _watcher(self) -> Informer:
        """Our slices, listed and watched only to notice what other writers change."""
        return Informer(
            self._kube,
            RESOURCE_SLICES,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            on_changes=self._on_changes,
        )

    def _on_changes(self, changes: Sequence[Change], origin: Origin) -> None:
        if origin == "list":
            return  # the first pass lists anyway
        if origin == "relist":
            # The watch broke: what happened meanwhile is unknown, so plan again from a fresh list.
            self.trigger(relist=True)
            return
        for change in changes:
            meta = change.object.get("metadata") or {}
            if self._foreign(change.type, meta):
                log.info(
                    "resource slice changed by another writer; reconciling",
                    slice=meta.get("name"),
                    event=change.type,
                )
                self.trigger(relist=True)

    def _foreign(self, kind: str, meta: dict[str, Any]) -> bool:
        name = str(meta.get("name") or "")
        if kind == "DELETED":
            if name in self._deleted:
                self._deleted.discard(name)
                return False
            return True
        if name in self._writing:
            return False
        return str(meta.get("resourceVersion") or "") not in self._own.get(name, ())

    # -- one pass -------------------------------------------------------------------------

    async def relist(self) -> None:
        items, _ = await self._kube.list_all(
            RESOURCE_SLICES, label_selector=self.label_selector, field_selector=self.field_selector
        )
        self._slices = {str(obj["metadata"]["name"]): obj for obj in items}
        self._stale = False

    def _desired_inputs(
        self, inventory: Inventory
    ) -> tuple[tuple[int, PublishPolicy, int, int], dict[tuple[str, str], str], dict[tuple[str, str], str]]:
        """What the desired pools are built from, read on the event loop (the quarantine and the
        link taints change there): the cache key, the quarantined devices and the link faults."""
        quarantine, links = self.quarantine, self.link_taints
        key = (
            inventory.version,
            self.policy,
            quarantine.version if quarantine else 0,
            links.version if links else 0,
        )
        if key == self._desired_key:
            return key, {}, {}
        quarantined = {k: q.reason for k, q in quarantine.active().items()} if quarantine else {}
        return key, quarantined, (links.active() if links else {})

    async def desired(self, inventory: Inventory) -> dict[str, DesiredPool]:
        """The pools ``inventory`` should be published as (cached per inventory version, policy,
        quarantine and link taints): the last ones patched with the devices that changed
        (:mod:`.patch`) where that can be done, else built whole in a worker thread, each device
        kept in the slice it is in (:mod:`.layout`)."""
        key, quarantined, link_faults = self._desired_inputs(inventory)
        if key == self._desired_key:
            self._changed = {}
            return self._desired
        patched = self._patched(inventory, key, DeviceMarks(quarantined, link_faults))
        if patched is not None:
            self._desired, self._changed = patched.pools, patched.changed
        else:
            before = {name: pool.layout() for name, pool in self._desired.items()} or stored_layouts(
                self._slices
            )
            self._desired = await asyncio.to_thread(
                desired_pools, inventory, key[1], quarantined, link_faults, self._memo, before
            )
            self._changed = None
        self._desired_key, self._built_from = key, inventory
        return self._desired

    def _patched(
        self, inventory: Inventory, key: tuple[int, PublishPolicy, int, int], marks: DeviceMarks
    ) -> Patched | None:
        """The last desired pools patched with what ``inventory`` changed, when only devices did,
        and few (a whole read makes every device new: built whole, in a worker thread)."""
        last, built_from = self._desired_key, self._built_from
        if last is None or built_from is None or last[1:] != key[1:] or built_from.pools != inventory.pools:
            return None
        delta = device_delta(built_from, inventory)
        if len(delta) > max(PATCH_MAX_DEVICES, len(inventory.devices) // 16):
            return None
        return patch_pools(self._desired, inventory, delta, key[1], marks, self._memo)

    async def sync(self, inventory: Inventory) -> PublishResult:
        """Bring the stored slices to ``inventory``; raises on API errors (the caller retries)."""
        started = time.monotonic()
        relisted = self._stale
        if self._stale:
            await self.relist()
        base = self._desired
        # Building, normalising and planning tens of thousands of devices (GPU partitions) is
        # seconds of CPU: done in a worker thread (a patch of a few devices is done here).
        desired = await self.desired(inventory)
        by_pool: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for name, obj in self._slices.items():
            pool = str(((obj.get("spec") or {}).get("pool") or {}).get("name") or "")
            by_pool[pool][name] = obj
        # The stored slices are what the last pass wrote for ``base``, and ``desired`` is it
        # patched: only the slices the patch changed can differ.
        only = self._changed if not relisted and base is self._last_synced else None
        if only is not None:
            plans = self._plans(desired, by_pool, self._slices, only)
        else:
            plans = await asyncio.to_thread(self._plans, desired, by_pool, dict(self._slices))
        result = PublishResult()
        outcomes = await asyncio.gather(
            *(self._apply(plan, result) for plan in plans), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        self._record(desired, by_pool, plans)
        self._last_synced = desired
        SLICE_RECONCILE_SECONDS.observe(time.monotonic() - started)
        self.last_result = result
        self.synced_version = inventory.version
        await self.published.put(inventory)
        if plans:
            log.info(
                "resource slices published",
                inventory_version=inventory.version,
                pools=",".join(result.pools_changed),
                writes=result.writes,
                deletes=result.deletes,
                seconds=round(time.monotonic() - started, 3),
            )
        if self.on_synced is not None:
            self.on_synced(inventory.version)
        if self._policy_changed_by(result):
            self._loop.trigger()
        return result

    def _plans(
        self,
        desired: dict[str, DesiredPool],
        by_pool: dict[str, dict[str, dict[str, Any]]],
        all_slices: dict[str, dict[str, Any]],
        only: dict[str, set[int]] | None = None,
    ) -> list[PoolPlan]:
        """Each pool's plan; with ``only`` (pool → the slices a patch changed), those alone."""
        pools = sorted(set(desired) | set(by_pool)) if only is None else sorted(only)
        return [
            plan
            for pool in pools
            if (
                plan := plan_pool(
                    pool,
                    desired.get(pool),
                    by_pool.get(pool, {}),
                    driver=self.policy.driver,
                    all_slices=all_slices,
                    normal_of=self._normal,
                    only=None if only is None else only[pool],
                )
            )
            is not None
        ]

    def _record(
        self,
        desired: dict[str, DesiredPool],
        by_pool: dict[str, dict[str, dict[str, Any]]],
        plans: list[PoolPlan],
    ) -> None:
        written = {plan.pool: plan.generation for plan in plans if plan.writes}
        for name, pool in desired.items():
            POOL_DEVICES.labels(pool=name, state="published").set(pool.device_count)
            for reason in WithheldReason:
                count = sum(1 for r in pool.withheld.values() if r is reason)
                POOL_DEVICES.labels(pool=name, state=f"withheld-{reason.value}").set(count)
            generation = written.get(name)
            if generation is None:
                stored = next(iter(by_pool.get(name, {}).values()), None)
                generation = int(
                    (((stored or {}).get("spec") or {}).get("pool") or {}).get("generation") or 0
                )
            POOL_GENERATION.labels(pool=name).set(generation)

    async def _apply(self, plan: PoolPlan, result: PublishResult) -> None:
        for name, rv in plan.deletes_first:
            await self._delete(name, rv)
            result.deletes += 1
        layout = self.policy.counters

        def check_all() -> None:
            for write in [*plan.writes, *plan.writes_after]:
                check_slice(write.obj, layout)  # never send what the API server would reject

        await asyncio.to_thread(check_all)
        await asyncio.gather(*(self._write(w) for w in plan.writes))
        result.writes += len(plan.writes)
        if plan.writes_after:
            # Devices a slice gains are added only once every other slice has dropped them (a
            # device twice in one pool makes the pool invalid): after all of ``writes``.
            await asyncio.gather(*(self._write(self._after(w)) for w in plan.writes_after))
            result.writes += len(plan.writes_after)
        for name, rv in plan.deletes:
            await self._delete(name, rv)
            result.deletes += 1
        result.pools_changed.append(plan.pool)
        log.debug(
            "pool written",
            pool=plan.pool,
            generation=plan.generation,
            slices=len(plan.writes),
            deleted=len(plan.deletes),
        )

    def _after(self, write: SliceWrite) -> SliceWrite:
        """``write`` on top of what this pass wrote to the same slice before it."""
        stored = self._slices.get(write.name)
        rv = str(((stored or {}).get("metadata") or {}).get("resourceVersion") or "")
        if not rv or rv == write.resource_version:
            return write
        obj = {**write.obj, "metadata": {**write.obj["metadata"], "resourceVersion": rv}}
        return dataclasses.replace(write, obj=obj, resource_version=rv)

    async def _write(self, write: SliceWrite) -> None:
        verb = "create" if write.resource_version is None else "update"
        _log_rewrite(write, self._slices, self._normal, self.synced_version)
        async with self._sem:
            self._writing.add(write.name)
            try:
                if write.resource_version is None:
                    stored = await self._kube.create(RESOURCE_SLICES, write.obj)
                else:
                    stored = await self._kube.replace(RESOURCE_SLICES, write.obj)
            except (Conflict, AlreadyExists, NotFound) as err:
                SLICE_WRITES.labels(verb=verb, outcome=err.reason or "Conflict").inc()
                raise _Stale(f"{verb} of resource slice {write.name}: {err}") from err
            except ApiError as err:
                SLICE_WRITES.labels(verb=verb, outcome=err.reason or "Error").inc()
                raise
            finally:
                self._writing.discard(write.name)
        SLICE_WRITES.labels(verb=verb, outcome="ok").inc()
        name = write.name
        self._slices[name] = stored
        own = self._own[name]
        own.append(str((stored.get("metadata") or {}).get("resourceVersion") or ""))
        del own[:-8]
        if self.dropped.check(write.obj, stored) and write.normal is not None:
            self._normal.remember(stored, write.normal)

    async def _delete(self, name: str, resource_version: str) -> None:
        async with self._sem:
            self._deleted.add(name)
            try:
                await self._kube.delete(RESOURCE_SLICES, name, resource_version=resource_version or None)
            except NotFound:
                SLICE_WRITES.labels(verb="delete", outcome="NotFound").inc()
            except Conflict as err:
                self._deleted.discard(name)
                SLICE_WRITES.labels(verb="delete", outcome="Conflict").inc()
                raise _Stale(f"delete of resource slice {name}: {err}") from err
            except ApiError as err:
                self._deleted.discard(name)
                SLICE_WRITES.labels(verb="delete", outcome=err.reason or "Error").inc()
                raise
            else:
                SLICE_WRITES.labels(verb="delete", outcome="ok").inc()
        self._slices.pop(name, None)
        self._own.pop(name, None)

    def _policy_changed_by(self, result: PublishResult) -> bool:
        return self._desired_key is not None and self._desired_key[1] != self.policy
