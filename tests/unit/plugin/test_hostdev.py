from __future__ import annotations

import asyncio
import os
import struct
from pathlib import Path

import pytest

from dra_driver.plugin.hostdev import (
    DeviceIdentity,
    DeviceNotVisible,
    HostScanner,
    normalize_serial,
    pcie_device_serial,
)
from dra_driver.plugin.hostview import read_attr


def pci_device(
    root: Path,
    bdf: str,
    vendor: int,
    device: int,
    *,
    serial: str | None = None,
    group: int | None = None,
    nvme: str | None = None,
    driver: str | None = None,
) -> Path:
    dev = root / "bus" / "pci" / "devices" / bdf
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(f"0x{vendor:04x}\n")
    (dev / "device").write_text(f"0x{device:04x}\n")
    (dev / "class").write_text("0x030200\n")
    (dev / "numa_node").write_text("1\n")
    if serial is not None:
        (dev / "serial").write_text(serial + "\n")
    if group is not None:
        target = root / "kernel" / "iommu_groups" / str(group)
        target.mkdir(parents=True, exist_ok=True)
        os.symlink(target, dev / "iommu_group")
    if nvme is not None:
        (dev / "nvme" / nvme).mkdir(parents=True)
    if driver is not None:
        drv = root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        (drv / "unbind").write_text("")
        os.symlink(drv, dev / "driver")
    return dev


GPU = DeviceIdentity(name="gpu-0", type="gpu", vendor_id="0x10de", device_id="0x2330", serial="1654922000123")


