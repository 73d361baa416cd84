"""Whether a device a real host has enumerated is ready to be given to a container, and if not,
why (docs/plugin.md, "On a real host"): NVMe bound to its driver with its ``/dev`` nodes and every
active namespace, a NIC bound with its interface under the name udev leaves it, udev done with it.
The emulated tree needs none of this.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import struct
from collections.abc import Callable
from pathlib import Path

from dra_driver.plugin.hostview import (
    hex_id,
    link_name,
    listdir,
    nvme_controllers,
    nvme_namespaces,
    read_attr,
)

__all__ = ["ReadinessCheck", "active_nvme_namespaces", "udev_record_properties"]

#: PCI class codes (base class, sub class) whose readiness needs a driver: NVMe, Ethernet.
_NVME_CLASS = 0x0108
_NETWORK_BASE_CLASS = 0x02


class ReadinessCheck:
    """Asks a real host's sysfs, ``/dev`` and udev whether a device is ready."""

    def __init__(
        self,
        *,
        dev_root: Path = Path("/dev"),
        active_namespaces: Callable[[str], int | None] | None = None,
        udev_root: Path = Path("/run/udev"),
    ) -> None:
        #: where a real host's device nodes are looked for (a test points it at a made-up tree)
        self.dev_root = dev_root
        #: how many active namespaces an NVMe controller reports, asked through its char device
        self.active_namespaces = active_namespaces or active_nvme_namespaces
        #: udev's runtime directory (its control socket and database; a test points it elsewhere)
        self.udev_root = udev_root

    def why_not(self, bdf: str, dev: Path) -> str | None:
        """Why a real host's device is not usable yet (driver not bound, nodes missing); None: ready."""
        pci_class = hex_id(read_attr(dev / "class")) or 0
        needs_driver = pci_class >> 8 == _NVME_CLASS or pci_class >> 16 == _NETWORK_BASE_CLASS
        driver = link_name(dev / "driver")
        if needs_driver and driver is None:
            return (
                f"it is enumerated at {bdf} but no driver is bound to it (a driver probe that failed "
                "or is still running, or no driver module for it: see the kernel log, "
                f"'dmesg | grep {bdf}')"
            )
        if pci_class >> 8 == _NVME_CLASS and driver == "nvme":
            controllers = nvme_controllers(dev)
            if not controllers:
                return f"the nvme driver is bound at {bdf} but has not set up a controller yet"
            for ctrl in controllers:
                state = read_attr(dev / "nvme" / ctrl / "state")
                if state not in (None, "live"):
                    return f"NVMe controller {ctrl} at {bdf} is {state}, not live"
                if not (self.dev_root / ctrl).exists():
                    return f"/dev/{ctrl} of {bdf} does not exist yet"
                namespaces = nvme_namespaces(dev, ctrl)
                # The driver scans a live controller's namespaces in the background: its char
                # device exists before its block devices, and a spec written then would name no
                # namespace. So wait for as many as the controller reports active.
                expected = self.active_namespaces(str(self.dev_root / ctrl))
                if len(namespaces) < (1 if expected is None else expected):
                    of = (
                        f"{expected} active namespaces"
                        if expected is not None
                        else "namespaces (at least one: it could not be asked how many are active)"
                    )
                    return (
                        f"NVMe controller {ctrl} at {bdf} is live, but the kernel has set up "
                        f"{len(namespaces)} of its {of} so far (the nvme driver's namespace scan; a "
                        "namespace of a command set this kernel does not support is never set up: "
                        f"see 'dmesg | grep {ctrl}')"
                    )
                for ns in namespaces:
                    if not (self.dev_root / ns).exists():
                        return f"/dev/{ns} of {bdf} does not exist yet"
                for ns in namespaces:
                    # udev probes a new disk (blkid) with it open: until it is done, the device
                    # would look in use to an unprepare, and its /dev/disk links are missing
                    number = read_attr(dev / "nvme" / ctrl / ns / "dev")
                    pending = self._udev_pending(f"b{number}") if number else None
                    if pending is not None:
                        return f"udev {pending} /dev/{ns} of {bdf}"
        if pci_class >> 16 == _NETWORK_BASE_CLASS and driver is not None:
            interfaces = listdir(dev / "net")
            if not interfaces:
                return f"the {driver} driver is bound at {bdf} but has not registered a network interface yet"
            # udev renames a new interface (eth1 -> enp3s0, NamePolicy of the .link file) while it
            # processes its add event, and it writes the interface's database record, marked
            # ID_RENAMING=1, *before* the rename (systemd 252 in the QEMU guests, and today's
            # source): a recorded interface may still have its kernel name. The name is final
            # once the record no longer says so (the rename's move event processed), which is
            # what systemd-networkd waits for (_udev_pending).
            for name in interfaces:
                index = read_attr(dev / "net" / name / "ifindex")
                if index is None and self.udev_running():
                    # the interface is being renamed this very moment: its old directory is gone
                    return f"the interface {name} of {bdf} is being renamed"
                pending = self._udev_pending(f"n{index}") if index else None
                if pending is not None:
                    return f"udev {pending} the interface {name} of {bdf}"
        return None

    def udev_running(self) -> bool:
        return os.path.exists(self.udev_root / "control")

    def _udev_pending(self, record: str) -> str | None:
        """What udev, where it runs on this host, still does with a device (how the reason goes on:
        "has not processed", "is renaming", "is still processing"); None once it is done or where
        no udev runs (an emulated tree, a container without udevd).

        Done means what systemd-networkd waits for before it uses an interface
        (``link_check_initialized`` in src/network/networkd-link.c): the device is initialized
        (udev wrote its database record, ``<udev_root>/data/<record>``: ``n<ifindex>``,
        ``b<major>:<minor>``; pyudev's ``Device.is_initialized``), and the record has neither
        ``ID_RENAMING`` (written before an interface's rename, dropped when its move event is
        processed: src/udev/udev-event.c, ``rename_netif``) nor ``ID_PROCESSING`` (systemd 255+:
        an event for the device is being processed, or its RUN programs still run).
        """
        if not self.udev_running():
            return None
        try:
            text = (self.udev_root / "data" / record).read_text()
        except OSError:  # not there yet (or unreadable: then it cannot be known to be done)
            return "has not processed"
        properties = udev_record_properties(text)
        if _udev_true(properties.get("ID_RENAMING")):
            return "is renaming"
        if _udev_true(properties.get("ID_PROCESSING")):
            return "is still processing"
        return None


