"""What a host sees: the sysfs tree entries and the PCI configuration space the emulator writes."""

from __future__ import annotations

import dataclasses
import os
import random
import struct
from pathlib import Path

from emulator.redfish.model.state import BindingRecord, HostAddress, utcnow
from emulator.redfish.sysfs.hostview import (
    CXL_WINDOW_BASE,
    HOST_BRIDGE,
    MEMORY_BLOCK_BYTES,
    HostEntry,
    HostView,
    allocate_address,
)
from emulator.redfish.sysfs.pciconfig import CONFIG_SIZE, config_space, dsn_from_serial
from manager_api.devices import BindingStyle
from manager_api.models import DeviceType


def _gpu(serial: str = "48b02d0000a1f000", **address: int | str) -> HostEntry:
    return HostEntry(
        host="h1",
        target="gpu0",
        type=DeviceType.GPU,
        address=HostAddress(bdf="0000:41:00.0", iommu_group=32, **address),
        vendor_id=0x10DE,
        device_id=0x2331,
        class_code=0x030200,
        revision_id=0xA1,
        subsystem_vendor_id=0x10DE,
        subsystem_id=0x1626,
        pcie_generation=5,
        pcie_width=16,
        serial=serial,
        model="NVIDIA H100 PCIe",
        numa_node=1,
    )


def _find_capability(cfg: bytes, cap_id: int) -> int | None:
    pointer = cfg[0x34]
    while pointer:
        if cfg[pointer] == cap_id:
            return pointer
        pointer = cfg[pointer + 1]
    return None


def test_config_space_reads_like_real_hardware() -> None:
    cfg = config_space(
        vendor_id=0x10DE,
        device_id=0x2331,
        class_code=0x030200,
        revision_id=0xA1,
        subsystem_vendor_id=0x10DE,
        subsystem_id=0x1626,
        pcie_generation=5,
        pcie_width=16,
        serial="48b02d0000a1f000",
    )
    assert len(cfg) == CONFIG_SIZE
    vendor, device, _command, status = struct.unpack_from("<HHHH", cfg, 0)
    assert (vendor, device) == (0x10DE, 0x2331)
    assert status & 0x10, "capabilities list bit"
    assert cfg[0x08] == 0xA1 and int.from_bytes(cfg[0x09:0x0C], "little") == 0x030200
    assert cfg[0x0E] & 0x7F == 0, "type-0 header"
    assert struct.unpack_from("<HH", cfg, 0x2C) == (0x10DE, 0x1626)
    pcie = _find_capability(cfg, 0x10)
    assert pcie is not None
    link_status = struct.unpack_from("<H", cfg, pcie + 0x12)[0]
    assert link_status & 0xF == 5 and (link_status >> 4) & 0x3F == 16
    header = struct.unpack_from("<I", cfg, 0x100)[0]
    assert header & 0xFFFF == 0x0003 and (header >> 16) & 0xF == 1 and header >> 20 == 0
    low, high = struct.unpack_from("<II", cfg, 0x104)
    assert (high << 32) | low == 0x48B02D0000A1F000


def test_no_serial_capability_without_a_hex_serial() -> None:
    assert dsn_from_serial("S6EUNG0T500001") is None
    assert dsn_from_serial("1322023040501") is None
    cfg = config_space(
        vendor_id=0x144D,
        device_id=0xA826,
        class_code=0x010802,
        revision_id=0,
        subsystem_vendor_id=0x144D,
        subsystem_id=0,
        pcie_generation=5,
        pcie_width=4,
        serial="S6EUNG0T500001",
    )
    assert cfg[0x100:0x10C] == bytes(12)


