"""Partitions of a GPU and shares of a memory pool: the attaches and detaches that hand out part
of a device (issues 35, 36; docs/manager.md "Partitions and shares").

* **Partitions.** A GPU is bound, through the ordinary confirmed bind, to the node of its first
  partition; its ledger entry is then held by :data:`PARTITIONS_HOLDER` and lists each placement's
  claim. Further placements on that node are one ledger write; another node, an overlapping
  placement or a whole-device claim is busy. The last holder's release unbinds the GPU (or keeps
  it warm).
* **Shares.** A share of a memory pool is a ledger entry of its own (``<pool>/<shareID>``),
  admitted under the pool's lock against what the pool holds, whatever the scheduler saw; the
  driver carves and connects its chunk (:mod:`fabric.driver.shares`).
"""

from __future__ import annotations

from collections.abc import Callable

from fabric.bindings.answers import Answer, Answers
from fabric.bindings.budgets import BudgetGate, within_budget
from fabric.bindings.checks import busy, check_free, check_usable, claim_allows, reachable_target
from fabric.bindings.warm import COLD, HIT, WarmPool
from fabric.driver.operations import OperationDriver
from fabric.driver.resets import reset_by_node
from fabric.state.claims import ClaimView
from fabric.state.inventory import Inventory, pool_used_bytes
from fabric.state.ledger import (
    PARTITIONS_HOLDER,
    Ledger,
    LedgerState,
    PartitionHold,
    ShareRecord,
    share_key,
)
from fabric.state.model import DeviceRecord, HostRecord
from manager_api import models as api
from manager_api.errors import DeviceBusy, DeviceNotFound
from manager_api.partitions import PartitionDevice, conflict, parse_partition
from plumbing.crashpoints import crash_point

__all__ = ["Sharing"]


