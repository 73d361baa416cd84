"""A stand-in for the ``pynvml`` module (nvidia-ml-py) for the NVML partitioner's tests: no GPU
exists here. It keeps a GPU's MIG state — mode, GPU instances with their placements, compute
instances — answers as NVML does (``NVML_ERROR_INSUFFICIENT_RESOURCES`` for an occupied
placement, ``NVML_ERROR_NOT_FOUND`` for an instance that is gone, a mode change that waits for a
reset), and records every call in order. Names, constants and error values are the real module's
(``test_nvml.py`` holds them to it where nvidia-ml-py is installed).
"""

from __future__ import annotations

import ctypes
import itertools
import types
import uuid
from dataclasses import dataclass, field
from typing import Any, TypeVar

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_IN_USE = 19
NVML_ERROR_INSUFFICIENT_RESOURCES = 23
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x0F
NVML_COMPUTE_INSTANCE_PROFILE_COUNT = 0x09
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0
NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE = 0x0
NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE = 0x1
NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE = 0x2
NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE = 0x3
NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE = 0x4
NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE = 0x5
NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE = 0x6
#: compute-instance profile index → its compute slices
_COMPUTE_PROFILES = {0x0: 1, 0x1: 2, 0x2: 3, 0x3: 4, 0x4: 7, 0x5: 8, 0x6: 6}


_T = TypeVar("_T")


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {
            NVML_ERROR_INSUFFICIENT_RESOURCES: "Insufficient Resources",
            NVML_ERROR_NOT_FOUND: "Not Found",
            NVML_ERROR_NOT_SUPPORTED: "Not Supported",
            NVML_ERROR_IN_USE: "In use by another client",
            NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
        }.get(self.value, f"NVML Error with code {self.value}")


class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


@dataclass
class ProfileInfo:
    """``c_nvmlGpuInstanceProfileInfo_v2_t``'s fields the partitioner reads."""

    id: int
    sliceCount: int
    instanceCount: int
    multiprocessorCount: int
    memorySizeMB: int
    name: bytes
    memory_slices: int = 1


@dataclass
class Placement:
    start: int
    size: int


@dataclass
class GpuInstance:
    id: int
    profile: ProfileInfo
    placement: Placement
    #: compute instance id → the MIG device's UUID
    computes: dict[int, str] = field(default_factory=dict)


@dataclass
class Gpu:
    bdf: str
    minor: int
    mig: tuple[int, int] = (NVML_DEVICE_MIG_ENABLE, NVML_DEVICE_MIG_ENABLE)
    instances: dict[int, GpuInstance] = field(default_factory=dict)
    #: what nvmlDeviceSetMigMode answers (its activation status); a status other than success
    #: leaves the mode pending until a reset
    set_mode_status: int = NVML_SUCCESS


#: an H100's GPU-instance profiles by NVML profile index (nvidia-smi mig -lgip): index → info
H100_PROFILES = {
    0x0: ProfileInfo(19, 1, 7, 16, 9984, b"MIG 1g.10gb", 1),
    0x1: ProfileInfo(14, 2, 3, 32, 20096, b"MIG 2g.20gb", 2),
    0x2: ProfileInfo(9, 3, 2, 60, 40448, b"MIG 3g.40gb", 4),
    0x3: ProfileInfo(5, 4, 1, 64, 40448, b"MIG 4g.40gb", 4),
    0x4: ProfileInfo(0, 7, 1, 132, 81152, b"MIG 7g.80gb", 8),
    0x7: ProfileInfo(20, 1, 1, 16, 9984, b"MIG 1g.10gb+me", 1),
    0x9: ProfileInfo(15, 1, 4, 26, 20096, b"MIG 1g.20gb", 2),
}