def test_pci_device_appears_and_disappears(tmp_path: Path) -> None:
    view = HostView(tmp_path)
    view.reset({"h1": "256EBD99-678F-4F37-B1B6-3B826CE5E7A8"})
    sys_root = view.sys_root("h1")
    assert (
        sys_root / "class" / "dmi" / "id" / "product_uuid"
    ).read_text() == "256ebd99-678f-4f37-b1b6-3b826ce5e7a8\n"
    entry = _gpu()
    view.add(entry)
    link = sys_root / "bus" / "pci" / "devices" / "0000:41:00.0"
    assert link.is_symlink() and not os.readlink(link).startswith("/"), (
        "relative links keep the tree relocatable"
    )
    device = link.resolve()
    assert device == (sys_root / "devices" / HOST_BRIDGE / "0000:41:00.0").resolve()
    files = {p.name: p.read_bytes() for p in device.iterdir() if p.is_file() and not p.is_symlink()}
    assert files["vendor"] == b"0x10de\n" and files["device"] == b"0x2331\n"
    assert files["class"] == b"0x030200\n" and files["subsystem_vendor"] == b"0x10de\n"
    assert files["subsystem_device"] == b"0x1626\n" and files["numa_node"] == b"1\n"
    assert files["current_link_speed"] == b"32.0 GT/s PCIe\n" and files["current_link_width"] == b"16\n"
    assert files["serial"] == b"48b02d0000a1f000\n"
    assert len(files["config"]) == CONFIG_SIZE
    group = (link / "iommu_group").resolve()
    assert group == (sys_root / "kernel" / "iommu_groups" / "32").resolve()
    assert (group / "devices" / "0000:41:00.0").resolve() == device

    view.remove(entry)
    assert not link.exists() and not link.is_symlink()
    assert not (sys_root / "kernel" / "iommu_groups" / "32").exists()
    assert list((sys_root / "devices" / HOST_BRIDGE).iterdir()) == []


def test_nvme_controller(tmp_path: Path) -> None:
    view = HostView(tmp_path)
    view.reset({"h1": "256ebd99-678f-4f37-b1b6-3b826ce5e7a8"})
    entry = HostEntry(
        **{
            **_gpu().__dict__,
            "type": DeviceType.NVME,
            "serial": "S6EUNG0T500001",
            "model": "PM1743",
            "address": HostAddress(bdf="0000:42:00.0", nvme=0),
        }
    )
    view.add(entry)
    sys_root = view.sys_root("h1")
    controller = sys_root / "bus" / "pci" / "devices" / "0000:42:00.0" / "nvme" / "nvme0"
    assert (controller / "serial").read_text() == "S6EUNG0T500001\n"
    assert (controller / "dev").read_text().endswith(":0\n")
    assert (sys_root / "class" / "nvme" / "nvme0").resolve() == controller.resolve()
    assert not (sys_root / "bus" / "pci" / "devices" / "0000:42:00.0" / "iommu_group").exists()
    view.remove(entry)
    assert not (sys_root / "class" / "nvme" / "nvme0").exists()


def _chunk(target: str, region: int) -> HostEntry:
    """A 16 GiB chunk of the 64 GiB CXL device of serial c0ffee000001 (memdev 0), on host h1."""
    return HostEntry(
        **{
            **_gpu().__dict__,
            "type": DeviceType.CXL_MEMORY,
            "serial": "0000c0ffee000001",
            "size_bytes": 16 << 30,
            "device_size_bytes": 64 << 30,
            "target": target,
            "address": HostAddress(memdev=0, region=region),
        }
    )


def test_cxl_memdev_is_shared_by_the_chunks_of_one_device(tmp_path: Path) -> None:
    view = HostView(tmp_path)
    view.reset({"h1": "256ebd99-678f-4f37-b1b6-3b826ce5e7a8"})
    first, second = _chunk("cxl-c0", 0), _chunk("cxl-c1", 1)
    view.add(first)
    view.add(second)
    cxl = view.sys_root("h1") / "bus" / "cxl" / "devices"
    assert sorted(p.name for p in cxl.iterdir()) == ["mem0", "region0", "region1"]
    assert (cxl / "mem0" / "serial").read_text() == "0xc0ffee000001\n"
    assert (cxl / "region1" / "size").read_text() == "0x400000000\n"
    assert (cxl / "region1" / "mode").read_text() == "ram\n"
    assert (cxl / "region1" / "target0").read_text() == "mem0\n"
    assert (
        view.sys_root("h1") / "bus" / "dax" / "devices" / "dax1.0" / "size"
    ).read_text() == f"{16 << 30}\n"
    view.remove(first)
    assert sorted(p.name for p in cxl.iterdir()) == ["mem0", "region1"], "mem0 stays while region1 uses it"
    view.remove(second)
    assert list(cxl.iterdir()) == []


