"""What each host sees of its bindings: a bound target shows up in its host's sysfs tree while the
host's port to the target's switch is up, as the entry this module makes of the binding."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from emulator.redfish.engine.conditions import Conditions
from emulator.redfish.model.state import BindingRecord, SideEffect
from emulator.redfish.sysfs.hostview import HostEntry, HostView, cpu_nodes
from emulator.topology import FabricIndex

__all__ = ["Visibility"]


@dataclass(eq=False)
class Visibility:
    index: FabricIndex
    conditions: Conditions
    view: HostView

    def visible(self, binding: BindingRecord) -> bool:
        return self.conditions.port_up(self.index.targets[binding.target].device.switch, binding.host)

    def show(self, binding: BindingRecord) -> SideEffect:
        """The host-view update that makes ``binding`` appear (run once the change is durable)."""
        return functools.partial(self.view.add, self.entry(binding))

    def hide(self, binding: BindingRecord) -> SideEffect:
        return functools.partial(self.view.remove, self.entry(binding))

    def rebuild(self, bindings: list[BindingRecord]) -> None:
        """Every host's tree anew, holding the visible ``bindings`` (at start, from the durable state)."""
        hosts = self.index.hosts.values()
        self.view.reset({h.name: str(h.uuid) for h in hosts}, {h.name: cpu_nodes(h.numa_node) for h in hosts})
        for binding in bindings:
            if self.visible(binding):
                self.view.add(self.entry(binding))

    def entry(self, binding: BindingRecord) -> HostEntry:
        target = self.index.targets[binding.target]
        dev = target.device
        model = dev.model
        return HostEntry(
            host=binding.host,
            target=binding.target,
            type=dev.type,
            address=binding.address.model_copy(),
            vendor_id=model.vendor_id,
            device_id=model.device_id,
            class_code=model.class_code,
            revision_id=model.revision_id,
            subsystem_vendor_id=dev.subsystem_vendor_id,
            subsystem_id=model.subsystem_id,
            pcie_generation=model.pcie_generation,
            pcie_width=model.pcie_width,
            serial=dev.serial,
            model=model.model,
            numa_node=self.index.hosts[binding.host].numa_node,
            size_bytes=target.chunk.size_bytes if target.chunk else int(model.memory or 0),
            device_size_bytes=int(model.memory or 0),
        )
