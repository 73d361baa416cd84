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
import os
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from dra_driver.plugin.hostside import HostSide
from dra_driver.plugin.hostview import (
    DeviceIdentity,
    DeviceInUse,
    DeviceNotVisible,
    HostDevice,
    hex_id,
    link_name,
    listdir,
    normalize_serial,
    nvme_controllers,
    nvme_namespaces,
    pcie_device_serial,
    read_attr,
)
from dra_driver.plugin.readiness import ReadinessCheck, active_nvme_namespaces, udev_record_properties
from plumbing.backoff import Backoff
from plumbing.logs import get_logger

__all__ = [
    "DeviceIdentity",
    "DeviceInUse",
    "DeviceNotVisible",
    "HostDevice",
    "HostScanner",
    "SysfsChanges",
    "active_nvme_namespaces",
    "normalize_serial",
    "pcie_device_serial",
    "udev_record_properties",
]

log = get_logger(__name__)

#: udev subsystems whose events can make a device visible or ready.
UDEV_SUBSYSTEMS = ("pci", "nvme", "block", "net", "cxl", "dax")
#: While udev events wake the scan, a re-scan without an event is only a safety net.
_EVENT_SAFETY_NET_SECONDS = 2.0
_POLL_MAX_SECONDS = 0.25


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
        self.readiness = ReadinessCheck(
            dev_root=dev_root, active_namespaces=active_namespaces, udev_root=udev_root
        )
        self.host_side = HostSide(sysfs_root, real_host=real_host)
        #: device name → why a candidate found on a real host is not ready yet (for the error)
        self.not_ready: dict[str, str] = {}

    # -- scanning --------------------------------------------------------------------------

    def find(self, identity: DeviceIdentity, exclude: Collection[str] = ()) -> HostDevice | None:
        """The host's view of ``identity``, skipping sysfs paths in ``exclude`` (held by other claims)."""
        if identity.type == "cxl-memory":
            return self._find_cxl(identity, exclude)
        return self._find_pci(identity, exclude)

    def _pci_serial(self, where: str | Path) -> str | None:
        serial = read_attr(os.path.join(where, "serial"))
        if serial is not None or not self.real_host:
            return serial
        dev = Path(where)
        try:
            with open(dev / "config", "rb") as handle:
                dsn = pcie_device_serial(handle.read(4096))
        except OSError:
            dsn = None
        if dsn is not None:
            return dsn
        for ctrl in nvme_controllers(dev):
            return read_attr(dev / "nvme" / ctrl / "serial")
        return None

    def _find_pci(self, identity: DeviceIdentity, exclude: Collection[str]) -> HostDevice | None:
        # Paths as strings until a function matches: a scan looks at every PCI function of the
        # host on each wake-up, and pathlib's joins cost more than the reads (read_attr).
        base = os.path.join(self.root, "bus", "pci", "devices")
        try:
            entries = sorted(os.listdir(base))
        except FileNotFoundError:
            return None
        want_vendor, want_device = hex_id(identity.vendor_id), hex_id(identity.device_id)
        want_serial = normalize_serial(identity.serial)
        for bdf in entries:
            where = f"{base}/{bdf}"
            if where in exclude:
                continue
            if want_vendor is not None and hex_id(read_attr(f"{where}/vendor")) != want_vendor:
                continue
            if want_device is not None and hex_id(read_attr(f"{where}/device")) != want_device:
                continue
            if self.real_host:
                reason = self.readiness.why_not(bdf, Path(where))
                if reason is not None:
                    self.not_ready[identity.name] = reason
                    continue
            if want_serial is not None:
                serial = self._pci_serial(where)
                # A real device without any serial (no DSN capability, not NVMe) is recognised by
                # its vendor and device ID alone (docs/plugin.md, "On a real host").
                if (serial is not None or not self.real_host) and normalize_serial(serial) != want_serial:
                    continue
            self.not_ready.pop(identity.name, None)
            return self._describe_pci(bdf, Path(where))
        return None

    def _describe_pci(self, bdf: str, dev: Path) -> HostDevice:
        driver = link_name(dev / "driver")
        group = link_name(dev / "iommu_group")
        nodes: list[str] = []
        # A real host exposes the IOMMU group only while vfio-pci drives the device; an emulated
        # host has no /dev at all, so there the nodes only name what a real host would expose.
        if group is not None and (not self.real_host or driver == "vfio-pci"):
            nodes += [f"/dev/vfio/{group}"] + (["/dev/vfio/vfio"] if self.real_host else [])
        for ctrl in nvme_controllers(dev):
            nodes.append(f"/dev/{ctrl}")
            if self.real_host:
                nodes += [f"/dev/{ns}" for ns in nvme_namespaces(dev, ctrl)]
        numa = read_attr(dev / "numa_node")
        return HostDevice(
            sysfs_path=str(dev),
            pci_address=bdf,
            driver=driver,
            iommu_group=group,
            numa_node=int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
            device_nodes=nodes,
            net_interfaces=listdir(dev / "net") if self.real_host else [],
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
            and (want_serial is None or normalize_serial(read_attr(cxl / name / "serial")) == want_serial)
        }
        if not memdevs:
            return None
        for region in entries:
            if not region.startswith("region"):
                continue
            path = cxl / region
            if str(path) in exclude:
                continue
            target = read_attr(path / "target0")
            memdev = self._memdev_of_target(cxl, target) if target else None
            if memdev not in memdevs:
                continue
            if identity.memory_bytes is not None:
                size = read_attr(path / "size")
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

    # -- acting on the host (plugin.hostside) ------------------------------------------------

    def users(self, device: HostDevice) -> str | None:
        """Who still uses ``device`` on this host (:meth:`HostSide.users`)."""
        return self.host_side.users(device)

    def reset(self, device: HostDevice) -> str | None:
        """Function-level reset of a PCIe device (:meth:`HostSide.reset`); None when done."""
        return self.host_side.reset(device)

    def remove(self, device: HostDevice) -> None:
        """Unbind and remove a PCIe device the kernel way (:meth:`HostSide.remove`)."""
        self.host_side.remove(device)
