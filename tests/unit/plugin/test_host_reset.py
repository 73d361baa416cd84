"""The plugin's function-level reset (``HostScanner.reset``) on a hand-made sysfs tree under a temp
dir: the same code a real host runs against /sys (docs/plugin.md "Reset between tenants")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.plugin.hostdev import DeviceIdentity, HostDevice, HostScanner

BDF = "0000:41:00.0"
NIC = DeviceIdentity(name="nic0", type="nic", vendor_id="0x15b3", device_id="0x1021", serial=None)


def _nic(root: Path, *, reset_file: bool) -> Path:
    dev = root / "devices" / "pci0000:40" / BDF
    dev.mkdir(parents=True)
    (dev / "vendor").write_text("0x15b3\n")
    (dev / "device").write_text("0x1021\n")
    (dev / "class").write_text("0x020000\n")
    (dev / "config").write_bytes(bytes(256))
    (dev / "net" / "eth1").mkdir(parents=True)
    drv = root / "bus" / "pci" / "drivers" / "mlx5_core"
    drv.mkdir(parents=True)
    os.symlink(drv, dev / "driver")
    if reset_file:
        (dev / "reset").write_text("")
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    os.symlink(dev, bus / BDF)
    return dev


@pytest.mark.parametrize("real_host", [True, False])
def test_reset_writes_1_to_the_devices_reset_file_under_the_root(tmp_path: Path, real_host: bool) -> None:
    dev = _nic(tmp_path, reset_file=True)
    scanner = HostScanner(tmp_path, real_host=real_host)
    host = scanner.find(NIC)
    assert host is not None and host.pci_address == BDF
    assert scanner.reset(host) is None
    assert (dev / "reset").read_text() == "1\n"
    assert scanner.reset(host) is None  # each reset is one more write: a retried prepare resets again
    assert (dev / "reset").read_text() == "1\n1\n"


def test_a_device_without_a_reset_file_fails_and_no_file_is_created(tmp_path: Path) -> None:
    dev = _nic(tmp_path, reset_file=False)
    scanner = HostScanner(tmp_path, real_host=True)
    host = scanner.find(NIC)
    assert host is not None
    failure = scanner.reset(host)
    assert failure is not None and "supports no reset method" in failure
    assert str(tmp_path / "bus" / "pci" / "devices" / BDF / "reset") in failure
    assert not (dev / "reset").exists(), "the reset file must never be created"


def test_a_refused_write_fails_with_the_reason(tmp_path: Path) -> None:
    dev = _nic(tmp_path, reset_file=False)
    (dev / "reset").mkdir()  # opening it for writing fails (EISDIR), as a refused sysfs write would
    scanner = HostScanner(tmp_path, real_host=True)
    host = scanner.find(NIC)
    assert host is not None
    failure = scanner.reset(host)
    assert failure is not None and failure.startswith("cannot open ") and "directory" in failure


def test_a_device_without_a_pcie_function_cannot_be_reset(tmp_path: Path) -> None:
    region = HostDevice(
        sysfs_path=str(tmp_path / "devices" / "cxl" / "region0"), memdev="mem0", region="region0"
    )
    failure = HostScanner(tmp_path, real_host=True).reset(region)
    assert failure == "it has no PCIe function on this host to reset"
