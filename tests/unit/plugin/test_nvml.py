"""The NVML partitioner against a stand-in ``pynvml`` that records the calls (no GPU here): the call
sequence of NVIDIA's own DRA driver, the destroy in reverse, nothing half-made after a failure,
and every NVML failure as one line naming the GPU and the profile. Where nvidia-ml-py is
installed, the stand-in is held to the real module's names and values; where an NVIDIA GPU is,
the real thing is asked too (else skipped, saying why)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_driver.plugin.hostdev import HostDevice
from dra_driver.plugin.nvml import NvmlPartitioner, profile_name
from dra_driver.plugin.partitioner import PartitionFailed
from manager_api.partitions import BUILTIN_TABLES, PartitionProfile
from tests.unit.plugin import fake_nvml
from tests.unit.plugin.fake_nvml import FakeNvml, Gpu

BDF = "0000:41:00.0"
GPU = HostDevice(sysfs_path=f"/sys/bus/pci/devices/{BDF}", pci_address=BDF)
H100 = BUILTIN_TABLES["h100-80gb"]


def profile(name: str) -> PartitionProfile:
    found = H100.profile(name)
    assert found is not None
    return found


def capability(proc: Path, minor: int, gi: int, ci: int | None, cap: int) -> None:
    """The driver's capability file of a MIG instance: ``DeviceFileMinor`` names its /dev node."""
    path = proc / "driver" / "nvidia" / "capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
    if ci is not None:
        path = path / f"ci{ci}"
    path.mkdir(parents=True, exist_ok=True)
    (path / "access").write_text(f"DeviceFileMinor: {cap}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")


@pytest.fixture
def nvml() -> FakeNvml:
    return FakeNvml(Gpu(BDF, minor=2))


def partitioner(nvml: FakeNvml, tmp_path: Path) -> NvmlPartitioner:
    return NvmlPartitioner(nvml=nvml, proc_root=tmp_path / "proc", dev_root=Path("/dev"))


def test_create_follows_nvidias_sequence_and_names_the_partitions_nodes(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    capability(tmp_path / "proc", 2, 1, None, 21)
    capability(tmp_path / "proc", 2, 1, 0, 22)
    made = partitioner(nvml, tmp_path).create(GPU, profile("3g.40gb"), 4)
    assert nvml.names() == [
        "nvmlInit",
        "nvmlDeviceGetHandleByPciBusId",
        "nvmlDeviceGetMigMode",
        # the profiles in NVML's order until the name matches (0: 1g.10gb, 1: 2g.20gb, 2: 3g.40gb)
        "nvmlDeviceGetGpuInstanceProfileInfo",
        "nvmlDeviceGetGpuInstanceProfileInfo",
        "nvmlDeviceGetGpuInstanceProfileInfo",
        "nvmlDeviceCreateGpuInstanceWithPlacement",
        "nvmlGpuInstanceGetInfo",
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        "nvmlGpuInstanceCreateComputeInstance",
        "nvmlComputeInstanceGetInfo",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetMinorNumber",
    ]
    # the profile's NVML id (9 for 3g.40gb), never its index; the placement in memory slices
    assert ("nvmlDeviceCreateGpuInstanceWithPlacement", 9, 4, 4) in nvml.calls
    # the compute instance of the instance's whole size: 3 compute slices
    assert (
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        fake_nvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        0,
    ) in nvml.calls
    (instance,) = nvml.gpus[BDF].instances.values()
    assert made.uuid == instance.computes[0] and made.uuid.startswith("MIG-")
    assert (made.profile, made.start, made.size, made.gpu) == ("3g.40gb", 4, 4, BDF)
    assert (made.gpu_instance, made.compute_instance) == (instance.id, 0)
    assert made.device_nodes == [
        "/dev/nvidia2",
        "/dev/nvidiactl",
        "/dev/nvidia-caps/nvidia-cap21",
        "/dev/nvidia-caps/nvidia-cap22",
    ]
    assert made.env == {"NVIDIA_VISIBLE_DEVICES": made.uuid}


def test_mig_mode_is_enabled_first_when_it_is_off(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.gpus[BDF].mig = (fake_nvml.NVML_DEVICE_MIG_DISABLE, fake_nvml.NVML_DEVICE_MIG_DISABLE)
    partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 0)
    assert nvml.names()[2:5] == ["nvmlDeviceGetMigMode", "nvmlDeviceSetMigMode", "nvmlDeviceGetMigMode"]
    assert ("nvmlDeviceSetMigMode", fake_nvml.NVML_DEVICE_MIG_ENABLE) in nvml.calls


def test_a_mig_mode_waiting_for_a_reset_is_one_line_and_nothing_is_made(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    gpu = nvml.gpus[BDF]
    gpu.mig = (fake_nvml.NVML_DEVICE_MIG_DISABLE, fake_nvml.NVML_DEVICE_MIG_DISABLE)
    gpu.set_mode_status = fake_nvml.NVML_ERROR_IN_USE  # a process holds the GPU: pending
    with pytest.raises(PartitionFailed) as failed:
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 0)
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"GPU {BDF}: MIG mode needs a reset before a 1g.10gb partition can be made")
    assert "nvidia-smi -r" in message and not failed.value.permanent
    assert "nvmlDeviceCreateGpuInstanceWithPlacement" not in nvml.names()
    # and the next try does not ask to enable it again while it is pending
    nvml.calls.clear()
    with pytest.raises(PartitionFailed):
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 0)
    assert "nvmlDeviceSetMigMode" not in nvml.names()


