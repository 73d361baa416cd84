"""PCI configuration space images, as a host's ``/sys/bus/pci/devices/<BDF>/config`` returns them.

Only what scanning code reads is filled in: the type-0 header (IDs, class code, revision,
subsystem IDs, capability pointer), a PCI Express capability with link capability and status
(so ``lspci``-style tools see the link speed and width) and, when the device's serial number is
16 hex digits, the Device Serial Number extended capability at offset 0x100.
References: PCI Local Bus Specification 3.0 §6.1 (header), PCI Express Base Specification 5.0
§7.5.3 (PCI Express capability) and §7.9.3 (Device Serial Number capability).
"""

from __future__ import annotations

import re
import struct

__all__ = ["CONFIG_SIZE", "config_space", "dsn_from_serial", "link_speed_text"]

CONFIG_SIZE = 4096
_PCIE_CAP = 0x40
_DSN_CAP = 0x100
_CAP_ID_PCIE = 0x10
_EXT_CAP_ID_DSN = 0x0003
_STATUS_CAP_LIST = 0x0010
_COMMAND_MEMORY = 0x0002

#: Link speed by PCIe generation, as Linux writes ``current_link_speed``.
_SPEEDS = {
    1: "2.5 GT/s PCIe",
    2: "5.0 GT/s PCIe",
    3: "8.0 GT/s PCIe",
    4: "16.0 GT/s PCIe",
    5: "32.0 GT/s PCIe",
    6: "64.0 GT/s PCIe",
}


def link_speed_text(generation: int) -> str:
    return _SPEEDS[generation]


def dsn_from_serial(serial: str) -> int | None:
    """The 64-bit Device Serial Number a 16-hex-digit serial stands for, else None."""
    if re.fullmatch(r"[0-9A-Fa-f]{16}", serial):
        return int(serial, 16)
    return None


def config_space(
    *,
    vendor_id: int,
    device_id: int,
    class_code: int,
    revision_id: int,
    subsystem_vendor_id: int,
    subsystem_id: int,
    pcie_generation: int,
    pcie_width: int,
    serial: str,
) -> bytes:
    cfg = bytearray(CONFIG_SIZE)
    struct.pack_into("<HHHH", cfg, 0x00, vendor_id, device_id, _COMMAND_MEMORY, _STATUS_CAP_LIST)
    # 0x08: revision, then the class code as programming interface, subclass, base class
    struct.pack_into("<I", cfg, 0x08, (class_code << 8) | revision_id)
    cfg[0x0E] = 0x00  # header type 0, single function
    struct.pack_into("<HH", cfg, 0x2C, subsystem_vendor_id, subsystem_id)
    cfg[0x34] = _PCIE_CAP
    cfg[0x3D] = 0x01  # INTA#

    # PCI Express capability: version 2, device/port type 0 (PCI Express endpoint)
    cfg[_PCIE_CAP] = _CAP_ID_PCIE
    cfg[_PCIE_CAP + 1] = 0x00  # last capability in the list
    struct.pack_into("<H", cfg, _PCIE_CAP + 0x02, 0x0002)
    struct.pack_into("<I", cfg, _PCIE_CAP + 0x04, 0x00000001)  # device capabilities: 256-byte max payload
    link = (pcie_width << 4) | pcie_generation
    struct.pack_into("<I", cfg, _PCIE_CAP + 0x0C, link)  # link capabilities: max speed, max width
    struct.pack_into("<H", cfg, _PCIE_CAP + 0x12, link)  # link status: current speed, negotiated width
    # link capabilities 2: supported link speeds vector, bit n set for generation n
    struct.pack_into("<I", cfg, _PCIE_CAP + 0x2C, sum(1 << g for g in range(1, pcie_generation + 1)))

    dsn = dsn_from_serial(serial)
    if dsn is not None:
        # extended capability header: ID, version 1, next capability offset 0 (end of list)
        struct.pack_into("<I", cfg, _DSN_CAP, _EXT_CAP_ID_DSN | (1 << 16))
        struct.pack_into("<II", cfg, _DSN_CAP + 4, dsn & 0xFFFFFFFF, dsn >> 32)
    return bytes(cfg)
