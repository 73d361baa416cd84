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

from dra_driver.controller.resourcenames import (
    BindingConditionNames,
    attach_failed_taint_key,
    fit_value,
    unhealthy_taint_key,
)
from dra_driver.selection.quantity import format_bytes
from manager_api.devices import SliceAttribute, SliceCapacity, SliceForm
from manager_api.models import BindingState, Device, Health
from plumbing.names import is_dns1123_label, is_label_value

__all__ = [
    "ATTRIBUTE_NAMES",
    "CAPACITY_NAMES",
    "SLICE_ATTRIBUTES",
    "SLICE_CAPACITIES",
    "WARM_ATTRIBUTE",
    "Conversion",
    "PublishPolicy",
    "WithheldReason",
    "mark_warm",
    "to_dra_device",
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


def to_dra_device(device: Device, policy: PublishPolicy, quarantined: str | None = None) -> Conversion:
    """The ``Device`` entry of a ResourceSlice for ``device``, or why it is withheld.

    ``quarantined``: the reason its attaches failed, when it is out of allocation for that."""
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

    out: dict[str, Any] = {"name": device.name, "attributes": _attributes(device, policy.driver)}
    capacity = _capacity(device, policy.driver)
    if capacity:
        out["capacity"] = capacity
    taints = []
    if unhealthy:
        # Value = the Redfish Health, so a claim may tolerate "Warning" but not "Critical".
        taints.append(
            {"key": unhealthy_taint_key(policy.driver), "value": device.health.value, "effect": "NoSchedule"}
        )
    if quarantined is not None:
        # The value is the last failure's reason code; a taint value must be a label value.
        value = quarantined if is_label_value(quarantined) else "AttachFailed"
        effect = "NoExecute" if policy.evict_quarantined else "NoSchedule"
        taints.append({"key": attach_failed_taint_key(policy.driver), "value": value, "effect": effect})
    if taints:
        out["taints"] = taints
    if policy.binding_conditions or policy.binds_to_node:
        out["bindsToNode"] = True
    if policy.binding_conditions:
        names = BindingConditionNames(policy.driver)
        out["bindingConditions"] = [names.attached]
        out["bindingFailureConditions"] = [names.failed]
    return Conversion(device.name, out)
