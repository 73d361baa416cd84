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
:meth:`HostView.node_resets` counts the lines (the Bindings table's ``NodeResets``). What a node
agent adds under a device's directory (a GPU's partitions, ``mig/``) goes with the device when it
is unbound: the next host it is bound to starts clean.

CXL memory comes up as a Linux ≥ 6.3 host shows a committed ``ram`` region: the region, its dax
device, the memory blocks of its range (``devices/system/memory/memory<M>``, offline, as a kernel
without ``CONFIG_MEMORY_HOTPLUG_DEFAULT_ONLINE`` leaves them) and a CPU-less NUMA node of its own
(``devices/system/node/node<K>``). A node agent onlines a block by writing ``online_movable`` to
its ``state``, as on a real host; the emulator plays the kernel's part within
:data:`KERNEL_TICK` seconds (``state`` reads ``online``, ``valid_zones`` the zone, the node's
``meminfo`` counts the block, ``has_memory`` lists the node) — :class:`MemoryHotplug`.

Methods run in the state store's writer thread, never on the event loop.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from emulator.redfish.model.state import BindingRecord, HostAddress
from emulator.redfish.sysfs.pciconfig import config_space, dsn_from_serial, link_speed_text
from manager_api.devices import DeviceType

__all__ = [
    "CXL_WINDOW_BASE",
    "HOST_BRIDGE",
    "KERNEL_TICK",
    "MEMORY_BLOCK_BYTES",
    "HostEntry",
    "HostView",
    "allocate_address",
    "cpu_nodes",
]

