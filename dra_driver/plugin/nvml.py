"""MIG partitions of a real NVIDIA GPU through NVML (the ``nvidia-ml-py`` package, ``pynvml``).

The optional dependency ``fabric-dra[nvidia]`` brings the package; it is imported on the first
partition, so a plugin that never makes one never needs it, and it loads the node's
``libnvidia-ml.so.1`` (the NVIDIA driver's library) only then. The call sequence is NVIDIA's own
DRA driver's (``createMigDevice`` / ``deleteMigDevice`` in its ``nvlib.go``):

create
    ``nvmlDeviceGetHandleByPciBusId`` → ``nvmlDeviceGetMigMode`` (and ``nvmlDeviceSetMigMode``
    ENABLE when it is off: a mode change the GPU cannot take without a reset is refused with one
    line) → ``nvmlDeviceGetGpuInstanceProfileInfo`` for each profile until the name matches →
    ``nvmlDeviceCreateGpuInstanceWithPlacement`` → ``nvmlGpuInstanceGetInfo`` →
    ``nvmlGpuInstanceGetComputeInstanceProfileInfo`` (the compute profile of the instance's whole
    size) → ``nvmlGpuInstanceCreateComputeInstance`` → ``nvmlComputeInstanceGetInfo`` →
    ``nvmlDeviceGetUUID`` of the MIG device (``MIG-<uuid>``).
destroy
    in reverse: ``nvmlDeviceGetGpuInstanceById`` → ``nvmlGpuInstanceGetComputeInstanceById`` →
    ``nvmlComputeInstanceDestroy`` → ``nvmlGpuInstanceDestroy``.

A create that fails part way destroys what it made. MIG mode is left enabled when the last
partition goes: changing it back may need a GPU reset, and the reset between tenants
(:meth:`NvmlPartitioner.reset`) turns it off when the GPU serves whole again.

The container's device nodes are the parent GPU's ``/dev/nvidia<minor>``, ``/dev/nvidiactl`` and
the two MIG capability devices ``/dev/nvidia-caps/nvidia-cap<N>`` whose minors the driver lists in
``/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<G>/access`` and ``…/gi<G>/ci<C>/access``
(``DeviceFileMinor: N``).
"""

from __future__ import annotations

import ctypes
import importlib
import math
import threading
from pathlib import Path
from types import ModuleType
from typing import Any

from dra_driver.plugin.hostview import HostDevice
from dra_driver.plugin.partitioner import Partition, PartitionFailed, partition_env
from manager_api.partitions import PartitionProfile
from plumbing.logs import get_logger

__all__ = ["NVML_EXTRA", "NvmlPartitioner", "profile_name"]

log = get_logger(__name__)

#: how an operator gets the package
NVML_EXTRA = "pip install 'fabric-dra[nvidia]'"

#: GPU-instance slice count → the compute-instance profile of the instance's whole size
_COMPUTE_PROFILE_OF_SLICES = {
    1: "NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE",
    2: "NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE",
    3: "NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE",
    4: "NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE",
    6: "NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE",
    7: "NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE",
    8: "NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE",
}


def profile_name(info: Any) -> str:
    """A GPU-instance profile's name as ``nvidia-smi mig -lgip`` prints it (``1g.10gb``): NVML's
    own name (``MIG 1g.10gb``) where it gives one, else slices and memory rounded up to GiB."""
    raw = getattr(info, "name", b"")
    name = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")
    name = name.strip().removeprefix("MIG ").strip()
    if name:
        return name
    return f"{info.sliceCount}g.{math.ceil(info.memorySizeMB / 1024)}gb"


