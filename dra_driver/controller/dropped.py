"""What an API server drops of the slices the controller writes, and what the controller
publishes instead.

A cluster without a feature gate accepts a ResourceSlice but drops the gated fields on write
(``k8s.io/kubernetes/pkg/registry/resource/resourceslice/strategy.go``, ``dropDisabledFields``):
device taints (DRADeviceTaints), ``bindsToNode`` and binding conditions
(DRADeviceBindingConditions), shared counters and ``consumesCounters`` (DRAPartitionableDevices),
``allowMultipleAllocations`` and capacity policies (DRAConsumableCapacity). The publisher compares
what it sent with what came back; once a field is seen dropped, the policy it publishes with leaves
the feature out (or withholds what would be unsafe without it) for as long as the process runs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from dra_driver.controller.devices import PublishPolicy
from dra_driver.controller.features import CounterLayout
from plumbing.logs import get_logger

__all__ = ["DroppedFields"]

log = get_logger(__name__)


@dataclasses.dataclass
class DroppedFields:
    """The gated fields this API server was seen to drop."""

    taints: bool = False
    bindings: bool = False
    counters: bool = False
    shares: bool = False

    def applied_to(self, policy: PublishPolicy) -> PublishPolicy:
        """``policy`` less what the API server drops."""
        return dataclasses.replace(
            policy,
            device_taints=policy.device_taints and not self.taints,
            binding_conditions=policy.binding_conditions and not self.bindings,
            binds_to_node=policy.binds_to_node and not self.bindings,
            counters=CounterLayout.OFF if self.counters else policy.counters,
            shares=policy.shares and not self.shares,
        )

    def check(self, sent: dict[str, Any], stored: dict[str, Any]) -> bool:
        """A cluster without a feature gate drops the gated fields on write: notice, and adapt.

        True when the API server kept every device and every gated field that was sent.
        """
        sent_devices = (sent.get("spec") or {}).get("devices") or []
        kept = {d.get("name"): d for d in (stored.get("spec") or {}).get("devices") or []}
        lost_taints = lost_bindings = False
        sent_conditions = any(d.get("bindingConditions") for d in sent_devices)
        for device in sent_devices:
            back = kept.get(device["name"]) or {}
            lost_taints = lost_taints or bool(device.get("taints") and not back.get("taints"))
            lost_bindings = lost_bindings or bool(device.get("bindsToNode") and not back.get("bindsToNode"))
        lost_counters = bool(
            (sent.get("spec") or {}).get("sharedCounters")
            and not (stored.get("spec") or {}).get("sharedCounters")
        )
        lost_shares = False
        for device in sent_devices:
            back = kept.get(device["name"]) or {}
            lost_counters = lost_counters or bool(
                device.get("consumesCounters") and not back.get("consumesCounters")
            )
            lost_shares = lost_shares or bool(
                device.get("allowMultipleAllocations") and not back.get("allowMultipleAllocations")
            )
        if lost_counters and not self.counters:
            # Partitions without their counters could be allocated overlapping: never leave them so.
            self.counters = True
            log.error(
                "the API server dropped shared counters (feature gate DRAPartitionableDevices is off): "
                "publishing GPUs whole, without partitions",
                slice=sent["metadata"]["name"],
            )
        if lost_shares and not self.shares:
            self.shares = True
            log.error(
                "the API server dropped allowMultipleAllocations (feature gate DRAConsumableCapacity is "
                "off): memory pools are withheld",
                slice=sent["metadata"]["name"],
            )
        if lost_taints and not self.taints:
            self.taints = True
            log.warning(
                "the API server dropped device taints (feature gate DRADeviceTaints is off): "
                "unhealthy devices are withheld from the slices instead",
                slice=sent["metadata"]["name"],
            )
        if lost_bindings and not self.bindings and not sent_conditions:
            self.bindings = True
            log.warning(
                "the API server dropped bindsToNode (feature gate DRADeviceBindingConditions is off): "
                "pods sharing a claim are not pinned to one node; keep them together with pod "
                "affinity (docs/plugin.md, 'Pods sharing a claim')",
                slice=sent["metadata"]["name"],
            )
        elif lost_bindings and not self.bindings:
            self.bindings = True
            log.error(
                "the API server dropped bindsToNode and binding conditions: enable the feature gates "
                "DRADeviceBindingConditions and DRAResourceClaimDeviceStatus, or run without "
                "--binding-conditions; publishing without them (devices attach at prepare time, and GPU "
                "partitions are offered only of GPUs already on a node)",
                slice=sent["metadata"]["name"],
            )
        return (
            len(kept) == len(sent_devices)
            and not lost_taints
            and not lost_bindings
            and not lost_counters
            and not lost_shares
        )
