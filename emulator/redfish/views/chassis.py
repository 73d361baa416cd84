"""``/redfish/v1/Chassis``: the enclosures and the pooled hardware in them.

Each switch has an enclosure chassis (``Chassis/{switch}``); PCIe devices live in their switch's
enclosure as a PCIeDevice (with one PCIeFunction, ``0``) plus the resource that *is* the device:
a Processor (GPU ``ProcessorType: GPU``, FPGA ``FPGA``), a Drive (NVMe) or a NetworkAdapter
(NIC). Each CXL Type-3 memory device is a module chassis of its own (``Chassis/{device}``, as in
DMTF's public-cxl mockup) with its PCIeDevice, CXL logical device ``0`` and memory domain ``0``,
whose memory chunks are the unit a host binds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict

from emulator.redfish.model import uris
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
    Status,
    ref,
    refs,
)
from emulator.redfish.sysfs.pciconfig import dsn_from_serial
from emulator.redfish.tree.http import Reply, Request, parse_body
from emulator.redfish.tree.nodes import CollectionNode, Context, Node, actions
from emulator.redfish.views.common import (
    device_class,
    device_status,
    function_uri,
    hex16,
    logical_device_uri,
    primary_uri,
)
from emulator.redfish.views.composition import block_uri
from emulator.topology import FABRIC_CXL, Device, SwitchInfo
from manager_api.devices import DeviceType

__all__ = ["ChassisCollectionNode", "processor_model"]

_MIB = 1 << 20


def _interface(device: Device) -> PCIeInterface:
    gen = f"Gen{device.model.pcie_generation}"
    width = device.model.pcie_width
    return PCIeInterface(PCIeType=gen, MaxPCIeType=gen, LanesInUse=width, MaxLanes=width)


def processor_model(ctx: Context, device: Device, uri: str) -> Processor:
    memory = device.model.memory
    return Processor(
        odata_id=uri,
        Id=device.id,
        Name=f"{device.id} ({device.model.model})",
        ProcessorType="GPU" if device.type == DeviceType.GPU else "FPGA",
        Manufacturer=device.model.manufacturer,
        Model=device.model.model,
        SerialNumber=device.serial,
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


def _device_collection(
    ctx: Context,
    uri: str,
    collection_type: str,
    name: str,
    devices: list[Device],
    make: Callable[[Context, Device], Node],
) -> CollectionNode:
    by_id = {d.id: d for d in devices}
    return CollectionNode(
        ctx,
        uri,
        collection_type,
        name,
        lambda: list(by_id),
        lambda i: make(ctx, by_id[i]) if i in by_id else None,
    )


class SwitchChassisNode(Node):
    def __init__(self, ctx: Context, switch: SwitchInfo) -> None:
        super().__init__(ctx, uris.chassis(switch.id))
        self.switch = switch
        self.devices = [ctx.index.devices[d] for d in switch.devices] if switch.fabric != FABRIC_CXL else []

    def _of(self, *types: DeviceType) -> list[Device]:
        return [d for d in self.devices if d.type in types]

    def render(self) -> Chassis:
        sw = self.switch
        has = {d.type for d in self.devices}
        return Chassis(
            odata_id=self.uri,
            Id=sw.id,
            Name=f"{sw.fabric} enclosure {sw.id}",
            Description=f"Enclosure of {sw.fabric} switch {sw.id} and the devices behind it",
            ChassisType="Enclosure",
            Manufacturer=sw.manufacturer,
            Model=sw.model,
            Status=Status(),
            PCIeDevices=ref(f"{self.uri}/PCIeDevices") if self.devices else None,
            Processors=ref(f"{self.uri}/Processors") if has & {DeviceType.GPU, DeviceType.FPGA} else None,
            Drives=ref(f"{self.uri}/Drives") if DeviceType.NVME in has else None,
            NetworkAdapters=ref(f"{self.uri}/NetworkAdapters") if DeviceType.NIC in has else None,
            Links=ChassisLinks(
                ManagedBy=[ref(uris.MANAGER)],
                Switches=[ref(uris.switch(sw.fabric, sw.id))],
                ResourceBlocks=refs([block_uri(self.ctx, d.id) for d in self.devices]) or None,
            ),
        )

    def child(self, segment: str) -> Node | None:
        ctx, uri = self.ctx, self.uri
        if segment == "PCIeDevices" and self.devices:
            return _device_collection(
                ctx,
                f"{uri}/PCIeDevices",
                "PCIeDeviceCollection",
                f"PCIe devices in {self.switch.id}",
                self.devices,
                PCIeDeviceNode,
            )
        if segment == "Processors" and self._of(DeviceType.GPU, DeviceType.FPGA):
            return _device_collection(
                ctx,
                f"{uri}/Processors",
                "ProcessorCollection",
                f"Processors in {self.switch.id}",
                self._of(DeviceType.GPU, DeviceType.FPGA),
                ProcessorNode,
            )
        if segment == "Drives" and self._of(DeviceType.NVME):
            return _device_collection(
                ctx,
                f"{uri}/Drives",
                "DriveCollection",
                f"Drives in {self.switch.id}",
                self._of(DeviceType.NVME),
                DriveNode,
            )
        if segment == "NetworkAdapters" and self._of(DeviceType.NIC):
            return _device_collection(
                ctx,
                f"{uri}/NetworkAdapters",
                "NetworkAdapterCollection",
                f"Network adapters in {self.switch.id}",
                self._of(DeviceType.NIC),
                NetworkAdapterNode,
            )
        return None


class CxlChassisNode(Node):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, uris.chassis(device.id))
        self.device = device

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
            Status=device_status(self.ctx, dev),
            PCIeDevices=ref(f"{self.uri}/PCIeDevices"),
            MemoryDomains=ref(f"{self.uri}/MemoryDomains"),
            Links=ChassisLinks(ManagedBy=[ref(uris.MANAGER)]),
        )

    def child(self, segment: str) -> Node | None:
        ctx = self.ctx
        if segment == "PCIeDevices":
            return _device_collection(
                ctx,
                f"{self.uri}/PCIeDevices",
                "PCIeDeviceCollection",
                f"PCIe devices in {self.device.id}",
                [self.device],
                PCIeDeviceNode,
            )
        if segment == "MemoryDomains":
            return CollectionNode(
                ctx,
                f"{self.uri}/MemoryDomains",
                "MemoryDomainCollection",
                f"Memory domains of {self.device.id}",
                lambda: ["0"],
                lambda m: MemoryDomainNode(ctx, self.device) if m == "0" else None,
            )
        return None


class PCIeDeviceNode(Node):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, uris.pcie_device(device))
        self.device = device

    def render(self) -> PCIeDevice:
        dev = self.device
        cxl = dev.type == DeviceType.CXL_MEMORY
        return PCIeDevice(
            odata_id=self.uri,
            Id=dev.id,
            Name=f"{dev.id} ({dev.model.model})",
            Manufacturer=dev.model.manufacturer,
            Model=dev.model.model,
            SerialNumber=dev.serial,
            UUID=str(dev.uuid) if dev.uuid else None,
            FirmwareVersion=dev.model.firmware_version,
            Status=device_status(self.ctx, dev),
            PCIeInterface=_interface(dev),
            PCIeFunctions=ref(f"{self.uri}/PCIeFunctions"),
            CXLDevice=CXLDevice() if cxl else None,
            CXLLogicalDevices=ref(f"{self.uri}/CXLLogicalDevices") if cxl else None,
            Links=PCIeDeviceLinks(
                Chassis=[ref(uris.chassis(uris.chassis_of(dev)))],
                Processors=[ref(primary_uri(dev))] if dev.type in (DeviceType.GPU, DeviceType.FPGA) else [],
            ),
        )

    def child(self, segment: str) -> Node | None:
        ctx, dev = self.ctx, self.device
        if segment == "PCIeFunctions":
            return CollectionNode(
                ctx,
                f"{self.uri}/PCIeFunctions",
                "PCIeFunctionCollection",
                f"PCIe functions of {dev.id}",
                lambda: ["0"],
                lambda f: PCIeFunctionNode(ctx, dev) if f == "0" else None,
            )
        if segment == "CXLLogicalDevices" and dev.type == DeviceType.CXL_MEMORY:
            return CollectionNode(
                ctx,
                f"{self.uri}/CXLLogicalDevices",
                "CXLLogicalDeviceCollection",
                f"CXL logical devices of {dev.id}",
                lambda: ["0"],
                lambda ld: CXLLogicalDeviceNode(ctx, dev) if ld == "0" else None,
            )
        return None


class PCIeFunctionNode(Node):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, function_uri(device))
        self.device = device

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
            links.MemoryDomains = [ref(f"{uris.chassis(dev.id)}/MemoryDomains/0")]
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
            Status=device_status(self.ctx, dev),
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


class _ResettableNode(Node):
    """A device's own resource offering its schema's ``Reset`` action (Processor v1_6_0+, Drive
    v1_7_0+), as a composable service offers it to clean a device between tenants. The engine
    resets it at once and counts it on the device's binding (:meth:`Engine.reset_device`)."""

    schema: ClassVar[str]

    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, primary_uri(device))
        self.device = device

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
            Id=dev.id,
            Name=f"{dev.id} ({dev.model.model})",
            Manufacturer=dev.model.manufacturer,
            Model=dev.model.model,
            SerialNumber=dev.serial,
            CapacityBytes=int(dev.model.memory) if dev.model.memory else None,
            Status=device_status(self.ctx, dev),
            Links=DriveLinks(
                Chassis=ref(uris.chassis(dev.switch)),
                PCIeFunctions=[ref(function_uri(dev))],
                Endpoints=[ref(uris.endpoint(dev.fabric, dev.id))],
            ),
            Actions=self.reset_actions(),
        )


