"""The scanner's real-host rules on a hand-made sysfs tree: ready means driver bound (NVMe, NICs),
a serial is compared only where the device exposes one (docs/plugin.md, "On a real host")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dra_driver.plugin.hostdev import (
    DeviceIdentity,
    HostScanner,
    active_nvme_namespaces,
    udev_record_properties,
)


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
    """Where no udev runs (no control socket), the interface's existence is enough."""
    dev = _device(tmp_path, "0000:02:00.0", 0x8086, 0x10D3, 0x020000)
    _bind(tmp_path, dev, "e1000e")
    scanner = HostScanner(tmp_path, real_host=True, udev_root=tmp_path / "no-udev")
    assert scanner.find(NIC) is None
    assert "has not registered a network interface" in scanner.not_ready["nic-0"]
    (dev / "net" / "eth1").mkdir(parents=True)
    found = scanner.find(NIC)
    assert found is not None and found.net_interfaces == ["eth1"] and found.driver == "e1000e"
    assert "nic-0" not in scanner.not_ready


def _udev(root: Path) -> Path:
    """A running udev's runtime directory: its control socket (a file will do) and database."""
    udev = root / "run-udev"
    (udev / "data").mkdir(parents=True)
    (udev / "control").touch()
    return udev


#: What udev 252 wrote for a hot-plugged e1000e in the QEMU guest, in this order (read back by a
#: loop in the guest: docs/plugin.md, "On a real host"): the record, holding only ID_RENAMING,
#: while the interface was still eth1; the rename; the add event's full record, still marked;
#: the move event's record, unmarked.
_RECORD_BEFORE_RENAME = "E:ID_RENAMING=1\n"
_RECORD_AFTER_ADD = (
    "I:16347146\nE:ID_NET_NAME_MAC=enx5254000000a1\nE:ID_NET_NAME_PATH=enp3s0\n"
    "E:ID_NET_NAME=enp3s0\nE:ID_RENAMING=1\nG:systemd\nQ:systemd\nV:1\n"
)
_RECORD_AFTER_MOVE = _RECORD_AFTER_ADD.replace("E:ID_RENAMING=1\n", "")


def test_a_nic_is_ready_only_under_the_name_udev_leaves_it(tmp_path: Path) -> None:
    """Issue 17's race: udev (systemd 252 in the QEMU guests) writes an interface's database
    record, marked ID_RENAMING=1, before it renames the interface, and drops the mark when it processes the
    rename's move event (src/udev/udev-event.c, rename_netif). A scanner that took the record's
    existence for "done" counted eth1 ready and wrote it into the CDI spec an instant before it
    became enp3s0. Ready is what systemd-networkd waits for: recorded, not renaming."""
    dev = _device(tmp_path, "0000:03:00.0", 0x8086, 0x10D3, 0x020000)
    _bind(tmp_path, dev, "e1000e")
    udev = _udev(tmp_path)
    scanner = HostScanner(tmp_path, real_host=True, udev_root=udev)
    (dev / "net" / "eth1").mkdir(parents=True)
    (dev / "net" / "eth1" / "ifindex").write_text("3\n")

    assert scanner.find(NIC) is None
    assert scanner.not_ready["nic-0"] == "udev has not processed the interface eth1 of 0000:03:00.0"

    (udev / "data" / "n3").write_text(_RECORD_BEFORE_RENAME)
    assert scanner.find(NIC) is None
    assert scanner.not_ready["nic-0"] == "udev is renaming the interface eth1 of 0000:03:00.0"

    # the rename itself: the kernel moves the directory; in between there is none to read
    (dev / "net" / "eth1" / "ifindex").unlink()
    assert scanner.find(NIC) is None
    assert scanner.not_ready["nic-0"] == "the interface eth1 of 0000:03:00.0 is being renamed"
    (dev / "net" / "eth1").rename(dev / "net" / "enp3s0")
    (dev / "net" / "enp3s0" / "ifindex").write_text("3\n")
    assert scanner.find(NIC) is None  # renamed, but udev has not processed the move event yet

    (udev / "data" / "n3").write_text(_RECORD_AFTER_ADD)
    assert scanner.find(NIC) is None
    assert scanner.not_ready["nic-0"] == "udev is renaming the interface enp3s0 of 0000:03:00.0"

    (udev / "data" / "n3").write_text(_RECORD_AFTER_MOVE)
    found = scanner.find(NIC)
    assert found is not None and found.net_interfaces == ["enp3s0"]
    assert "nic-0" not in scanner.not_ready


def test_a_namespace_that_udev_is_still_processing_is_not_ready(tmp_path: Path) -> None:
    """systemd 255 and later mark a recorded device ID_PROCESSING=1 while an event of it is being
    processed (or its RUN programs still run): a disk is ready only once that is over."""
    dev = _device(tmp_path, "0000:01:00.0", 0x1B36, 0x0010, 0x010802)
    _bind(tmp_path, dev, "nvme")
    ctrl = dev / "nvme" / "nvme0"
    (ctrl / "nvme0n1").mkdir(parents=True)
    (ctrl / "nvme0n1" / "dev").write_text("259:0\n")
    (ctrl / "serial").write_text("SN1\n")
    (ctrl / "state").write_text("live\n")
    dev_root = tmp_path / "dev"
    dev_root.mkdir()
    (dev_root / "nvme0").touch()
    (dev_root / "nvme0n1").touch()
    udev = _udev(tmp_path)
    scanner = HostScanner(
        tmp_path, real_host=True, dev_root=dev_root, active_namespaces=lambda _: 1, udev_root=udev
    )
    want = DeviceIdentity(name="nvme-0", type="nvme", vendor_id="0x1b36", device_id="0x0010", serial="SN1")
    assert scanner.find(want) is None
    assert scanner.not_ready["nvme-0"] == "udev has not processed /dev/nvme0n1 of 0000:01:00.0"
    (udev / "data" / "b259:0").write_text("S:disk/by-id/nvme-SN1\nE:ID_PROCESSING=1\nE:ID_SERIAL=SN1\n")
    assert scanner.find(want) is None
    assert scanner.not_ready["nvme-0"] == "udev is still processing /dev/nvme0n1 of 0000:01:00.0"
    (udev / "data" / "b259:0").write_text("S:disk/by-id/nvme-SN1\nE:ID_SERIAL=SN1\n")
    assert scanner.find(want) is not None


def test_udev_record_properties_are_its_e_lines() -> None:
    assert udev_record_properties(_RECORD_AFTER_ADD + "E:EMPTY=\nE:WITH=an=sign\n") == {
        "ID_NET_NAME_MAC": "enx5254000000a1",
        "ID_NET_NAME_PATH": "enp3s0",
        "ID_NET_NAME": "enp3s0",
        "ID_RENAMING": "1",
        "EMPTY": "",
        "WITH": "an=sign",
    }


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
