"""Stable Kubernetes names for fabric things (docs/architecture.md, "Names").

A device name is a DNS label (RFC 1123: at most 63 of ``[a-z0-9-]``, alphanumeric at both ends)
derived from the Redfish Id of the device's target endpoint, resource block or memory chunk — ids
that the fabric keeps across restarts of every process, so the name does too. Names are unique per
manager, because the REST API addresses devices by name alone: when two fabrics use the same Id,
those devices are prefixed with their fabric's Id; when even that collides, a short hash of the
device's Redfish URI tells them apart.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import Field, replace
from typing import Any, ClassVar, Protocol, TypeVar

from plumbing.names import DNS1123_LABEL_MAX_LENGTH, DNS1123_SUBDOMAIN_MAX_LENGTH

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


def _hash(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:_HASH_LEN]


def dns_label(text: str, identity: str | None = None) -> str:
    """``text`` as a DNS label; cut to fit and suffixed with a hash of ``identity`` (or ``text``)."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower())
    label = re.sub(r"-{2,}", "-", label).strip("-")
    if not label:
        return f"device-{_hash(identity or text)}"
    if len(label) > _MAX_LABEL:
        label = label[: _MAX_LABEL - _HASH_LEN - 1].rstrip("-") + "-" + _hash(identity or text)
    return label


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