class NetworkAdapterNode(Node):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, primary_uri(device))
        self.device = device

    def render(self) -> NetworkAdapter:
        dev = self.device
        return NetworkAdapter(
            odata_id=self.uri,
            Id=dev.id,
            Name=f"{dev.id} ({dev.model.model})",
            Manufacturer=dev.model.manufacturer,
            Model=dev.model.model,
            SerialNumber=dev.serial,
            Status=device_status(self.ctx, dev),
            Controllers=[
                Controller(
                    PCIeInterface=_interface(dev),
                    Links=ControllerLinks(PCIeDevices=[ref(uris.pcie_device(dev))]),
                )
            ],
        )


class CXLLogicalDeviceNode(Node):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, logical_device_uri(device))
        self.device = device

    def render(self) -> CXLLogicalDevice:
        dev = self.device
        return CXLLogicalDevice(
            odata_id=self.uri,
            Id="0",
            Name=f"{dev.id} logical device 0",
            Status=device_status(self.ctx, dev),
            Identifiers=[Identifier(DurableName=_gcxlid(dev.serial), DurableNameFormat="GCXLID")],
            SemanticsSupported=["CXLio", "CXLmem"],
            MemorySizeMiB=int(dev.model.memory or 0) // _MIB,
            Links=CXLLogicalDeviceLinks(
                PCIeFunctions=[ref(function_uri(dev))],
                MemoryDomains=[ref(f"{uris.chassis(dev.id)}/MemoryDomains/0")],
                MemoryChunks=refs([uris.chunk(dev.id, c.index) for c in dev.chunks]),
                Endpoints=[ref(uris.endpoint(dev.fabric, dev.id))],
            ),
        )