def test_an_occupied_placement_is_insufficient_resources_in_one_line(nvml: FakeNvml, tmp_path: Path) -> None:
    partitioner(nvml, tmp_path).create(GPU, profile("2g.20gb"), 2)
    with pytest.raises(PartitionFailed) as failed:
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 3)
    message = str(failed.value)
    assert message.startswith(
        f"GPU {BDF}: no 1g.10gb partition at slice 3: NVML has no room for its GPU instance"
    )
    assert "nothing was left behind" in message and "\n" not in message
    assert len(nvml.gpus[BDF].instances) == 1


def test_a_failed_compute_instance_destroys_the_gpu_instance_it_made(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.fail["nvmlGpuInstanceCreateComputeInstance"] = fake_nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(PartitionFailed) as failed:
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 5)
    assert "no room for its compute instance" in str(failed.value)
    assert nvml.names()[-1] == "nvmlGpuInstanceDestroy"
    assert nvml.gpus[BDF].instances == {}


def test_a_failure_after_the_compute_instance_destroys_both_in_reverse(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    nvml.fail["nvmlDeviceGetUUID"] = fake_nvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(PartitionFailed):
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 5)
    assert nvml.names()[-2:] == ["nvmlComputeInstanceDestroy", "nvmlGpuInstanceDestroy"]
    assert nvml.gpus[BDF].instances == {}


def test_a_gpu_without_mig_is_permanent(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.fail["nvmlDeviceGetMigMode"] = fake_nvml.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(PartitionFailed) as failed:
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 0)
    assert failed.value.permanent
    assert str(failed.value) == f"GPU {BDF} does not support MIG, so no 1g.10gb partition can be made on it"


def test_a_profile_the_gpu_does_not_offer_names_what_it_offers(tmp_path: Path) -> None:
    a100_like = {0x0: fake_nvml.ProfileInfo(19, 1, 7, 14, 4864, b"MIG 1g.5gb", 1)}
    nvml = FakeNvml(Gpu(BDF, minor=0), profiles=a100_like)
    with pytest.raises(PartitionFailed) as failed:
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 0)
    assert failed.value.permanent
    assert f"GPU {BDF} has no MIG profile 1g.10gb (it offers 1g.5gb)" in str(failed.value)


def test_destroy_goes_in_reverse_and_is_idempotent(nvml: FakeNvml, tmp_path: Path) -> None:
    p = partitioner(nvml, tmp_path)
    made = p.create(GPU, profile("1g.10gb"), 1)
    nvml.calls.clear()
    p.destroy(made)
    assert nvml.names() == [
        "nvmlDeviceGetHandleByPciBusId",
        "nvmlDeviceGetGpuInstanceById",
        "nvmlGpuInstanceGetInfo",
        "nvmlGpuInstanceGetComputeInstanceById",
        "nvmlComputeInstanceDestroy",
        "nvmlGpuInstanceDestroy",
    ]
    assert nvml.gpus[BDF].instances == {}
    p.destroy(made)  # gone already: nothing to do
    assert nvml.names()[-1] == "nvmlDeviceGetGpuInstanceById"


