"""One inventory device (:class:`manager_api.models.Device`) → one ``resource.k8s.io/v1`` ``Device``.

Attributes and capacity are those pinned in docs/architecture.md, qualified with the driver
name (``fabric-dra.io/type``): every field of the API model that the table of device attributes
(:mod:`manager_api.devices`) marks with a ``SliceAttribute`` or ``SliceCapacity``. Values that
break the API's rules are made to fit (:func:`~dra_driver.controller.resourcenames.fit_value`),
never sent as they are: one bad value would make the API server reject the whole slice, and with it
every device of the slice.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dra_driver.controller.features import CounterLayout
from dra_driver.controller.resourcenames import (
    BindingConditionNames,
    attach_failed_taint_key,
    drain_taint_key,
    fabric_unavailable_taint_key,
    fit_value,
    link_errors_taint_key,
    unhealthy_taint_key,
)
from dra_driver.selection.quantity import format_bytes, format_quantity
from manager_api.devices import MEMORY_CAPACITY, SliceAttribute, SliceCapacity, SliceForm
from manager_api.models import BindingState, Device, Health, MemoryPool
from manager_api.partitions import (
    COUNTER_MEMORY,
    PartitionDevice,
    PartitionTable,
    counter_set,
    fit_problem,
    partition_devices,
)
from plumbing.names import is_dns1123_label, is_label_value

__all__ = [
    "ATTRIBUTE_NAMES",
    "CAPACITY_NAMES",
    "MEMORY_CAPACITY",
    "MEMORY_POOL_ATTRIBUTE",
    "PARTITION_ATTRIBUTE",
    "PARTITION_TABLE_ATTRIBUTE",
    "PARTITION_TYPE",
    "SLICE_ATTRIBUTES",
    "SLICE_CAPACITIES",
    "WARM_ATTRIBUTE",
    "Conversion",
    "CounterLayout",
    "PublishPolicy",
    "WithheldReason",
    "counter_set_entry",
    "mark_warm",
    "memory_request_policy",
    "partition_conversions",
    "to_dra_device",
    "usable_table",
]


def _published(kind: type[SliceAttribute] | type[SliceCapacity]) -> list[tuple[str, Any]]:
    """(Device field, its slice marker) for every field of the API model that carries ``kind``."""
    return [
        (field, marker)
        for field, info in Device.model_fields.items()
        for marker in info.metadata
        if isinstance(marker, kind)
    ]


#: (Device field, attribute), in the order docs/architecture.md lists them
SLICE_ATTRIBUTES: tuple[tuple[str, SliceAttribute], ...] = tuple(
    sorted(_published(SliceAttribute), key=lambda item: int(item[1].rank))
)
#: (Device field, capacity)
SLICE_CAPACITIES: tuple[tuple[str, SliceCapacity], ...] = tuple(_published(SliceCapacity))
#: attribute and capacity identifiers (unqualified)
ATTRIBUTE_NAMES: tuple[str, ...] = tuple(a.name for _, a in SLICE_ATTRIBUTES)
CAPACITY_NAMES: tuple[str, ...] = tuple(c.name for _, c in SLICE_CAPACITIES)


#: the attribute (``bool: true``) of a device the manager keeps warm on the node of its slice; set only
#: on those, which are published node-local (:mod:`.slices`). Not a field of the attribute table: it
#: is a publication fact (state ``warm``), not a property of the device.
WARM_ATTRIBUTE = "warm"


def mark_warm(device: dict[str, Any], driver: str) -> dict[str, Any]:
    """``device`` (a published ``Device``) as published warm: with ``<driver>/warm: true``."""
    return {
        **device,
        "attributes": {**device.get("attributes", {}), f"{driver}/{WARM_ATTRIBUTE}": {"bool": True}},
    }


#: the ``type`` attribute of a GPU partition's device: apart from ``gpu``, so a class or a claim that
#: asks for a whole GPU (``type == "gpu"``) never gets a partition; the kubelet plugin records its
#: partitions under the same type (``dra_driver.plugin.attach.PARTITION_TYPE``)
PARTITION_TYPE = "gpu-partition"
#: the profile name of a partition (``1g.10gb``): what a claim asks for
PARTITION_ATTRIBUTE = "partition"
#: the partition table of a partitionable GPU and of its partitions (``h100-80gb``): one
#: DeviceClass per table selects them (deploy/base/deviceclasses.yaml)
PARTITION_TABLE_ATTRIBUTE = "partitionTable"
#: ``bool: true`` on a memory pool's device (allocated many times, by size), so a class tells it from a
#: pre-made chunk bound whole without ``device.allowMultipleAllocations``, which CEL before 1.34 lacks
MEMORY_POOL_ATTRIBUTE = "memoryPool"
#: where a partition starts on its GPU's memory slices
PARTITION_START_ATTRIBUTE = "partitionStart"


class WithheldReason(StrEnum):
    """Why a device of the inventory is not published."""

    #: bound outside fabric-dra: the scheduler would hand out a device nobody can attach
    UNMANAGED = "unmanaged"
    #: the fabric reports it absent or disabled
    UNAVAILABLE = "unavailable"
    #: unhealthy, and the cluster cannot taint devices
    UNHEALTHY = "unhealthy"
    #: its name is not a DNS label, so no ResourceSlice can carry it
    INVALID_NAME = "invalid-name"
    #: its attach keeps failing (:mod:`.quarantine`), and the cluster cannot taint devices
    ATTACH_FAILED = "attach-failed"
    #: an operator drained it (``fabric-dra drain``), and the cluster cannot taint devices
    DRAINED = "drained"
    #: its PCIe link errs past the controller's thresholds (:mod:`.linktaints`), and the cluster
    #: cannot taint devices
    LINK_ERRORS = "link-errors"
    #: a memory pool, and the cluster cannot allocate a device many times (``DRAConsumableCapacity``)
    SHARES_UNSUPPORTED = "shares-unsupported"
    #: a memory pool with less room than its smallest chunk
    NO_ROOM = "no-room"
    #: its manager's inventory cannot be read (the manager or its Redfish service is down), and
    #: the cluster cannot taint devices
    FABRIC_UNAVAILABLE = "fabric-unavailable"
    #: a GPU partition that cannot be offered: its table does not fit the GPU, its name is taken
    #: in the pool, or its GPU is withheld
    PARTITION = "partition"


@dataclass(frozen=True, slots=True)
class PublishPolicy:
    driver: str
    #: True: unhealthy devices are published with a NoSchedule taint; False: withheld.
    device_taints: bool
    #: True: devices carry bindsToNode and the binding / binding-failure conditions.
    binding_conditions: bool
    #: True: devices carry bindsToNode even without binding conditions, so the scheduler pins a
    #: claim's allocation to the node it chose and every pod sharing the claim goes there.
    binds_to_node: bool = False
    #: which controller owns the slices: one per fabric manager when several publish one driver
    publisher: str = "default"
    #: True (the plain flow): a quarantined device's taint is NoExecute, so the pods stuck with its
    #: allocation are evicted and their claims allocated again (:mod:`.quarantine`)
    evict_quarantined: bool = False
    #: where GPU partitions' shared counters go, or OFF: no partitions
    counters: CounterLayout = CounterLayout.SPLIT
    #: True: memory pools are published as one device allocated many times (consumable capacity)
    shares: bool = True
    #: True: the manager of these pools cannot be read past its grace; every device is tainted
    #: fabric-unavailable (or withheld), so nothing new is allocated from a fabric nobody can attach
    fabric_unavailable: bool = False
    #: the effect of the link-errors taint (:mod:`.linktaints`): NoSchedule, NoExecute or None
    link_taint_effect: str = "NoSchedule"
    #: True: drains are DeviceTaintRules of their own (:mod:`.drainrules`), not taints in the slices
    drain_rules: bool = False


@dataclass(frozen=True, slots=True)
class Conversion:
    """A published device (``device``) or the reason it is withheld."""

    name: str
    device: dict[str, Any] | None
    withheld: WithheldReason | None = None

    @property
    def tainted(self) -> bool:
        return bool(self.device and self.device.get("taints"))


def _hex_id(value: str | None) -> str | None:
    """PCI IDs as the kernel prints them: ``0x10de``."""
    if not value:
        return None
    text = value.strip().lower()
    if not text.startswith("0x"):
        text = "0x" + text
    return text


def _attribute(device: Device, value: object, form: SliceForm) -> dict[str, Any] | None:
    """One ``DeviceAttribute`` value of ``device``, or None when it has none."""
    if value is None or value == "":
        return None
    if form is SliceForm.INT:
        return {"int": value}
    text = str(value)
    if form is SliceForm.PCI_ID:
        text = _hex_id(text) or ""
    elif form is SliceForm.PER_POOL:
        text = f"{device.pool}/{text}"
    return {"string": fit_value(text)} if text else None


def _attributes(device: Device, driver: str) -> dict[str, dict[str, Any]]:
    attributes: dict[str, dict[str, Any]] = {}
    for field, attribute in SLICE_ATTRIBUTES:
        value = _attribute(device, getattr(device, field), attribute.form)
        if value is not None:
            attributes[f"{driver}/{attribute.name}"] = value
    return attributes


def _capacity(device: Device, driver: str) -> dict[str, dict[str, str]]:
    return {
        f"{driver}/{capacity.name}": {"value": format_bytes(amount)}
        for field, capacity in SLICE_CAPACITIES
        if (amount := getattr(device, field))
    }


#: the default share of a memory pool a request gets when it names no size (rounded up to the grid)
DEFAULT_SHARE_BYTES = 1 << 30


def memory_request_policy(pool: MemoryPool) -> tuple[int, dict[str, Any]] | None:
    """The capacity a memory pool offers and its ``requestPolicy``, or None when no chunk fits.

    The value is the domain's size less what is carved outside fabric-dra — never the free size:
    the allocator subtracts this driver's own shares itself (``consumable_capacity.go``), so
    publishing the free size would count them twice. ``validRange`` is the domain's chunk grid: min
    = its smallest chunk, step = its increment, max = the largest chunk on that grid (the API server
    wants ``max - min`` a whole number of steps, ``validateRequestPolicyRange``); the default is
    the smallest grid size of at least 1 GiB (or max)."""
    value = pool.size_bytes - pool.outside_bytes
    low, step = pool.min_chunk_bytes, pool.increment_bytes
    if value < low:
        return None
    high = low + (value - low) // step * step
    default = min(high, low + max(0, -(-(DEFAULT_SHARE_BYTES - low) // step)) * step)
    policy = {
        "default": format_bytes(default),
        "validRange": {"min": format_bytes(low), "max": format_bytes(high), "step": format_bytes(step)},
    }
    return value, policy


def usable_table(device: Device) -> PartitionTable | None:
    """The partition table of ``device`` when it is a GPU the table fits (``fit_problem``), else None:
    a table promising more memory than the GPU has is never offered."""
    table = device.partition_table
    if table is None or fit_problem(table, device.memory_bytes) is not None:
        return None
    return table


def counter_set_entry(device: Device) -> dict[str, Any] | None:
    """The ``CounterSet`` of a partitionable GPU (``manager_api.partitions.counter_set``), or None."""
    table = usable_table(device)
    if table is None:
        return None
    name, counters = counter_set(device.name, table)
    return {"name": name, "counters": _counters(counters)}


def _counters(counters: dict[str, int]) -> dict[str, dict[str, str]]:
    # canonical, as the API server stores a quantity (a count of 1000 would read back "1k")
    return {
        name: {
            "value": format_bytes(amount) if name == COUNTER_MEMORY else format_quantity(amount, binary=False)
        }
        for name, amount in counters.items()
    }


def _consumes(gpu: str, counters: dict[str, int]) -> list[dict[str, Any]]:
    return [{"counterSet": gpu, "counters": _counters(counters)}]


def partition_conversions(device: Device, whole: Conversion, driver: str) -> list[Conversion]:
    """The partitions of partitionable GPU ``device`` as devices of its pool, each consuming its
    share of the GPU's counter set (:func:`counter_set_entry`), given the GPU's own published
    ``whole``: every placement of every profile (``manager_api.partitions.partition_devices``),
    with the GPU's attributes, taints and binding fields, ``type: gpu-partition``, the profile as
    ``partition``, its memory as capacity ``memory`` — and no ``uuid`` (a partition has its own).
    Withheld with the GPU."""
    if device.partition_table is None:
        return []
    table = usable_table(device)
    placements = partition_devices(device.name, device.partition_table)
    if whole.device is None or table is None:
        return [Conversion(p.name, None, WithheldReason.PARTITION) for p in placements]
    return [_partition(p, whole.device, driver) for p in placements]


def _partition(partition: PartitionDevice, gpu: dict[str, Any], driver: str) -> Conversion:
    attributes = {k: v for k, v in gpu["attributes"].items() if k != f"{driver}/uuid"}
    attributes[f"{driver}/type"] = {"string": PARTITION_TYPE}
    attributes[f"{driver}/{PARTITION_ATTRIBUTE}"] = {"string": partition.profile.name}
    attributes[f"{driver}/{PARTITION_TABLE_ATTRIBUTE}"] = {"string": partition.table.name}
    attributes[f"{driver}/{PARTITION_START_ATTRIBUTE}"] = {"int": partition.start}
    out: dict[str, Any] = {
        **{k: v for k, v in gpu.items() if k not in ("name", "attributes", "capacity", "consumesCounters")},
        "name": partition.name,
        "attributes": attributes,
        "capacity": {
            f"{driver}/{MEMORY_CAPACITY}": {"value": format_bytes(int(partition.profile.memory_bytes))}
        },
        "consumesCounters": _consumes(partition.gpu, partition.consumes),
    }
    return Conversion(partition.name, out)


def _taints(
    device: Device, policy: PublishPolicy, quarantined: str | None, link_fault: str | None
) -> list[dict[str, str]]:
    """The taints a published ``device`` carries in its slice."""
    taints: list[dict[str, str]] = []
    if device.health is not Health.OK:
        # Value = the Redfish Health, so a claim may tolerate "Warning" but not "Critical".
        taints.append(
            {"key": unhealthy_taint_key(policy.driver), "value": device.health.value, "effect": "NoSchedule"}
        )
    if quarantined is not None:
        # The value is the last failure's reason code; a taint value must be a label value.
        value = quarantined if is_label_value(quarantined) else "AttachFailed"
        effect = "NoExecute" if policy.evict_quarantined else "NoSchedule"
        taints.append({"key": attach_failed_taint_key(policy.driver), "value": value, "effect": effect})
    if link_fault is not None and policy.device_taints:
        taints.append(
            {
                "key": link_errors_taint_key(policy.driver),
                "value": link_fault,
                "effect": policy.link_taint_effect,
            }
        )
    if device.drain is not None and not policy.drain_rules:
        # The manager holds the reason to a label value; the drain's effect as the operator chose it.
        reason = device.drain.reason if is_label_value(device.drain.reason) else "maintenance"
        taints.append(
            {"key": drain_taint_key(policy.driver), "value": reason, "effect": str(device.drain.effect)}
        )
    if policy.fabric_unavailable:
        # NoSchedule, not NoExecute: what runs keeps its devices; the fabric holds them still.
        taints.append(
            {"key": fabric_unavailable_taint_key(policy.driver), "value": "true", "effect": "NoSchedule"}
        )
    return taints


def to_dra_device(
    device: Device, policy: PublishPolicy, quarantined: str | None = None, link_fault: str | None = None
) -> Conversion:
    """The ``Device`` entry of a ResourceSlice for ``device``, or why it is withheld.

    ``quarantined``: the reason its attaches failed, when it is out of allocation for that;
    ``link_fault``: the fault of its PCIe link, when its errors are past the thresholds.
    A memory pool (``memory_pool``) is one device allocated many times, its capacity ``memory``
    shared (:func:`memory_request_policy`); a partitionable GPU consumes its whole counter set
    (:func:`partition_conversions` makes its partitions), where the cluster keeps counters."""
    if not is_dns1123_label(device.name):
        return Conversion(device.name, None, WithheldReason.INVALID_NAME)
    if not device.managed:
        return Conversion(device.name, None, WithheldReason.UNMANAGED)
    if device.state is BindingState.UNAVAILABLE:
        return Conversion(device.name, None, WithheldReason.UNAVAILABLE)
    unhealthy = device.health is not Health.OK
    if unhealthy and not policy.device_taints:
        return Conversion(device.name, None, WithheldReason.UNHEALTHY)
    if quarantined is not None and not policy.device_taints:
        return Conversion(device.name, None, WithheldReason.ATTACH_FAILED)
    if device.drain is not None and not policy.device_taints and not policy.drain_rules:
        return Conversion(device.name, None, WithheldReason.DRAINED)
    if policy.fabric_unavailable and not policy.device_taints:
        return Conversion(device.name, None, WithheldReason.FABRIC_UNAVAILABLE)
    if link_fault is not None and not policy.device_taints and policy.link_taint_effect != "None":
        return Conversion(device.name, None, WithheldReason.LINK_ERRORS)

    pool = device.memory_pool
    if pool is not None and not policy.shares:
        return Conversion(device.name, None, WithheldReason.SHARES_UNSUPPORTED)
    shared = memory_request_policy(pool) if pool is not None else None
    if pool is not None and shared is None:
        return Conversion(device.name, None, WithheldReason.NO_ROOM)

    out: dict[str, Any] = {"name": device.name, "attributes": _attributes(device, policy.driver)}
    capacity: dict[str, dict[str, Any]] = dict(_capacity(device, policy.driver))
    if shared is not None:
        size, request_policy = shared
        capacity[f"{policy.driver}/{MEMORY_CAPACITY}"] = {
            "value": format_bytes(size),
            "requestPolicy": request_policy,
        }
        out["allowMultipleAllocations"] = True
        out["attributes"][f"{policy.driver}/{MEMORY_POOL_ATTRIBUTE}"] = {"bool": True}
    if capacity:
        out["capacity"] = capacity
    table = usable_table(device)
    if table is not None and policy.counters is not CounterLayout.OFF:
        out["attributes"][f"{policy.driver}/{PARTITION_TABLE_ATTRIBUTE}"] = {"string": table.name}
        out["consumesCounters"] = _consumes(*counter_set(device.name, table))
    taints = _taints(device, policy, quarantined, link_fault)
    if taints:
        out["taints"] = taints
    if policy.binding_conditions or policy.binds_to_node:
        out["bindsToNode"] = True
    if policy.binding_conditions:
        names = BindingConditionNames(policy.driver)
        out["bindingConditions"] = [names.attached]
        out["bindingFailureConditions"] = [names.failed]
    return Conversion(device.name, out)
