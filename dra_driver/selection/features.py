"""The scheduler feature gates device selection follows (``structured.Features``)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Features"]


@dataclass(frozen=True)
class Features:
    """Feature gates of the scheduler being modelled; all on by default (Kubernetes 1.36)."""

    admin_access: bool = True
    prioritized_list: bool = True
    device_taints: bool = True
    binding_conditions: bool = True
    #: DRAPartitionableDevices: shared counters, per-device node selection
    partitionable_devices: bool = True
    #: DRAConsumableCapacity: ``allowMultipleAllocations``, capacity requests, ``distinctAttribute``
    consumable_capacity: bool = True
