"""The scanner's real-host rules on a hand-made sysfs tree: ready means driver bound (NVMe, NICs),
a serial is compared only where the device exposes one (docs/plugin.md, "On a real host")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.plugin.hostdev import DeviceIdentity, HostScanner, active_nvme_namespaces


def _device(root: Path, bdf: str, vendor: int, device: int, pci_class: int) -> Path:
    dev = root / "devices" / "pci0000:00" / bdf
    dev.mkdir(parents=True)
    (dev / "vendor").write_text(f"0x{vendor:04x}\n")
    (dev / "device").write_text(f"0x{device:04x}\n")
    (dev / "class").write_text(f"0x{pci_class:06x}\n")
    (dev / "config").write_bytes(bytes(256))  # no extended capabilities: no DSN
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(dev, bus / bdf)
    return dev


def _bind(root: Path, dev: Path, driver: str) -> None:
    drv = root / "bus" / "pci" / "drivers" / driver
    drv.mkdir(parents=True, exist_ok=True)
    os.symlink(drv, dev / "driver")


NIC = DeviceIdentity(
    name="nic-0", type="nic", vendor_id="0x8086", device_id="0x10d3", serial="525400ffff0000a1"
)
GPU = DeviceIdentity(name="gpu-0", type="gpu", vendor_id="0x1234", device_id="0x11e8", serial="FDQEDU0000")


def test_a_nic_without_a_driver_is_not_ready_and_says_why(tmp_path: Path) -> None:
    _device(tmp_path, "0000:02:00.0", 0x8086, 0x10D3, 0x020000)
    scanner = HostScanner(tmp_path, real_host=True)
    assert scanner.find(NIC) is None
    assert "no driver is bound to it" in scanner.not_ready["nic-0"]
    assert "dmesg | grep 0000:02:00.0" in scanner.not_ready["nic-0"]


def test_a_bound_nic_is_ready_once_its_interface_exists(tmp_path: Path) -> None:
    dev = _device(tmp_path, "0000:02:00.0", 0x8086, 0x10D3, 0x020000)
    _bind(tmp_path, dev, "e1000e")
    scanner = HostScanner(tmp_path, real_host=True)
    assert scanner.find(NIC) is None
    assert "has not registered a network interface" in scanner.not_ready["nic-0"]
    (dev / "net" / "eth1").mkdir(parents=True)
    found = scanner.find(NIC)
    assert found is not None and found.net_interfaces == ["eth1"] and found.driver == "e1000e"
    assert "nic-0" not in scanner.not_ready


@pytest.mark.parametrize("real_host", [True, False])
def test_a_device_without_any_serial_matches_by_id_only_on_a_real_host(
    tmp_path: Path, real_host: bool
) -> None:
    _device(tmp_path, "0000:03:00.0", 0x1234, 0x11E8, 0x00FF00)
    found = HostScanner(tmp_path, real_host=real_host).find(GPU)
    # an emulated tree always has a serial file: there a missing one is a mismatch
    assert (found is not None) is real_host


def test_an_nvme_serial_is_read_from_its_controller(tmp_path: Path) -> None:
    dev = _device(tmp_path, "0000:01:00.0", 0x1B36, 0x0010, 0x010802)
    _bind(tmp_path, dev, "nvme")
    scanner = HostScanner(tmp_path, real_host=True)
    want = DeviceIdentity(name="nvme-0", type="nvme", vendor_id="0x1b36", device_id="0x0010", serial="SN1")
    assert scanner.find(want) is None
    assert "has not set up a controller" in scanner.not_ready["nvme-0"]
    ctrl = dev / "nvme" / "nvme0"
    ctrl.mkdir(parents=True)
    (ctrl / "serial").write_text("SN2                 \n")
    (ctrl / "state").write_text("live\n")
    # /dev/nvme0 of this made-up tree does not exist on the machine running the test
    assert scanner.find(want) is None
    assert scanner._pci_serial(dev) == "SN2"


@pytest.mark.parametrize(("driver", "nodes"), [("vfio-pci", ["/dev/vfio/7", "/dev/vfio/vfio"]), ("edu", [])])
def test_vfio_nodes_only_while_vfio_pci_drives_the_device(
    tmp_path: Path, driver: str, nodes: list[str]
) -> None:
    """The QEMU guests have no IOMMU, so this rule is shown on a hand-made tree only: a device in
    IOMMU group 7 gets /dev/vfio/7 and the container /dev/vfio/vfio while vfio-pci drives it, and
    no vfio node under any other driver (the group's node exists only under vfio-pci)."""
    dev = _device(tmp_path, "0000:03:00.0", 0x1234, 0x11E8, 0x00FF00)
    group = tmp_path / "kernel" / "iommu_groups" / "7"
    group.mkdir(parents=True)
    os.symlink(group, dev / "iommu_group")
    _bind(tmp_path, dev, driver)
    found = HostScanner(tmp_path, real_host=True).find(GPU)
    assert found is not None and found.device_nodes == nodes


@pytest.mark.parametrize(("active", "waits_for"), [(2, 2), (None, 1), (0, 0)])
def test_an_nvme_drive_is_ready_once_every_active_namespace_has_its_node(
    tmp_path: Path, active: int | None, waits_for: int
) -> None:
    """The nvme driver makes a live controller's char device before it has scanned its namespaces:
    the drive is ready only once the kernel has set up as many as the controller reports active
    (at least one when it cannot be asked), each with its /dev node."""
    dev = _device(tmp_path, "0000:01:00.0", 0x1B36, 0x0010, 0x010802)
    _bind(tmp_path, dev, "nvme")
    ctrl = dev / "nvme" / "nvme0"
    ctrl.mkdir(parents=True)
    (ctrl / "serial").write_text("SN1\n")
    (ctrl / "state").write_text("live\n")
    dev_root = tmp_path / "dev"
    dev_root.mkdir()
    (dev_root / "nvme0").touch()
    asked: list[str] = []

    def active_namespaces(node: str) -> int | None:
        asked.append(node)
        return active

    scanner = HostScanner(tmp_path, real_host=True, dev_root=dev_root, active_namespaces=active_namespaces)
    want = DeviceIdentity(name="nvme-0", type="nvme", vendor_id="0x1b36", device_id="0x0010", serial="SN1")
    for n in range(1, waits_for + 1):
        assert scanner.find(want) is None
        assert f"has set up {n - 1} of its" in scanner.not_ready["nvme-0"]
        assert "dmesg | grep nvme0" in scanner.not_ready["nvme-0"]
        (ctrl / f"nvme0n{n}").mkdir()  # the block device in sysfs; its /dev node comes next
        if n < waits_for:
            (dev_root / f"nvme0n{n}").touch()
    if waits_for:
        assert scanner.find(want) is None
        assert scanner.not_ready["nvme-0"] == f"/dev/nvme0n{waits_for} of 0000:01:00.0 does not exist yet"
        (dev_root / f"nvme0n{waits_for}").touch()
    found = scanner.find(want)
    assert found is not None
    assert found.device_nodes == ["/dev/nvme0", *(f"/dev/nvme0n{n}" for n in range(1, waits_for + 1))]
    assert asked and set(asked) == {str(dev_root / "nvme0")}


def test_the_active_namespace_count_of_something_that_is_no_nvme_controller_is_unknown(
    tmp_path: Path,
) -> None:
    (tmp_path / "nvme0").touch()
    assert active_nvme_namespaces(str(tmp_path / "nvme0")) is None  # ENOTTY from a plain file
    assert active_nvme_namespaces(str(tmp_path / "missing")) is None
