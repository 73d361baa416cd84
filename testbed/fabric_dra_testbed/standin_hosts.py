"""What the manager stand-in's bindings look like on the nodes: the emulator's own host views
(:class:`emulator.redfish.sysfs.hostview.HostView`), laid out by the stand-in instead of by the
emulator's binding engine, so a plugin under test runs with ``--sysfs-root <root>/hosts/<node>/sys``
and finds exactly the files it finds beside the real emulator (docs/emulator.md, "What a host
sees"): a bound PCIe device's directory, a CXL region with its dax device, memory blocks and
CPU-less NUMA node, and the emulated kernel that answers the blocks' ``state`` writes.

Pages in use that refuse an offline (:meth:`EmulatedHosts.pages_in_use`) are the emulated kernel's
``pinned`` blocks: the real kernel's answer is ``EBUSY`` on the write; the emulated kernel answers a
node agent's writes a tick later, so it refuses by putting ``online`` back into ``state``, as its
answer to anything else it refuses. And where the emulator's release does not wait for the host,
this one checks: a region taken away while a block of it is online is recorded
(:attr:`EmulatedHosts.yanked`), the failure a node agent must never cause.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

from emulator.redfish.model.state import BindingRecord, HostAddress
from emulator.redfish.sysfs.hostview import (
    MEMORY_BLOCK_BYTES,
    HostEntry,
    HostView,
    allocate_address,
)
from manager_api.devices import BindingStyle, DeviceType
from manager_api.models import Device

__all__ = ["EmulatedHosts"]

_CLASS_CODES = {
    DeviceType.GPU: 0x030200,
    DeviceType.NVME: 0x010802,
    DeviceType.NIC: 0x020000,
    DeviceType.FPGA: 0x120000,
}


class EmulatedHosts:
    """The nodes' host views under ``root/hosts``; each node's tree at :meth:`sysfs`."""

    def __init__(self, root: Path, nodes: list[str]) -> None:
        self.view = HostView(root / "hosts")
        #: the emulated kernel's part in memory hot-plug (its ``pinned`` blocks refuse offlines)
        self.kernel = self.view.memory
        self.view.reset({node: f"00000000-0000-4000-8000-{i:012x}" for i, node in enumerate(nodes)})
        self._lock = threading.Lock()
        #: target → (its record, its entry, the device it comes from) while bound
        self._bound: dict[str, tuple[BindingRecord, HostEntry, str]] = {}
        #: regions taken away with a block online: "<node>/<target>: memory<B>"
        self.yanked: list[str] = []

    def sysfs(self, node: str) -> Path:
        return self.view.sys_root(node)

    def _entry(self, node: str, target: str, device: Device, address: HostAddress, size: int) -> HostEntry:
        def hex_or(value: str | None, default: int) -> int:
            return int(value, 16) if value else default

        return HostEntry(
            host=node,
            target=target,
            type=device.type,
            address=address,
            vendor_id=hex_or(device.vendor_id, 0x1D82),
            device_id=hex_or(device.device_id, 0x0001),
            class_code=_CLASS_CODES.get(device.type, 0x050210),
            revision_id=1,
            subsystem_vendor_id=hex_or(device.vendor_id, 0x1D82),
            subsystem_id=0,
            pcie_generation=device.pcie_generation or 5,
            pcie_width=device.pcie_width or 16,
            serial=device.serial or target,
            model=device.model or "",
            numa_node=0,
            size_bytes=size,
            device_size_bytes=device.memory_pool.size_bytes if device.memory_pool else size,
        )

    def plug(self, node: str, device: Device, *, target: str | None = None, size: int = 0) -> None:
        """``device`` appears on ``node`` (a share's region is ``target``, of ``size`` bytes)."""
        target = target or device.name
        with self._lock:
            if target in self._bound:
                return
            # a pool's regions share the pool device's memdev: bindings name the device they come from
            host_bindings = [(r, owner) for r, _, owner in self._bound.values() if r.host == node]
            address = allocate_address(host_bindings, device.type, device.name, size_bytes=size)
            record = BindingRecord(
                target=target,
                host=node,
                style=BindingStyle.CONNECTION if size else BindingStyle.ZONE,
                since=datetime.now(UTC),
                address=address,
            )
            entry = self._entry(node, target, device, address, size)
            self.view.add(entry)
            self._bound[target] = (record, entry, device.name)

    def unplug(self, target: str) -> None:
        """``target`` is taken away from its node (a region's blocks checked first)."""
        with self._lock:
            bound = self._bound.pop(target, None)
            if bound is None:
                return
            record, entry, _owner = bound
            if record.address.hpa is not None and entry.size_bytes:
                memory = self.sysfs(record.host) / "devices" / "system" / "memory"
                first = record.address.hpa // MEMORY_BLOCK_BYTES
                for block in range(first, first + entry.size_bytes // MEMORY_BLOCK_BYTES):
                    try:
                        state = (memory / f"memory{block}" / "state").read_text().strip()
                    except FileNotFoundError:
                        continue
                    if state != "offline":
                        self.yanked.append(f"{record.host}/{target}: memory{block} {state}")
            self.view.remove(entry)

    def pages_in_use(self, node: str, target: str, refusals: int) -> list[int]:
        """The next ``refusals`` offline writes to each block of region ``target`` on ``node``
        fail as pages in use would; the blocks."""
        record, entry, _owner = self._bound[target]
        if record.address.hpa is None:
            raise ValueError(f"{target} is no memory region")
        first = record.address.hpa // MEMORY_BLOCK_BYTES
        blocks = list(range(first, first + entry.size_bytes // MEMORY_BLOCK_BYTES))
        for block in blocks:
            self.kernel.pinned[(node, block)] = refusals
        return blocks

    def bound(self) -> dict[str, str]:
        """Target → node of everything plugged now."""
        with self._lock:
            return {target: record.host for target, (record, _, _) in self._bound.items()}