#: ``NVME_IOCTL_ADMIN_CMD``: ``_IOWR('N', 0x41, struct nvme_passthru_cmd)`` (linux/nvme_ioctl.h),
#: the command 72 bytes: opcode, flags, rsvd1, nsid, cdw2, cdw3, metadata, addr, metadata_len,
#: data_len, cdw10-cdw15, timeout_ms, result.
_NVME_IOCTL_ADMIN_CMD = 0xC0484E41
_NVME_PASSTHRU = struct.Struct("<BBHIIIQQIIIIIIIIII")
#: Identify (admin opcode 06h), CNS 02h: the active namespace ID list, 1024 IDs of 4 bytes
#: (NVMe Base Specification 2.0, 5.17.2.2); unused entries are zero.
_NVME_IDENTIFY = 0x06
_NVME_CNS_ACTIVE_NSIDS = 0x02
_NSID_LIST_BYTES = 4096


def active_nvme_namespaces(char_device: str) -> int | None:
    """How many namespaces the NVMe controller behind ``char_device`` (``/dev/nvme0``) reports
    active (at most 1024, one Identify page); None when it cannot be asked (the node is not a
    controller, the plugin lacks CAP_SYS_ADMIN, the controller is not live)."""
    buffer = ctypes.create_string_buffer(_NSID_LIST_BYTES)
    command = bytearray(
        _NVME_PASSTHRU.pack(
            _NVME_IDENTIFY, 0, 0, 0, 0, 0, 0, ctypes.addressof(buffer), 0, _NSID_LIST_BYTES,
            _NVME_CNS_ACTIVE_NSIDS, 0, 0, 0, 0, 0, 0, 0,
        )
    )  # fmt: skip
    try:
        fd = os.open(char_device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        status = fcntl.ioctl(fd, _NVME_IOCTL_ADMIN_CMD, command)
    except OSError:
        return None
    finally:
        os.close(fd)
    if status != 0:  # an NVMe status code: the controller refused the command
        return None
    ids = struct.unpack(f"<{_NSID_LIST_BYTES // 4}I", buffer.raw)
    return sum(1 for nsid in ids if nsid)


def udev_record_properties(text: str) -> dict[str, str]:
    """The properties (``E:KEY=value`` lines) of a udev database record (``/run/udev/data/*``;
    the other lines are links ``S:``, tags ``G:``/``Q:``, the initialisation time ``I:``...)."""
    properties = {}
    for line in text.splitlines():
        if line.startswith("E:"):
            key, _, value = line[2:].partition("=")
            properties[key] = value
    return properties


def _udev_true(value: str | None) -> bool:
    """A udev boolean property as systemd parses it (``parse_boolean``)."""
    return value is not None and value.strip().lower() in ("1", "yes", "y", "true", "t", "on")
