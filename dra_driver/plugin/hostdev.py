"""What this host sees: find an attached fabric device in sysfs, wait for it, remove it.

The same code scans a real host's ``/sys`` and the emulator's per-host tree (see
docs/architecture.md, "Emulated hosts"): a PCIe device is the ``bus/pci/devices/<BDF>``
directory whose ``vendor`` + ``device`` + serial match the fabric's record; a CXL memory chunk is
the ``region<N>`` whose target memdev has the device's serial and whose ``size`` is the chunk's.
On a real host a pyudev monitor wakes waiters on every add event, and an optional PCI rescan
covers slots that do not announce hot-plugged devices.

A real kernel is slower and less complete than the emulated tree (docs/plugin.md, "On a real
host"): a device is enumerated before its driver has probed it, an NVMe drive's serial and
namespaces exist only once the ``nvme`` driver has set the controller up, and a NIC's interface
only once its driver has registered it. So on a real host a device counts as visible when it is
*ready*: NVMe bound to its driver with its ``/dev`` nodes, a NIC bound with its interface under
the name udev leaves it (udev renames a new interface after recording it), other devices
enumerated. Its serial is the PCIe Device Serial Number when the device has that
capability, else the NVMe controller serial; a device with neither is recognised by vendor and
device ID alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import os
import struct
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.errors import KubeletPluginError
from manager_api.errors import FabricError
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = [
    "DeviceIdentity",
    "DeviceInUse",
    "DeviceNotVisible",
    "HostDevice",
    "HostScanner",
    "SysfsChanges",
    "normalize_serial",
    "pcie_device_serial",
    "udev_record_properties",
]

log = get_logger(__name__)

#: PCIe Extended Capability ID of the Device Serial Number capability (PCIe Base Spec 6.0, 7.9.3).
_DSN_CAP_ID = 0x0003
_EXT_CAP_START = 0x100
#: PCI class codes (base class, sub class) whose readiness needs a driver: NVMe, Ethernet.
_NVME_CLASS = 0x0108
_NETWORK_BASE_CLASS = 0x02
#: udev subsystems whose events can make a device visible or ready.
UDEV_SUBSYSTEMS = ("pci", "nvme", "block", "net", "cxl", "dax")
#: While udev events wake the scan, a re-scan without an event is only a safety net.
_EVENT_SAFETY_NET_SECONDS = 2.0
_POLL_MAX_SECONDS = 0.25


class DeviceNotVisible(KubeletPluginError):
    """The fabric bound the device, but this host did not see it in time."""


class DeviceInUse(KubeletPluginError, FabricError):
    """A prepared device is still used on this host (mounted, held open): it is neither removed nor
    detached under its user; the kubelet's retry tries again."""

    code = "DeviceInUse"
    retriable = True


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """What the fabric says a device is: enough to recognise it in sysfs."""

    name: str
    type: str
    vendor_id: str | None = None
    device_id: str | None = None
    serial: str | None = None
    memory_bytes: int | None = None


