"""What each emulated host sees: a sysfs-like tree per host under ``<state-dir>/hosts/<host>/sys``.

A node agent started with ``--sysfs-root <state-dir>/hosts/<host>/sys`` runs the same scanning
code it runs on real hardware. Entries appear when a target is bound to the host (and its
host port is up) and disappear when it is unbound. The layout follows Linux: real directories
under ``devices/``, symlinks from ``bus/*/devices/``; every file is written the way the kernel
formats it (``0x%04x`` IDs with a newline, decimal link width, ...). docs/emulator.md lists
every path. At start-up the trees are rebuilt from the durable state, so they always agree
with it after a crash.

Each bound PCIe function has a ``reset`` file, as a Linux device with a reset method does
(Documentation/ABI/testing/sysfs-bus-pci). It starts empty with every binding (a hot-add is a cold
reset) and is a line log: a node agent that resets the device appends ``1``, and
:meth:`HostView.node_resets` counts the lines (the Bindings table's ``NodeResets``).

Methods run in the state store's writer thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from emulator.redfish.model.state import BindingRecord, HostAddress
from emulator.redfish.sysfs.pciconfig import config_space, dsn_from_serial, link_speed_text
from manager_api.devices import DeviceType

__all__ = ["HOST_BRIDGE", "HostEntry", "HostView", "allocate_address"]

#: The host bridge every fabric-attached PCIe device of an emulated host sits under.
HOST_BRIDGE = "pci0000:40"
_FIRST_BUS = 0x41
_BUSES_PER_DOMAIN = 0xFF - _FIRST_BUS
_FIRST_IOMMU_GROUP = 32
_NVME_CHAR_MAJOR = 241
_VFIO_TYPES = {DeviceType.GPU, DeviceType.NIC, DeviceType.FPGA}
_MEMDEV_NAMESPACE = uuid.UUID("6c1f1a0e-8d5e-4f55-9a55-2f1c0de5a111")


@dataclass(frozen=True)
class HostEntry:
    """Everything needed to materialise one bound target on one host (immutable snapshot)."""

    host: str
    target: str
    type: DeviceType
    address: HostAddress
    vendor_id: int
    device_id: int
    class_code: int
    revision_id: int
    subsystem_vendor_id: int
    subsystem_id: int
    pcie_generation: int
    pcie_width: int
    serial: str
    model: str
    numa_node: int
    size_bytes: int = 0
    device_size_bytes: int = 0


def _lowest_free(used: set[int], start: int) -> int:
    n = start
    while n in used:
        n += 1
    return n


def allocate_address(
    host_bindings: list[tuple[BindingRecord, str]], device_type: DeviceType, device_id: str
) -> HostAddress:
    """Pick the sysfs names a newly bound target gets on a host: lowest free, like hot-plug.

    ``host_bindings`` are the host's current bindings, each with the Id of its device.
    """
    if device_type == DeviceType.CXL_MEMORY:
        regions = {b.address.region for b, _ in host_bindings if b.address.region is not None}
        memdev = next(
            (b.address.memdev for b, d in host_bindings if d == device_id and b.address.memdev is not None),
            None,
        )
        if memdev is None:
            memdev = _lowest_free(
                {b.address.memdev for b, _ in host_bindings if b.address.memdev is not None}, 0
            )
        return HostAddress(memdev=memdev, region=_lowest_free(regions, 0))
    slots = set()
    for b, _ in host_bindings:
        if b.address.bdf is not None:
            domain, bus = int(b.address.bdf[0:4], 16), int(b.address.bdf[5:7], 16)
            slots.add(domain * _BUSES_PER_DOMAIN + bus - _FIRST_BUS)
    slot = _lowest_free(slots, 0)
    bdf = f"{slot // _BUSES_PER_DOMAIN:04x}:{_FIRST_BUS + slot % _BUSES_PER_DOMAIN:02x}:00.0"
    address = HostAddress(bdf=bdf)
    if device_type in _VFIO_TYPES:
        groups = {b.address.iommu_group for b, _ in host_bindings if b.address.iommu_group is not None}
        address.iommu_group = _lowest_free(groups, _FIRST_IOMMU_GROUP)
    if device_type == DeviceType.NVME:
        address.nvme = _lowest_free(
            {b.address.nvme for b, _ in host_bindings if b.address.nvme is not None}, 0
        )
    return address


def _write(path: Path, text: str | bytes) -> None:
    # plain os calls: these files are new, and Path.write_text's layers cost more than the write
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode("ascii") if isinstance(text, str) else text)
    finally:
        os.close(fd)


def _symlink(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    os.symlink(target, link)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class HostView:
    """The host trees under ``hosts_dir``, with two siblings on the same filesystem.

    ``<hosts_dir>.stage`` holds unbound PCIe devices (see :meth:`_stage`); ``<hosts_dir>.trash``
    receives removed CXL directories by rename (a scanner sees them vanish at once), and a
    daemon thread empties it afterwards.
    """

    def __init__(self, hosts_dir: Path, qemu_hosts: frozenset[str] = frozenset()) -> None:
        self.hosts_dir = hosts_dir
        #: hosts of ``kind: qemu``: their guest's kernel is their view (emulator/qemu), no tree here
        self.qemu_hosts = qemu_hosts
        #: unbound PCIe devices, ready to be renamed into a host's tree (same filesystem)
        self.stage_dir = hosts_dir.with_name(hosts_dir.name + ".stage")
        self.trash_dir = hosts_dir.with_name(hosts_dir.name + ".trash")
        self._purge: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._purger: threading.Thread | None = None

    def _discard(self, path: Path) -> None:
        """Make ``path`` (a directory) disappear now; delete its contents in the background."""
        self.trash_dir.mkdir(parents=True, exist_ok=True)
        parked = self.trash_dir / uuid.uuid4().hex
        try:
            os.rename(path, parked)
        except FileNotFoundError:
            return
        self._purge.put(parked)
        if self._purger is None or not self._purger.is_alive():
            self._purger = threading.Thread(target=self._empty_trash, name="hostview-trash", daemon=True)
            self._purger.start()

    def _empty_trash(self) -> None:
        while True:
            try:
                parked = self._purge.get(timeout=5)
            except queue.Empty:
                return
            shutil.rmtree(parked, ignore_errors=True)

    def sys_root(self, host: str) -> Path:
        return self.hosts_dir / host / "sys"

    def prepare_host(self, host: str, system_uuid: str) -> None:
        """The skeleton a host has with nothing bound (empty bus directories, its DMI UUID)."""
        sys_root = self.sys_root(host)
        for sub in (
            "bus/pci/devices",
            "bus/cxl/devices",
            "bus/dax/devices",
            "kernel/iommu_groups",
            "class/nvme",
        ):
            (sys_root / sub).mkdir(parents=True, exist_ok=True)
        (sys_root / "devices" / HOST_BRIDGE).mkdir(parents=True, exist_ok=True)
        (sys_root / "devices" / "cxl").mkdir(parents=True, exist_ok=True)
        dmi = sys_root / "class" / "dmi" / "id"
        dmi.mkdir(parents=True, exist_ok=True)
        _write(dmi / "product_uuid", system_uuid.lower() + "\n")

    def reset(self, hosts: dict[str, str]) -> None:
        """Remove every host tree and lay out empty skeletons for ``hosts`` (name → UUID)."""
        for stale in (self.hosts_dir, self.stage_dir, self.trash_dir):
            if stale.exists():
                shutil.rmtree(stale)
        for host, system_uuid in hosts.items():
            if host not in self.qemu_hosts:
                self.prepare_host(host, system_uuid)

    def add(self, entry: HostEntry) -> None:
        if entry.host in self.qemu_hosts:
            return
        if entry.type == DeviceType.CXL_MEMORY:
            self._add_cxl(entry)
        else:
            self._add_pci(entry)

    def remove(self, entry: HostEntry) -> None:
        if entry.host in self.qemu_hosts:
            return
        if entry.type == DeviceType.CXL_MEMORY:
            self._remove_cxl(entry)
        else:
            self._remove_pci(entry)

    def node_resets(self, host: str, address: HostAddress) -> int | None:
        """How many function-level resets the host's node agent wrote to the bound PCIe function
        at ``address`` since it was bound (lines of its ``reset`` file); None for CXL memory and
        for hosts whose view is a guest's kernel."""
        if host in self.qemu_hosts or address.bdf is None:
            return None
        try:
            text = (self.sys_root(host) / "devices" / HOST_BRIDGE / address.bdf / "reset").read_text()
        except FileNotFoundError:
            return 0
        return sum(1 for line in text.splitlines() if line.strip() == "1")

    # --- PCIe ----------------------------------------------------------------------------

    def _stage(self, e: HostEntry) -> Path:
        """The unbound device's directory, with every file that does not depend on a host.

        A device moves into a host's tree and back out of it by ``rename``: binding costs a few
        metadata operations instead of creating a dozen files, and a scanner sees the device
        appear (its bus symlink last) or vanish at once, never half-built.
        """
        stage = self.stage_dir / e.target
        if (stage / "dev").is_dir():
            return stage
        dev = stage / "dev"
        dev.mkdir(parents=True, exist_ok=True)
        _write(dev / "vendor", f"0x{e.vendor_id:04x}\n")
        _write(dev / "device", f"0x{e.device_id:04x}\n")
        _write(dev / "class", f"0x{e.class_code:06x}\n")
        _write(dev / "revision", f"0x{e.revision_id:02x}\n")
        _write(dev / "subsystem_vendor", f"0x{e.subsystem_vendor_id:04x}\n")
        _write(dev / "subsystem_device", f"0x{e.subsystem_id:04x}\n")
        _write(dev / "current_link_speed", link_speed_text(e.pcie_generation) + "\n")
        _write(dev / "current_link_width", f"{e.pcie_width}\n")
        _write(dev / "max_link_speed", link_speed_text(e.pcie_generation) + "\n")
        _write(dev / "max_link_width", f"{e.pcie_width}\n")
        _write(dev / "serial", e.serial + "\n")
        _write(
            dev / "config",
            config_space(
                vendor_id=e.vendor_id,
                device_id=e.device_id,
                class_code=e.class_code,
                revision_id=e.revision_id,
                subsystem_vendor_id=e.subsystem_vendor_id,
                subsystem_id=e.subsystem_id,
                pcie_generation=e.pcie_generation,
                pcie_width=e.pcie_width,
                serial=e.serial,
            ),
        )
        if e.type in _VFIO_TYPES:
            (stage / "group" / "devices").mkdir(parents=True, exist_ok=True)
        if e.type == DeviceType.NVME:
            ctrl = dev / "nvme" / "ctrl"
            ctrl.mkdir(parents=True, exist_ok=True)
            _write(ctrl / "serial", e.serial + "\n")
            _write(ctrl / "model", e.model + "\n")
        return stage

    def _add_pci(self, e: HostEntry) -> None:
        bdf = e.address.bdf
        if bdf is None:
            raise ValueError(f"PCIe function {e.target} on {e.host} has no bus/device/function address")
        sys_root = self.sys_root(e.host)
        stage = self._stage(e)
        dev = sys_root / "devices" / HOST_BRIDGE / bdf
        os.rename(stage / "dev", dev)
        _write(dev / "numa_node", f"{e.numa_node}\n")
        _write(dev / "reset", "")  # no function-level reset yet in this binding
        if e.address.iommu_group is not None:
            group = sys_root / "kernel" / "iommu_groups" / str(e.address.iommu_group)
            os.rename(stage / "group", group)
            os.symlink(f"../../../../devices/{HOST_BRIDGE}/{bdf}", group / "devices" / bdf)
            os.symlink(f"../../../kernel/iommu_groups/{e.address.iommu_group}", dev / "iommu_group")
        if e.address.nvme is not None:
            name = f"nvme{e.address.nvme}"
            ctrl = dev / "nvme" / name
            os.rename(dev / "nvme" / "ctrl", ctrl)
            _write(ctrl / "dev", f"{_NVME_CHAR_MAJOR}:{e.address.nvme}\n")
            _symlink(sys_root / "class" / "nvme" / name, f"../../devices/{HOST_BRIDGE}/{bdf}/nvme/{name}")
        # the bus entry last: a scanner that sees it finds every file already in place
        _symlink(sys_root / "bus" / "pci" / "devices" / bdf, f"../../../devices/{HOST_BRIDGE}/{bdf}")

    def _remove_pci(self, e: HostEntry) -> None:
        bdf = e.address.bdf
        if bdf is None:
            raise ValueError(f"PCIe function {e.target} on {e.host} has no bus/device/function address")
        sys_root = self.sys_root(e.host)
        _unlink(sys_root / "bus" / "pci" / "devices" / bdf)  # first: the device is gone for scanners
        dev = sys_root / "devices" / HOST_BRIDGE / bdf
        if not dev.is_dir():
            return
        stage = self.stage_dir / e.target
        if (stage / "dev").exists():  # cannot happen unless a tree was edited by hand
            self._discard(stage)
        stage.mkdir(parents=True, exist_ok=True)
        if e.address.nvme is not None:
            name = f"nvme{e.address.nvme}"
            _unlink(sys_root / "class" / "nvme" / name)
            _unlink(dev / "nvme" / name / "dev")
            with contextlib.suppress(FileNotFoundError):
                os.rename(dev / "nvme" / name, dev / "nvme" / "ctrl")
        if e.address.iommu_group is not None:
            group = sys_root / "kernel" / "iommu_groups" / str(e.address.iommu_group)
            _unlink(dev / "iommu_group")
            _unlink(group / "devices" / bdf)
            with contextlib.suppress(FileNotFoundError):
                os.rename(group, stage / "group")
        _unlink(dev / "numa_node")
        _unlink(dev / "reset")
        os.rename(dev, stage / "dev")

    # --- CXL -----------------------------------------------------------------------------

    def _add_cxl(self, e: HostEntry) -> None:
        memdev_n, region_n = e.address.memdev, e.address.region
        if memdev_n is None or region_n is None:
            raise ValueError(f"CXL memory {e.target} on {e.host} has no memdev/region number")
        sys_root = self.sys_root(e.host)
        memdev = f"mem{memdev_n}"
        mem = sys_root / "devices" / "cxl" / memdev
        (mem / "ram").mkdir(parents=True, exist_ok=True)
        dsn = dsn_from_serial(e.serial)
        # Linux prints a memdev's serial as "%#llx"; a non-hex serial is written as it is.
        _write(mem / "serial", (f"{dsn:#x}" if dsn is not None else e.serial) + "\n")
        _write(mem / "numa_node", f"{e.numa_node}\n")
        _write(mem / "ram" / "size", f"{e.device_size_bytes:#x}\n")
        _symlink(sys_root / "bus" / "cxl" / "devices" / memdev, f"../../../devices/cxl/{memdev}")

        region = f"region{region_n}"
        reg = sys_root / "devices" / "cxl" / region
        reg.mkdir(parents=True, exist_ok=True)
        _write(reg / "size", f"{e.size_bytes:#x}\n")
        _write(reg / "uuid", str(uuid.uuid5(_MEMDEV_NAMESPACE, f"{e.host}/{e.target}")) + "\n")
        _write(reg / "mode", "ram\n")
        _write(reg / "interleave_ways", "1\n")
        _write(reg / "commit", "1\n")
        _write(reg / "target0", memdev + "\n")
        _symlink(sys_root / "bus" / "cxl" / "devices" / region, f"../../../devices/cxl/{region}")

        dax_name = f"dax{region_n}.0"
        dax = reg / f"dax_region{region_n}" / dax_name
        dax.mkdir(parents=True, exist_ok=True)
        _write(dax / "size", f"{e.size_bytes}\n")
        _write(dax / "target_node", f"{e.numa_node}\n")
        _symlink(
            sys_root / "bus" / "dax" / "devices" / dax_name,
            f"../../../devices/cxl/{region}/dax_region{region_n}/{dax_name}",
        )

    def _remove_cxl(self, e: HostEntry) -> None:
        memdev_n, region_n = e.address.memdev, e.address.region
        if memdev_n is None or region_n is None:
            raise ValueError(f"CXL memory {e.target} on {e.host} has no memdev/region number")
        sys_root = self.sys_root(e.host)
        memdev = f"mem{memdev_n}"
        _unlink(sys_root / "bus" / "dax" / "devices" / f"dax{region_n}.0")
        _unlink(sys_root / "bus" / "cxl" / "devices" / f"region{region_n}")
        self._discard(sys_root / "devices" / "cxl" / f"region{region_n}")
        # The memdev goes once no region of this host targets it any more.
        for other in (sys_root / "devices" / "cxl").glob("region*/target0"):
            with contextlib.suppress(FileNotFoundError):
                if other.read_text().strip() == memdev:
                    return
        _unlink(sys_root / "bus" / "cxl" / "devices" / memdev)
        self._discard(sys_root / "devices" / "cxl" / memdev)
