"""Drains as DeviceTaintRules, where the cluster serves them.

A DeviceTaintRule "adds one taint to all devices which match the selector. This has the same
effect as if the taint was specified directly in the ResourceSlice by the DRA driver"
(``k8s.io/api/resource/v1beta2/types.go``, KEP-5055): the scheduler merges rule taints into the
slices it allocates from (``k8s.io/dynamic-resource-allocation/resourceslice/tracker``), and
kube-controller-manager's device taint eviction controller evicts for a ``NoExecute`` rule as for
a slice taint (``pkg/controller/devicetainteviction``), reporting progress in the rule's status
(condition ``EvictionInProgress``). A rule is an object of its own that an operator can see
(``kubectl get devicetaintrules``), and a drain no longer rewrites the pool's slices.

So with ``--drain-taints rules`` (or ``auto`` where discovery finds ``devicetaintrules``), every
device the inventory shows drained gets one rule: selector driver, pool and device; taint
``<driver>/drain`` with the drain's reason as value and its effect. Rules carry the label
``<driver>/drain-rule=<publisher>``, so each controller finds its own again: every pass lists them,
creates what is missing, rewrites what differs (compare-and-swap) and deletes what no drain covers
any more; a pass with nothing to change writes nothing. A restarted controller converges the same
way, as do rules deleted or edited by hand (on the next inventory change or resync).
"""

from __future__ import annotations

import asyncio
from typing import Any

from dra_driver.controller.delta import KeptDevices
from dra_driver.controller.metrics import SLICE_WRITES
from dra_driver.controller.reconciler import Reconciler
from dra_driver.controller.resourcenames import drain_rule_label, drain_taint_key, short_hash
from dra_driver.errors import ControllerError
from manager_api.feed import InventorySource
from manager_api.models import Device, DeviceDrain, Inventory
from plumbing.backoff import Backoff
from plumbing.kube import ApiError, KubeClient, NotFound
from plumbing.kube.resources import DEVICE_TAINT_RULES
from plumbing.logs import get_logger
from plumbing.names import is_label_value

__all__ = ["DrainRules", "rule_name"]

log = get_logger(__name__)


class _Stale(ControllerError):
    """A rule changed under us; list again and plan again."""


def rule_name(driver: str, pool: str, device: str) -> str:
    """``<driver>-drain-<device>-<hash of pool/device>``: a DNS subdomain (the driver a subdomain,
    the device a label), apart for the same device name in two pools."""
    return f"{driver}-drain-{device}-{short_hash(f'{pool}/{device}')}"


