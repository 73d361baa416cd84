"""``/redfish/v1/CompositionService``: one resource block per pooled PCIe device.

A block is ``Composed`` into the host its device is bound to (by any style), ``Composing``
while a bind of it runs as a task, ``Unused`` otherwise. Resource zones group the blocks
behind one switch (blocks of one zone can be composed together).

Behaviours (docs/emulator.md) change the shape: ``storageBlocks: storage`` makes an NVMe block
list a Storage resource whose ``Drives`` link to the drive, instead of the drive itself;
``sharedBlocks`` makes blocks ``ComposedAndAvailable`` in two or more systems at once;
``resourceBlocks: root-only`` lists the blocks in ``/redfish/v1/ResourceBlocks`` (ServiceRoot
1.5) with no CompositionService.
"""

from __future__ import annotations

import functools

from emulator.redfish.model import uris
from emulator.redfish.model.resources import (
    CompositionService,
    CompositionStatus,
    NetworkInterface,
    NetworkInterfaceLinks,
    ResourceBlock,
    ResourceBlockLinks,
    Status,
    Storage,
    StorageLinks,
    Zone,
    ZoneLinks,
    ref,
    refs,
)
from emulator.redfish.model.state import OperationKind
from emulator.redfish.tree.nodes import CollectionNode, Context, Node, collection_of
from emulator.redfish.views.common import DeviceNode, Segment, ServiceNode, named, primary_uri
from emulator.topology import FABRIC_PCIE, Device
from manager_api.devices import DeviceType

__all__ = [
    "CompositionServiceNode",
    "ResourceBlockNode",
    "block_uri",
    "root_blocks_node",
    "shared_holders",
]

#: the root-level collection of a service without a CompositionService (ServiceRoot 1.5 ResourceBlocks)
ROOT_BLOCKS = f"{uris.ROOT}/ResourceBlocks"

_BLOCK_TYPE = {
    DeviceType.GPU: "Processor",
    DeviceType.FPGA: "Processor",
    DeviceType.NVME: "Storage",
    DeviceType.NIC: "Network",
}


def _pcie_devices(ctx: Context) -> list[Device]:
    return list(ctx.index.fabric_devices(FABRIC_PCIE))


def _blocks_base(ctx: Context) -> str:
    root_only = ctx.index.topology.behaviour.resource_blocks == "root-only"
    return ROOT_BLOCKS if root_only else uris.RESOURCE_BLOCKS


def block_uri(ctx: Context, device_id: str) -> str:
    """The URI of a device's resource block, wherever this service lists its blocks."""
    return f"{_blocks_base(ctx)}/{device_id}"


def shared_holders(ctx: Context, device_id: str) -> list[str]:
    """The hosts a block is composed into at once (behaviour.sharedBlocks), else none."""
    return list(ctx.index.topology.behaviour.shared_blocks.get(device_id, []))


def _blocks_collection(ctx: Context, uri: str) -> CollectionNode:
    """The blocks, one per PCIe device: a member is looked up by Id, not found among all of them
    (resolving each block's URI built every block's entry, and the expanded collection of
    10,100 blocks took longer than any client waits: quadratic)."""

    def member(ident: str) -> Node | None:
        device = ctx.index.devices.get(ident)
        if device is None or device.fabric != FABRIC_PCIE:
            return None
        return ResourceBlockNode(ctx, device)

    return CollectionNode(
        ctx,
        uri,
        "ResourceBlockCollection",
        "Resource blocks",
        lambda: [d.id for d in _pcie_devices(ctx)],
        member,
    )


def root_blocks_node(ctx: Context) -> CollectionNode:
    """``/redfish/v1/ResourceBlocks`` (behaviour.resourceBlocks "root-only")."""
    return _blocks_collection(ctx, ROOT_BLOCKS)


class CompositionServiceNode(ServiceNode, at=uris.COMPOSITION):
    def render(self) -> CompositionService:
        return CompositionService(
            **self.service(),
            Description="Compose pooled PCIe devices into fabric hosts (expandable systems)",
            ResourceBlocks=ref(uris.RESOURCE_BLOCKS),
            ResourceZones=ref(uris.RESOURCE_ZONES),
        )

    def child(self, segment: str) -> Node | None:
        ctx = self.ctx
        if segment == "ResourceBlocks":
            return _blocks_collection(ctx, uris.RESOURCE_BLOCKS)
        if segment == "ResourceZones":
            zones = {
                s.id: functools.partial(ResourceZoneNode, ctx, s.id)
                for s in ctx.index.fabric_switches(FABRIC_PCIE)
            }
            return collection_of(ctx, uris.RESOURCE_ZONES, "ZoneCollection", "Resource zones", zones)
        return None