class HostDevice(BaseModel):
    """Where this host sees an attached device (stored in the checkpoint)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    sysfs_path: str = Field(description="the device's directory under --sysfs-root")
    pci_address: str | None = None
    memdev: str | None = None
    region: str | None = None
    dax: str | None = None
    driver: str | None = None
    iommu_group: str | None = None
    numa_node: int | None = None
    device_nodes: list[str] = Field(default_factory=list, description="host /dev paths a container needs")
    net_interfaces: list[str] = Field(default_factory=list, description="a NIC's network interfaces")


def normalize_serial(value: str | None) -> str | None:
    """Serials compare without case, separators or a hex prefix: ``0x00AB`` == ``00-ab`` == ``ab``."""
    if value is None:
        return None
    text = value.strip().lower().replace("-", "").replace(":", "").replace(" ", "")
    text = text.removeprefix("0x")
    if text and all(c in "0123456789abcdef" for c in text):
        text = text.lstrip("0") or "0"
    return text or None


def _hex_id(value: str | None) -> int | None:
    if not value:
        return None
    try:
        return int(value.strip(), 16)
    except ValueError:
        return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, NotADirectoryError, PermissionError, OSError):
        return None


def _link_name(path: Path) -> str | None:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def pcie_device_serial(config_space: bytes) -> str | None:
    """The Device Serial Number extended capability of a PCIe config space dump, as ``xx-xx-…``.

    Walks the extended capability list from offset 0x100 (PCIe Base Spec 6.0, 7.6.3); the
    capability holds the 64-bit serial little-endian at +4. Formatted high byte first, as lspci does.
    """
    offset = _EXT_CAP_START
    seen: set[int] = set()
    while offset and offset + 12 <= len(config_space) and offset not in seen:
        seen.add(offset)
        (header,) = struct.unpack_from("<I", config_space, offset)
        if header in (0, 0xFFFFFFFF):
            return None
        cap_id = header & 0xFFFF
        if cap_id == _DSN_CAP_ID:
            (serial,) = struct.unpack_from("<Q", config_space, offset + 4)
            return "-".join(f"{b:02x}" for b in serial.to_bytes(8, "big"))
        offset = (header >> 20) & 0xFFC
    return None


class SysfsChanges:
    """Wakes waiters when the host's device set may have changed.

    On a real host a pyudev netlink monitor (subsystems pci, nvme, cxl, dax) signals every event;
    elsewhere (an emulated tree) waiters fall back to polling with back-off.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._monitor: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def watching(self) -> bool:
        return self._monitor is not None

    def start_udev(self) -> bool:
        """Listen for udev events; False (and polling) where netlink is not available, or where
        ``FABRIC_DRA_UDEV=off`` asks for the polling fallback (to measure or work around udev)."""
        if os.environ.get("FABRIC_DRA_UDEV", "").lower() == "off":
            log.info("udev events switched off (FABRIC_DRA_UDEV=off), polling sysfs instead")
            return False
        try:
            import pyudev  # only real hosts pay for the import

            context = pyudev.Context()
            monitor = pyudev.Monitor.from_netlink(context)
            for subsystem in UDEV_SUBSYSTEMS:
                monitor.filter_by(subsystem)
            monitor.start()
        except Exception as err:  # any failure means: poll instead
            log.warning("udev monitor unavailable, polling sysfs instead", error=str(err))
            return False
        self._loop = asyncio.get_running_loop()
        self._monitor = monitor
        self._loop.add_reader(monitor.fileno(), self._on_readable)
        return True

    def _on_readable(self) -> None:
        while True:
            device = self._monitor.poll(timeout=0)
            if device is None:
                break
            log.debug("udev event", action=device.action, sys_path=device.sys_path)
        self.notify()

    def notify(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    async def wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._event.wait(), seconds)

    def stop(self) -> None:
        if self._monitor is not None and self._loop is not None:
            self._loop.remove_reader(self._monitor.fileno())
            self._monitor = None