#: The host bridge every fabric-attached PCIe device of an emulated host sits under.
HOST_BRIDGE = "pci0000:40"
_FIRST_BUS = 0x41
_BUSES_PER_DOMAIN = 0xFF - _FIRST_BUS
_FIRST_IOMMU_GROUP = 32
_NVME_CHAR_MAJOR = 241
_VFIO_TYPES = {DeviceType.GPU, DeviceType.NIC, DeviceType.FPGA}
_MEMDEV_NAMESPACE = uuid.UUID("6c1f1a0e-8d5e-4f55-9a55-2f1c0de5a111")
#: the memory block size of every emulated host: x86-64 takes 128 MiB to 2 GiB (larger on big
#: machines); 1 GiB keeps a 64 GiB region at 64 blocks. kmem onlines whole blocks only, so a
#: region smaller than a block has none (it still serves as a dax device).
MEMORY_BLOCK_BYTES = 1 << 30
#: where the host's CXL fixed memory window starts (host physical address): regions are placed
#: from here, block-aligned, lowest free first
CXL_WINDOW_BASE = 1 << 40
#: how often the emulated kernel looks at the memory blocks' ``state`` files a node agent writes
KERNEL_TICK = 0.05
#: the files (and directories) of a PCIe function the emulator writes; the rest is a node agent's
_PCI_FILES = frozenset(
    {
        "vendor",
        "device",
        "class",
        "revision",
        "subsystem_vendor",
        "subsystem_device",
        "current_link_speed",
        "current_link_width",
        "max_link_speed",
        "max_link_width",
        "serial",
        "config",
        "numa_node",
        "reset",
        "iommu_group",
        "nvme",
    }
)


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
    host_bindings: list[tuple[BindingRecord, str]],
    device_type: DeviceType,
    device_id: str,
    *,
    size_bytes: int = 0,
    first_memory_node: int = 1,
) -> HostAddress:
    """Pick the sysfs names a newly bound target gets on a host: lowest free, like hot-plug.

    ``host_bindings`` are the host's current bindings, each with the Id of its device. CXL memory of
    ``size_bytes`` also gets a block-aligned range of host physical addresses in the CXL window and
    a NUMA node of its own, the lowest free from ``first_memory_node`` (past the host's CPU nodes).
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
        spans = sorted(
            (b.address.hpa, b.address.hpa + (b.address.hpa_bytes or 0))
            for b, _ in host_bindings
            if b.address.hpa is not None
        )
        span = -(-max(size_bytes, 1) // MEMORY_BLOCK_BYTES) * MEMORY_BLOCK_BYTES
        hpa = CXL_WINDOW_BASE
        for start, end in spans:
            if start - hpa >= span:
                break
            hpa = max(hpa, end)
        nodes = {b.address.node for b, _ in host_bindings if b.address.node is not None}
        return HostAddress(
            memdev=memdev,
            region=_lowest_free(regions, 0),
            hpa=hpa,
            hpa_bytes=span,
            node=_lowest_free(nodes, first_memory_node),
        )
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


def cpu_nodes(numa_node: int) -> int:
    """How many NUMA nodes with CPUs a host has whose fabric root port is on ``numa_node``: up to
    that one (at least one); its hot-added memory nodes come after them."""
    return max(numa_node, 0) + 1


def _write(path: Path, text: str | bytes) -> None:
    # plain os calls: these files are new, and Path.write_text's layers cost more than the write
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode("ascii") if isinstance(text, str) else text)
    finally:
        os.close(fd)


def _holds(path: Path, text: str) -> bool:
    """Whether ``path`` holds exactly ``text``."""
    data = text.encode("ascii")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        return os.read(fd, len(data) + 1) == data
    finally:
        os.close(fd)


def _rewrite(path: Path, text: str) -> None:
    """``path`` holding ``text``: left alone when it does already (a read costs ext4 no
    journalled change; a truncate and write free and allocate a block)."""
    if not _holds(path, text):
        _write(path, text)


def _links_to(link: Path, target: str) -> bool:
    try:
        return os.readlink(link) == target
    except OSError:
        return False


def _symlink(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        link.unlink()
    os.symlink(target, link)


def _new_symlink(link: Path, target: str) -> None:
    """A symlink in a directory that exists, where none is expected (one call, not three)."""
    try:
        os.symlink(target, link)
    except FileExistsError:
        _symlink(link, target)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class _LinkPool:
    """Symlinks an unbind took out of a host's tree, by target, for a bind to rename into place.

    A bind makes three links (the bus entry, the IOMMU group's member, the device's group) and
    an unbind removes them; on ext4 each new inode costs a scan of the recently deleted ones,
    which made these links a third of the emulator's CPU per bind+unbind. A link's target names
    only an address (``../../../devices/pci0000:40/0000:41:00.0``), so any parked link with the
    target a bind needs is the link it would make. The pool lives in ``<hosts_dir>.links``; what
    it holds is known from this process only (a restart lays the trees out anew).
    """

    def __init__(self, pool_dir: Path) -> None:
        self.pool_dir = pool_dir
        self._parked: dict[str, list[Path]] = {}
        self._names = itertools.count()

    def clear(self) -> None:
        self._parked.clear()

    def park(self, link: Path, target: str) -> None:
        """Take ``link`` out of its tree (one rename: gone at once for a scanner)."""
        try:
            if os.readlink(link) != target:
                raise OSError(link)  # not a link the emulator made there: removed, not kept
        except FileNotFoundError:
            return
        except OSError:
            _unlink(link)
            return
        parked = self.pool_dir / str(next(self._names))
        try:
            os.rename(link, parked)
        except FileNotFoundError:
            self.pool_dir.mkdir(parents=True, exist_ok=True)
            os.rename(link, parked)
        self._parked.setdefault(target, []).append(parked)

    def place(self, link: Path, target: str) -> None:
        """``link`` → ``target``: a parked one renamed into place (over what is there), else a new one."""
        kept = self._parked.get(target)
        if kept:
            with contextlib.suppress(FileNotFoundError):
                os.rename(kept.pop(), link)
                return
        _symlink(link, target)


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
        self.links = _LinkPool(hosts_dir.with_name(hosts_dir.name + ".links"))
        self._purge: queue.SimpleQueue[Path] = queue.SimpleQueue()
        self._purger: threading.Thread | None = None
        #: the kernel's part in memory hot-plug: blocks and NUMA nodes of hot-added CXL memory
        self.memory = MemoryHotplug(self)

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
            if parked.is_dir() and not parked.is_symlink():
                shutil.rmtree(parked, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    parked.unlink()

    def sys_root(self, host: str) -> Path:
        return self.hosts_dir / host / "sys"

    def prepare_host(self, host: str, system_uuid: str, cpu_nodes: int = 1) -> None:
        """The skeleton a host has with nothing bound: empty bus directories, its DMI UUID, its
        ``cpu_nodes`` NUMA nodes with CPUs, the memory block size."""
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
        self.memory.prepare(sys_root, cpu_nodes)

    def reset(self, hosts: dict[str, str], cpu_nodes: Mapping[str, int] | None = None) -> None:
        """Remove every host tree and lay out empty skeletons for ``hosts`` (name → UUID), each
        with its ``cpu_nodes`` (default 1). Memory blocks a node agent onlined come back online
        when their region does: the hosts did not restart with the fabric service."""
        self.memory.forget(self.hosts_dir)
        self.links.clear()
        for stale in (self.hosts_dir, self.stage_dir, self.trash_dir, self.links.pool_dir):
            if stale.exists():
                shutil.rmtree(stale)
        for host, system_uuid in hosts.items():
            if host not in self.qemu_hosts:
                self.prepare_host(host, system_uuid, (cpu_nodes or {}).get(host, 1))

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
        # numa_node and reset come back from the stage with the device: rewritten in place (and
        # only when they differ), not created
        _rewrite(dev / "numa_node", f"{e.numa_node}\n")
        _rewrite(dev / "reset", "")  # no function-level reset yet in this binding
        if e.address.iommu_group is not None:
            group = sys_root / "kernel" / "iommu_groups" / str(e.address.iommu_group)
            os.rename(stage / "group", group)
            self.links.place(group / "devices" / bdf, f"../../../../devices/{HOST_BRIDGE}/{bdf}")
            self.links.place(dev / "iommu_group", f"../../../kernel/iommu_groups/{e.address.iommu_group}")
        if e.address.nvme is not None:
            name = f"nvme{e.address.nvme}"
            ctrl = dev / "nvme" / name
            os.rename(dev / "nvme" / "ctrl", ctrl)
            _write(ctrl / "dev", f"{_NVME_CHAR_MAJOR}:{e.address.nvme}\n")
            _symlink(sys_root / "class" / "nvme" / name, f"../../devices/{HOST_BRIDGE}/{bdf}/nvme/{name}")
        # the bus entry last: a scanner that sees it finds every file already in place
        self.links.place(sys_root / "bus" / "pci" / "devices" / bdf, f"../../../devices/{HOST_BRIDGE}/{bdf}")

    def _remove_pci(self, e: HostEntry) -> None:
        """Move the device back to the stage: its bus entry first (the device is gone for
        scanners), its links to the pool, its directory and IOMMU group with their files."""
        bdf = e.address.bdf
        if bdf is None:
            raise ValueError(f"PCIe function {e.target} on {e.host} has no bus/device/function address")
        sys_root = self.sys_root(e.host)
        self.links.park(sys_root / "bus" / "pci" / "devices" / bdf, f"../../../devices/{HOST_BRIDGE}/{bdf}")
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
            self.links.park(dev / "iommu_group", f"../../../kernel/iommu_groups/{e.address.iommu_group}")
            self.links.park(group / "devices" / bdf, f"../../../../devices/{HOST_BRIDGE}/{bdf}")
            with contextlib.suppress(FileNotFoundError):
                os.rename(group, stage / "group")
        # what a node agent made under the device (a GPU's partitions) goes with it: the next host
        # it is bound to must not find the last tenant's
        for name in os.listdir(dev):
            if name not in _PCI_FILES:
                self._discard(dev / name)
        os.rename(dev, stage / "dev")

    # --- CXL -----------------------------------------------------------------------------

    def _add_cxl(self, e: HostEntry) -> None:
        memdev_n, region_n = e.address.memdev, e.address.region
        if memdev_n is None or region_n is None:
            raise ValueError(f"CXL memory {e.target} on {e.host} has no memdev/region number")
        sys_root = self.sys_root(e.host)
        memdev = f"mem{memdev_n}"
        mem = sys_root / "devices" / "cxl" / memdev
        bus_link = sys_root / "bus" / "cxl" / "devices" / memdev
        link_target = f"../../../devices/cxl/{memdev}"
        dsn = dsn_from_serial(e.serial)
        # Linux prints a memdev's serial as "%#llx"; a non-hex serial is written as it is.
        serial = (f"{dsn:#x}" if dsn is not None else e.serial) + "\n"
        # The kernel probes a memdev once (drivers/cxl/pci.c cxl_pci_probe → devm_cxl_add_memdev,
        # drivers/cxl/core/memdev.c: one memN per device, for the device's life); a region made on
        # it later (drivers/cxl/core/region.c) does not touch it. So here: a second region leaves
        # the memdev as it is. Made again (a truncate and write, a bus link removed and re-made), a
        # scanner looking for the first region's chunk then would find its memdev without a serial,
        # or none.
        if not (_links_to(bus_link, link_target) and _holds(mem / "serial", serial)):
            (mem / "ram").mkdir(parents=True, exist_ok=True)
            _rewrite(mem / "serial", serial)
            _rewrite(mem / "numa_node", f"{e.numa_node}\n")
            _rewrite(mem / "ram" / "size", f"{e.device_size_bytes:#x}\n")
            if not _links_to(bus_link, link_target):
                _symlink(bus_link, link_target)

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

        if e.address.hpa is not None:
            _write(reg / "resource", f"{e.address.hpa:#x}\n")

        dax_name = f"dax{region_n}.0"
        dax = reg / f"dax_region{region_n}" / dax_name
        dax.mkdir(parents=True, exist_ok=True)
        node = e.address.node if e.address.node is not None else e.numa_node
        _write(dax / "size", f"{e.size_bytes}\n")
        # target_node: the node the memory becomes once onlined; numa_node: the closest CPU node
        _write(dax / "target_node", f"{node}\n")
        _write(dax / "numa_node", f"{e.numa_node}\n")
        if e.address.hpa is not None:
            _write(dax / "resource", f"{e.address.hpa:#x}\n")
        # the memory blocks and the CPU-less node first: a scanner that finds the dax device finds them
        if e.address.hpa is not None and e.address.node is not None:
            first = e.address.hpa // MEMORY_BLOCK_BYTES
            self.memory.add(e.host, e.address.node, range(first, first + e.size_bytes // MEMORY_BLOCK_BYTES))
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
        if e.address.node is not None:
            self.memory.remove(e.host, e.address.node)
        _unlink(sys_root / "bus" / "cxl" / "devices" / f"region{region_n}")
        self._discard(sys_root / "devices" / "cxl" / f"region{region_n}")
        # The memdev goes once no region of this host targets it any more.
        for other in (sys_root / "devices" / "cxl").glob("region*/target0"):
            with contextlib.suppress(FileNotFoundError):
                if other.read_text().strip() == memdev:
                    return
        _unlink(sys_root / "bus" / "cxl" / "devices" / memdev)
        self._discard(sys_root / "devices" / "cxl" / memdev)


# --- memory hot-plug: the kernel's part ----------------------------------------------------------

#: memory block ``state`` a node agent may write → (what it reads back, ``online``, ``valid_zones``)
#: (Documentation/admin-guide/mm/memory-hotplug.rst: after ``online_movable`` the state reads
#: ``online`` and the zone is in ``valid_zones``)
_ONLINE_AS = {
    "online_movable": ("online", "1", "Movable"),
    "online_kernel": ("online", "1", "Normal"),
    "online": ("online", "1", "Normal"),
}
_OFFLINE = ("offline", "0", "Normal Movable")
_CPUS_PER_NODE = 8
_CPU_NODE_KIB = 64 << 20  # 64 GiB of boot memory per CPU node


def _node_list(nodes: set[int]) -> str:
    """Nodes as the kernel prints a nodemask list: ``0-1,3``."""
    ranges: list[str] = []
    for n in sorted(nodes):
        if ranges and ranges[-1].split("-")[-1] == str(n - 1):
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{n}"
        else:
            ranges.append(str(n))
    return ",".join(ranges) + "\n"


def _meminfo(node: int, total_kib: int) -> str:
    # drivers/base/node.c node_read_meminfo: "Node %d MemTotal:       %8lu kB"
    return (
        f"Node {node} MemTotal:       {total_kib:8d} kB\n"
        f"Node {node} MemFree:        {total_kib:8d} kB\n"
        f"Node {node} MemUsed:        {0:8d} kB\n"
    )


@dataclass
class _HostMemory:
    """One host's NUMA nodes: how many have CPUs, and the hot-added ones with their blocks."""

    sys_root: Path
    cpu_nodes: int
    #: CPU-less node → its memory blocks
    nodes: dict[int, list[int]] = field(default_factory=dict)
    #: block → what its ``state`` read last time the kernel looked (as it wrote it)
    states: dict[int, str] = field(default_factory=dict)