def test_a_second_chunk_leaves_the_memdev_a_first_chunk_uses_untouched(tmp_path: Path) -> None:
    """The kernel probes a memdev once; a second region on it does not re-create the memdev. A
    rewrite (truncate, then write) or a re-made bus link leaves a moment in which a scanner finds
    the memdev without its serial or not at all, and with it the first chunk gone from the host."""
    view = HostView(tmp_path)
    view.reset({"h1": "256ebd99-678f-4f37-b1b6-3b826ce5e7a8"})
    view.add(_chunk("cxl-c0", 0))
    cxl = view.sys_root("h1") / "bus" / "cxl" / "devices"
    memdev = view.sys_root("h1") / "devices" / "cxl" / "mem0"
    watched = [cxl / "mem0", memdev / "serial", memdev / "numa_node", memdev / "ram" / "size"]
    for path in watched:  # an old time stamp: any write or re-make after this shows
        os.utime(path, ns=(10**18, 10**18), follow_symlinks=False)
    before = [(os.lstat(p).st_ino, os.lstat(p).st_mtime_ns, os.lstat(p).st_size) for p in watched]
    second = _chunk("cxl-c1", 1)
    for _ in range(3):
        view.add(second)
        view.remove(second)
    view.add(second)
    after = [(os.lstat(p).st_ino, os.lstat(p).st_mtime_ns, os.lstat(p).st_size) for p in watched]
    assert after == before
    assert (cxl / "mem0" / "serial").read_text() == "0xc0ffee000001\n"


def _binding(target: str, address: HostAddress) -> BindingRecord:
    return BindingRecord(target=target, host="h1", style=BindingStyle.ZONE, since=utcnow(), address=address)


def test_addresses_are_lowest_free_like_hot_plug() -> None:
    first = allocate_address([], DeviceType.GPU, "gpu0")
    assert first == HostAddress(bdf="0000:41:00.0", iommu_group=32)
    taken = [
        (_binding("gpu0", first), "gpu0"),
        (_binding("gpu1", HostAddress(bdf="0000:43:00.0", iommu_group=34)), "gpu1"),
    ]
    assert allocate_address(taken, DeviceType.NIC, "nic0") == HostAddress(bdf="0000:42:00.0", iommu_group=33)
    assert allocate_address(taken, DeviceType.NVME, "nvme0") == HostAddress(bdf="0000:42:00.0", nvme=0)
    gib = 1 << 30
    window = CXL_WINDOW_BASE
    chunks = [
        (_binding("c0", HostAddress(memdev=0, region=0, hpa=window, hpa_bytes=2 * gib, node=1)), "cxl0")
    ]
    # the next region: after the first in the CXL window, block-aligned, on a node of its own
    assert allocate_address(
        chunks, DeviceType.CXL_MEMORY, "cxl0", size_bytes=gib + 1, first_memory_node=1
    ) == HostAddress(memdev=0, region=1, hpa=window + 2 * gib, hpa_bytes=2 * gib, node=2)
    assert allocate_address(chunks, DeviceType.CXL_MEMORY, "cxl1", size_bytes=gib, first_memory_node=2) == (
        HostAddress(memdev=1, region=1, hpa=window + 2 * gib, hpa_bytes=gib, node=2)
    )
    # a hole left by a released region is used again when the new one fits in it
    gap = [
        *chunks,
        (
            _binding("c2", HostAddress(memdev=0, region=2, hpa=window + 4 * gib, hpa_bytes=gib, node=2)),
            "cxl0",
        ),
    ]
    gap[0] = (
        _binding("c0", HostAddress(memdev=0, region=0, hpa=window + gib, hpa_bytes=gib, node=1)),
        "cxl0",
    )
    assert allocate_address(gap, DeviceType.CXL_MEMORY, "cxl0", size_bytes=gib).hpa == window
    assert allocate_address(gap, DeviceType.CXL_MEMORY, "cxl0", size_bytes=2 * gib).hpa == window + 2 * gib
    # past the last bus of a domain, hot-plugged devices continue in the next PCI domain
    full: list[tuple[BindingRecord, str]] = []
    for i in range(0xFF - 0x41):
        address = allocate_address(full, DeviceType.NVME, f"n{i}")
        full.append((_binding(f"n{i}", address), f"n{i}"))
    assert full[-1][0].address.bdf == "0000:fe:00.0"
    assert allocate_address(full, DeviceType.NVME, "last").bdf == "0001:41:00.0"


