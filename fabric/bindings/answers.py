"""The answer to an attach or a detach: where the device (a share's key, a GPU serving
partitions) stands for the claim, after waiting up to the request's ``wait`` for its operation.

One place renders an :class:`manager_api.models.Attachment` from the ledger and the inventory, for
whole devices (:mod:`fabric.bindings.attachments`) and for partitions and shares
(:mod:`fabric.bindings.sharing`) alike.
"""

from __future__ import annotations

import time

from fabric.driver.operations import OperationDriver
from fabric.state.inventory import Inventory
from fabric.state.ledger import Ledger, LedgerEntry, LedgerState, ResetState
from manager_api import models as api
from manager_api.errors import AttachTimeout, BindFailed, DeviceNotFound, FabricUnavailable

__all__ = ["Answer", "Answers"]

Answer = tuple[api.Attachment, int]


class Answers:
    def __init__(self, inventory: Inventory, ledger: Ledger, driver: OperationDriver) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.driver = driver

    def known_entry(self, device: str) -> LedgerEntry | None:
        """``device``'s ledger entry (None: free); DeviceNotFound when the fabric does not know it
        either (a share's key names its pool)."""
        entry = self.ledger.get(device)
        if entry is None and self.inventory.device(device.split("/", 1)[0]) is None:
            raise DeviceNotFound(f"device {device} is not in the fabric inventory", device=device)
        return entry

    def attachment(
        self,
        device: str,
        node: str,
        claim_uid: str,
        state: api.AttachmentState,
        *,
        operation: str | None = None,
    ) -> api.Attachment:
        """The answer about ``device`` (a share's key answers with its pool and the share);
        ``operation``: the one the answer is about, when the entry may be another's now."""
        entry = self.ledger.get(device)
        record = self.inventory.device(device.split("/", 1)[0])
        share = None
        if entry is not None and entry.share is not None and entry.claim_uid == claim_uid:
            share = api.MemoryShare(
                share_id=entry.share.share_id,
                claim_uid=entry.claim_uid,
                node=entry.node,
                memory_bytes=entry.share.memory_bytes,
                state=api.BindingState.BOUND
                if entry.state is LedgerState.BOUND
                else api.BindingState(str(entry.state)),
                chunk=entry.share.chunk,
                connection=entry.share.connection,
            )
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
            share=share,
            device=rendered,
            node=node,
            claim_uid=claim_uid,
            state=state,
            operation_id=operation
            or (entry.operation_id if entry and entry.claim_uid == claim_uid else None),
            # asked again while pending (a retried prepare): reset again, never less
            reset_required=mine
            and entry is not None
            and entry.state is LedgerState.BOUND
            and state is api.AttachmentState.ATTACHED
            and entry.reset is ResetState.PENDING,
        )

    async def answer(
        self,
        device: str,
        node: str,
        claim: str,
        kind: api.OperationKind,
        wait: float,
        *,
        operation: str | None = None,
    ) -> Answer:
        """Wait up to ``wait`` seconds for the device's operation, then say where it stands.

        A detach names its ``operation`` (the id its intent recorded, or the one it joined): its
        answer is that operation's outcome, never the state of whatever holds the device after
        it — the same holder may have it again already (a GPU's next partition on the node binds
        it again once the unbind is done)."""
        slot = self.driver.slot(device)
        deadline = time.monotonic() + max(0.0, wait)
        while True:
            entry = self.ledger.get(device)
            if (
                kind is api.OperationKind.DETACH
                and operation is not None
                and (entry is None or entry.operation_id != operation)
            ):
                return self._ended(device, node, claim, operation)
            mine = entry is not None and entry.claim_uid == claim and entry.node == node
            if kind is api.OperationKind.ATTACH:
                if mine and entry is not None and entry.state is LedgerState.BOUND:
                    return self.attachment(device, node, claim, api.AttachmentState.ATTACHED), 200
                if not mine or (entry is not None and entry.rollback):
                    raise slot.error or BindFailed(
                        f"attaching {device} to {node} failed", device=device, node=node
                    )
            else:
                if not mine:
                    return self.attachment(device, node, claim, api.AttachmentState.DETACHED), 200
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
                return self.attachment(device, node, claim, state), 202
            await slot.moved_on(remaining)

    def _ended(self, device: str, node: str, claim: str, operation: str) -> Answer:
        """The answer of a detach whose operation no longer holds the entry: the entry goes only
        once the fabric confirmed the unbind (or the device left the fabric), so it is detached,
        unless the operation log says the operation failed."""
        op = self.driver.operations.get(operation)
        if op is not None and op.state is api.OperationState.FAILED:
            message = op.error.message if op.error is not None else "the operation failed"
            raise BindFailed(f"detaching {device} from {node} failed: {message}", device=device, node=node)
        return self.attachment(device, node, claim, api.AttachmentState.DETACHED, operation=operation), 200
