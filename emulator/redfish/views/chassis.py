"""``/redfish/v1/Chassis``: the enclosures and the pooled hardware in them.

Each switch has an enclosure chassis (``Chassis/{switch}``); PCIe devices live in their switch's
enclosure as a PCIeDevice (with one PCIeFunction, ``0``) plus the resource that *is* the device:
a Processor (GPU ``ProcessorType: GPU``, FPGA ``FPGA``), a Drive (NVMe) or a NetworkAdapter
(NIC). A partitionable GPU's PCIeDevice carries its partition table as
``Oem.FabricDRA.PartitionTable`` (manager_api.partitions, camelCase). Each CXL Type-3 memory
device is a module chassis of its own (``Chassis/{device}``, as in DMTF's public-cxl mockup) with
its PCIeDevice, CXL logical device ``0`` and memory domain ``0``, whose memory chunks are the unit
a host binds. A device with a pool has a domain that allows chunk creation (MemoryDomain v1_5_0):
a POST to its ``MemoryChunks`` carves a chunk, a DELETE of the chunk gives its memory back.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from emulator.redfish.engine.operation import Operation
from emulator.redfish.model import uris
from emulator.redfish.model.faults import LinkDegraded
from emulator.redfish.model.oem import OEM_NAMESPACE, PCIE_DEVICE_OEM_TYPE
from emulator.redfish.model.resources import (
    Action,
    Chassis,
    ChassisLinks,
    Controller,
    ControllerLinks,
    CXLDevice,
    CXLLogicalDevice,
    CXLLogicalDeviceLinks,
    Drive,
    DriveLinks,
    Identifier,
    MemoryChunks,
    MemoryChunksLinks,
    MemoryDomain,
    MemoryDomainLinks,
    NetworkAdapter,
    PCIeDevice,
    PCIeDeviceLinks,
    PCIeFunction,
    PCIeFunctionLinks,
    PCIeInterface,
    Processor,
    ProcessorLinks,
    ProcessorMemory,
    Ref,
    Status,
    ref,
    refs,
)
from emulator.redfish.model.state import OperationKind
from emulator.redfish.sysfs.pciconfig import dsn_from_serial
from emulator.redfish.tree.http import Reply, Request, parse_body
from emulator.redfish.tree.nodes import CollectionNode, Context, Node, actions, collection_of
from emulator.redfish.views.common import (
    Body,
    DeviceNode,
    device_class,
    device_status,
    function_uri,
    hex16,
    logical_device_uri,
    primary_uri,
    product,
)
from emulator.redfish.views.composition import block_uri
from emulator.redfish.views.outcome import reply_for
from emulator.topology import FABRIC_CXL, Chunk, Device, SwitchInfo
from manager_api.devices import BindingStyle, DeviceType

__all__ = ["ChassisCollectionNode", "processor_model"]

_MIB = 1 << 20


def _interface(device: Device, link: LinkDegraded | None = None) -> PCIeInterface:
    """The device's link: what it trained at (a ``LinkDegraded`` fault lowers it) and its maximum."""
    gen = f"Gen{device.model.pcie_generation}"
    width = device.model.pcie_width
    trained_gen = link.PCIeType if link is not None and link.PCIeType else gen
    trained_width = link.LanesInUse if link is not None and link.LanesInUse else width
    return PCIeInterface(PCIeType=trained_gen, MaxPCIeType=gen, LanesInUse=trained_width, MaxLanes=width)


