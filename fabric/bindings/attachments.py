"""Attach and detach requests: the rules that keep a device from ever being bound to two nodes.

This is the request front of ``POST /api/v1/attachments`` and ``DELETE /api/v1/attachments/{device}``:
it checks a request, decides from the ledger what it means, has the operation driver
(:mod:`fabric.driver.operations`) record the intent and run the operation, and answers attached
(200), still attaching or detaching (202), or why not. It never touches the fabric itself.

* **Idempotent per claim UID + device.** A repeated attach joins or returns the existing binding;
  a detach by anyone but the holder (claim UID *and* node) is a no-op success.
* **Exclusive.** A device held by another claim or node, bound outside fabric-dra, or still being
  detached is 409 DeviceBusy with who holds it; the new holder gets it only after the fabric
  confirmed the unbind.
* **Leader only.** A follower refuses every request (:class:`manager_api.errors.NotLeader`).
* **Warm devices** (:mod:`fabric.bindings.warm`). A device warm on the claim's node is the claim's after
  one ledger write (no Redfish request) once it was reset since its last claim; warm on another
  node, it is detached there and attached here; released while its node's pool is below target,
  it goes back to warm instead of unbinding, to be reset before another claim gets it. A device
  its node resets (no Redfish ``Reset`` action) is a hit still ``reset: pending``: the answer says
  ``resetRequired`` until the plugin reports the reset (:meth:`Attachments.report_reset`).

How the operation runs (one at a time per device, intent before action, never blind, rolled back
when it fails) is :mod:`fabric.driver.operations` and :mod:`fabric.driver.attempts`; how unfinished
ones are resumed after a restart is :mod:`fabric.bindings.reconcile`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from fabric.bindings.warm import COLD, HIT, MISS, WarmPool
from fabric.driver.operations import OperationDriver, reset_by_node
from fabric.state.inventory import Inventory
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState, ResetState
from fabric.state.model import DeviceRecord
from manager_api import models as api
from manager_api.errors import (
    AttachTimeout,
    BindFailed,
    BindRefused,
    DeviceBusy,
    DeviceNotFound,
    DeviceUnhealthy,
    FabricUnavailable,
    NodeNotFound,
    NotLeader,
)
from plumbing.logs import get_logger

__all__ = ["Attachments"]

log = get_logger(__name__)


class Attachments:
    def __init__(
        self, inventory: Inventory, ledger: Ledger, driver: OperationDriver, *, warm: WarmPool | None = None
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.driver = driver
        self.warm = warm
        self.is_leader = driver.is_leader

    def _require_leader(self) -> None:
        if not self.is_leader():
            raise NotLeader("this fabric manager replica is not the leader; ask the leader", retry_after=2.0)

    def _attachment(
        self, device: str, node: str, claim_uid: str, state: api.AttachmentState
    ) -> api.Attachment:
        record = self.inventory.device(device)
        entry = self.ledger.get(device)
        if record is not None:
            rendered = self.inventory.render_device(record)
        else:  # the device left the fabric; describe what is known
            rendered = api.Device(
                name=device,
                pool="",
                fabric="",
                type=api.DeviceType.OTHER,
                state=api.BindingState.UNAVAILABLE,
                binding_style="",
                redfish_uri=entry.device_key if entry else "",
            )
        mine = entry is not None and entry.claim_uid == claim_uid and entry.node == node
        return api.Attachment(
            device=rendered,
            node=node,
            claim_uid=claim_uid,
            state=state,
            operation_id=entry.operation_id if entry and entry.claim_uid == claim_uid else None,
            # asked again while pending (a retried prepare): reset again, never less
            reset_required=mine
            and entry is not None
            and entry.state is LedgerState.BOUND
            and state is api.AttachmentState.ATTACHED
            and entry.reset is ResetState.PENDING,
        )

    async def attach(self, request: api.AttachRequest, wait: float) -> tuple[api.Attachment, int]:
        """Bind ``request.device`` to ``request.node`` for the claim; (attachment, HTTP status)."""
        self._require_leader()
        name, node, claim = request.device, request.node, request.claim_uid
        record = self.inventory.device(name)
        if record is None:
            raise DeviceNotFound(f"device {name} is not in the fabric inventory", device=name)
        host = self.inventory.host_for_node(node)
        if host is None:
            raise NodeNotFound(f"node {node} is not a host of any fabric this manager knows", node=node)
        if host.id not in record.reachable_hosts:
            if not host.initiators.get(record.fabric):
                raise NodeNotFound(
                    f"node {node} (host {host.id}) has no port on fabric {record.fabric} of device {name}",
                    node=node,
                    device=name,
                )
            raise BindRefused(
                f"device {name} is not reachable from node {node}: host {host.id} is not cabled to the "
                f"switch {name} hangs off (fabric {record.fabric})",
                node=node,
                device=name,
            )
        slot = self.driver.slot(name)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            async with slot.lock:
                entry = self.ledger.get(name)
                record = self.inventory.device(name) or record  # a move changed its binding meanwhile
                if entry is None:
                    self._check_free(record)
                    self.ledger.admit(node, name)
                    await self.driver.start_attach(record, host, node, claim, namespace=request.namespace)
                    self._claimed(record, node, COLD)
                    break
                if entry.warm_held:
                    node_reset = reset_by_node(record)  # its plugin resets it before the claim uses it
                    if entry.state is LedgerState.WARM and entry.node == node and (entry.clean or node_reset):
                        self._check_usable(record)
                        await self.driver.take_warm(
                            entry, claim, namespace=request.namespace, node_reset=node_reset
                        )
                        self._claimed(record, node, HIT)
                        return self._attachment(name, node, claim, api.AttachmentState.ATTACHED), 200
                    if entry.state is LedgerState.WARM and entry.node != node:
                        # Warm on another node: moved (detached there, then attached here as
                        # usual once the fabric let go), never refused and never bound twice.
                        await self.driver.start_detach(entry)
                        self._claimed(record, node, MISS)
                        log.info("warm device moves to another node", device=name, node=node, claim=claim)
                    # Warming, cooling, or reset after its last claim (a reset that fails takes
                    # it out of the pool: this claim then gets it cold): wait for that to finish.
                    self.driver.kick(name)
                    event = slot.event
                    warming = True
                elif entry.claim_uid != claim or entry.node != node:
                    raise self._busy(entry)
                elif entry.state is LedgerState.BOUND:
                    return self._attachment(name, node, claim, api.AttachmentState.ATTACHED), 200
                elif entry.state is LedgerState.ATTACHING:
                    self.driver.kick(name)
                    break
                elif not entry.rollback:
                    raise DeviceBusy(
                        f"device {name} is being detached for claim {claim}; attach it again once detached",
                        device=name,
                        node=node,
                        held_by=f"{entry.node}/{entry.claim_uid}",
                        retry_after=1.0,
                    )
                else:
                    self.driver.kick(name)
                    event = slot.event
                    warming = False
            # A retry of a failed attach: let its rollback finish, then attach afresh. A device
            # warming up or cooling down (moving here from another node): the same.
            remaining = deadline - time.monotonic()
            if remaining <= 0 and warming:
                # Not busy: it comes to this claim. The plugin asks again (a long poll).
                return self._attachment(name, node, claim, api.AttachmentState.ATTACHING), 202
            if remaining <= 0:
                raise DeviceBusy(
                    f"device {name} is rolling back a failed attach for claim {claim}; ask again",
                    device=name,
                    node=node,
                    held_by=f"{node}/{claim}",
                    retry_after=1.0,
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
        return await self._answer(
            name, node, claim, api.OperationKind.ATTACH, max(0.0, deadline - time.monotonic())
        )

    async def report_reset(
        self, device: str, report: api.ResetReport, wait: float
    ) -> tuple[api.Attachment, int]:
        """The plugin of ``report.node`` reset (or could not reset) ``device``, which its claim got
        from the warm pool still ``reset: pending``. ``ok``: the entry is ``done`` (durably) and the
        answer ``attached``. ``failed``: the device is detached and attached again for the same
        claim (a slot power cycle); the answer is where that stands (``attaching``: the plugin
        asks again with an attach, then waits for the device to be visible again). A report for a
        device the claim holds clean is an idempotent success."""
        self._require_leader()
        node, claim = report.node, report.claim_uid
        slot = self.driver.slot(device)
        async with slot.lock:
            entry = self._known_entry(device)
            if entry is None or entry.claim_uid != claim or entry.node != node:
                raise DeviceBusy(
                    f"device {device} is not held by claim {claim} on node {node}; only its holder "
                    "reports its reset",
                    device=device,
                    node=node,
                    held_by=f"{entry.node}/{entry.claim_uid}" if entry else "",
                )
            if entry.state is not LedgerState.BOUND or entry.reset is not ResetState.PENDING:
                # reported twice, or power-cycled already: where it stands answers the plugin
                state = (
                    api.AttachmentState.ATTACHED
                    if entry.state is LedgerState.BOUND
                    else api.AttachmentState.ATTACHING
                )
                return self._attachment(device, node, claim, state), 200
            if report.outcome is api.ResetOutcome.OK:
                await self.driver.node_reset_done(entry)
                return self._attachment(device, node, claim, api.AttachmentState.ATTACHED), 200
            namespace, failed = entry.namespace, entry.model_copy()
            reason = f"the node could not reset it: {report.message}"
            await self.driver.node_reset_failed(entry, reason)
        await self.driver.node_reset_failure(failed, reason)  # its Event: not under the device's lock
        deadline = time.monotonic() + max(0.0, wait)
        # A detach that fails or does not finish in time fails the claim's prepare: the device
        # is out of the pool either way, never handed over unreset.
        _, status = await self._answer(device, node, claim, api.OperationKind.DETACH, wait)
        if status != 200:
            raise AttachTimeout(
                f"device {device} could not be reset by node {node} and is still being power-cycled "
                "(detached); the claim's prepare is retried",
                device=device,
                node=node,
            )
        record = self.inventory.device(device)
        host = self.inventory.host_for_node(node)
        if record is None or host is None:
            raise DeviceNotFound(f"device {device} is no longer on the fabric", device=device)
        async with slot.lock:
            entry = self.ledger.get(device)
            if entry is None:
                self.ledger.admit(node, device)
                await self.driver.start_attach(record, host, node, claim, namespace=namespace)
            elif entry.claim_uid != claim:
                # Taken meanwhile (the pool warmed it up again by a hot-add: clean): the plugin's
                # attach finds where it stands.
                return self._attachment(device, node, claim, api.AttachmentState.ATTACHING), 202
        return await self._answer(
            device, node, claim, api.OperationKind.ATTACH, max(0.0, deadline - time.monotonic())
        )

    def _known_entry(self, device: str) -> LedgerEntry | None:
        """``device``'s ledger entry (None: free); DeviceNotFound when the fabric does not know it
        either."""
        entry = self.ledger.get(device)
        if entry is None and self.inventory.device(device) is None:
            raise DeviceNotFound(f"device {device} is not in the fabric inventory", device=device)
        return entry

    @staticmethod
    def _busy(entry: LedgerEntry) -> DeviceBusy:
        doing = {
            LedgerState.ATTACHING: "being attached to",
            LedgerState.BOUND: "bound to",
            LedgerState.DETACHING: "being detached from",
            LedgerState.WARM: "kept warm on",
        }[entry.state]
        return DeviceBusy(
            f"device {entry.device} is {doing} node {entry.node} for claim {entry.claim_uid}",
            device=entry.device,
            held_by=f"{entry.node}/{entry.claim_uid}",
            retry_after=2.0,
        )

    def _claimed(self, record: DeviceRecord, node: str, outcome: str) -> None:
        if self.warm is not None:
            self.warm.claimed(record, node, outcome)

    def _check_free(self, record: DeviceRecord) -> None:
        if record.bound_hosts:
            host = record.bound_hosts[0]
            node = self.inventory.node_for_host(host)
            held = f"{node or 'host ' + host} (bound outside fabric-dra)"
            raise DeviceBusy(
                f"device {record.name} is bound to {held}; fabric-dra never touches bindings it did not make",
                device=record.name,
                held_by=held,
            )
        self._check_usable(record)

    @staticmethod
    def _check_usable(record: DeviceRecord) -> None:
        if not record.attributes.available:
            raise DeviceUnhealthy(
                f"device {record.name} is not available: the fabric reports it absent, disabled or unusable",
                device=record.name,
            )
        if record.attributes.health is api.Health.CRITICAL:
            raise DeviceUnhealthy(
                f"device {record.name} is unhealthy: the fabric reports it Critical", device=record.name
            )

    async def detach(self, device: str, claim: str, node: str, wait: float) -> tuple[api.Attachment, int]:
        """Unbind ``device`` if ``claim`` holds it on ``node``; anything else is a no-op success."""
        self._require_leader()
        slot = self.driver.slot(device)
        async with slot.lock:
            entry = self._known_entry(device)
            if entry is None or entry.claim_uid != claim or entry.node != node:
                return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            if entry.state is LedgerState.BOUND and self.warm is not None and self.warm.wants_back(entry):
                # kept bound, and reset before another claim gets it (the driver runs the reset)
                await self.driver.keep_warm(entry)  # stays bound to the node: nothing to wait for
                return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
            if entry.state is not LedgerState.DETACHING or entry.rollback:
                await self.driver.start_detach(entry)
            self.driver.kick(device)
        return await self._answer(device, node, claim, api.OperationKind.DETACH, wait)

    async def _answer(
        self, device: str, node: str, claim: str, kind: api.OperationKind, wait: float
    ) -> tuple[api.Attachment, int]:
        """Wait up to ``wait`` seconds for the device's operation, then say where it stands."""
        slot = self.driver.slot(device)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            entry = self.ledger.get(device)
            mine = entry is not None and entry.claim_uid == claim and entry.node == node
            if kind is api.OperationKind.ATTACH:
                if mine and entry is not None and entry.state is LedgerState.BOUND:
                    return self._attachment(device, node, claim, api.AttachmentState.ATTACHED), 200
                if not mine or (entry is not None and entry.rollback):
                    raise slot.error or BindFailed(
                        f"attaching {device} to {node} failed", device=device, node=node
                    )
            else:
                if not mine:
                    return self._attachment(device, node, claim, api.AttachmentState.DETACHED), 200
                if entry is not None and entry.state is not LedgerState.DETACHING:
                    raise slot.error or BindFailed(f"detaching {device} from {node} failed", device=device)
            if not slot.running and slot.error is not None:
                raise slot.error  # the operation paused (fabric unreachable, task still running) or failed
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if isinstance(slot.error, FabricUnavailable | AttachTimeout):
                    raise slot.error
                state = (
                    api.AttachmentState.ATTACHING
                    if kind is api.OperationKind.ATTACH
                    else api.AttachmentState.DETACHING
                )
                return self._attachment(device, node, claim, state), 202
            event = slot.event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