class ResourceBlockNode(DeviceNode):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, device, block_uri(ctx, device.id))

    @property
    def _storage(self) -> bool:
        """The block lists a Storage resource, not its drive (behaviour.storageBlocks "storage")."""
        storage = self.ctx.index.topology.behaviour.storage_blocks == "storage"
        return storage and self.device.type == DeviceType.NVME

    def render(self) -> ResourceBlock:
        dev, engine = self.device, self.ctx.engine
        # behaviour.blockStatus "stale": the block never says it was composed (the system does)
        current = self.ctx.index.topology.behaviour.block_status == "current"
        binding = engine.bindings.binding(dev.id) if current else None
        task_id = engine.bindings.inflight.get(dev.id) if current else None
        task = engine.state.tasks.get(task_id) if task_id else None
        holders = [binding.host] if binding is not None else []
        shared = shared_holders(self.ctx, dev.id)
        if shared:
            state, holders = "ComposedAndAvailable", shared
        elif task is not None and task.kind == OperationKind.BIND:
            state = "Composing"
        elif binding is not None:
            state = "Composed"
        else:
            state = "Unused"
        processors = [ref(primary_uri(dev))] if dev.type in (DeviceType.GPU, DeviceType.FPGA) else []
        drives = [ref(primary_uri(dev))] if dev.type == DeviceType.NVME and not self._storage else []
        storage = [ref(f"{self.uri}/Storage/{dev.id}")] if self._storage else None
        interfaces = [ref(f"{self.uri}/NetworkInterfaces/{dev.id}")] if dev.type == DeviceType.NIC else []
        return ResourceBlock(
            odata_id=self.uri,
            **named(dev),
            Description=f"Pooled {dev.type.value} {dev.id} behind {dev.switch}",
            ResourceBlockType=[_BLOCK_TYPE.get(dev.type, "Expansion")],
            Status=self.status(),
            CompositionStatus=CompositionStatus(
                CompositionState=state,
                SharingCapable=bool(shared),
                MaxCompositions=max(1, len(shared)),
                NumberOfCompositions=len(holders),
            ),
            Processors=processors,
            Drives=drives,
            NetworkInterfaces=interfaces,
            Storage=storage,
            Links=ResourceBlockLinks(
                ComputerSystems=[ref(uris.system(h)) for h in holders],
                Chassis=[ref(uris.chassis(dev.switch))],
                Zones=[ref(f"{uris.RESOURCE_ZONES}/{dev.switch}")],
            ),
        )

    def child(self, segment: str) -> Node | None:
        if segment == "NetworkInterfaces" and self.device.type == DeviceType.NIC:
            uri = f"{self.uri}/NetworkInterfaces"
            return Segment(
                self.ctx,
                uri,
                {self.device.id: NetworkInterfaceNode(self.ctx, self.device, f"{uri}/{self.device.id}")},
            )
        if segment == "Storage" and self._storage:
            uri = f"{self.uri}/Storage"
            return Segment(
                self.ctx, uri, {self.device.id: StorageNode(self.ctx, self.device, f"{uri}/{self.device.id}")}
            )
        return None


class StorageNode(DeviceNode):
    """The storage subsystem of an NVMe block: its one drive is the pooled device."""

    def render(self) -> Storage:
        return Storage(
            odata_id=self.uri,
            Id=self.device.id,
            Name=f"{self.device.id} storage",
            Status=self.status(),
            Drives=[ref(primary_uri(self.device))],
            Links=StorageLinks(Enclosures=[ref(uris.chassis(self.device.switch))]),
        )


class NetworkInterfaceNode(DeviceNode):
    def render(self) -> NetworkInterface:
        return NetworkInterface(
            odata_id=self.uri,
            Id=self.device.id,
            Name=f"{self.device.id} network interface",
            Status=self.status(),
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
            Links=ZoneLinks(ResourceBlocks=refs([block_uri(self.ctx, d) for d in devices])),
        )