def _cxl(target: str, region: int, node: int, size: int, hpa: int) -> HostEntry:
    return HostEntry(
        **{
            **_gpu().__dict__,
            "target": target,
            "type": DeviceType.CXL_MEMORY,
            "serial": "0000c0ffee000100",
            "size_bytes": size,
            "device_size_bytes": 256 << 30,
            "address": HostAddress(memdev=0, region=region, hpa=hpa, hpa_bytes=size, node=node),
        }
    )


def test_cxl_memory_brings_blocks_and_a_cpu_less_node_the_kernel_onlines(tmp_path: Path) -> None:
    view = HostView(tmp_path)
    view.reset({"h1": "256ebd99-678f-4f37-b1b6-3b826ce5e7a8"}, {"h1": 2})
    system = view.sys_root("h1") / "devices" / "system"
    assert (system / "memory" / "block_size_bytes").read_text() == f"{MEMORY_BLOCK_BYTES:x}\n"
    assert (system / "node" / "online").read_text() == "0-1\n"
    assert (system / "node" / "node1" / "cpulist").read_text() == "8-15\n"
    gib = 1 << 30
    entry = _cxl("pool-c1", 0, 2, 3 * gib + gib // 2, CXL_WINDOW_BASE)
    view.add(entry)
    # whole blocks only (kmem onlines no part of one): 3.5 GiB is 3 blocks of 1 GiB
    first = CXL_WINDOW_BASE // MEMORY_BLOCK_BYTES
    blocks = sorted(p.name for p in (system / "memory").glob("memory[0-9]*"))
    assert blocks == [f"memory{first + i}" for i in range(3)]
    block = system / "memory" / blocks[0]
    assert (block / "state").read_text() == "offline\n" and (block / "online").read_text() == "0\n"
    assert (block / "phys_index").read_text() == f"{first:08x}\n"
    assert (block / "node2").resolve() == (system / "node" / "node2").resolve()
    assert (system / "node" / "node2" / blocks[1]).resolve() == (system / "memory" / blocks[1]).resolve()
    assert (system / "node" / "node2" / "cpulist").read_text() == "\n"
    assert (system / "node" / "online").read_text() == "0-2\n"
    assert (system / "node" / "has_memory").read_text() == "0-1\n", "nothing of node2 is online yet"
    dax = view.sys_root("h1") / "bus" / "dax" / "devices" / "dax0.0"
    assert (dax / "target_node").read_text() == "2\n" and (dax / "numa_node").read_text() == "1\n"
    region = view.sys_root("h1") / "bus" / "cxl" / "devices" / "region0"
    assert (region / "resource").read_text() == f"{CXL_WINDOW_BASE:#x}\n"

    # a node agent onlines two blocks movable and writes nonsense to the third
    (block / "state").write_text("online_movable\n")
    (system / "memory" / blocks[1] / "state").write_text("online\n")
    (system / "memory" / blocks[2] / "state").write_text("sideways\n")
    view.memory.settle()
    assert (block / "state").read_text() == "online\n" and (block / "valid_zones").read_text() == "Movable\n"
    assert (system / "memory" / blocks[1] / "valid_zones").read_text() == "Normal\n"
    assert (system / "memory" / blocks[2] / "state").read_text() == "offline\n", "refused, as EINVAL"
    meminfo = (system / "node" / "node2" / "meminfo").read_text()
    assert meminfo.startswith(f"Node 2 MemTotal:       {2 * gib >> 10:8d} kB\n")
    assert (system / "node" / "has_memory").read_text() == "0-2\n"
    assert (system / "node" / "has_normal_memory").read_text() == "0-2\n"
    (block / "state").write_text("offline\n")
    (system / "memory" / blocks[1] / "state").write_text("offline\n")
    view.memory.settle()
    assert (system / "node" / "has_memory").read_text() == "0-1\n"
    assert "MemTotal:              0 kB" in (system / "node" / "node2" / "meminfo").read_text()

    view.remove(entry)
    assert list((system / "memory").glob("memory[0-9]*")) == []
    assert sorted(p.name for p in (system / "node").glob("node[0-9]*")) == ["node0", "node1"]
    assert (system / "node" / "online").read_text() == "0-1\n"


def test_hot_added_memory_follows_auto_online_blocks(tmp_path: Path) -> None:
    view = HostView(tmp_path)
    view.reset({"h1": "256ebd99-678f-4f37-b1b6-3b826ce5e7a8"})
    system = view.sys_root("h1") / "devices" / "system"
    assert (system / "memory" / "auto_online_blocks").read_text() == "offline\n"
    (system / "memory" / "auto_online_blocks").write_text("online_movable\n")
    view.add(_cxl("pool-c1", 0, 1, 2 << 30, CXL_WINDOW_BASE))
    states = {(p / "state").read_text() for p in (system / "memory").glob("memory[0-9]*")}
    assert states == {"online\n"}
    assert (system / "node" / "has_memory").read_text() == "0-1\n"


def test_what_a_node_agent_made_under_a_device_goes_with_it(tmp_path: Path) -> None:
    """A GPU's partitions (docs/emulator.md: the plugin writes ``mig/<label>-<start>/``) vanish
    when the GPU is unbound, and the next host it is bound to finds none of them."""
    view = HostView(tmp_path)
    view.reset({"h1": "256ebd99-678f-4f37-b1b6-3b826ce5e7a8", "h2": "cada35a1-97be-4c3e-813e-f502cc82b866"})
    entry = _gpu()
    view.add(entry)
    device = view.sys_root("h1") / "bus" / "pci" / "devices" / "0000:41:00.0"
    partition = device / "mig" / "1g10gb-3"
    partition.mkdir(parents=True)
    for name, text in {
        "uuid": "MIG-5f0e…",
        "profile": "1g.10gb",
        "start": "3",
        "size": "1",
        "minor": "7",
    }.items():
        (partition / name).write_text(text + "\n")
    (device / "agent-note").write_text("a file of the node agent's\n")
    view.remove(entry)
    assert not device.exists()
    moved = HostEntry(**{**entry.__dict__, "host": "h2"})
    view.add(moved)
    again = view.sys_root("h2") / "bus" / "pci" / "devices" / "0000:41:00.0"
    assert (again / "vendor").read_text() == "0x10de\n"
    assert not (again / "mig").exists() and not (again / "agent-note").exists()


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a link's target, a file's text, a directory's mark."""
    out: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = "-> " + os.readlink(path)
            elif path.is_dir():
                out[rel] = "/"
            else:
                out[rel] = path.read_bytes().hex()
    return out


def test_a_device_moved_between_hosts_and_addresses_leaves_the_tree_a_fresh_bind_makes(
    tmp_path: Path,
) -> None:
    """A bind reuses what the last unbind parked (files, IOMMU links, the bus entry): after binds
    and unbinds on other hosts, other addresses and other groups, with a node agent's reset in
    between, each host's tree is the one a first bind on a fresh view writes."""
    rng = random.Random(7)  # a fixed sequence
    entry = _gpu()
    used = HostView(tmp_path / "used" / "hosts")
    used.reset({"h1": "u1", "h2": "u2"})
    for turn in range(40):
        host = rng.choice(["h1", "h2"])
        bdf = rng.choice(["0000:41:00.0", "0000:42:00.0"])
        group = rng.choice([32, 33])
        address = HostAddress(bdf=bdf, iommu_group=group)
        entry = dataclasses.replace(entry, host=host, address=address, numa_node=rng.choice([0, 1]))
        used.add(entry)
        fresh = HostView(tmp_path / f"fresh{turn}" / "hosts")
        fresh.reset({"h1": "u1", "h2": "u2"})
        fresh.add(entry)
        for name in ("h1", "h2"):
            assert _tree(used.sys_root(name)) == _tree(fresh.sys_root(name)), (host, bdf, group)
        if rng.random() < 0.5:  # a node agent's function-level reset: the next bind starts at none
            (used.sys_root(host) / "devices" / HOST_BRIDGE / bdf / "reset").write_text("1\n")
        used.remove(entry)
        empty = HostView(tmp_path / f"empty{turn}" / "hosts")
        empty.reset({"h1": "u1", "h2": "u2"})
        for name in ("h1", "h2"):
            assert _tree(used.sys_root(name)) == _tree(empty.sys_root(name)), (host, bdf, group)
