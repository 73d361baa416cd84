"""What several views share: where each device's resources live, its status, link parsing."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.resources import PciId, Status
from emulator.redfish.tree.nodes import Context, Node
from emulator.topology import Device
from manager_api.devices import DeviceType

__all__ = [
    "LinkIn",
    "Segment",
    "device_class",
    "device_status",
    "entity_type",
    "function_uri",
    "hex16",
    "link_id",
    "logical_device_uri",
    "pci_id",
    "primary_uri",
    "resolve_endpoint",
]


class LinkIn(BaseModel):
    """A link in a request body: ``{"@odata.id": "..."}``."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    odata_id: str = Field(alias="@odata.id", min_length=1)


def hex16(value: int) -> str:
    return f"0x{value:04x}"


def device_status(ctx: Context, device: Device) -> Status:
    return Status(State="Enabled", Health=ctx.engine.conditions.health(device.id))


def function_uri(device: Device) -> str:
    return f"{uris.pcie_device(device)}/PCIeFunctions/0"


def logical_device_uri(device: Device) -> str:
    return f"{uris.pcie_device(device)}/CXLLogicalDevices/0"


def primary_uri(device: Device) -> str:
    """The resource that *is* the device: its Processor, Drive, NetworkAdapter or CXL logical device."""
    base = uris.chassis(uris.chassis_of(device))
    if device.type in (DeviceType.GPU, DeviceType.FPGA):
        return f"{base}/Processors/{device.id}"
    if device.type == DeviceType.NVME:
        return f"{base}/Drives/{device.id}"
    if device.type == DeviceType.NIC:
        return f"{base}/NetworkAdapters/{device.id}"
    return logical_device_uri(device)


def entity_type(device: Device) -> str:
    """Endpoint ``ConnectedEntities[].EntityType`` (Endpoint v1 EntityType enum)."""
    return {
        DeviceType.GPU: "Processor",
        DeviceType.FPGA: "Processor",
        DeviceType.NVME: "Drive",
        DeviceType.NIC: "NetworkController",
        DeviceType.CXL_MEMORY: "CXLDevice",
    }.get(device.type, "Processor")


def device_class(class_code: int) -> str:
    """PCIeFunction ``DeviceClass`` from the PCI base class code."""
    return {
        0x01: "MassStorageController",
        0x02: "NetworkController",
        0x03: "DisplayController",
        0x05: "MemoryController",
        0x0B: "Processor",
        0x12: "ProcessingAccelerators",
    }.get(class_code >> 16, "Other")


def pci_id(device: Device) -> PciId:
    m = device.model
    return PciId(
        VendorId=hex16(m.vendor_id),
        DeviceId=hex16(m.device_id),
        SubsystemVendorId=hex16(device.subsystem_vendor_id),
        SubsystemId=hex16(m.subsystem_id),
        ClassCode=f"0x{m.class_code:06x}",
    )


def link_id(uri: str, prefix: str) -> str | None:
    """The last segment of ``uri`` if it is directly under ``prefix`` (trailing slash ignored)."""
    uri = uri.rstrip("/")
    if not uri.startswith(prefix + "/"):
        return None
    rest = uri[len(prefix) + 1 :]
    return rest if rest and "/" not in rest else None


def resolve_endpoint(ctx: Context, fabric_id: str, uri: str, prop: str) -> tuple[str | None, Device | None]:
    """(host, None) for a host initiator or (None, device) for a device target of ``fabric_id``.

    Raises 400 ResourceNotFound naming ``prop`` when ``uri`` is no endpoint of that fabric.
    """
    ident = link_id(uri, f"{uris.fabric(fabric_id)}/Endpoints")
    if ident is not None:
        if ident in ctx.index.hosts and any(
            ident in sw.upstream_ports for sw in ctx.index.fabric_switches(fabric_id)
        ):
            return ident, None
        device = ctx.index.devices.get(ident)
        if device is not None and device.fabric == fabric_id:
            return None, device
    raise RedfishError.of(
        400,
        "ResourceNotFound",
        "Endpoint",
        uri,
        related=[f"/{prop}"],
        detail=f"{uri} is not an endpoint of fabric {fabric_id}.",
    )


class Segment(Node):
    """A path segment that is not a resource itself (``.../ResourceBlocks/nic0/NetworkInterfaces``)."""

    allow = ()
    is_resource = False

    def __init__(self, ctx: Context, uri: str, children: dict[str, Node]) -> None:
        super().__init__(ctx, uri)
        self.children = children

    def child(self, segment: str) -> Node | None:
        return self.children.get(segment)