class NvmlPartitioner:
    """MIG GPU and compute instances of real GPUs; ``nvml`` is the ``pynvml`` module (tests pass a
    stand-in that records the calls), imported on first use when not given."""

    name = "nvml"

    def __init__(
        self,
        *,
        nvml: ModuleType | Any | None = None,
        proc_root: Path = Path("/proc"),
        dev_root: Path = Path("/dev"),
    ) -> None:
        self._nvml = nvml
        self.proc_root = proc_root
        self.dev_root = dev_root
        self._lock = threading.Lock()
        self._initialised = False

    # -- the library ---------------------------------------------------------------------------

    def _lib(self) -> Any:
        """The initialised NVML module; :class:`PartitionFailed` (permanent) when the node has none."""
        with self._lock:
            if self._nvml is None:
                try:
                    self._nvml = importlib.import_module("pynvml")
                except ImportError as err:
                    raise PartitionFailed(
                        "NVML is not available to this plugin: the nvidia-ml-py package is not installed "
                        f"({NVML_EXTRA}; docs/plugin.md, 'GPU partitions')",
                        permanent=True,
                    ) from err
            nvml = self._nvml
            if not self._initialised:
                try:
                    nvml.nvmlInit()
                except nvml.NVMLError as err:
                    raise PartitionFailed(_init_failure(nvml, err), permanent=True) from err
                self._initialised = True
            return nvml

    def _handle(self, nvml: Any, bdf: str, what: str) -> Any:
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(bdf)
        except nvml.NVMLError as err:
            raise PartitionFailed(f"GPU {bdf}: NVML does not know it ({err}); {what}") from err

    # -- create --------------------------------------------------------------------------------

    def create(self, gpu: HostDevice, profile: PartitionProfile, start: int) -> Partition:
        bdf = gpu.pci_address or ""
        nvml = self._lib()
        what = f"no {profile.name} partition was made"
        handle = self._handle(nvml, bdf, what)
        self._enable_mig(nvml, handle, bdf, profile)
        info = self._gpu_profile(nvml, handle, bdf, profile)
        placement = nvml.c_nvmlGpuInstancePlacement_t()
        placement.start, placement.size = start, profile.memory_slices
        try:
            gpu_instance = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, placement)
        except nvml.NVMLError as err:
            raise _create_failure(nvml, err, bdf, profile, start, "its GPU instance") from err
        compute_instance = None
        try:
            gi_info = nvml.nvmlGpuInstanceGetInfo(gpu_instance)
            ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gpu_instance,
                getattr(nvml, _COMPUTE_PROFILE_OF_SLICES[info.sliceCount]),
                nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            compute_instance = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_profile.id)
            ci_info = nvml.nvmlComputeInstanceGetInfo(compute_instance)
            uuid = _text(nvml.nvmlDeviceGetUUID(ci_info.device))
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        except (nvml.NVMLError, KeyError) as err:
            # nothing half-made: what this call made goes again, compute instance first
            self._undo(nvml, compute_instance, gpu_instance)
            if isinstance(err, KeyError):
                raise PartitionFailed(
                    f"GPU {bdf}: profile {profile.name} has {info.sliceCount} compute slices, for which "
                    f"NVML has no compute-instance profile; {what}",
                    permanent=True,
                ) from err
            raise _create_failure(nvml, err, bdf, profile, start, "its compute instance") from err
        partition = Partition(
            uuid=uuid,
            profile=profile.name,
            start=start,
            size=profile.memory_slices,
            gpu=bdf,
            device_nodes=self._device_nodes(minor, gi_info.id, ci_info.id),
            env=partition_env(uuid),
            gpu_instance=gi_info.id,
            compute_instance=ci_info.id,
        )
        log.info("MIG partition created", gpu=bdf, profile=profile.name, start=start, uuid=uuid)
        return partition

    def _enable_mig(self, nvml: Any, handle: Any, bdf: str, profile: PartitionProfile) -> None:
        try:
            current, pending = nvml.nvmlDeviceGetMigMode(handle)
            if current == nvml.NVML_DEVICE_MIG_ENABLE:
                return
            if pending != nvml.NVML_DEVICE_MIG_ENABLE:
                status = nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_ENABLE)
                if status == nvml.NVML_SUCCESS:
                    current, pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError as err:
            if err.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                raise PartitionFailed(
                    f"GPU {bdf} does not support MIG, so no {profile.name} partition can be made on it",
                    permanent=True,
                ) from err
            raise PartitionFailed(
                f"GPU {bdf}: MIG mode could not be enabled for a {profile.name} partition ({err}); "
                f"{_next_step(nvml, err)}"
            ) from err
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            raise PartitionFailed(
                f"GPU {bdf}: MIG mode needs a reset before a {profile.name} partition can be made "
                "(enabling it is pending until the GPU is reset: stop every process on it and run "
                f"'nvidia-smi -r -i {bdf}'); the kubelet retries"
            )

    def _gpu_profile(self, nvml: Any, handle: Any, bdf: str, profile: PartitionProfile) -> Any:
        offered = []
        for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except nvml.NVMLError:
                continue  # a profile this GPU does not have
            name = profile_name(info)
            if name == profile.name:
                return info
            offered.append(name)
        raise PartitionFailed(
            f"GPU {bdf} has no MIG profile {profile.name} (it offers {', '.join(offered) or 'none'}): the "
            "partition table the fabric declares for it does not match the GPU",
            permanent=True,
        )

    def _access_minor(self, path: Path) -> int | None:
        try:
            text = path.read_text()
        except OSError:
            return None
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "DeviceFileMinor" and value.strip().isdigit():
                return int(value.strip())
        return None

    def _device_nodes(self, minor: int, gpu_instance: int, compute_instance: int) -> list[str]:
        mig = self.proc_root / "driver" / "nvidia" / "capabilities" / f"gpu{minor}" / "mig"
        caps = [
            self._access_minor(mig / f"gi{gpu_instance}" / "access"),
            self._access_minor(mig / f"gi{gpu_instance}" / f"ci{compute_instance}" / "access"),
        ]
        if None in caps:
            log.warning(
                "MIG capability minors not readable; the container gets the GPU's nodes only",
                path=str(mig),
            )
        nodes = [f"{self.dev_root}/nvidia{minor}", f"{self.dev_root}/nvidiactl"]
        nodes += [f"{self.dev_root}/nvidia-caps/nvidia-cap{cap}" for cap in caps if cap is not None]
        return nodes

    def _undo(self, nvml: Any, compute_instance: Any, gpu_instance: Any) -> None:
        for destroy, instance in (
            (nvml.nvmlComputeInstanceDestroy, compute_instance),
            (nvml.nvmlGpuInstanceDestroy, gpu_instance),
        ):
            if instance is None:
                continue
            try:
                destroy(instance)
            except nvml.NVMLError as err:
                log.error("could not undo a partly made MIG partition", error=str(err))

    # -- destroy, existing, reset -------------------------------------------------------------

    def destroy(self, partition: Partition) -> None:
        nvml = self._lib()
        what = f"its {partition.profile} partition {partition.uuid} stays"
        handle = self._handle(nvml, partition.gpu, what)
        if partition.gpu_instance is None:
            return
        try:
            gpu_instance = nvml.nvmlDeviceGetGpuInstanceById(handle, partition.gpu_instance)
            placement = nvml.nvmlGpuInstanceGetInfo(gpu_instance).placement
        except nvml.NVMLError as err:
            if err.value == nvml.NVML_ERROR_NOT_FOUND:
                return  # already gone (a reset, or the GPU left the host)
            raise _destroy_failure(nvml, err, partition) from err
        if (placement.start, placement.size) != (partition.start, partition.size):
            # the id was given to another placement since: this one is gone, that one is not ours
            log.info("MIG partition already gone", gpu=partition.gpu, uuid=partition.uuid)
            return
        try:
            if partition.compute_instance is not None:
                try:
                    compute = nvml.nvmlGpuInstanceGetComputeInstanceById(
                        gpu_instance, partition.compute_instance
                    )
                except nvml.NVMLError as err:
                    if err.value != nvml.NVML_ERROR_NOT_FOUND:
                        raise
                else:
                    nvml.nvmlComputeInstanceDestroy(compute)
            nvml.nvmlGpuInstanceDestroy(gpu_instance)
        except nvml.NVMLError as err:
            raise _destroy_failure(nvml, err, partition) from err
        log.info("MIG partition destroyed", gpu=partition.gpu, profile=partition.profile, uuid=partition.uuid)

    def existing(self, gpu: HostDevice) -> list[Partition]:
        bdf = gpu.pci_address or ""
        nvml = self._lib()
        handle = self._handle(nvml, bdf, "its partitions cannot be listed")
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
        except nvml.NVMLError:
            return []  # no MIG on this GPU: no partitions
        if current != nvml.NVML_DEVICE_MIG_ENABLE:
            return []
        minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
        found: list[Partition] = []
        for index in range(nvml.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, index)
            except nvml.NVMLError:
                continue
            for gpu_instance in _instances(
                nvml, nvml.nvmlDeviceGetGpuInstances, handle, info.id, info.instanceCount,
                nvml.c_nvmlGpuInstance_t,
            ):  # fmt: skip
                gi_info = nvml.nvmlGpuInstanceGetInfo(gpu_instance)
                uuid, ci_id = "", None
                for ci_index in range(nvml.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
                    try:
                        ci_profile = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                            gpu_instance, ci_index, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                        )
                    except nvml.NVMLError:
                        continue
                    for compute in _instances(
                        nvml, nvml.nvmlGpuInstanceGetComputeInstances, gpu_instance, ci_profile.id,
                        ci_profile.instanceCount, nvml.c_nvmlComputeInstance_t,
                    ):  # fmt: skip
                        ci_info = nvml.nvmlComputeInstanceGetInfo(compute)
                        uuid, ci_id = _text(nvml.nvmlDeviceGetUUID(ci_info.device)), ci_info.id
                found.append(
                    Partition(
                        uuid=uuid,
                        profile=profile_name(info),
                        start=gi_info.placement.start,
                        size=gi_info.placement.size,
                        gpu=bdf,
                        device_nodes=self._device_nodes(minor, gi_info.id, ci_id)
                        if ci_id is not None
                        else [],
                        env=partition_env(uuid) if uuid else {},
                        gpu_instance=gi_info.id,
                        compute_instance=ci_id,
                    )
                )
        return sorted(found, key=lambda p: p.start)

    def reset(self, gpu: HostDevice) -> list[Partition]:
        """Every GPU and compute instance destroyed, and MIG mode off (the GPU serves whole again);
        a mode change that waits for a GPU reset is logged, not failed: the next partition enables
        it again anyway."""
        found = self.existing(gpu)
        for partition in found:
            self.destroy(partition)
        nvml = self._lib()
        bdf = gpu.pci_address or ""
        handle = self._handle(nvml, bdf, "MIG mode stays as it is")
        try:
            current, _pending = nvml.nvmlDeviceGetMigMode(handle)
            if current == nvml.NVML_DEVICE_MIG_ENABLE:
                status = nvml.nvmlDeviceSetMigMode(handle, nvml.NVML_DEVICE_MIG_DISABLE)
                if status != nvml.NVML_SUCCESS:
                    log.warning("MIG mode off is pending a GPU reset", gpu=bdf, status=status)
        except nvml.NVMLError as err:
            if err.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                log.warning("MIG mode could not be turned off", gpu=bdf, error=str(err))
        return found


