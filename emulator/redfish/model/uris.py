"""Every URI the emulator serves, built in one place (views, engine and events share them).

Layout (ids from the topology; ``{n}`` are service-assigned numbers)::

    /redfish/v1/Systems/{host}                                   one per host
    /redfish/v1/Systems/{host}/Processors/{CPU0|device}          bound GPUs/FPGAs appear here
    /redfish/v1/Systems/{host}/MemoryDomains/CXL/MemoryChunks/{chunk}
    /redfish/v1/Chassis/{switch}                                 the enclosure of a switch
    /redfish/v1/Chassis/{switch}/PCIeDevices/{device}[/PCIeFunctions/0]
    /redfish/v1/Chassis/{switch}/Processors|Drives|NetworkAdapters/{device}
    /redfish/v1/Chassis/{cxl-device}                             one module per CXL memory device
    /redfish/v1/Chassis/{cxl-device}/PCIeDevices/{cxl-device}/CXLLogicalDevices/0
    /redfish/v1/Chassis/{cxl-device}/MemoryDomains/0/MemoryChunks/{n}
    /redfish/v1/Fabrics/{PCIe|CXL}/Switches/{switch}/Ports/{UPn|DPn}
    /redfish/v1/Fabrics/{PCIe|CXL}/Switches/{switch}/Ports/{DPn}/Metrics
    /redfish/v1/Fabrics/{PCIe|CXL}/Endpoints/{host|device}
    /redfish/v1/Fabrics/PCIe/Zones/{host|n}
    /redfish/v1/Fabrics/CXL/Connections/{n}
    /redfish/v1/CompositionService/ResourceBlocks/{device}
    /redfish/v1/CompositionService/ResourceZones/{switch}
    /redfish/v1/TaskService/Tasks/{n}, /redfish/v1/TaskService/TaskMonitors/{n}
    /redfish/v1/Oem/FabricDRA/{Bindings|Faults}                  test and admin tooling
"""

from __future__ import annotations

from emulator.topology import FABRIC_CXL, Device

__all__ = [
    "ACCOUNTS",
    "COMPOSITION",
    "EVENT_SERVICE",
    "MANAGER",
    "MANAGERS",
    "OEM",
    "OEM_BINDINGS",
    "OEM_FAULTS",
    "REGISTRIES",
    "RESOURCE_BLOCKS",
    "RESOURCE_ZONES",
    "ROLES",
    "ROOT",
    "SESSIONS",
    "SESSION_SERVICE",
    "SSE",
    "TASKS",
    "TASK_MONITORS",
    "TASK_SERVICE",
    "chassis",
    "chassis_of",
    "chunk",
    "connection",
    "endpoint",
    "fabric",
    "memory_domain",
    "pcie_device",
    "port",
    "resource_block",
    "switch",
    "system",
    "task",
    "task_monitor",
    "zone",
]

ROOT = "/redfish/v1"
SESSION_SERVICE = f"{ROOT}/SessionService"
SESSIONS = f"{SESSION_SERVICE}/Sessions"
ACCOUNT_SERVICE = f"{ROOT}/AccountService"
ACCOUNTS = f"{ACCOUNT_SERVICE}/Accounts"
ROLES = f"{ACCOUNT_SERVICE}/Roles"
TASK_SERVICE = f"{ROOT}/TaskService"
TASKS = f"{TASK_SERVICE}/Tasks"
TASK_MONITORS = f"{TASK_SERVICE}/TaskMonitors"
EVENT_SERVICE = f"{ROOT}/EventService"
SSE = f"{EVENT_SERVICE}/SSE"
REGISTRIES = f"{ROOT}/Registries"
MANAGERS = f"{ROOT}/Managers"
MANAGER = f"{MANAGERS}/FabricManager"
COMPOSITION = f"{ROOT}/CompositionService"
RESOURCE_BLOCKS = f"{COMPOSITION}/ResourceBlocks"
RESOURCE_ZONES = f"{COMPOSITION}/ResourceZones"
OEM = f"{ROOT}/Oem/FabricDRA"
OEM_BINDINGS = f"{OEM}/Bindings"
OEM_FAULTS = f"{OEM}/Faults"


def system(host: str) -> str:
    return f"{ROOT}/Systems/{host}"


def chassis(switch_id: str) -> str:
    return f"{ROOT}/Chassis/{switch_id}"


def chassis_of(device: Device) -> str:
    """PCIe devices live in their switch's enclosure; each CXL memory device is its own module."""
    return device.id if device.fabric == FABRIC_CXL else device.switch


def pcie_device(device: Device) -> str:
    return f"{chassis(chassis_of(device))}/PCIeDevices/{device.id}"


def memory_domain(device_id: str) -> str:
    """A CXL memory device's one memory domain."""
    return f"{chassis(device_id)}/MemoryDomains/0"


def chunk(device_id: str, index: int) -> str:
    return f"{memory_domain(device_id)}/MemoryChunks/{index}"


def fabric(fabric_id: str) -> str:
    return f"{ROOT}/Fabrics/{fabric_id}"


def switch(fabric_id: str, switch_id: str) -> str:
    return f"{fabric(fabric_id)}/Switches/{switch_id}"


def port(fabric_id: str, switch_id: str, port_id: str) -> str:
    return f"{switch(fabric_id, switch_id)}/Ports/{port_id}"


def port_metrics(fabric_id: str, switch_id: str, port_id: str) -> str:
    return f"{port(fabric_id, switch_id, port_id)}/Metrics"


def endpoint(fabric_id: str, endpoint_id: str) -> str:
    return f"{fabric(fabric_id)}/Endpoints/{endpoint_id}"


def zone(fabric_id: str, zone_id: str) -> str:
    return f"{fabric(fabric_id)}/Zones/{zone_id}"


def connection(fabric_id: str, connection_id: str) -> str:
    return f"{fabric(fabric_id)}/Connections/{connection_id}"


def resource_block(device: str) -> str:
    return f"{RESOURCE_BLOCKS}/{device}"


def task(task_id: str) -> str:
    return f"{TASKS}/{task_id}"


def task_monitor(task_id: str) -> str:
    return f"{TASK_MONITORS}/{task_id}"