class HostScanner:
    """Finds fabric devices in one sysfs tree."""

    def __init__(
        self,
        sysfs_root: Path,
        *,
        real_host: bool,
        pci_rescan: bool = False,
        changes: SysfsChanges | None = None,
        clock: Callable[[], float] = time.monotonic,
        dev_root: Path = Path("/dev"),
        active_namespaces: Callable[[str], int | None] | None = None,
        udev_root: Path = Path("/run/udev"),
    ) -> None:
        self.root = sysfs_root
        self.real_host = real_host
        self.pci_rescan = pci_rescan
        self.changes = changes or SysfsChanges()
        self._clock = clock
        #: where a real host's device nodes are looked for (a test points it at a made-up tree)
        self.dev_root = dev_root
        #: how many active namespaces an NVMe controller reports, asked through its char device
        self.active_namespaces = active_namespaces or active_nvme_namespaces
        #: udev's runtime directory (its control socket and database; a test points it elsewhere)
        self.udev_root = udev_root
        #: device name → why a candidate found on a real host is not ready yet (for the error)
        self.not_ready: dict[str, str] = {}

    # -- scanning --------------------------------------------------------------------------

    def find(self, identity: DeviceIdentity, exclude: Collection[str] = ()) -> HostDevice | None:
        """The host's view of ``identity``, skipping sysfs paths in ``exclude`` (held by other claims)."""
        if identity.type == "cxl-memory":
            return self._find_cxl(identity, exclude)
        return self._find_pci(identity, exclude)

    def _pci_serial(self, dev: Path) -> str | None:
        serial = _read(dev / "serial")
        if serial is not None or not self.real_host:
            return serial
        try:
            with open(dev / "config", "rb") as handle:
                dsn = pcie_device_serial(handle.read(4096))
        except OSError:
            dsn = None
        if dsn is not None:
            return dsn
        for ctrl in _nvme_controllers(dev):
            return _read(dev / "nvme" / ctrl / "serial")
        return None

    def _not_ready(self, bdf: str, dev: Path) -> str | None:
        """Why a real host's device is not usable yet (driver not bound, nodes missing); None: ready."""
        pci_class = _hex_id(_read(dev / "class")) or 0
        needs_driver = pci_class >> 8 == _NVME_CLASS or pci_class >> 16 == _NETWORK_BASE_CLASS
        driver = _link_name(dev / "driver")
        if needs_driver and driver is None:
            return (
                f"it is enumerated at {bdf} but no driver is bound to it (a driver probe that failed "
                "or is still running, or no driver module for it: see the kernel log, "
                f"'dmesg | grep {bdf}')"
            )
        if pci_class >> 8 == _NVME_CLASS and driver == "nvme":
            controllers = _nvme_controllers(dev)
            if not controllers:
                return f"the nvme driver is bound at {bdf} but has not set up a controller yet"
            for ctrl in controllers:
                state = _read(dev / "nvme" / ctrl / "state")
                if state not in (None, "live"):
                    return f"NVMe controller {ctrl} at {bdf} is {state}, not live"
                if not (self.dev_root / ctrl).exists():
                    return f"/dev/{ctrl} of {bdf} does not exist yet"
                namespaces = _nvme_namespaces(dev, ctrl)
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
                    number = _read(dev / "nvme" / ctrl / ns / "dev")
                    pending = self._udev_pending(f"b{number}") if number else None
                    if pending is not None:
                        return f"udev {pending} /dev/{ns} of {bdf}"
        if pci_class >> 16 == _NETWORK_BASE_CLASS and driver is not None:
            interfaces = _listdir(dev / "net")
            if not interfaces:
                return f"the {driver} driver is bound at {bdf} but has not registered a network interface yet"
            # udev renames a new interface (eth1 -> enp3s0, NamePolicy of the .link file) while it
            # processes its add event, and it writes the interface's database record, marked
            # ID_RENAMING=1, *before* the rename (systemd 252 in the QEMU guests, and today's
            # source): a recorded interface may still have its kernel name. The name is final
            # once the record no longer says so (the rename's move event processed), which is
            # what systemd-networkd waits for (_udev_pending).
            for name in interfaces:
                index = _read(dev / "net" / name / "ifindex")
                if index is None and self._udev_running():
                    # the interface is being renamed this very moment: its old directory is gone
                    return f"the interface {name} of {bdf} is being renamed"
                pending = self._udev_pending(f"n{index}") if index else None
                if pending is not None:
                    return f"udev {pending} the interface {name} of {bdf}"
        return None

    def _udev_running(self) -> bool:
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
        if not self._udev_running():
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

    def _find_pci(self, identity: DeviceIdentity, exclude: Collection[str]) -> HostDevice | None:
        base = self.root / "bus" / "pci" / "devices"
        try:
            entries = sorted(os.listdir(base))
        except FileNotFoundError:
            return None
        want_vendor, want_device = _hex_id(identity.vendor_id), _hex_id(identity.device_id)
        want_serial = normalize_serial(identity.serial)
        for bdf in entries:
            dev = base / bdf
            if str(dev) in exclude:
                continue
            if want_vendor is not None and _hex_id(_read(dev / "vendor")) != want_vendor:
                continue
            if want_device is not None and _hex_id(_read(dev / "device")) != want_device:
                continue
            if self.real_host:
                reason = self._not_ready(bdf, dev)
                if reason is not None:
                    self.not_ready[identity.name] = reason
                    continue
            if want_serial is not None:
                serial = self._pci_serial(dev)
                # A real device without any serial (no DSN capability, not NVMe) is recognised by
                # its vendor and device ID alone (docs/plugin.md, "On a real host").
                if (serial is not None or not self.real_host) and normalize_serial(serial) != want_serial:
                    continue
            self.not_ready.pop(identity.name, None)
            return self._describe_pci(bdf, dev)
        return None

    def _describe_pci(self, bdf: str, dev: Path) -> HostDevice:
        driver = _link_name(dev / "driver")
        group = _link_name(dev / "iommu_group")
        nodes: list[str] = []
        # A real host exposes the IOMMU group only while vfio-pci drives the device; an emulated
        # host has no /dev at all, so there the nodes only name what a real host would expose.
        if group is not None and (not self.real_host or driver == "vfio-pci"):
            nodes += [f"/dev/vfio/{group}"] + (["/dev/vfio/vfio"] if self.real_host else [])
        for ctrl in _nvme_controllers(dev):
            nodes.append(f"/dev/{ctrl}")
            if self.real_host:
                nodes += [f"/dev/{ns}" for ns in _nvme_namespaces(dev, ctrl)]
        numa = _read(dev / "numa_node")
        return HostDevice(
            sysfs_path=str(dev),
            pci_address=bdf,
            driver=driver,
            iommu_group=group,
            numa_node=int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
            device_nodes=nodes,
            net_interfaces=_listdir(dev / "net") if self.real_host else [],
        )

    def _memdev_of_target(self, cxl: Path, target: str) -> str | None:
        if target.startswith("mem"):
            return target
        # A real region's targetN names an endpoint decoder (decoderE.D) that lives below memN.
        try:
            resolved = os.path.realpath(cxl / target)
        except OSError:
            return None
        return next((part for part in Path(resolved).parts if part.startswith("mem")), None)

    def _find_cxl(self, identity: DeviceIdentity, exclude: Collection[str]) -> HostDevice | None:
        cxl = self.root / "bus" / "cxl" / "devices"
        try:
            entries = sorted(os.listdir(cxl))
        except FileNotFoundError:
            return None
        want_serial = normalize_serial(identity.serial)
        memdevs = {
            name
            for name in entries
            if name.startswith("mem")
            and (want_serial is None or normalize_serial(_read(cxl / name / "serial")) == want_serial)
        }
        if not memdevs:
            return None
        for region in entries:
            if not region.startswith("region"):
                continue
            path = cxl / region
            if str(path) in exclude:
                continue
            target = _read(path / "target0")
            memdev = self._memdev_of_target(cxl, target) if target else None
            if memdev not in memdevs:
                continue
            if identity.memory_bytes is not None:
                size = _read(path / "size")
                try:
                    if size is None or int(size, 0) != identity.memory_bytes:
                        continue
                except ValueError:
                    continue
            dax = self._dax_of_region(path, region)
            return HostDevice(
                sysfs_path=str(path),
                memdev=memdev,
                region=region,
                dax=dax,
                device_nodes=[f"/dev/{dax}"] if dax else [],
            )
        return None

    def _dax_of_region(self, path: Path, region: str) -> str | None:
        number = region.removeprefix("region")
        # Real kernel: regionN/dax_regionN/daxN.M; emulated tree: bus/dax/devices/daxN.0.
        with contextlib.suppress(OSError):
            for sub in sorted(os.listdir(path)):
                if sub.startswith("dax_region"):
                    for dax in sorted(os.listdir(path / sub)):
                        if dax.startswith("dax") and "." in dax:
                            return dax
        candidate = f"dax{number}.0"
        if (self.root / "bus" / "dax" / "devices" / candidate).exists():
            return candidate
        return None

    def present(self, device: HostDevice) -> bool:
        return os.path.isdir(device.sysfs_path)

    @staticmethod
    def present_path(sysfs_path: str) -> bool:
        return os.path.isdir(sysfs_path)

    # -- waiting -----------------------------------------------------------------------------

    async def wait_visible(
        self,
        identity: DeviceIdentity,
        *,
        within: float,
        exclude: Callable[[], Collection[str]] = frozenset,
    ) -> HostDevice:
        """Scan until the device shows up; udev events (real hosts) or back-off polling wake the scan."""
        deadline = self._clock() + within
        # A local poll woken early by udev: no jitter, nobody else to desynchronise from. With udev
        # events the scan runs when the kernel reports a change; the timed re-scan only catches a
        # missed event. Without them, back-off polling finds the device.
        backoff = Backoff(
            initial=0.002,
            maximum=_EVENT_SAFETY_NET_SECONDS if self.changes.watching else _POLL_MAX_SECONDS,
            jitter=0,
        )
        rescanned_at: float | None = None
        while True:
            found = self.find(identity, exclude())
            if found is not None:
                return found
            now = self._clock()
            if now >= deadline:
                reason = self.not_ready.pop(identity.name, None)
                if reason is not None:
                    raise DeviceNotVisible(
                        f"device {identity.name} was bound to this node but is not usable after "
                        f"{within:.0f}s: {reason}"
                    )
                raise DeviceNotVisible(
                    f"device {identity.name} was bound to this node but did not appear under "
                    f"{self.root} within {within:.0f}s; check the host's PCIe hot-plug/CXL setup "
                    f"(or enable --pci-rescan)"
                )
            if (
                self.pci_rescan
                and identity.type != "cxl-memory"
                and (rescanned_at is None or now - rescanned_at >= 5.0)
            ):
                rescanned_at = now
                await asyncio.to_thread(self._rescan)
                continue
            await self.changes.wait(min(backoff.next(), deadline - now))

    def _rescan(self) -> None:
        rescan = self.root / "bus" / "pci" / "rescan"
        try:
            rescan.write_text("1")
        except OSError as err:
            log.warning("PCI rescan failed", path=str(rescan), error=str(err))

    # -- removal -----------------------------------------------------------------------------

    def users(self, device: HostDevice) -> str | None:
        """Who still uses ``device`` on this host (mounted, held open), or None. Real hosts only.

        A block device that the kernel will not open exclusively (``O_EXCL``) is mounted or held
        by a filesystem, RAID or LVM; a process with one of the device nodes open is found in
        ``/proc/<pid>/fd`` as ``fuser`` does.
        """
        if not self.real_host:
            return None
        for node in device.device_nodes:
            if not os.path.basename(node).startswith("nvme") or "n" not in os.path.basename(node)[4:]:
                continue
            try:
                fd = os.open(node, os.O_RDONLY | os.O_EXCL | os.O_CLOEXEC)
            except OSError as err:
                if err.errno == errno.EBUSY:
                    return f"{node} is mounted or held exclusively"
                continue
            os.close(fd)
        holders = _open_by(set(device.device_nodes))
        if holders:
            return "opened by " + ", ".join(holders)
        return None

    def reset(self, device: HostDevice) -> str | None:
        """Function-level reset of a PCIe device: ``1`` written to its sysfs ``reset`` file
        (Documentation/ABI/testing/sysfs-bus-pci; the kernel picks the method: FLR, AF FLR, PM,
        bus). Blocking. None when done, else why not (one line): no PCIe function, no ``reset``
        file (the device supports no reset method), or the write refused. The file is opened
        without ``O_CREAT`` (a missing one is a failure, never created) and appended to: sysfs
        ignores the offset, and an emulated host's file keeps one line per reset."""
        if device.pci_address is None:
            return "it has no PCIe function on this host to reset"
        path = self.root / "bus" / "pci" / "devices" / device.pci_address / "reset"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except FileNotFoundError:
            return f"{path} does not exist: the device supports no reset method"
        except OSError as err:
            return f"cannot open {path}: {err.strerror}"
        try:
            os.write(fd, b"1\n")
        except OSError as err:
            return f"writing 1 to {path} failed: {err.strerror}"
        finally:
            os.close(fd)
        log.info("device reset (function-level)", device_path=str(path.parent))
        return None

    def remove(self, device: HostDevice) -> None:
        """Unbind the driver and remove a PCIe device the kernel way (blocking: the driver may take
        seconds). Only files the kernel provides are written: an emulated tree has none of them."""
        if device.pci_address is None:
            return  # CXL regions are torn down by the fabric; nothing for the host to do here
        dev = Path(device.sysfs_path)
        if self.real_host:
            reason = self.users(device)
            if reason is not None:
                raise DeviceInUse(
                    f"it is still in use on this node ({device.pci_address}: {reason}); it was neither "
                    "removed nor detached"
                )
        unbind = dev / "driver" / "unbind"
        if unbind.exists():
            unbind.write_text(device.pci_address)
            log.info("driver unbound", device_path=str(dev), driver=device.driver)
        remove = dev / "remove"
        if remove.exists():
            remove.write_text("1")
            log.info("device removed from the host", device_path=str(dev))


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