class MemoryDomainNode(Node):
    def __init__(self, ctx: Context, device: Device) -> None:
        super().__init__(ctx, f"{uris.chassis(device.id)}/MemoryDomains/0")
        self.device = device

    def render(self) -> MemoryDomain:
        dev = self.device
        return MemoryDomain(
            odata_id=self.uri,
            Id="0",
            Name=f"Memory of {dev.id}",
            Description=f"{len(dev.chunks)} chunks of {dev.chunks[0].size_mib} MiB" if dev.chunks else None,
            Status=device_status(self.ctx, dev),
            MemoryChunks=ref(f"{self.uri}/MemoryChunks"),
            MemorySizeMiB=int(dev.model.memory or 0) // _MIB,
            Links=MemoryDomainLinks(
                CXLLogicalDevices=[ref(logical_device_uri(dev))], PCIeFunctions=[ref(function_uri(dev))]
            ),
        )

    def child(self, segment: str) -> Node | None:
        if segment != "MemoryChunks":
            return None
        ctx, dev = self.ctx, self.device
        ids = [str(c.index) for c in dev.chunks]
        return CollectionNode(
            ctx,
            f"{self.uri}/MemoryChunks",
            "MemoryChunksCollection",
            f"Memory chunks of {dev.id}",
            lambda: ids,
            lambda c: ChunkNode(ctx, dev, int(c)) if c in ids else None,
        )


class ChunkNode(Node):
    def __init__(self, ctx: Context, device: Device, index: int) -> None:
        super().__init__(ctx, uris.chunk(device.id, index))
        self.device, self.chunk = device, device.chunks[index]

    def render(self) -> MemoryChunks:
        dev, chunk = self.device, self.chunk
        return MemoryChunks(
            odata_id=self.uri,
            Id=str(chunk.index),
            Name=chunk.id,
            Description=f"Chunk {chunk.index} of {dev.id}; bind it with a CXL Connection",
            Status=device_status(self.ctx, dev),
            MemoryChunkSizeMiB=chunk.size_mib,
            AddressRangeOffsetMiB=chunk.offset_bytes // _MIB,
            MediaLocation="Local",
            Links=MemoryChunksLinks(
                CXLLogicalDevices=[ref(logical_device_uri(dev))],
                Endpoints=[ref(uris.endpoint(dev.fabric, dev.id))],
            ),
        )
