"""QEMU hosts without QEMU: root-port layout, stand-in checks, MAC from a DSN-form serial, what the
guest keeps visible under its own tmpfs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from emulator.errors import ConfigError
from emulator.qemu.guest import MEMORY_NODE, GuestConfig, kept_paths, root_ports
from emulator.qemu.host import check_qemu_hosts, fabric_ports, mac_of_serial
from emulator.qemu.memory import Dimm
from emulator.topology import parse_topology


def _topology(model: dict[str, Any], serial: str) -> dict[str, Any]:
    return {
        "version": 1,
        "service": {"uuid": "7b0a3c52-5d8e-4b43-9a3e-3d0c3f1d5a10"},
        "hosts": [
            {"name": "q", "uuid": "0e6f6a4e-2f4d-4c6b-8f3e-6a1b2c3d4e5f", "kind": "qemu"},
            {"name": "f", "uuid": "1e6f6a4e-2f4d-4c6b-8f3e-6a1b2c3d4e5f"},
        ],
        "models": {"m": model},
        "pcie": {"switches": [{"id": "sw", "devices": [{"id": "d0", "model": "m", "serial": serial}]}]},
    }


NIC = {"type": "nic", "manufacturer": "Intel", "model": "e1000e", "vendorId": "0x8086", "deviceId": "0x10d3",
       "classCode": "0x020000"}  # fmt: skip
GPU = {"type": "gpu", "manufacturer": "NVIDIA", "model": "H100", "vendorId": "0x10de", "deviceId": "0x2331",
       "classCode": "0x030200"}  # fmt: skip


def test_kind_defaults_to_file() -> None:
    index = parse_topology(_topology(NIC, "525400ffff000001"))
    assert [h.kind for h in index.topology.hosts] == ["qemu", "file"]


def test_a_stand_in_with_a_dsn_form_serial_is_accepted() -> None:
    index = parse_topology(_topology(NIC, "525400ffff000001"))
    assert check_qemu_hosts(index) == []
    assert fabric_ports(index, "q") == ["sw/DP0"]


def test_a_device_without_stand_in_or_with_a_bad_serial_is_refused() -> None:
    problems = check_qemu_hosts(parse_topology(_topology(GPU, "48b02d0000a1f000")))
    assert len(problems) == 1 and "has no QEMU stand-in" in str(problems[0])
    problems = check_qemu_hosts(parse_topology(_topology(NIC, "48b02d0000a1f000")))
    assert len(problems) == 1 and "MAC-derived PCIe DSN" in str(problems[0])


def test_mac_of_serial() -> None:
    assert mac_of_serial("52-54-00-FF-FF-00-00-a1") == "52:54:00:00:00:a1"
    assert mac_of_serial("48b02d0000a1f000") is None


def test_root_ports_pack_eight_functions_per_slot() -> None:
    ports = root_ports([f"sw/DP{n}" for n in range(10)])
    assert [p.addr for p in ports[:2]] == ["0x10.0", "0x10.1"]
    assert ports[8].addr == "0x11.0" and ports[8].slot == 9 and ports[8].id == "rp9"
    assert "multifunction=on" in ports[0].device_arg() and "multifunction" not in ports[1].device_arg()


def test_a_checkout_under_a_guest_tmpfs_is_kept_visible() -> None:
    """The guest mounts a tmpfs on /tmp, /run, /var/lib...: a checkout (or a virtualenv) there would
    vanish under it and the guest's init would not find guest-init.sh (a kernel panic at boot)."""
    assert kept_paths("/tmp/ci/.venv/bin/python", Path("/tmp/ci")) == ["/tmp/ci"]
    assert kept_paths("/usr/bin/python3", Path("/var/lib/ci/workspace")) == ["/var/lib/ci/workspace"]
    assert kept_paths("/run/venv/bin/python", Path("/tmp/ci")) == ["/run/venv", "/tmp/ci"]
    # the root is the host's, read-only, as it is: nothing to keep
    assert kept_paths("/home/me/tree/.venv/bin/python", Path("/home/me/tree")) == []
    assert kept_paths("/usr/bin/python3", Path("/srv/tmp/tree")) == []
    with pytest.raises(ValueError, match="no spaces"):
        kept_paths("/usr/bin/python3", Path("/tmp/my tree"))


def test_a_guest_with_dimm_slots_has_a_memory_only_node() -> None:
    plain = GuestConfig("g", [], Path("/tmp/g"), memory_mib=512)
    assert plain.memory_args() == ["-m", "512"]
    args = GuestConfig(
        "g", [], Path("/tmp/g"), memory_mib=512, cpus=2, dimm_slots=2, hotplug_mib=256
    ).memory_args()
    assert args == [
        "-m", "512M,slots=2,maxmem=768M",
        "-object", "memory-backend-ram,id=boot-mem,size=512M",
        "-numa", "node,nodeid=0,cpus=0-1,memdev=boot-mem",
        "-numa", f"node,nodeid={MEMORY_NODE}",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match="hotplug_mib"):
        GuestConfig("g", [], Path("/tmp/g"), dimm_slots=1).memory_args()


def test_a_dimm_names_the_memory_blocks_of_its_range() -> None:
    dimm = Dimm(id="d", addr=4 << 30, size=256 << 20, node=MEMORY_NODE)
    assert dimm.blocks(128 << 20) == [32, 33]
    assert dimm.backend == "d-mem"