class FakeNvml(types.ModuleType):
    """``pynvml`` as far as the partitioner uses it, over the GPUs it is given."""

    def __init__(self, *gpus: Gpu, profiles: dict[int, ProfileInfo] | None = None) -> None:
        super().__init__("pynvml")
        for name, value in globals().items():
            if name.startswith("NVML_") or name in ("NVMLError", "c_nvmlGpuInstancePlacement_t"):
                setattr(self, name, value)
        self.c_nvmlGpuInstance_t = ctypes.c_void_p
        self.c_nvmlComputeInstance_t = ctypes.c_void_p
        self.gpus = {g.bdf: g for g in gpus}
        self.profiles = profiles if profiles is not None else H100_PROFILES
        self.calls: list[tuple[Any, ...]] = []
        #: function name → the NVML error it raises (once)
        self.fail: dict[str, int] = {}
        self.init_error: int | None = None
        self._ids = itertools.count(1)
        #: handle → what it stands for
        self._handles: dict[int, Any] = {}

    # -- helpers -----------------------------------------------------------------------------

    def _call(self, name: str, *args: Any) -> None:
        self.calls.append((name, *args))
        if name in self.fail:
            raise NVMLError(self.fail.pop(name))

    def _handle(self, obj: Any) -> int:
        handle = 0x1000 + next(self._ids)
        self._handles[handle] = obj
        return handle

    def _of(self, handle: Any, kind: type[_T]) -> _T:
        obj = self._handles.get(int(handle))
        if not isinstance(obj, kind):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return obj

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    # -- the API --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        if self.init_error is not None:
            raise NVMLError(self.init_error)

    def nvmlDeviceGetHandleByPciBusId(self, bdf: str) -> int:
        self._call("nvmlDeviceGetHandleByPciBusId", bdf)
        if bdf not in self.gpus:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._handle(self.gpus[bdf])

    def nvmlDeviceGetMigMode(self, handle: int) -> list[int]:
        self._call("nvmlDeviceGetMigMode")
        return list(self._of(handle, Gpu).mig)

    def nvmlDeviceSetMigMode(self, handle: int, mode: int) -> int:
        self._call("nvmlDeviceSetMigMode", mode)
        gpu = self._of(handle, Gpu)
        if gpu.set_mode_status == NVML_SUCCESS:
            gpu.mig = (mode, mode)
        else:
            gpu.mig = (gpu.mig[0], mode)  # pending until the GPU is reset
        return gpu.set_mode_status

    def nvmlDeviceGetMinorNumber(self, handle: int) -> int:
        self._call("nvmlDeviceGetMinorNumber")
        gpu: Gpu = self._of(handle, Gpu)
        return gpu.minor

    def nvmlDeviceGetGpuInstanceProfileInfo(self, handle: int, index: int) -> ProfileInfo:
        self._call("nvmlDeviceGetGpuInstanceProfileInfo", index)
        self._of(handle, Gpu)
        if index not in self.profiles:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return self.profiles[index]

    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, handle: int, profile_id: int, placement: c_nvmlGpuInstancePlacement_t
    ) -> int:
        self._call("nvmlDeviceCreateGpuInstanceWithPlacement", profile_id, placement.start, placement.size)
        gpu = self._of(handle, Gpu)
        if gpu.mig[0] != NVML_DEVICE_MIG_ENABLE:
            raise NVMLError(NVML_ERROR_RESET_REQUIRED)
        profile = next(p for p in self.profiles.values() if p.id == profile_id)
        wanted = set(range(placement.start, placement.start + placement.size))
        taken = {
            s
            for gi in gpu.instances.values()
            for s in range(gi.placement.start, gi.placement.start + gi.placement.size)
        }
        if placement.size != profile.memory_slices or wanted & taken:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = min(set(range(1, 15)) - set(gpu.instances))
        instance = GpuInstance(gi_id, profile, Placement(placement.start, placement.size))
        gpu.instances[gi_id] = instance
        return self._handle((gpu, instance))

    def _gi(self, handle: Any) -> tuple[Gpu, GpuInstance]:
        obj = self._handles.get(int(handle))
        if not isinstance(obj, tuple) or len(obj) != 2:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        gpu, instance = obj
        if gpu.instances.get(instance.id) is not instance:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return gpu, instance

    def nvmlGpuInstanceGetInfo(self, handle: int) -> Any:
        self._call("nvmlGpuInstanceGetInfo")
        _gpu, instance = self._gi(handle)
        return types.SimpleNamespace(
            id=instance.id,
            profileId=instance.profile.id,
            placement=types.SimpleNamespace(start=instance.placement.start, size=instance.placement.size),
        )

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, handle: int, index: int, engine: int) -> Any:
        self._call("nvmlGpuInstanceGetComputeInstanceProfileInfo", index, engine)
        _gpu, instance = self._gi(handle)
        slices = _COMPUTE_PROFILES.get(index)
        if slices is None or slices > instance.profile.sliceCount:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return types.SimpleNamespace(id=100 + index, sliceCount=slices, instanceCount=1)

    def nvmlGpuInstanceCreateComputeInstance(self, handle: int, profile_id: int) -> int:
        self._call("nvmlGpuInstanceCreateComputeInstance", profile_id)
        gpu, instance = self._gi(handle)
        if instance.computes:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        instance.computes[0] = f"MIG-{uuid.uuid4()}"
        return self._handle((gpu, instance, 0))

    def _ci(self, handle: Any) -> tuple[Gpu, GpuInstance, int]:
        obj = self._handles.get(int(handle))
        if not isinstance(obj, tuple) or len(obj) != 3:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        gpu, instance, ci_id = obj
        if gpu.instances.get(instance.id) is not instance or ci_id not in instance.computes:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return gpu, instance, ci_id

    def nvmlComputeInstanceGetInfo(self, handle: int) -> Any:
        self._call("nvmlComputeInstanceGetInfo")
        _gpu, instance, ci_id = self._ci(handle)
        device = self._handle(("mig", instance.computes[ci_id]))
        return types.SimpleNamespace(id=ci_id, device=device)

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        self._call("nvmlDeviceGetUUID")
        obj = self._handles.get(int(handle))
        if not isinstance(obj, tuple) or obj[0] != "mig":
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return str(obj[1])

    def nvmlDeviceGetGpuInstanceById(self, handle: int, gi_id: int) -> int:
        self._call("nvmlDeviceGetGpuInstanceById", gi_id)
        gpu = self._of(handle, Gpu)
        if gi_id not in gpu.instances:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._handle((gpu, gpu.instances[gi_id]))

    def nvmlGpuInstanceGetComputeInstanceById(self, handle: int, ci_id: int) -> int:
        self._call("nvmlGpuInstanceGetComputeInstanceById", ci_id)
        gpu, instance = self._gi(handle)
        if ci_id not in instance.computes:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._handle((gpu, instance, ci_id))

    def nvmlComputeInstanceDestroy(self, handle: int) -> int:
        self._call("nvmlComputeInstanceDestroy")
        _gpu, instance, ci_id = self._ci(handle)
        del instance.computes[ci_id]
        return NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, handle: int) -> int:
        self._call("nvmlGpuInstanceDestroy")
        gpu, instance = self._gi(handle)
        if instance.computes:
            raise NVMLError(NVML_ERROR_IN_USE)
        del gpu.instances[instance.id]
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstances(self, handle: int, profile_id: int, array: Any, count_ref: Any) -> int:
        self._call("nvmlDeviceGetGpuInstances", profile_id)
        gpu = self._of(handle, Gpu)
        found = [gi for gi in gpu.instances.values() if gi.profile.id == profile_id]
        for i, instance in enumerate(found):
            array[i] = self._handle((gpu, instance))
        count_ref._obj.value = len(found)
        return NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstances(
        self, handle: int, profile_id: int, array: Any, count_ref: Any
    ) -> int:
        self._call("nvmlGpuInstanceGetComputeInstances", profile_id)
        gpu, instance = self._gi(handle)
        # one compute instance of the instance's whole size: listed under that compute profile
        whole = 100 + next(i for i, s in _COMPUTE_PROFILES.items() if s == instance.profile.sliceCount)
        found = list(instance.computes) if profile_id == whole else []
        for i, ci_id in enumerate(found):
            array[i] = self._handle((gpu, instance, ci_id))
        count_ref._obj.value = len(found)
        return NVML_SUCCESS


#: every name of ``pynvml`` the fake offers (functions, constants, types)
USED_NAMES = sorted(
    {
        name
        for name in {*dir(FakeNvml), *globals()}
        if name.startswith(("nvml", "NVML_", "c_nvml")) or name == "NVMLError"
    }
    | {"c_nvmlGpuInstance_t", "c_nvmlComputeInstance_t"}
)
#: constants whose values NVML keeps from release to release (the profile counts grow)
STABLE_VALUES = [
    *sorted(
        name
        for name in globals()
        if name.startswith(("NVML_ERROR_", "NVML_DEVICE_MIG_", "NVML_COMPUTE_INSTANCE_PROFILE_"))
        and not name.endswith("_COUNT")
    ),
    "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED",
    "NVML_SUCCESS",
]
