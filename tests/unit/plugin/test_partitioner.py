"""The emulated partitioner writes partitions into a host view the emulator laid out (design 35-36,
A6; docs/emulator.md "GPU partitions"): whole or not at all, one placement's slices never twice,
capability minors unique on the host, and they go with the GPU when it is unbound."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from dra_driver.plugin.backend import identity_of
from dra_driver.plugin.hostdev import HostDevice, HostScanner
from dra_driver.plugin.partitioner import EmulatedPartitioner, PartitionFailed
from fabric_dra_testbed.standin_hosts import EmulatedHosts
from fabric_dra_testbed.standins import make_device
from manager_api.partitions import BUILTIN_TABLES, PartitionProfile

H100 = BUILTIN_TABLES["h100-80gb"]
NODE = "node-a"


def profile(name: str) -> PartitionProfile:
    found = H100.profile(name)
    assert found is not None
    return found


@pytest.fixture
def hosts(tmp_path: Path) -> EmulatedHosts:
    return EmulatedHosts(tmp_path, [NODE])


def plugged(hosts: EmulatedHosts, name: str) -> HostDevice:
    device = make_device(name, partition_table=H100)
    hosts.plug(NODE, device)
    found = HostScanner(hosts.sysfs(NODE), real_host=False).find(identity_of(device))
    assert found is not None
    return found


def test_a_partition_is_the_files_of_the_design_under_the_gpus_pci_directory(hosts: EmulatedHosts) -> None:
    gpu = plugged(hosts, "gpu0")
    partitioner = EmulatedPartitioner(hosts.sysfs(NODE))
    made = partitioner.create(gpu, profile("1g.10gb"), 3)
    directory = Path(gpu.sysfs_path) / "mig" / "1g10gb-3"
    files = {f: (directory / f).read_text() for f in sorted(os.listdir(directory))}
    assert set(files) == {"uuid", "profile", "start", "size", "minor", "dev"}
    assert re.fullmatch(
        r"MIG-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\n", files["uuid"]
    )
    assert (files["profile"], files["start"], files["size"]) == ("1g.10gb\n", "3\n", "1\n")
    assert files["dev"] == f"/dev/nvidia-caps/nvidia-cap{files['minor'].strip()}\n"
    assert made.uuid == files["uuid"].strip()
    assert made.device_nodes == [files["dev"].strip()]
    assert made.env == {"NVIDIA_VISIBLE_DEVICES": made.uuid}
    assert (made.gpu, made.start, made.size) == (gpu.pci_address, 3, 1)
    # the real directory, behind the bus symlink, holds it: the emulator's unbind takes it away
    assert os.path.realpath(directory).startswith(str(hosts.sysfs(NODE) / "devices" / "pci0000:40"))
    assert partitioner.existing(gpu) == [made]


def test_an_overlapping_placement_is_refused_in_one_line_and_leaves_nothing(hosts: EmulatedHosts) -> None:
    gpu = plugged(hosts, "gpu0")
    partitioner = EmulatedPartitioner(hosts.sysfs(NODE))
    first = partitioner.create(gpu, profile("3g.40gb"), 4)
    with pytest.raises(PartitionFailed) as refused:
        partitioner.create(gpu, profile("1g.20gb"), 6)
    message = str(refused.value)
    assert "\n" not in message
    assert f"GPU {gpu.pci_address}" in message and "1g.20gb" in message
    assert f"memory slice 6 is taken by partition {first.uuid} (3g.40gb at 4)" in message
    assert not refused.value.permanent
    assert sorted(os.listdir(Path(gpu.sysfs_path) / "mig")) == ["3g40gb-4"]


def test_minors_are_unique_on_the_host_across_gpus(hosts: EmulatedHosts) -> None:
    gpus = [plugged(hosts, "gpu0"), plugged(hosts, "gpu1")]
    partitioner = EmulatedPartitioner(hosts.sysfs(NODE))
    made = [partitioner.create(g, profile("1g.10gb"), s) for g in gpus for s in (0, 1)]
    minors = [p.device_nodes[0] for p in made]
    assert len(set(minors)) == 4
    partitioner.destroy(made[1])
    again = partitioner.create(gpus[0], profile("1g.10gb"), 5)
    assert again.device_nodes == made[1].device_nodes  # the freed minor is the lowest free


def test_destroy_is_idempotent_and_reset_removes_everything_even_half_made(hosts: EmulatedHosts) -> None:
    gpu = plugged(hosts, "gpu0")
    partitioner = EmulatedPartitioner(hosts.sysfs(NODE))
    one = partitioner.create(gpu, profile("1g.10gb"), 0)
    partitioner.create(gpu, profile("2g.20gb"), 2)
    partitioner.destroy(one)
    partitioner.destroy(one)
    assert [p.profile for p in partitioner.existing(gpu)] == ["2g.20gb"]
    # a create interrupted by a crash leaves its temporary directory: never a partition
    (Path(gpu.sysfs_path) / "mig" / ".new-1g10gb-6-deadbeef").mkdir()
    assert [p.profile for p in partitioner.existing(gpu)] == ["2g.20gb"]
    gone = partitioner.reset(gpu)
    assert [p.profile for p in gone] == ["2g.20gb"]
    assert os.listdir(Path(gpu.sysfs_path) / "mig") == []


def test_partitions_go_with_the_gpu_when_it_is_unbound(hosts: EmulatedHosts) -> None:
    gpu = plugged(hosts, "gpu0")
    partitioner = EmulatedPartitioner(hosts.sysfs(NODE))
    partitioner.create(gpu, profile("7g.80gb"), 0)
    hosts.unplug("gpu0")
    again = plugged(hosts, "gpu0")
    assert partitioner.existing(again) == []


def test_a_gpu_gone_from_the_host_is_one_line(hosts: EmulatedHosts) -> None:
    gpu = plugged(hosts, "gpu0")
    hosts.unplug("gpu0")
    with pytest.raises(PartitionFailed, match=r"is no longer on this node; no 1g\.10gb partition was made"):
        EmulatedPartitioner(hosts.sysfs(NODE)).create(gpu, profile("1g.10gb"), 0)


def test_never_the_real_sys() -> None:
    with pytest.raises(ValueError, match="never /sys"):
        EmulatedPartitioner(Path("/sys"))
