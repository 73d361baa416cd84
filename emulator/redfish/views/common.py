"""What several views share: where each device's resources live, its status, link parsing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypedDict

from pydantic import BaseModel, ConfigDict, Field

from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.resources import PciId, Status
from emulator.redfish.tree.nodes import Context, Node
from emulator.topology import Device
from manager_api.devices import DeviceType

__all__ = [
    "Body",
    "DeviceNode",
    "LinkIn",
    "Named",
    "Product",
    "Segment",
    "ServiceFacts",
    "ServiceNode",
    "check_reachable",
    "device_class",
    "device_status",
    "entity_type",
    "function_uri",
    "hex16",
    "link_id",
    "logical_device_uri",
    "named",
    "parameter_error",
    "pci_id",
    "primary_uri",
    "product",
    "resolve_endpoint",
]


class Body(BaseModel):
    """A request body or action parameters: a property the schema does not have is refused."""

    model_config = ConfigDict(extra="forbid")


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


def parameter_error(prop: str, action: str, detail: str, *, pointer: str | None = None) -> RedfishError:
    """400 ActionParameterValueError: parameter ``prop`` of ``action`` names what cannot be used here."""
    related = [pointer or f"/{prop}"]
    return RedfishError.of(400, "ActionParameterValueError", prop, action, related=related, detail=detail)


def check_reachable(
    ctx: Context,
    device: Device,
    host: str,
    prop: str,
    action: str | None = None,
    *,
    pointer: str | None = None,
) -> None:
    """400 unless ``host`` is cabled to the switch ``device`` hangs off; ``prop`` (a parameter of
    ``action``, or a property) named the device, at ``pointer`` in the body."""
    if ctx.index.host_reaches(host, device, ctx.engine.conditions.cut_links()):
        return
    detail = f"{device.id} hangs off {device.switch}, which is not cabled to {host}."
    if any(s.interswitch_ports for s in ctx.index.fabric_switches(device.fabric)):
        detail = (
            f"{device.id} hangs off {device.switch}, which is neither cabled to {host} nor joined "
            f"by inter-switch links to a switch that is."
        )
    if action is not None:
        raise parameter_error(prop, action, detail, pointer=pointer)
    raise RedfishError.of(400, "PropertyValueError", prop, related=[pointer or f"/{prop}"], detail=detail)


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


class ServiceFacts(TypedDict):
    """What every service of the root states about itself: where, which, and that it is well."""

    odata_id: str
    Id: str
    Name: str
    Status: Status


class ServiceNode(Node):
    """A service of the root (SessionService, AccountService, TaskService, ...) at the fixed URI
    its subclass names (``class TaskServiceNode(ServiceNode, at=uris.TASK_SERVICE)``); its Id is
    that URI's last segment."""

    _at: ClassVar[str]

    def __init_subclass__(cls, *, at: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if at is not None:
            cls._at = at

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, type(self)._at)

    def service(self) -> ServiceFacts:
        """``@odata.id``, ``Id`` (``TaskService``), ``Name`` (``Task Service``) and ``Status``."""
        ident = self.uri.rsplit("/", 1)[-1]
        return {
            "odata_id": self.uri,
            "Id": ident,
            "Name": ident.replace("Service", " Service"),
            "Status": Status(),
        }


class Named(TypedDict):
    """How the resources that stand for a device are called: its Id, and its Id with its model."""

    Id: str
    Name: str


class Product(Named):
    """The identity a device's own resources state (PCIeDevice, Processor, Drive, NetworkAdapter)."""

    Manufacturer: str
    Model: str
    SerialNumber: str


def named(device: Device) -> Named:
    return {"Id": device.id, "Name": f"{device.id} ({device.model.model})"}


def product(device: Device) -> Product:
    return {
        **named(device),
        "Manufacturer": device.model.manufacturer,
        "Model": device.model.model,
        "SerialNumber": device.serial,
    }


class DeviceNode(Node):
    """A resource that stands for one pooled device. A subclass names where such resources live
    (``class PCIeDeviceNode(DeviceNode, at=uris.pcie_device)``), or its maker passes the URI."""

    _locate: ClassVar[Callable[[Device], str]]

    def __init_subclass__(cls, *, at: Callable[[Device], str] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if at is not None:
            cls._locate = at

    def __init__(self, ctx: Context, device: Device, uri: str | None = None) -> None:
        super().__init__(ctx, uri if uri is not None else type(self)._locate(device))
        self.device = device

    def status(self) -> Status:
        return device_status(self.ctx, self.device)