#: What udev's processes are called (the daemon, and its workers since systemd 247).
_UDEV_PROCESSES = frozenset({"systemd-udevd", "(udev-worker)", "udevd"})


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _nvme_controllers(dev: Path) -> list[str]:
    return [c for c in _listdir(dev / "nvme") if c.startswith("nvme")]


def _nvme_namespaces(dev: Path, ctrl: str) -> list[str]:
    """Block devices of a controller: ``nvme0n1`` (or ``nvme0c0n1`` hidden under multipath: skip)."""
    return [ns for ns in _listdir(dev / "nvme" / ctrl) if ns.startswith(ctrl + "n")]


def _open_by(nodes: set[str]) -> list[str]:
    """``<comm>[<pid>]`` of every process with one of ``nodes`` open (like ``fuser``)."""
    if not nodes:
        return []
    found = []
    me = os.getpid()
    for pid in _listdir(Path("/proc")):
        if not pid.isdigit() or int(pid) == me:
            continue
        for fd in _listdir(Path("/proc") / pid / "fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target in nodes:
                comm = _read(Path("/proc") / pid / "comm") or "?"
                # udev opens a disk briefly to probe it after a change (its inotify watch): that
                # is no user, and the kernel ends the probe when the device goes
                if comm not in _UDEV_PROCESSES:
                    found.append(f"{comm}[{pid}]")
                break
    return found