def test_destroy_never_takes_an_instance_whose_id_went_to_another_placement(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    p = partitioner(nvml, tmp_path)
    made = p.create(GPU, profile("1g.10gb"), 1)
    p.destroy(made)
    other = p.create(GPU, profile("1g.10gb"), 6)  # NVML gives it the freed id
    assert other.gpu_instance == made.gpu_instance
    p.destroy(made)
    assert [gi.placement.start for gi in nvml.gpus[BDF].instances.values()] == [6]


def test_a_partition_in_use_is_not_removed_and_says_so(nvml: FakeNvml, tmp_path: Path) -> None:
    p = partitioner(nvml, tmp_path)
    made = p.create(GPU, profile("1g.10gb"), 1)
    nvml.fail["nvmlComputeInstanceDestroy"] = fake_nvml.NVML_ERROR_IN_USE
    with pytest.raises(PartitionFailed) as failed:
        p.destroy(made)
    assert str(failed.value) == (
        f"GPU {BDF}: the 1g.10gb partition {made.uuid} is still in use by a process, so it was not removed; "
        "it stays recorded and the kubelet retries"
    )


def test_existing_lists_every_instance_and_reset_removes_them_and_turns_mig_off(
    nvml: FakeNvml, tmp_path: Path
) -> None:
    p = partitioner(nvml, tmp_path)
    a = p.create(GPU, profile("1g.10gb"), 0)
    b = p.create(GPU, profile("3g.40gb"), 4)
    # a GPU instance without a compute instance (a create cut short by a crash)
    nvml.fail["nvmlGpuInstanceCreateComputeInstance"] = fake_nvml.NVML_ERROR_INSUFFICIENT_RESOURCES
    nvml.fail["nvmlGpuInstanceDestroy"] = fake_nvml.NVML_ERROR_IN_USE
    with pytest.raises(PartitionFailed):
        p.create(GPU, profile("1g.10gb"), 2)
    found = p.existing(GPU)
    assert [(x.profile, x.start, x.uuid) for x in found] == [
        ("1g.10gb", 0, a.uuid),
        ("1g.10gb", 2, ""),
        ("3g.40gb", 4, b.uuid),
    ]
    gone = p.reset(GPU)
    assert len(gone) == 3
    assert nvml.gpus[BDF].instances == {}
    assert nvml.gpus[BDF].mig == (fake_nvml.NVML_DEVICE_MIG_DISABLE, fake_nvml.NVML_DEVICE_MIG_DISABLE)


def test_an_nvml_library_that_is_missing_is_one_line(nvml: FakeNvml, tmp_path: Path) -> None:
    nvml.init_error = fake_nvml.NVML_ERROR_LIBRARY_NOT_FOUND
    with pytest.raises(PartitionFailed) as failed:
        partitioner(nvml, tmp_path).create(GPU, profile("1g.10gb"), 0)
    assert failed.value.permanent
    assert str(failed.value).startswith("NVML is not available on this node: libnvidia-ml.so.1 was not found")


def test_profile_names_as_nvidia_smi_prints_them() -> None:
    assert profile_name(fake_nvml.H100_PROFILES[0x0]) == "1g.10gb"
    unnamed = fake_nvml.ProfileInfo(0, 7, 1, 132, 81152, b"", 8)
    assert profile_name(unnamed) == "7g.80gb"  # 79.25 GiB rounds up, as NVIDIA names it


# -- the real nvidia-ml-py ------------------------------------------------------------------------


def test_on_this_machine_a_partition_fails_in_one_line_without_nvml_or_a_gpu() -> None:
    """The real import: without nvidia-ml-py, or without the NVIDIA driver's library, a partition
    is refused in one line that says which, and why it cannot work on this node."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except ImportError:
        expected = "the nvidia-ml-py package is not installed (pip install 'fabric-dra[nvidia]'"
    except Exception:
        expected = "NVML is not available on this node"
    else:
        pytest.skip("NVML works on this machine: the GPU test below runs instead")
    with pytest.raises(PartitionFailed) as failed:
        NvmlPartitioner().create(GPU, profile("1g.10gb"), 0)
    assert expected in str(failed.value) and "\n" not in str(failed.value)
    assert failed.value.permanent


def test_the_stand_in_has_the_real_modules_names_and_values() -> None:
    pynvml = pytest.importorskip(
        "pynvml", reason="nvidia-ml-py is not installed: pip install 'fabric-dra[nvidia]'"
    )
    missing = [name for name in fake_nvml.USED_NAMES if not hasattr(pynvml, name)]
    assert missing == []
    assert {n: getattr(pynvml, n) for n in fake_nvml.STABLE_VALUES} == {
        n: getattr(fake_nvml, n) for n in fake_nvml.STABLE_VALUES
    }
    assert [f[0] for f in pynvml.c_nvmlGpuInstancePlacement_t._fields_] == ["start", "size"]


def test_the_real_nvml_lists_the_partitions_of_this_machines_gpus() -> None:
    pynvml = pytest.importorskip(
        "pynvml", reason="nvidia-ml-py is not installed: pip install 'fabric-dra[nvidia]'"
    )
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        pytest.skip(f"no NVIDIA GPU here: NVML says {err}")
    count = pynvml.nvmlDeviceGetCount()
    if count == 0:
        pytest.skip("NVML works but this machine has no NVIDIA GPU")
    for index in range(count):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        bdf = pynvml.nvmlDeviceGetPciInfo(handle).busId
        bdf = bdf.decode() if isinstance(bdf, bytes) else bdf
        found = NvmlPartitioner().existing(HostDevice(sysfs_path="", pci_address=bdf))
        assert all(p.gpu == bdf for p in found)
