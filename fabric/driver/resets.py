"""Resets between tenants: a device a claim gives back to the warm pool is clean again before
another claim gets it.

A device kept warm after its claim is ``reset: pending`` (durably, in the same write that took it
back: :meth:`fabric.driver.records.OperationRecords.keep_warm`) until it is reset through its
Redfish ``Reset`` action (:meth:`TenantResets.reset`); until then no claim gets it. A reset that
fails takes the device out of the pool (detached, with a Warning Event). A device the fabric
offers no ``Reset`` action for is reset by the node's plugin instead (:func:`reset_by_node`): a
claim on its node gets it still ``pending`` and the attach answer says so; the plugin's report
settles it. docs/manager.md "Hygiene between tenants".
"""

from __future__ import annotations

import time
from collections.abc import Callable

from fabric.backends.base import Backend, BindContext
from fabric.driver.records import OperationRecords
from fabric.driver.settings import OperationSettings
from fabric.driver.slots import DeviceSlots
from fabric.state.inventory import Inventory
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState, ResetState
from fabric.state.metrics import ManagerMetrics
from fabric.state.model import DeviceRecord
from manager_api import models as api
from manager_api.errors import DeviceNotFound, FabricError, NotLeader
from plumbing.crashpoints import crash_point
from plumbing.kube.events import EventRecorder, ObjectRef
from plumbing.logs import get_logger

__all__ = ["TenantResets", "reset_by_node", "resettable"]

log = get_logger(__name__)


def reset_by_node(record: DeviceRecord) -> bool:
    """Whether ``record``'s device is reset between tenants by its node's plugin (a PCIe
    function-level reset through sysfs) rather than through the fabric: the fabric offers no
    Redfish ``Reset`` action for it, and it is a PCIe function (CXL memory has no PCIe function
    on the host for the plugin to reset)."""
    return record.attributes.reset_target is None and record.attributes.type is not api.DeviceType.CXL_MEMORY


def resettable(record: DeviceRecord) -> bool:
    """Whether ``record``'s device can be reset between tenants at all (fabric or node): only such
    a device may go back to the warm pool when its claim gives it back."""
    return record.attributes.reset_target is not None or reset_by_node(record)


class TenantResets:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        records: OperationRecords,
        slots: DeviceSlots,
        backend_for: Callable[[DeviceRecord], Backend],
        *,
        fence: Callable[[], None],
        settings: OperationSettings,
        metrics: ManagerMetrics | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.records = records
        self.slots = slots
        self.backend_for = backend_for
        self.fence = fence
        self.settings = settings
        self.metrics = metrics
        #: Kubernetes Events about devices (a failed reset), when the manager has API access
        self.events = events

    def due(self, entry: LedgerEntry | None) -> bool:
        """Whether the driver resets ``entry``'s warm device now: given back, not clean yet, and
        not one the next claim's plugin resets."""
        if entry is None or entry.state is not LedgerState.WARM or entry.clean:
            return False
        record = self.inventory.device(entry.device)
        return record is None or not reset_by_node(record)

    async def reset(self, entry: LedgerEntry) -> bool:
        """Reset the warm device of ``entry`` (``reset: pending``) through its Redfish ``Reset``
        action and mark it clean; a reset that fails, or that the device does not offer, takes it
        out of the pool (detached, Warning Event, ``fabric_dra_device_resets_total{outcome}``).
        False when nothing changed (this replica is not the leader, or the ledger could not record
        the failure): the pool's loop starts it again."""
        device = entry.device
        record = self.inventory.device(device)
        try:
            self.fence()
            crash_point("manager.warm.before-reset")
            if record is None:
                raise DeviceNotFound(f"device {device} is no longer on the fabric", device=device)
            ctx = BindContext(
                deadline=time.monotonic() + self.settings.task_timeout,
                fence=self.fence,
                action=f"reset {device} on {entry.host}",
            )
            await self.backend_for(record).reset(record, ctx)
        except NotLeader:
            return False  # the next leader finds the reset still due
        except FabricError as err:
            return await self._failed(entry, err)
        async with self.slots(device).lock:
            if self.ledger.get(device) is not entry or entry.state is not LedgerState.WARM:
                return True  # taken out of the pool meanwhile (a move, a cool-down): unbound anyway
            entry.reset = ResetState.DONE
            self.ledger.put(entry)
            # Not waited for: a restart that finds "pending" resets once more, never less.
            self.ledger.commit_soon()
        if self.metrics is not None:
            self.metrics.device_resets.labels("success").inc()
        log.info("warm device reset", device=device, node=entry.node, last_namespace=entry.namespace)
        return True

    async def _failed(self, entry: LedgerEntry, err: FabricError) -> bool:
        """Detach the device whose reset failed; False when the ledger could not record it."""
        async with self.slots(entry.device).lock:
            if self.ledger.get(entry.device) is not entry or entry.state is not LedgerState.WARM:
                return True  # moved or cooled meanwhile: unbound anyway
            try:
                await self.records.start_detach(entry)
            except FabricError as failed:  # the ledger cannot be written: still pending, tried again
                log.error("cannot record a failed reset", device=entry.device, error=failed.message)
                return False
            entry.error = err.message
        await self._report(
            entry,
            err.message,
            "it is detached instead and the next claim gets it cold",
            "it leaves the warm pool",
        )
        return True

    async def node_reset_failed(self, entry: LedgerEntry, reason: str) -> None:
        """Count, log and record as a Warning Event the node's failed reset of ``entry``'s device
        (a copy taken before its power cycle)."""
        await self._report(
            entry,
            reason,
            f"it is detached and attached again (a slot power cycle) for claim {entry.claim_uid}",
            "it is power-cycled for its claim",
        )

    async def _report(self, entry: LedgerEntry, reason: str, instead: str, outcome: str) -> None:
        """Count, log and record as a Warning Event on the node a reset that failed (by the fabric
        or by the node); ``instead`` says what happens to the device."""
        if self.metrics is not None:
            self.metrics.device_resets.labels("failure").inc()
        log.error(
            f"reset of a warm device failed; {outcome}", device=entry.device, node=entry.node, error=reason
        )
        if self.events is not None:
            await self.events.record(
                ObjectRef(kind="Node", name=entry.node),
                reason="DeviceResetFailed",
                action="Reset",
                event_type="Warning",
                note=(
                    f"device {entry.device} was given back to the warm pool of node {entry.node} and "
                    f"could not be reset before another claim ({reason}); {instead}"
                ),
            )