def _instances(nvml: Any, list_call: Any, parent: Any, profile_id: int, most: int, kind: Any) -> list[Any]:
    """The instances ``list_call`` (``nvmlDeviceGetGpuInstances``, ``nvmlGpuInstanceGetComputeInstances``)
    fills in for one profile."""
    if most <= 0:
        return []
    array = (kind * most)()
    count = ctypes.c_uint(0)
    try:
        list_call(parent, profile_id, array, ctypes.byref(count))
    except nvml.NVMLError:
        return []
    return [array[i] for i in range(min(count.value, most))]


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _init_failure(nvml: Any, err: Any) -> str:
    if err.value == nvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return (
            "NVML is not available on this node: libnvidia-ml.so.1 was not found (no NVIDIA driver, or the "
            "plugin's pod does not see the driver's libraries: docs/plugin.md, 'GPU partitions')"
        )
    if err.value == nvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return "NVML is not available on this node: the NVIDIA kernel driver is not loaded"
    if err.value == nvml.NVML_ERROR_NO_PERMISSION:
        return "NVML refused the plugin: it needs root (the DaemonSet runs it as root) to make partitions"
    return f"NVML could not be initialised on this node: {err}"


def _next_step(nvml: Any, err: Any) -> str:
    if err.value == nvml.NVML_ERROR_NO_PERMISSION:
        return "the plugin needs root to change MIG state"
    if err.value in (nvml.NVML_ERROR_IN_USE, nvml.NVML_ERROR_RESET_REQUIRED):
        return "stop every process on the GPU and reset it ('nvidia-smi -r'); the kubelet retries"
    return "the kubelet retries"