class Sharing:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        driver: OperationDriver,
        answers: Answers,
        *,
        claimed: Callable[[DeviceRecord, str, str], None],
        warm: WarmPool | None = None,
        claims: ClaimView | None = None,
        budgets: BudgetGate | None = None,
    ) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.driver = driver
        self.records = driver.records
        self.answers = answers
        #: tells the warm pool how a claim got its GPU (hit, miss, cold)
        self.claimed = claimed
        self.warm = warm
        self.claims = claims
        self.budgets = budgets

    # -- partitions ------------------------------------------------------------------------------

    def partition(self, name: str) -> PartitionDevice | None:
        """The partition device ``name`` names, of a GPU in the inventory; None for any other name."""
        if self.inventory.device(name) is not None:
            return None
        tables = {
            r.name: r.attributes.partition_table
            for r in self.inventory.devices()
            if r.attributes.partition_table is not None
        }
        return parse_partition(name, tables) if tables else None

    async def attach_partition(
        self, request: api.AttachRequest, partition: PartitionDevice, wait: float
    ) -> Answer:
        """A partition of a GPU for the claim: the GPU bound to the node of its first partition
        (the normal confirmed bind, held by :data:`PARTITIONS_HOLDER`), each placement held by one
        claim, none overlapping another; the GPU held whole, or for another node, is busy."""
        if request.share_id is not None or request.memory_bytes is not None:
            raise DeviceNotFound(
                f"device {request.device} is a GPU partition, no memory pool: this fabric has no "
                "shares of it",
                device=request.device,
            )
        gpu = partition.gpu
        request = await claim_allows(self.claims, self.inventory, request, gpu=gpu)
        record, host = reachable_target(self.inventory, request.model_copy(update={"device": gpu}))
        node, hold = request.node, PartitionHold(partition=partition.name, claim_uid=request.claim_uid)
        async with self.driver.slot(gpu).lock:
            record = self.inventory.device(gpu) or record
            entry = self.ledger.get(gpu)
            if entry is None:
                check_free(self.inventory, record)
                async with within_budget(self.budgets, request.claim_uid, partition.name):
                    self.ledger.admit(node, gpu)
                    await self.records.start_attach(
                        record, host, node, PARTITIONS_HOLDER, namespace=request.namespace, partitions=[hold]
                    )
                crash_point("manager.partition.after-holder-recorded")
                self.driver.kick(gpu)
                self.claimed(record, node, COLD)
            elif entry.warm_held and entry.state is LedgerState.WARM and entry.node == node:
                node_reset = reset_by_node(record)
                if not (entry.clean or node_reset):
                    raise DeviceBusy(
                        f"GPU {gpu} of partition {partition.name} is being reset after its last claim",
                        device=partition.name, held_by=f"{node}/", retry_after=1.0,
                    )  # fmt: skip
                check_usable(record)
                async with within_budget(self.budgets, request.claim_uid, partition.name):
                    await self.records.take_warm(
                        entry,
                        PARTITIONS_HOLDER,
                        namespace=request.namespace,
                        node_reset=node_reset,
                        partitions=[hold],
                    )
                crash_point("manager.partition.after-holder-recorded")
                self.claimed(record, node, HIT)
            elif not entry.partition_held or entry.node != node:
                err = busy(entry)
                err.message = f"GPU {gpu} of partition {partition.name}: {err.message}"
                err.device = partition.name
                raise err
            elif hold not in entry.partitions:
                if entry.state is LedgerState.DETACHING:
                    raise DeviceBusy(
                        f"GPU {gpu} is being released from node {node}; ask again once it is",
                        device=partition.name, held_by=f"{node}/partitions", retry_after=1.0,
                    )  # fmt: skip
                held = [p for h in entry.partitions if (p := self.partition(h.partition)) is not None]
                why = conflict(partition, held)
                if why is not None:
                    holders = ", ".join(f"{node}/{h.claim_uid}" for h in entry.partitions)
                    raise DeviceBusy(why, device=partition.name, node=node, held_by=holders)
                async with within_budget(self.budgets, request.claim_uid, partition.name):
                    await self.records.holders_changed(entry, [*entry.partitions, hold])
            elif entry.state is LedgerState.ATTACHING:
                self.driver.kick(gpu)
        attachment, status = await self.answers.answer(
            gpu, node, PARTITIONS_HOLDER, api.OperationKind.ATTACH, max(0.0, wait)
        )
        return attachment.model_copy(
            update={"claim_uid": request.claim_uid, "partition": partition.name}
        ), status

    async def detach_partition(
        self, partition: PartitionDevice, claim: str, node: str, wait: float
    ) -> Answer:
        """The holder goes (one durable write); the GPU is unbound (confirmed) only with its last,
        or kept warm on its node when the warm pool wants it back."""
        gpu = partition.gpu
        hold = PartitionHold(partition=partition.name, claim_uid=claim)
        async with self.driver.slot(gpu).lock:
            entry = self.ledger.get(gpu)
            if (
                entry is None
                or not entry.partition_held
                or entry.node != node
                or hold not in entry.partitions
            ):
                answer = self.answers.attachment(gpu, node, claim, api.AttachmentState.DETACHED)
                return answer.model_copy(update={"partition": partition.name}), 200
            left = [h for h in entry.partitions if h != hold]
            if left:
                await self.records.holders_changed(entry, left)
                answer = self.answers.attachment(gpu, node, claim, api.AttachmentState.DETACHED)
                return answer.model_copy(update={"partition": partition.name}), 200
            entry.partitions = []
            if entry.state is LedgerState.BOUND and self.warm is not None and self.warm.wants_back(entry):
                await self.records.keep_warm(entry)
                self.driver.kick(gpu)
                answer = self.answers.attachment(gpu, node, claim, api.AttachmentState.DETACHED)
                return answer.model_copy(update={"partition": partition.name}), 200
            if entry.state is not LedgerState.DETACHING or entry.rollback:
                await self.records.start_detach(entry)  # the last holder and the intent: one write
            operation = entry.operation_id  # its answer is this unbind's, whoever binds the GPU next
            self.driver.kick(gpu)
        attachment, status = await self.answers.answer(
            gpu, node, PARTITIONS_HOLDER, api.OperationKind.DETACH, wait, operation=operation
        )
        return attachment.model_copy(update={"claim_uid": claim, "partition": partition.name}), status

    # -- shares of a memory pool ---------------------------------------------------------------

    async def attach_share(
        self, request: api.AttachRequest, pool: DeviceRecord, host: HostRecord, wait: float
    ) -> Answer:
        """A chunk of the share's size carved from the pool and connected to the node, for the
        claim's allocation (shareID); never more than the pool holds, whatever the scheduler saw."""
        domain = pool.memory_domain
        if domain is None or request.share_id is None or request.memory_bytes is None:
            raise DeviceNotFound(
                f"device {request.device} is a memory pool, never bound whole: this fabric has no "
                "such whole device (an allocation of a pool has a shareID; send it with memoryBytes)",
                device=request.device,
            )
        node, claim = request.node, request.claim_uid
        key = share_key(pool.name, request.share_id)
        # The pool's lock: shares are admitted one at a time against what the pool holds.
        async with self.driver.slot(pool.name).lock:
            entry = self.ledger.get(key)
            if entry is None:
                check_usable(pool)
                chunk_bytes = domain.chunk_bytes(request.memory_bytes)
                used = pool_used_bytes(domain, self.ledger.shares_of(pool.name))
                if used + chunk_bytes > domain.size_bytes:
                    raise DeviceBusy(
                        f"{pool.name}: {_gib(used)} of {_gib(domain.size_bytes)} in use; "
                        f"{_gib(chunk_bytes)} asked",
                        device=pool.name, node=node, held_by=f"{pool.name}/shares",
                    )  # fmt: skip
                share = ShareRecord(
                    pool=pool.name,
                    share_id=request.share_id,
                    memory_bytes=request.memory_bytes,
                    chunk_mib=domain.chunk_mib(request.memory_bytes),
                )
                async with within_budget(
                    self.budgets, claim, pool.name, share_id=share.share_id, share_bytes=share.memory_bytes
                ):
                    self.ledger.admit(node, key)
                    await self.records.start_attach(
                        pool, host, node, claim, namespace=request.namespace, share=share
                    )
                self.driver.kick(key)
            elif entry.share is None or (entry.claim_uid, entry.node, entry.share.memory_bytes) != (
                claim,
                node,
                request.memory_bytes,
            ):
                raise DeviceBusy(
                    f"share {request.share_id} of {pool.name} is another allocation's",
                    device=pool.name, held_by=f"{entry.node}/{entry.claim_uid}",
                )  # fmt: skip
            elif entry.state is LedgerState.DETACHING and not entry.rollback:
                raise DeviceBusy(
                    f"share {request.share_id} of {pool.name} is being released; ask again once it is",
                    device=pool.name, held_by=f"{entry.node}/{entry.claim_uid}", retry_after=1.0,
                )  # fmt: skip
            elif entry.state is LedgerState.ATTACHING:
                self.driver.kick(key)
        return await self.answers.answer(key, node, claim, api.OperationKind.ATTACH, max(0.0, wait))


def _gib(n: int) -> str:
    """Bytes as GiB for a refusal: ``180 GiB``, ``1.5 GiB``."""
    return f"{n / (1 << 30):.2f}".rstrip("0").rstrip(".") + " GiB"
