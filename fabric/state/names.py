"""Stable Kubernetes names for fabric things (docs/architecture.md, "Names").

A device name is a DNS label (RFC 1123: at most 63 of ``[a-z0-9-]``, alphanumeric at both ends)
derived from the Redfish Id of the device's target endpoint, resource block or memory chunk — ids
that the fabric keeps across restarts of every process, so the name does too. Names are unique per
manager, because the REST API addresses devices by name alone: when two fabrics use the same Id,
those devices are prefixed with their fabric's Id; when even that collides, a short hash of the
device's Redfish URI tells them apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import Field, replace
from typing import Any, ClassVar, Protocol, TypeVar

from plumbing.names import DNS1123_LABEL_MAX_LENGTH, DNS1123_SUBDOMAIN_MAX_LENGTH, dns_label, short_hash

__all__ = ["NamedDevice", "assign_names", "dns_label", "pool_name"]


class NamedDevice(Protocol):
    """What naming reads of a device (a :class:`fabric.state.model.DeviceRecord`): a dataclass
    whose ``name`` is set from its Redfish Id, fabric and URI. Structural, so that this module
    sits below the backends that name their devices with it."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def key(self) -> str: ...

    @property
    def resource_id(self) -> str: ...

    @property
    def fabric(self) -> str: ...

    @property
    def name(self) -> str: ...


D = TypeVar("D", bound=NamedDevice)

_MAX_LABEL = DNS1123_LABEL_MAX_LENGTH
_HASH_LEN = 8
_hash = short_hash


def pool_name(service: str, fabric_id: str) -> str:
    """``<fabric-service>-<fabric id>``, a DNS subdomain, e.g. ``fabric-pcie``."""
    parts = [dns_label(p) for p in f"{service}-{fabric_id}".split(".")]
    return ".".join(p for p in parts if p)[:DNS1123_SUBDOMAIN_MAX_LENGTH]


def assign_names(devices: Sequence[D]) -> list[D]:
    """Give every device its unique name; deterministic for a given set of devices."""
    by_base: dict[str, list[D]] = defaultdict(list)
    for device in devices:
        by_base[dns_label(device.resource_id, device.key)].append(device)
    named: dict[str, list[D]] = defaultdict(list)
    for base, group in by_base.items():
        for device in group:
            name = base if len(group) == 1 else dns_label(f"{device.fabric}-{device.resource_id}", device.key)
            named[name].append(device)
    result: list[D] = []
    for name, group in named.items():
        for device in group:
            unique = name
            if len(group) > 1:
                unique = dns_label(f"{name[: _MAX_LABEL - _HASH_LEN - 1]}-{_hash(device.key)}", device.key)
            result.append(replace(device, name=unique))
    result.sort(key=lambda d: d.name)
    return result