def _create_failure(
    nvml: Any, err: Any, bdf: str, profile: PartitionProfile, start: int, step: str
) -> PartitionFailed:
    where = f"GPU {bdf}: no {profile.name} partition at slice {start}"
    if err.value == nvml.NVML_ERROR_INSUFFICIENT_RESOURCES:
        return PartitionFailed(
            f"{where}: NVML has no room for {step} (another GPU instance holds some of its memory "
            "slices, or the profile's instance limit is reached); nothing was left behind; the kubelet "
            "retries"
        )
    if err.value == nvml.NVML_ERROR_NOT_SUPPORTED:
        return PartitionFailed(f"{where}: NVML does not support {step} on this GPU", permanent=True)
    if err.value == nvml.NVML_ERROR_RESET_REQUIRED:
        return PartitionFailed(
            f"{where}: MIG mode needs a reset first (stop every process on the GPU and run "
            f"'nvidia-smi -r -i {bdf}'); nothing was left behind; the kubelet retries"
        )
    return PartitionFailed(
        f"{where}: NVML failed making {step} ({err}); nothing was left behind; {_next_step(nvml, err)}"
    )


def _destroy_failure(nvml: Any, err: Any, partition: Partition) -> PartitionFailed:
    where = f"GPU {partition.gpu}: the {partition.profile} partition {partition.uuid}"
    if err.value == nvml.NVML_ERROR_IN_USE:
        return PartitionFailed(
            f"{where} is still in use by a process, so it was not removed; it stays recorded and the "
            "kubelet retries"
        )
    return PartitionFailed(f"{where} could not be removed ({err}); it stays recorded and the kubelet retries")