def test_finds_a_pci_device_by_vendor_device_and_serial(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:41:00.0", 0x10DE, 0x2330, serial="1654922000999", group=11)
    pci_device(tmp_path, "0000:42:00.0", 0x10DE, 0x2330, serial="1654922000123", group=12)
    found = HostScanner(tmp_path, real_host=False).find(GPU)
    assert found is not None
    assert found.pci_address == "0000:42:00.0"
    assert found.iommu_group == "12"
    assert found.numa_node == 1
    assert found.device_nodes == ["/dev/vfio/12"]  # what a real host would expose


def test_real_host_exposes_vfio_only_when_vfio_pci_drives_the_device(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:41:00.0", 0x10DE, 0x2330, serial="1654922000123", group=12, driver="nvidia")
    found = HostScanner(tmp_path, real_host=True).find(GPU)
    assert found is not None and found.driver == "nvidia" and found.device_nodes == []


def test_nvme_controller_is_a_device_node(tmp_path: Path) -> None:
    pci_device(tmp_path, "0000:43:00.0", 0x144D, 0xA824, serial="S6XNNS0T", nvme="nvme2")
    nvme = DeviceIdentity(
        name="nvme-1", type="nvme", vendor_id="0x144d", device_id="0xa824", serial="S6XNNS0T"
    )
    found = HostScanner(tmp_path, real_host=False).find(nvme)
    assert found is not None and found.device_nodes == ["/dev/nvme2"]


def test_exclude_skips_devices_held_by_other_claims(tmp_path: Path) -> None:
    first = pci_device(tmp_path, "0000:41:00.0", 0x10DE, 0x2330)
    pci_device(tmp_path, "0000:42:00.0", 0x10DE, 0x2330)
    anonymous = DeviceIdentity(name="gpu-0", type="gpu", vendor_id="0x10de", device_id="0x2330")
    scanner = HostScanner(tmp_path, real_host=False)
    assert scanner.find(anonymous).pci_address == "0000:41:00.0"  # type: ignore[union-attr]
    assert scanner.find(anonymous, {str(first)}).pci_address == "0000:42:00.0"  # type: ignore[union-attr]


def cxl_tree(root: Path, *, serial: str = "0x1234abcd", size: int = 1 << 30, region: int = 0) -> None:
    cxl = root / "bus" / "cxl" / "devices"
    (cxl / "mem0").mkdir(parents=True, exist_ok=True)
    (cxl / "mem0" / "serial").write_text(serial + "\n")
    reg = cxl / f"region{region}"
    reg.mkdir()
    (reg / "size").write_text(f"{size:#x}\n")
    (reg / "target0").write_text("mem0\n")
    (reg / "mode").write_text("ram\n")
    (root / "bus" / "dax" / "devices" / f"dax{region}.0").mkdir(parents=True)


def test_finds_a_cxl_chunk_by_memdev_serial_and_size(tmp_path: Path) -> None:
    cxl_tree(tmp_path, size=1 << 30, region=0)
    cxl_tree(tmp_path, size=2 << 30, region=1)
    chunk = DeviceIdentity(name="cxl-0", type="cxl-memory", serial="1234ABCD", memory_bytes=2 << 30)
    found = HostScanner(tmp_path, real_host=False).find(chunk)
    assert found is not None
    assert (found.memdev, found.region, found.dax, found.device_nodes) == (
        "mem0",
        "region1",
        "dax1.0",
        ["/dev/dax1.0"],
    )
    other = DeviceIdentity(name="cxl-1", type="cxl-memory", serial="ffff", memory_bytes=2 << 30)
    assert HostScanner(tmp_path, real_host=False).find(other) is None


def test_device_serial_number_capability_is_read_from_config_space() -> None:
    config = bytearray(4096)
    # AER at 0x100 -> DSN at 0x140 -> end of list
    struct.pack_into("<I", config, 0x100, 0x0001 | (1 << 16) | (0x140 << 20))
    struct.pack_into("<I", config, 0x140, 0x0003 | (1 << 16))
    struct.pack_into("<Q", config, 0x144, 0x0011223344556677)
    assert pcie_device_serial(bytes(config)) == "00-11-22-33-44-55-66-77"
    assert pcie_device_serial(bytes(4096)) is None
    assert normalize_serial("00-11-22-33-44-55-66-77") == normalize_serial("0x11223344556677")


def test_real_host_falls_back_to_the_config_space_serial(tmp_path: Path) -> None:
    dev = pci_device(tmp_path, "0000:41:00.0", 0x10DE, 0x2330)
    config = bytearray(4096)
    struct.pack_into("<I", config, 0x100, 0x0003 | (1 << 16))
    struct.pack_into("<Q", config, 0x104, 0xABCDEF)
    (dev / "config").write_bytes(bytes(config))
    identity = DeviceIdentity(name="g", type="gpu", vendor_id="0x10de", device_id="0x2330", serial="0xabcdef")
    assert HostScanner(tmp_path, real_host=True).find(identity) is not None


async def test_wait_visible_returns_once_the_device_appears(tmp_path: Path) -> None:
    scanner = HostScanner(tmp_path, real_host=False)

    async def appear() -> None:
        await asyncio.sleep(0.05)
        pci_device(tmp_path, "0000:42:00.0", 0x10DE, 0x2330, serial="1654922000123")
        scanner.changes.notify()

    task = asyncio.create_task(appear())
    found = await scanner.wait_visible(GPU, within=10.0)
    await task
    assert found.pci_address == "0000:42:00.0"


async def test_wait_visible_gives_up_with_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DeviceNotVisible, match="did not appear"):
        await HostScanner(tmp_path, real_host=False).wait_visible(GPU, within=0.05)


async def test_pci_rescan_is_written_while_waiting(tmp_path: Path) -> None:
    (tmp_path / "bus" / "pci").mkdir(parents=True)
    (tmp_path / "bus" / "pci" / "rescan").write_text("")
    with pytest.raises(DeviceNotVisible):
        await HostScanner(tmp_path, real_host=True, pci_rescan=True).wait_visible(GPU, within=0.05)
    assert (tmp_path / "bus" / "pci" / "rescan").read_text() == "1"


def test_removal_unbinds_the_driver_then_removes_the_device(tmp_path: Path) -> None:
    dev = pci_device(tmp_path, "0000:41:00.0", 0x10DE, 0x2330, serial="1654922000123", driver="vfio-pci")
    (dev / "remove").write_text("")
    scanner = HostScanner(tmp_path, real_host=True)
    found = scanner.find(GPU)
    assert found is not None
    scanner.remove(found)
    assert (tmp_path / "bus" / "pci" / "drivers" / "vfio-pci" / "unbind").read_text() == "0000:41:00.0"
    assert (dev / "remove").read_text() == "1"


def test_removal_writes_nothing_into_an_emulated_tree(tmp_path: Path) -> None:
    dev = pci_device(tmp_path, "0000:41:00.0", 0x10DE, 0x2330, serial="1654922000123")
    scanner = HostScanner(tmp_path, real_host=False)
    found = scanner.find(GPU)
    assert found is not None
    before = sorted(os.listdir(dev))
    scanner.remove(found)
    assert sorted(os.listdir(dev)) == before


def test_an_attribute_reads_as_its_stripped_value_or_none(tmp_path: Path) -> None:
    """sysfs attributes through plain os calls: the value without its newline; None for what is
    not there or is no file; bytes that are no UTF-8 do not end the scan with an exception."""
    (tmp_path / "vendor").write_text("0x10de\n")
    (tmp_path / "odd").write_bytes(b"\xff\xfe0x1\n")
    assert read_attr(tmp_path / "vendor") == "0x10de"
    assert read_attr(str(tmp_path / "vendor")) == "0x10de"
    assert read_attr(tmp_path / "missing") is None
    assert read_attr(tmp_path) is None  # a directory
    assert read_attr(tmp_path / "vendor" / "below") is None  # not a directory on the way
    assert read_attr(tmp_path / "odd") == "\ufffd\ufffd0x1"