class DrainRules:
    def __init__(
        self, kube: KubeClient, *, driver: str, publisher: str, version: str, debounce: float = 0.05
    ) -> None:
        self._kube = kube
        self._driver = driver
        self._publisher = publisher
        #: the version of resource.k8s.io the rules are written in (each call names the resource
        #: itself, so tests/unit/deploy/test_rbac_code.py sees it)
        self.version = version
        self.resource = DEVICE_TAINT_RULES.with_version(version)
        #: the drained devices, kept from the devices each inventory changed (not a pass over all)
        self._drained = KeptDevices(lambda device: device.drain is not None)
        #: our rules by name, as last listed or written; None: list them first
        self._stored: dict[str, dict[str, Any]] | None = None
        self._loop = Reconciler(
            self.sync,
            retried=(ApiError, _Stale),
            on_failure=self._failed,
            debounce=debounce,
            backoff=Backoff(initial=0.1, maximum=30.0),
        )

    @property
    def label_selector(self) -> str:
        return f"{drain_rule_label(self._driver)}={self._publisher}"

    def _failed(self, err: Exception, retry_in: float) -> None:
        log.warning(
            "writing drain DeviceTaintRules failed; retrying",
            error=str(err).splitlines()[0],
            retry_in=round(retry_in, 2),
        )
        self._stored = None

    async def run(self, feed: InventorySource, *, resync_period: float) -> None:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._loop.follow(feed))
            tasks.create_task(self._loop.run(feed))
            tasks.create_task(self._resync(resync_period))

    async def _resync(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            self._stored = None
            self._loop.trigger()

    def _rule(self, device: Device, drain: DeviceDrain) -> dict[str, Any]:
        reason = drain.reason if is_label_value(drain.reason) else "maintenance"
        return {
            "apiVersion": self.resource.api_version,
            "kind": self.resource.kind,
            "metadata": {
                "name": rule_name(self._driver, device.pool, device.name),
                "labels": {drain_rule_label(self._driver): self._publisher},
                "annotations": {f"{self._driver}/drains": ",".join(drain.drains)[:1024]},
            },
            "spec": {
                "deviceSelector": {"driver": self._driver, "pool": device.pool, "device": device.name},
                "taint": {
                    "key": drain_taint_key(self._driver),
                    "value": reason,
                    "effect": str(drain.effect),
                },
            },
        }

    async def sync(self, inventory: Inventory) -> int:
        """Bring our rules to ``inventory``'s drains; the number of writes."""
        if self._stored is None:
            items, _ = await self._kube.list_all(
                DEVICE_TAINT_RULES.with_version(self.version), label_selector=self.label_selector
            )
            self._stored = {str(o["metadata"]["name"]): o for o in items}
        stored = self._stored
        want = {
            rule_name(self._driver, d.pool, d.name): self._rule(d, d.drain)
            for d in self._drained.update(inventory).values()
            if d.drain is not None
        }
        writes = 0
        for name, rule in want.items():
            have = stored.get(name)
            if have is None:
                stored[name] = await self._write("create", rule)
            elif not _same(rule, have):
                meta = {**rule["metadata"], "resourceVersion": have["metadata"].get("resourceVersion")}
                stored[name] = await self._write("update", {**rule, "metadata": meta})
            else:
                continue
            writes += 1
            log.info(
                "drain DeviceTaintRule written", rule=name, device=rule["spec"]["deviceSelector"]["device"]
            )
        for name in [n for n in stored if n not in want]:
            await self._delete(name, str(stored[name]["metadata"].get("resourceVersion") or ""))
            del stored[name]
            writes += 1
            log.info("drain DeviceTaintRule deleted: the device is no longer drained", rule=name)
        return writes

    async def _write(self, verb: str, rule: dict[str, Any]) -> dict[str, Any]:
        try:
            if verb == "create":
                stored = await self._kube.create(DEVICE_TAINT_RULES.with_version(self.version), rule)
            else:
                stored = await self._kube.replace(DEVICE_TAINT_RULES.with_version(self.version), rule)
        except ApiError as err:
            SLICE_WRITES.labels(verb=f"rule-{verb}", outcome=err.reason or "Error").inc()
            if err.status in (404, 409):
                raise _Stale(f"{verb} of DeviceTaintRule {rule['metadata']['name']}: {err}") from err
            raise
        SLICE_WRITES.labels(verb=f"rule-{verb}", outcome="ok").inc()
        return stored

    async def _delete(self, name: str, resource_version: str) -> None:
        try:
            await self._kube.delete(
                DEVICE_TAINT_RULES.with_version(self.version), name, resource_version=resource_version or None
            )
        except NotFound:
            pass
        except ApiError as err:
            SLICE_WRITES.labels(verb="rule-delete", outcome=err.reason or "Error").inc()
            if err.status == 409:
                raise _Stale(f"delete of DeviceTaintRule {name}: {err}") from err
            raise
        SLICE_WRITES.labels(verb="rule-delete", outcome="ok").inc()


def _same(want: dict[str, Any], have: dict[str, Any]) -> bool:
    """Whether the stored rule says what we want (``timeAdded`` and server fields aside)."""
    spec = have.get("spec") or {}
    taint = {k: v for k, v in (spec.get("taint") or {}).items() if k != "timeAdded"}
    labels = (have.get("metadata") or {}).get("labels") or {}
    return (
        spec.get("deviceSelector") == want["spec"]["deviceSelector"]
        and taint == want["spec"]["taint"]
        and all(labels.get(k) == v for k, v in want["metadata"]["labels"].items())
    )
