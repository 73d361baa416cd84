"""``/redfish/v1/CompositionService``: one resource block per pooled PCIe device.

A block is ``Composed`` into the host its device is bound to (by any style), ``Composing``
while a bind of it runs as a task, ``Unused`` otherwise. Resource zones group the blocks
behind one switch (blocks of one zone can be composed together).
"""

from __future__ import annotations

from emulator.redfish import uris
from emulator.redfish.models import (
    CompositionService,
    CompositionStatus,
    NetworkInterface,
    NetworkInterfaceLinks,
    ResourceBlock,
    ResourceBlockLinks,
    Status,
    Zone,
    ZoneLinks,
    ref,
    refs,
)
from emulator.redfish.nodes import CollectionNode, Context, Node
from emulator.redfish.state import OperationKind
from emulator.redfish.views.common import Segment, device_status, primary_uri
from emulator.topology import FABRIC_PCIE, Device
from manager_api.devices import DeviceType

__all__ = ["CompositionServiceNode", "ResourceBlockNode"]

_BLOCK_TYPE = {
    DeviceType.GPU: "Processor",
    DeviceType.FPGA: "Processor",
    DeviceType.NVME: "Storage",
    DeviceType.NIC: "Network",
}


def _pcie_devices(ctx: Context) -> list[Device]:
    return list(ctx.index.fabric_devices(FABRIC_PCIE))


class CompositionServiceNode(Node):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, uris.COMPOSITION)

    def render(self) -> CompositionService:
        return CompositionService(
            odata_id=self.uri,
            Id="CompositionService",
            Name="Composition Service",
            Description="Compose pooled PCIe devices into fabric hosts (expandable systems)",
            Status=Status(),
            ResourceBlocks=ref(uris.RESOURCE_BLOCKS),
            ResourceZones=ref(uris.RESOURCE_ZONES),
        )

    def child(self, segment: str) -> Node | None:
        ctx = self.ctx
        if segment == "ResourceBlocks":
            devices = {d.id: d for d in _pcie_devices(ctx)}
            return CollectionNode(
                ctx,
                uris.RESOURCE_BLOCKS,
                "ResourceBlockCollection",
                "Resource blocks",
                lambda: list(devices),
                lambda b: ResourceBlockNode(ctx, devices[b]) if b in devices else None,
            )
        if segment == "ResourceZones":
            switches = [s.id for s in ctx.index.fabric_switches(FABRIC_PCIE)]
            return CollectionNode(
                ctx,
                uris.RESOURCE_ZONES,
                "ZoneCollection",
                "Resource zones",
                lambda: switches,
                lambda z: ResourceZoneNode(ctx, z) if z in switches else None,
            )
        return None


class ResourceBlockNode(Node):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, uris.resource_block(device.id))
        self.device = device

    def render(self) -> ResourceBlock:
        dev, engine = self.device, self.ctx.engine
        # behaviour.blockStatus "stale": the block never says it was composed (the system does)
        current = self.ctx.index.topology.behaviour.block_status == "current"
        binding = engine.binding(dev.id) if current else None
        task_id = engine.inflight.get(dev.id) if current else None
        task = engine.state.tasks.get(task_id) if task_id else None
        if task is not None and task.kind == OperationKind.BIND:
            state = "Composing"
        elif binding is not None:
            state = "Composed"
        else:
            state = "Unused"
        processors = [ref(primary_uri(dev))] if dev.type in (DeviceType.GPU, DeviceType.FPGA) else []
        drives = [ref(primary_uri(dev))] if dev.type == DeviceType.NVME else []
        interfaces = [ref(f"{self.uri}/NetworkInterfaces/{dev.id}")] if dev.type == DeviceType.NIC else []
        return ResourceBlock(
            odata_id=self.uri,
            Id=dev.id,
            Name=f"{dev.id} ({dev.model.model})",
            Description=f"Pooled {dev.type.value} {dev.id} behind {dev.switch}",
            ResourceBlockType=[_BLOCK_TYPE.get(dev.type, "Expansion")],
            Status=device_status(self.ctx, dev),
            CompositionStatus=CompositionStatus(
                CompositionState=state, NumberOfCompositions=1 if binding is not None else 0
            ),
            Processors=processors,
            Drives=drives,
            NetworkInterfaces=interfaces,
            Links=ResourceBlockLinks(
                ComputerSystems=[ref(uris.system(binding.host))] if binding is not None else [],
                Chassis=[ref(uris.chassis(dev.switch))],
                Zones=[ref(f"{uris.RESOURCE_ZONES}/{dev.switch}")],
            ),
        )

    def child(self, segment: str) -> Node | None:
        if segment == "NetworkInterfaces" and self.device.type == DeviceType.NIC:
            uri = f"{self.uri}/NetworkInterfaces"
            return Segment(self.ctx, uri, {self.device.id: NetworkInterfaceNode(self.ctx, self.device, uri)})
        return None


class NetworkInterfaceNode(Node):
    def __init__(self, ctx: Context, device: Device, parent: str) -> None:
        super().__init__(ctx, f"{parent}/{device.id}")
        self.device = device

    def render(self) -> NetworkInterface:
        return NetworkInterface(
            odata_id=self.uri,
            Id=self.device.id,
            Name=f"{self.device.id} network interface",
            Status=device_status(self.ctx, self.device),
            Links=NetworkInterfaceLinks(NetworkAdapter=ref(primary_uri(self.device))),
        )


class ResourceZoneNode(Node):
    def __init__(self, ctx: Context, switch_id: str) -> None:
        super().__init__(ctx, f"{uris.RESOURCE_ZONES}/{switch_id}")
        self.switch_id = switch_id

    def render(self) -> Zone:
        devices = self.ctx.index.switches[self.switch_id].devices
        return Zone(
            odata_id=self.uri,
            Id=self.switch_id,
            Name=f"Resource zone {self.switch_id}",
            Description=f"Resource blocks behind switch {self.switch_id}",
            ZoneType="ZoneOfResourceBlocks",
            Status=Status(),
            Links=ZoneLinks(ResourceBlocks=refs([uris.resource_block(d) for d in devices])),
        )