class MemoryHotplug:
    """Memory blocks and CPU-less NUMA nodes of each host's hot-added CXL memory, and the kernel's
    answer to a node agent's ``state`` writes, applied every :data:`KERNEL_TICK` seconds by a
    thread that runs while any host has such memory.

    Paths under ``<sys>/devices/system/``: ``memory/block_size_bytes`` (hex without ``0x``, as
    the kernel prints it), ``memory/auto_online_blocks``, ``memory/memory<M>/{state, online,
    valid_zones, removable, phys_index, node<K>}``; ``node/node<K>/{cpulist, meminfo,
    memory<M>}``, ``node/{online, has_cpu, has_memory, has_normal_memory}``
    (Documentation/ABI/testing/sysfs-devices-memory, ABI/stable/sysfs-devices-node).
    """

    def __init__(self, view: HostView) -> None:
        self.view = view
        self._lock = threading.Lock()
        self._hosts: dict[str, _HostMemory] = {}
        self._thread: threading.Thread | None = None
        #: (host, block) → (state, valid_zones) of blocks online when the trees were last laid out
        self._online: dict[tuple[str, int], tuple[str, str]] = {}
        #: (host, block) → how many more offlines of that block fail as pages in use would (a
        #: test's fault: mm/memory_hotplug.c offline_pages cannot migrate them, EBUSY)
        self.pinned: dict[tuple[str, int], int] = {}

    def prepare(self, sys_root: Path, cpu_nodes: int) -> None:
        """A host's memory and node directories with nothing hot-added."""
        system = sys_root / "devices" / "system"
        (system / "memory").mkdir(parents=True, exist_ok=True)
        _write(system / "memory" / "block_size_bytes", f"{MEMORY_BLOCK_BYTES:x}\n")
        # Debian's kernel leaves hot-added memory offline (CONFIG_MEMORY_HOTPLUG_DEFAULT_ONLINE unset)
        _write(system / "memory" / "auto_online_blocks", "offline\n")
        for n in range(max(cpu_nodes, 1)):
            node = system / "node" / f"node{n}"
            node.mkdir(parents=True, exist_ok=True)
            _write(node / "cpulist", f"{n * _CPUS_PER_NODE}-{(n + 1) * _CPUS_PER_NODE - 1}\n")
            _write(node / "meminfo", _meminfo(n, _CPU_NODE_KIB))
        host = _HostMemory(sys_root, max(cpu_nodes, 1))
        with self._lock:
            self._hosts[sys_root.parent.name] = host
            self._lists(host)

    def forget(self, hosts_dir: Path) -> None:
        """Before the trees under ``hosts_dir`` are laid out anew: keep which blocks are online."""
        with self._lock:
            self._hosts.clear()
            self._online.clear()
            for state in hosts_dir.glob("*/sys/devices/system/memory/memory[0-9]*/state"):
                block = state.parent
                with contextlib.suppress(OSError, ValueError):
                    if state.read_text().strip() == "online":
                        host = block.parents[4].name  # <hosts>/<host>/sys/devices/system/memory
                        zones = (block / "valid_zones").read_text().strip()
                        self._online[(host, int(block.name.removeprefix("memory")))] = ("online", zones)

    def add(self, host_name: str, node: int, blocks: range) -> None:
        """CPU-less node ``node`` with memory ``blocks`` (as ``auto_online_blocks`` says: offline)."""
        with self._lock:
            host = self._hosts.get(host_name)
            if host is None:
                return
            system = host.sys_root / "devices" / "system"
            node_dir = system / "node" / f"node{node}"
            node_dir.mkdir(parents=True, exist_ok=True)
            _write(node_dir / "cpulist", "\n")
            try:
                auto = (system / "memory" / "auto_online_blocks").read_text().strip()
            except FileNotFoundError:
                auto = "offline"
            for block in blocks:
                state, online, zones = _ONLINE_AS.get(auto, _OFFLINE)
                kept = self._online.pop((host_name, block), None)
                if kept is not None:
                    (state, zones), online = kept, "1"
                # a new directory of new files, made with the fewest calls: a 64 GiB region has 64
                path = system / "memory" / f"memory{block}"
                with contextlib.suppress(FileExistsError):  # only a tree edited by hand has it
                    os.mkdir(path)
                _write(path / "state", f"{state}\n")
                _write(path / "online", f"{online}\n")
                _write(path / "valid_zones", f"{zones}\n")
                _write(path / "removable", "1\n")
                _write(path / "phys_index", f"{block:08x}\n")
                _new_symlink(path / f"node{node}", f"../../node/node{node}")
                _new_symlink(node_dir / f"memory{block}", f"../../memory/memory{block}")
                host.states[block] = f"{state}\n"
            host.nodes[node] = list(blocks)
            self._meminfo(host, node)
            self._lists(host)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="hostview-kernel", daemon=True)
                self._thread.start()

    def remove(self, host_name: str, node: int) -> None:
        """Node ``node`` and its memory blocks are gone (the region was taken away)."""
        with self._lock:
            host = self._hosts.get(host_name)
            if host is None:
                return
            system = host.sys_root / "devices" / "system"
            for block in host.nodes.pop(node, []):
                host.states.pop(block, None)
                self.view._discard(system / "memory" / f"memory{block}")
            self.view._discard(system / "node" / f"node{node}")
            self._lists(host)

    def _run(self) -> None:
        while True:
            time.sleep(KERNEL_TICK)
            with self._lock:
                if not any(h.nodes for h in self._hosts.values()):
                    self._thread = None
                    return
                for host in self._hosts.values():
                    self._settle(host)

    def settle(self) -> None:
        """Answer every ``state`` write now (what the thread does each tick; for tests)."""
        with self._lock:
            for host in self._hosts.values():
                self._settle(host)

    def _settle(self, host: _HostMemory) -> None:
        memory = host.sys_root / "devices" / "system" / "memory"
        changed: set[int] = set()
        for node, blocks in host.nodes.items():
            for block in blocks:
                path = memory / f"memory{block}"
                try:
                    written = (path / "state").read_text()
                except FileNotFoundError:
                    continue
                last = host.states.get(block)
                if written == last:
                    continue
                request = written.strip()
                if request in _ONLINE_AS:
                    state, online, zones = _ONLINE_AS[request]
                    if last is not None and last.strip() == "online" and request != "online":
                        state, zones = "online", (path / "valid_zones").read_text().strip()  # EINVAL
                elif request == "offline" and self._pinned(host, block, last):
                    # refused: the block stays online (the real kernel's write fails with EBUSY)
                    state, online, zones = "online", "1", (path / "valid_zones").read_text().strip()
                elif request == "offline":
                    state, online, zones = _OFFLINE
                else:  # the kernel refuses anything else (EINVAL): the block stays as it was
                    state = (last or "offline\n").strip()
                    online = "1" if state == "online" else "0"
                    zones = (path / "valid_zones").read_text().strip()
                _write(path / "state", f"{state}\n")
                _write(path / "online", f"{online}\n")
                _write(path / "valid_zones", f"{zones}\n")
                host.states[block] = f"{state}\n"
                changed.add(node)
        for node in changed:
            self._meminfo(host, node)
        if changed:
            self._lists(host)

    def _pinned(self, host: _HostMemory, block: int, last: str | None) -> bool:
        """Whether an offline of an online ``block`` is refused now (and one refusal used)."""
        key = (host.sys_root.parent.name, block)
        left = self.pinned.get(key, 0)
        if left <= 0 or (last or "").strip() != "online":
            return False
        self.pinned[key] = left - 1
        return True

    def _online_blocks(self, host: _HostMemory, node: int) -> list[int]:
        return [b for b in host.nodes.get(node, []) if host.states.get(b, "").strip() == "online"]

    def _meminfo(self, host: _HostMemory, node: int) -> None:
        kib = len(self._online_blocks(host, node)) * (MEMORY_BLOCK_BYTES >> 10)
        _write(host.sys_root / "devices" / "system" / "node" / f"node{node}" / "meminfo", _meminfo(node, kib))

    def _lists(self, host: _HostMemory) -> None:
        base = host.sys_root / "devices" / "system" / "node"
        cpus = set(range(host.cpu_nodes))
        with_memory = {n for n in host.nodes if self._online_blocks(host, n)}
        normal = {
            n
            for n in with_memory
            if any(
                (base.parent / "memory" / f"memory{b}" / "valid_zones").read_text().strip() == "Normal"
                for b in self._online_blocks(host, n)
            )
        }
        _write(base / "online", _node_list(cpus | set(host.nodes)))
        _write(base / "has_cpu", _node_list(cpus))
        _write(base / "has_memory", _node_list(cpus | with_memory))
        _write(base / "has_normal_memory", _node_list(cpus | normal))