def processor_model(ctx: Context, device: Device, uri: str) -> Processor:
    memory = device.model.memory
    return Processor(
        odata_id=uri,
        **product(device),
        ProcessorType="GPU" if device.type == DeviceType.GPU else "FPGA",
        UUID=str(device.uuid) if device.uuid else None,
        Status=device_status(ctx, device),
        ProcessorMemory=[ProcessorMemory(CapacityMiB=int(memory) // _MIB)] if memory else None,
        Links=ProcessorLinks(
            Chassis=ref(uris.chassis(uris.chassis_of(device))),
            PCIeDevice=ref(uris.pcie_device(device)),
            PCIeFunctions=[ref(function_uri(device))],
            Endpoints=[ref(uris.endpoint(device.fabric, device.id))],
        ),
    )


def _gcxlid(serial: str) -> str:
    """A CXL device's GCXLID (its 8-byte serial as dashed hex, then the logical device number)."""
    dsn = dsn_from_serial(serial)
    raw = f"{dsn:016X}" if dsn is not None else serial.encode().hex().upper()[:16].rjust(16, "0")
    return "-".join(raw[i : i + 2] for i in range(0, 16, 2)) + ":0000"


def _memory_domain_uri(device: Device) -> str:
    return uris.memory_domain(device.id)


def _partition_oem(device: Device) -> dict[str, Any] | None:
    """``Oem.FabricDRA.PartitionTable`` of a partitionable GPU: its model's table, camelCase."""
    table = device.model.partitions
    if table is None:
        return None
    return {
        OEM_NAMESPACE: {
            "@odata.type": PCIE_DEVICE_OEM_TYPE,
            "PartitionTable": table.model_dump(mode="json", by_alias=True),
        }
    }


class ChassisCollectionNode(CollectionNode):
    def __init__(self, ctx: Context) -> None:
        index = ctx.index
        switch_ids = list(index.switches)
        cxl_ids = [d.id for d in index.fabric_devices(FABRIC_CXL)]

        def make(ident: str) -> Node | None:
            if ident in index.switches:
                return SwitchChassisNode(ctx, index.switches[ident])
            if ident in cxl_ids:
                return CxlChassisNode(ctx, index.devices[ident])
            return None

        super().__init__(
            ctx, f"{uris.ROOT}/Chassis", "ChassisCollection", "Chassis", lambda: switch_ids + cxl_ids, make
        )


def _devices(
    ctx: Context, uri: str, collection_type: str, name: str, devices: list[Device], node: type[DeviceNode]
) -> CollectionNode:
    """The collection of ``devices``' resources of one kind (``node``), by device Id."""
    return collection_of(
        ctx, uri, collection_type, name, {d.id: functools.partial(node, ctx, d) for d in devices}
    )


def _the_one(
    ctx: Context, uri: str, collection_type: str, name: str, make: Callable[[], Node]
) -> CollectionNode:
    """A collection of one member, ``0`` (a device's one function, logical device, memory domain)."""
    return collection_of(ctx, uri, collection_type, name, {"0": make})


class SwitchChassisNode(Node):
    #: the pooled devices' collections an enclosure has: segment → (collection type, name, device types)
    COLLECTIONS: ClassVar[dict[str, tuple[str, str, frozenset[DeviceType] | None]]] = {
        "PCIeDevices": ("PCIeDeviceCollection", "PCIe devices", None),
        "Processors": ("ProcessorCollection", "Processors", frozenset({DeviceType.GPU, DeviceType.FPGA})),
        "Drives": ("DriveCollection", "Drives", frozenset({DeviceType.NVME})),
        "NetworkAdapters": ("NetworkAdapterCollection", "Network adapters", frozenset({DeviceType.NIC})),
    }

    def __init__(self, ctx: Context, switch: SwitchInfo) -> None:
        super().__init__(ctx, uris.chassis(switch.id))
        self.switch = switch
        self.devices = [ctx.index.devices[d] for d in switch.devices] if switch.fabric != FABRIC_CXL else []

    def _in(self, segment: str) -> list[Device]:
        """The devices whose resources the collection at ``segment`` lists."""
        types = self.COLLECTIONS[segment][2]
        return [d for d in self.devices if types is None or d.type in types]

    def _link(self, segment: str) -> Ref | None:
        return ref(f"{self.uri}/{segment}") if self._in(segment) else None

    def render(self) -> Chassis:
        sw = self.switch
        return Chassis(
            odata_id=self.uri,
            Id=sw.id,
            Name=f"{sw.fabric} enclosure {sw.id}",
            Description=f"Enclosure of {sw.fabric} switch {sw.id} and the devices behind it",
            ChassisType="Enclosure",
            Manufacturer=sw.manufacturer,
            Model=sw.model,
            Status=Status(),
            PCIeDevices=self._link("PCIeDevices"),
            Processors=self._link("Processors"),
            Drives=self._link("Drives"),
            NetworkAdapters=self._link("NetworkAdapters"),
            Links=ChassisLinks(
                ManagedBy=[ref(uris.MANAGER)],
                Switches=[ref(uris.switch(sw.fabric, sw.id))],
                ResourceBlocks=refs([block_uri(self.ctx, d.id) for d in self.devices]) or None,
            ),
        )

    def child(self, segment: str) -> Node | None:
        if segment not in self.COLLECTIONS or not self._in(segment):
            return None
        collection_type, name, _ = self.COLLECTIONS[segment]
        node = _POOLED_NODES[segment]
        uri = f"{self.uri}/{segment}"
        return _devices(
            self.ctx, uri, collection_type, f"{name} in {self.switch.id}", self._in(segment), node
        )


class CxlChassisNode(DeviceNode, at=lambda device: uris.chassis(device.id)):
    def render(self) -> Chassis:
        dev = self.device
        return Chassis(
            odata_id=self.uri,
            Id=dev.id,
            Name=f"CXL memory module {dev.id}",
            Description=f"{dev.model.model} behind CXL switch {dev.switch}",
            ChassisType="Module",
            Manufacturer=dev.model.manufacturer,
            Model=dev.model.model,
            SerialNumber=dev.serial,
            Status=self.status(),
            PCIeDevices=ref(f"{self.uri}/PCIeDevices"),
            MemoryDomains=ref(f"{self.uri}/MemoryDomains"),
            Links=ChassisLinks(ManagedBy=[ref(uris.MANAGER)]),
        )

    def child(self, segment: str) -> Node | None:
        ctx, dev = self.ctx, self.device
        if segment == "PCIeDevices":
            name = f"PCIe devices in {dev.id}"
            return _devices(
                ctx, f"{self.uri}/PCIeDevices", "PCIeDeviceCollection", name, [dev], PCIeDeviceNode
            )
        if segment == "MemoryDomains":
            name = f"Memory domains of {dev.id}"
            make = functools.partial(MemoryDomainNode, ctx, dev)
            return _the_one(ctx, f"{self.uri}/MemoryDomains", "MemoryDomainCollection", name, make)
        return None


class PCIeDeviceNode(DeviceNode, at=uris.pcie_device):
    def render(self) -> PCIeDevice:
        dev = self.device
        cxl = dev.type == DeviceType.CXL_MEMORY
        return PCIeDevice(
            odata_id=self.uri,
            **product(dev),
            UUID=str(dev.uuid) if dev.uuid else None,
            FirmwareVersion=dev.model.firmware_version,
            Status=self.status(),
            PCIeInterface=_interface(dev, self.ctx.engine.conditions.link(dev.id)),
            PCIeFunctions=ref(f"{self.uri}/PCIeFunctions"),
            CXLDevice=CXLDevice() if cxl else None,
            CXLLogicalDevices=ref(f"{self.uri}/CXLLogicalDevices") if cxl else None,
            Oem=_partition_oem(dev),
            Links=PCIeDeviceLinks(
                Chassis=[ref(uris.chassis(uris.chassis_of(dev)))],
                Processors=[ref(primary_uri(dev))] if dev.type in (DeviceType.GPU, DeviceType.FPGA) else [],
            ),
        )

    def child(self, segment: str) -> Node | None:
        ctx, dev = self.ctx, self.device
        if segment == "PCIeFunctions":
            function = functools.partial(PCIeFunctionNode, ctx, dev)
            name = f"PCIe functions of {dev.id}"
            return _the_one(ctx, f"{self.uri}/PCIeFunctions", "PCIeFunctionCollection", name, function)
        if segment == "CXLLogicalDevices" and dev.type == DeviceType.CXL_MEMORY:
            logical = functools.partial(CXLLogicalDeviceNode, ctx, dev)
            name = f"CXL logical devices of {dev.id}"
            return _the_one(ctx, f"{self.uri}/CXLLogicalDevices", "CXLLogicalDeviceCollection", name, logical)
        return None


class PCIeFunctionNode(DeviceNode, at=function_uri):
    def render(self) -> PCIeFunction:
        dev, m = self.device, self.device.model
        cxl = dev.type == DeviceType.CXL_MEMORY
        links = PCIeFunctionLinks(PCIeDevice=ref(uris.pcie_device(dev)))
        if dev.type in (DeviceType.GPU, DeviceType.FPGA):
            links.Processor = ref(primary_uri(dev))
        elif dev.type == DeviceType.NVME:
            links.Drives = [ref(primary_uri(dev))]
        elif cxl:
            links.CXLLogicalDevice = ref(logical_device_uri(dev))
            links.MemoryDomains = [ref(_memory_domain_uri(dev))]
        return PCIeFunction(
            odata_id=self.uri,
            Id="0",
            Name=f"{dev.id} function 0",
            FunctionProtocol="CXL" if cxl else "PCIe",
            DeviceClass=device_class(m.class_code),
            VendorId=hex16(m.vendor_id),
            DeviceId=hex16(m.device_id),
            SubsystemVendorId=hex16(dev.subsystem_vendor_id),
            SubsystemId=hex16(m.subsystem_id),
            ClassCode=f"0x{m.class_code:06x}",
            RevisionId=f"0x{m.revision_id:02x}",
            Status=self.status(),
            Links=links,
        )


#: The ``ResetType`` values a device's ``Reset`` offers (advertised as
#: ``ResetType@Redfish.AllowableValues``, DSP0266 "Allowable values"): a real service offers a
#: subset of Resource.ResetType for a function it cannot power on or off by itself, and refuses the
#: others with 400 ``ActionParameterValueNotInList`` (Base 1.22.1).
_ResetType = Literal["ForceRestart", "GracefulRestart"]
RESET_TYPES: tuple[str, ...] = get_args(_ResetType)


class _ResetParams(BaseModel):
    """The parameters of ``#Processor.Reset`` / ``#Drive.Reset``: ``ResetType``, optional — "the
    service can accept a request without the parameter and perform an implementation-specific
    default reset" (Processor_v1.xml) — and one of :data:`RESET_TYPES` when given."""

    model_config = ConfigDict(extra="forbid")
    ResetType: _ResetType | None = None


class _ResettableNode(DeviceNode, at=primary_uri):
    """A device's own resource offering its schema's ``Reset`` action (Processor v1_6_0+, Drive
    v1_7_0+), as a composable service offers it to clean a device between tenants. The engine
    resets it at once and counts it on the device's binding (:meth:`Engine.reset_device`)."""

    schema: ClassVar[str]

    def action_names(self) -> tuple[str, ...]:
        return (f"{self.schema}.Reset",)

    def reset_actions(self) -> dict[str, Action]:
        return {
            name: action.model_copy(update={"reset_types": list(RESET_TYPES)})
            for name, action in actions(self.uri, *self.action_names()).items()
        }

    def child(self, segment: str) -> Node | None:
        return self.actions_child(segment)

    async def action(self, name: str, request: Request) -> Reply:
        params = parse_body(_ResetParams, request.json() if request.body.strip() else {}, action=name)
        await self.ctx.engine.reset_device(self.device.id, params.ResetType)
        return Reply(204)


class ProcessorNode(_ResettableNode):
    schema = "Processor"

    def render(self) -> Processor:
        return processor_model(self.ctx, self.device, self.uri).model_copy(
            update={"Actions": self.reset_actions()}
        )


class DriveNode(_ResettableNode):
    schema = "Drive"

    def render(self) -> Drive:
        dev = self.device
        return Drive(
            odata_id=self.uri,
            **product(dev),
            CapacityBytes=int(dev.model.memory) if dev.model.memory else None,
            Status=self.status(),
            Links=DriveLinks(
                Chassis=ref(uris.chassis(dev.switch)),
                PCIeFunctions=[ref(function_uri(dev))],
                Endpoints=[ref(uris.endpoint(dev.fabric, dev.id))],
            ),
            Actions=self.reset_actions(),
        )


class NetworkAdapterNode(DeviceNode, at=primary_uri):
    def render(self) -> NetworkAdapter:
        dev = self.device
        return NetworkAdapter(
            odata_id=self.uri,
            **product(dev),
            Status=self.status(),
            Controllers=[
                Controller(
                    PCIeInterface=_interface(dev, self.ctx.engine.conditions.link(dev.id)),
                    Links=ControllerLinks(PCIeDevices=[ref(uris.pcie_device(dev))]),
                )
            ],
        )


#: the node of each pooled devices' collection of an enclosure (SwitchChassisNode.COLLECTIONS)
_POOLED_NODES: dict[str, type[DeviceNode]] = {
    "PCIeDevices": PCIeDeviceNode,
    "Processors": ProcessorNode,
    "Drives": DriveNode,
    "NetworkAdapters": NetworkAdapterNode,
}


class CXLLogicalDeviceNode(DeviceNode, at=logical_device_uri):
    def render(self) -> CXLLogicalDevice:
        dev = self.device
        return CXLLogicalDevice(
            odata_id=self.uri,
            Id="0",
            Name=f"{dev.id} logical device 0",
            Status=self.status(),
            Identifiers=[Identifier(DurableName=_gcxlid(dev.serial), DurableNameFormat="GCXLID")],
            SemanticsSupported=["CXLio", "CXLmem"],
            MemorySizeMiB=int(dev.model.memory or 0) // _MIB,
            Links=CXLLogicalDeviceLinks(
                PCIeFunctions=[ref(function_uri(dev))],
                MemoryDomains=[ref(_memory_domain_uri(dev))],
                MemoryChunks=refs([uris.chunk(dev.id, c.index) for c in self.ctx.index.chunks_of(dev)]),
                Endpoints=[ref(uris.endpoint(dev.fabric, dev.id))],
            ),
        )


class _ChunkCreate(Body):
    """The body of a POST to a pool's MemoryChunks. MemoryChunks v1_6 marks nothing
    ``RequiredOnCreate``; this service needs the size (it cannot guess one), takes the chunk's
    names, and makes Volatile memory only (the one ``AddressRangeType`` a RAM pool has)."""

    MemoryChunkSizeMiB: int = Field(strict=True)
    AddressRangeType: Literal["Volatile"] = "Volatile"
    Name: str | None = Field(default=None, max_length=255)
    Description: str | None = Field(default=None, max_length=1024)


class MemoryDomainNode(DeviceNode, at=_memory_domain_uri):
    def render(self) -> MemoryDomain:
        dev, pool = self.device, self.device.pool
        chunks = self.ctx.index.chunks_of(dev)
        if pool is not None:
            carver = self.ctx.engine.carver
            total, used = carver.total_mib(dev), carver.used_mib(dev)
            description = (
                f"Pool of {total} MiB: {used} MiB in {len(chunks)} chunks, {total - used} MiB free; "
                f"POST a chunk of {pool.min_chunk_mib} MiB plus multiples of {pool.increment_mib} MiB "
                "to MemoryChunks"
            )
        elif chunks:
            description = f"{len(chunks)} chunks of {chunks[0].size_bytes // _MIB} MiB"
        else:
            description = None
        return MemoryDomain(
            odata_id=self.uri,
            Id="0",
            Name=f"Memory of {dev.id}",
            Description=description,
            Status=self.status(),
            MemoryChunks=ref(f"{self.uri}/MemoryChunks"),
            AllowsMemoryChunkCreation=pool is not None,
            MinMemoryChunkSizeMiB=pool.min_chunk_mib if pool is not None else None,
            MemoryChunkIncrementMiB=pool.increment_mib if pool is not None else None,
            MemorySizeMiB=int(dev.model.memory or 0) // _MIB,
            Links=MemoryDomainLinks(
                CXLLogicalDevices=[ref(logical_device_uri(dev))], PCIeFunctions=[ref(function_uri(dev))]
            ),
        )

    def child(self, segment: str) -> Node | None:
        if segment != "MemoryChunks":
            return None
        ctx, dev = self.ctx, self.device

        def chunk(ident: str) -> Node | None:
            found = next((c for c in ctx.index.chunks_of(dev) if str(c.index) == ident), None)
            return ChunkNode(ctx, dev, found) if found is not None else None

        return CollectionNode(
            ctx,
            f"{self.uri}/MemoryChunks",
            "MemoryChunksCollection",
            f"Memory chunks of {dev.id}",
            lambda: [str(c.index) for c in ctx.index.chunks_of(dev)],
            chunk,
            on_post=self._create if dev.pool is not None else None,
        )

    async def _create(self, request: Request) -> Reply:
        """POST to the pool's MemoryChunks: 201 with ``Location``, ``ETag`` and the chunk made
        (DSP0266 "POST (create)"), or the domain's refusal (emulator.redfish.model.errors)."""
        body = parse_body(_ChunkCreate, request.json())
        chunk = await self.ctx.engine.create_chunk(
            self.device, body.MemoryChunkSizeMiB, name=body.Name, description=body.Description
        )
        node = ChunkNode(self.ctx, self.device, chunk)
        raw, etag = self.ctx.renderer.render(node)
        headers = {"Location": node.uri, **({"ETag": etag} if self.ctx.renderer.etags else {})}
        return Reply(201, None, headers, raw=raw)


class ChunkNode(DeviceNode):
    """A memory chunk: pre-made (read only), or carved from a pool (DELETE gives it back)."""

    def __init__(self, ctx: Context, device: Device, chunk: Chunk) -> None:
        super().__init__(ctx, device, uris.chunk(device.id, chunk.index))
        self.chunk = chunk
        if chunk.carved:
            self.allow = ("GET", "HEAD", "DELETE")

    def _releasing(self) -> bool:
        task_id = self.ctx.engine.bindings.inflight.get(self.chunk.id)
        return task_id is not None and self.ctx.engine.state.tasks[task_id].kind == OperationKind.RELEASE

    def render(self) -> MemoryChunks:
        dev, chunk = self.device, self.chunk
        record = self.ctx.engine.state.chunks.get(chunk.id) if chunk.carved else None
        releasing = self._releasing()
        if record is not None:
            name = record.name or chunk.id
            description = record.description or (
                f"Carved from the pool of {dev.id}; connect it with a CXL Connection, DELETE it to "
                "give the memory back"
            )
        else:
            name = chunk.id
            description = f"Chunk {chunk.index} of {dev.id}; bind it with a CXL Connection"
        status = self.status()
        if releasing:
            status = status.model_copy(update={"State": "Disabled"})
        return MemoryChunks(
            odata_id=self.uri,
            Id=str(chunk.index),
            Name=name,
            Description=description,
            Status=status,
            MemoryChunkSizeMiB=chunk.size_bytes // _MIB,
            AddressRangeOffsetMiB=chunk.offset_bytes // _MIB,
            MediaLocation="Local",
            # MemoryChunks v1_5_0: Offline asks consumers to let go; a release sanitizes it meanwhile
            RequestedOperationalState="Offline" if releasing else "Online",
            Links=MemoryChunksLinks(
                CXLLogicalDevices=[ref(logical_device_uri(dev))],
                Endpoints=[ref(uris.endpoint(dev.fabric, dev.id))],
            ),
        )

    async def delete(self, request: Request) -> Reply:
        if not self.chunk.carved:
            return await super().delete(request)
        op = Operation(
            kind=OperationKind.RELEASE,
            style=BindingStyle.CONNECTION,
            fabric=self.device.fabric,
            host="",
            targets=[self.chunk.id],
            method="DELETE",
            uri=self.uri,
        )
        return await reply_for(self.ctx, op, request)
