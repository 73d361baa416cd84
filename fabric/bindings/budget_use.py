"""What one allocated device takes from a DeviceBudget, and what a tree holds (docs/budgets.md,
"Enforcement"): pure functions over a claim, the inventory's record and the ledger, no I/O.

* **Device class.** An allocation result names its request (``request``); the class is the
  claim's ``spec.devices.requests[]`` entry of that name — ``exactly.deviceClassName`` — or, for a
  ``firstAvailable`` request, the subrequest the scheduler chose (the result names it
  ``<request>/<subrequest>``, k8s.io/api/resource/v1 ``DeviceRequestAllocationResult.Request``).
* **Model.** The inventory's record of the device (a partition: its GPU's; a memory share: its
  pool's), as the accounting names it (:func:`fabric.bindings.warm_policy.model_of`). A budget's
  ``model`` is a lower-case name (the CRD's pattern), so it matches the inventory's model as
  written or in its :func:`model_slug` form: ``NVIDIA H100 PCIe`` is ``nvidia-h100-pcie``.
* **GPU memory.** A GPU's memory capacity; a GPU partition's own memory (its profile's), never its
  whole GPU's.
* **CXL memory.** A memory share's ``memoryBytes`` (what the allocation consumed); a whole CXL
  memory device's memory.

Every allocated device counts as one device of its class and model, a partition and a share
included: each is one device of the ResourceSlice the scheduler allocated.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from fabric.bindings.warm_policy import model_of
from fabric.state.budgets import DeviceBudget, DeviceLimit
from fabric.state.ledger import Ledger, LedgerState
from fabric.state.model import DeviceRecord
from manager_api.devices import DeviceType
from manager_api.partitions import PartitionDevice
from plumbing.kube.dra import DeviceRequestAllocationResult, ResourceClaim

__all__ = [
    "Holder",
    "Holding",
    "TreeUse",
    "device_class_of",
    "holders",
    "holding_of",
    "model_slug",
]


@dataclass(frozen=True, slots=True)
class Holding:
    """What one allocated device takes from a budget."""

    device_class: str | None
    model: str
    gpu_memory: int = 0
    cxl_memory: int = 0

    def matches(self, limit: DeviceLimit) -> bool:
        if limit.device_class_name is not None:
            return self.device_class == limit.device_class_name
        return limit.model in (self.model, model_slug(self.model))


@dataclass
class TreeUse:
    """What one tree holds now: its devices by class and by model, and its memory."""

    holdings: list[Holding] = field(default_factory=list)

    def add(self, holding: Holding) -> None:
        self.holdings.append(holding)

    def devices(self, limit: DeviceLimit) -> int:
        return sum(1 for h in self.holdings if h.matches(limit))

    @property
    def gpu_memory(self) -> int:
        return sum(h.gpu_memory for h in self.holdings)

    @property
    def cxl_memory(self) -> int:
        return sum(h.cxl_memory for h in self.holdings)


def model_slug(model: str) -> str:
    """``model`` as a DeviceBudget names it: lower case, each run of other characters than letters,
    digits, ``.`` and ``_`` one ``-`` (``NVIDIA H100 PCIe`` → ``nvidia-h100-pcie``)."""
    return re.sub(r"[^a-z0-9._]+", "-", model.lower()).strip("-._")


def device_class_of(claim: ResourceClaim, request: str) -> str | None:
    """The DeviceClass of the claim's request ``request`` (``name`` or ``name/subrequest``); None
    when the claim's spec names none (a claim whose spec does not read)."""
    name, _, sub = request.partition("/")
    devices = claim.spec.get("devices") if isinstance(claim.spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    for entry in requests if isinstance(requests, list) else []:
        if not isinstance(entry, Mapping) or entry.get("name") != name:
            continue
        if sub:
            for option in entry.get("firstAvailable") or []:
                if isinstance(option, Mapping) and option.get("name") == sub:
                    return _string(option.get("deviceClassName"))
            return None
        exactly = entry.get("exactly")
        if isinstance(exactly, Mapping):
            return _string(exactly.get("deviceClassName"))
        return _string(entry.get("deviceClassName"))  # resource.k8s.io/v1beta1 spelling
    return None


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def allocation_result(
    claim: ResourceClaim, device: str, share_id: str | None = None
) -> DeviceRequestAllocationResult | None:
    """The claim's result allocating ``device`` (for a memory pool: the share ``share_id``)."""
    return next(
        (r for r in claim.results if r.device == device and (share_id is None or r.share_id == share_id)),
        None,
    )


def holding_of(
    claim: ResourceClaim | None,
    device: str,
    record: DeviceRecord | None,
    *,
    partition: PartitionDevice | None = None,
    share_bytes: int | None = None,
    share_id: str | None = None,
) -> Holding:
    """What ``device`` held by ``claim`` takes: ``record`` is the device's (a partition's GPU, a
    share's pool); ``share_bytes`` the share's ``memoryBytes``. A claim gone or no longer
    allocating the device still holds it: its class is then unknown, its model and memory not."""
    result = allocation_result(claim, device, share_id) if claim is not None else None
    device_class = device_class_of(claim, result.request) if claim is not None and result else None
    model = model_of(record) if record is not None else "unknown"
    kind = record.attributes.type if record is not None else None
    memory = record.attributes.memory_bytes or 0 if record is not None else 0
    if share_bytes is not None:
        return Holding(device_class, model, cxl_memory=share_bytes)
    if partition is not None:
        return Holding(device_class, model, gpu_memory=int(partition.profile.memory_bytes))
    if kind is DeviceType.GPU:
        return Holding(device_class, model, gpu_memory=memory)
    if kind is DeviceType.CXL_MEMORY:
        return Holding(device_class, model, cxl_memory=memory)
    return Holding(device_class, model)


@dataclass(frozen=True, slots=True)
class Holder:
    """One claim's hold on one device, as the ledger records it (durable before the fabric acts)."""

    claim_uid: str
    device: str
    record: DeviceRecord | None
    partition: PartitionDevice | None = None
    share_id: str | None = None
    share_bytes: int | None = None


def holders(
    ledger: Ledger,
    device: Callable[[str], DeviceRecord | None],
    partition: Callable[[str], PartitionDevice | None],
) -> Iterator[Holder]:
    """Every claim's hold the ledger records as attaching or bound — attaches in flight included,
    since their intent is written before the fabric is asked, and a crash before that write leaves
    nothing to count. Detaching entries are on their way out; warm ones are no claim's."""
    for entry in ledger.entries():
        if entry.state not in (LedgerState.ATTACHING, LedgerState.BOUND) or entry.rollback:
            continue
        if entry.share is not None:
            yield Holder(
                entry.claim_uid,
                entry.share.pool,
                device(entry.share.pool),
                share_id=entry.share.share_id,
                share_bytes=entry.share.memory_bytes,
            )
        elif entry.partition_held:
            for hold in entry.partitions:
                yield Holder(hold.claim_uid, hold.partition, device(entry.device), partition(hold.partition))
        elif not entry.warm_held:
            yield Holder(entry.claim_uid, entry.device, device(entry.device))


def budget_applies(budget: DeviceBudget, holding: Holding) -> bool:
    """Whether any limit of ``budget`` counts ``holding`` (else it never refuses it)."""
    limits = budget.spec.limits
    return (
        any(holding.matches(limit) for limit in limits.devices)
        or (limits.gpu_memory is not None and holding.gpu_memory > 0)
        or (limits.cxl_memory is not None and holding.cxl_memory > 0)
        or limits.device_hours is not None
    )
