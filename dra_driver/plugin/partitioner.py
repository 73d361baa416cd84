"""GPU partitions on this node: the :class:`Partitioner` interface, the record of one partition
(:class:`Partition`, kept in the checkpoint), its failures, and the emulated implementation.

A partition claim's device is one placement of one profile of a fabric GPU (``gpu0-1g10gb-3``,
:mod:`manager_api.partitions`). The fabric binds the whole GPU to this node; the plugin then carves
the partition out of it and hands the container only that:

* :class:`EmulatedPartitioner` writes the partition into the emulated host's sysfs tree, under
  the GPU's PCI directory, as NVIDIA's driver would make a MIG device appear (docs/emulator.md,
  "GPU partitions"): ``mig/<label>-<start>/`` with ``uuid``, ``profile``, ``start``, ``size``,
  ``minor`` and ``dev``. The emulator removes the GPU's directory on unbind, so its partitions go
  with it.
* :class:`dra_driver.plugin.nvml.NvmlPartitioner` makes a MIG GPU instance and compute instance
  through NVML on a real host.

Which one a plugin uses follows ``--host-mode`` (real: NVML). Every method blocks
(NVML calls, file writes): the backend runs them in a worker thread, one GPU at a time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from dra_driver.errors import KubeletPluginError
from dra_driver.plugin.hostview import HostDevice, listdir, read_attr
from manager_api.partitions import PartitionProfile
from plumbing.logs import get_logger

__all__ = [
    "NVIDIA_VISIBLE_DEVICES",
    "EmulatedPartitioner",
    "Partition",
    "PartitionFailed",
    "Partitioner",
    "partition_env",
]

log = get_logger(__name__)

#: the variable the NVIDIA container toolkit reads to pick the devices of a container
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
#: the directory under a GPU's PCI directory that holds its emulated partitions (design §A6)
MIG_DIR = "mig"
#: the first minor an emulated capability device gets (NVIDIA's ``nvidia-cap1``, ``nvidia-cap2``
#: are the driver's own ``mig/config`` and ``mig/monitor`` capabilities)
_FIRST_MINOR = 3


class PartitionFailed(KubeletPluginError):
    """A partition could not be made (or removed) on this node; the message is one line that
    names the GPU and the profile. ``permanent``: retrying on this node cannot help (the GPU
    does not support partitions), so the claim's devices are rolled back."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class Partition(BaseModel):
    """One partition made on this node (stored in the checkpoint with its claim's device)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str = Field(description="MIG-<uuid>: what NVIDIA_VISIBLE_DEVICES names")
    profile: str = Field(description="the profile's name, 1g.10gb")
    start: int = Field(ge=0, description="its first memory slice")
    size: int = Field(ge=1, description="memory slices it takes")
    gpu: str = Field(description="the PCI address of the GPU it is carved from")
    device_nodes: list[str] = Field(default_factory=list, description="host /dev paths a container needs")
    env: dict[str, str] = Field(default_factory=dict, description="variables the container needs")
    #: NVML's GPU instance and compute instance ids (real hosts)
    gpu_instance: int | None = None
    compute_instance: int | None = None
    #: its directory in the emulated host's tree
    path: str | None = None

    @property
    def slices(self) -> range:
        return range(self.start, self.start + self.size)

    def is_placement(self, profile: str, start: int) -> bool:
        return (self.profile, self.start) == (profile, start)


class Partitioner(Protocol):
    """How partitions are made on a GPU of this host (blocking calls)."""

    name: str

    def create(self, gpu: HostDevice, profile: PartitionProfile, start: int) -> Partition:
        """Make a partition of ``profile`` at memory slice ``start`` of ``gpu``; nothing is left
        half-made when it fails (:class:`PartitionFailed`)."""
        ...

    def destroy(self, partition: Partition) -> None:
        """Remove ``partition``; one that is already gone is no error."""
        ...

    def existing(self, gpu: HostDevice) -> list[Partition]:
        """Every partition ``gpu`` has now, whoever made it."""
        ...

    def reset(self, gpu: HostDevice) -> list[Partition]:
        """Remove every partition of ``gpu`` (the reset between tenants); the ones removed."""
        ...


def partition_env(uuid: str) -> dict[str, str]:
    return {NVIDIA_VISIBLE_DEVICES: uuid}


class EmulatedPartitioner:
    """Partitions in an emulated host's sysfs tree (``--sysfs-root``, never the real ``/sys``)."""

    name = "emulated"

    def __init__(self, sysfs_root: Path, *, new_uuid: Callable[[], str] | None = None) -> None:
        if sysfs_root.resolve() == Path("/sys"):
            raise ValueError("the emulated partitioner writes an emulated host's tree, never /sys")
        self.root = sysfs_root
        self._new_uuid = new_uuid or (lambda: f"MIG-{uuidlib.uuid4()}")

    def _mig(self, gpu: HostDevice) -> Path:
        return Path(gpu.sysfs_path) / MIG_DIR

    def _read(self, gpu: HostDevice, path: Path) -> Partition | None:
        values = {f: read_attr(path / f) for f in ("uuid", "profile", "start", "size", "dev")}
        if any(values[f] is None for f in ("uuid", "profile", "start", "size")):
            return None
        try:
            start, size = int(values["start"] or ""), int(values["size"] or "")
        except ValueError:
            return None
        uuid = values["uuid"] or ""
        return Partition(
            uuid=uuid,
            profile=values["profile"] or "",
            start=start,
            size=size,
            gpu=gpu.pci_address or os.path.basename(gpu.sysfs_path),
            device_nodes=[values["dev"]] if values["dev"] else [],
            env=partition_env(uuid),
            path=str(path),
        )

    def existing(self, gpu: HostDevice) -> list[Partition]:
        mig = self._mig(gpu)
        found = (self._read(gpu, mig / name) for name in listdir(mig) if not name.startswith("."))
        return sorted((p for p in found if p is not None), key=lambda p: p.start)

    def _minors_in_use(self) -> set[int]:
        """Capability minors are per host, like ``/dev/nvidia-caps``: every GPU's partitions count."""
        used: set[int] = set()
        devices = self.root / "bus" / "pci" / "devices"
        for bdf in listdir(devices):
            mig = devices / bdf / MIG_DIR
            for name in listdir(mig):
                minor = read_attr(mig / name / "minor")
                if minor is not None and minor.isdigit():
                    used.add(int(minor))
        return used

    def create(self, gpu: HostDevice, profile: PartitionProfile, start: int) -> Partition:
        where = f"GPU {gpu.pci_address or gpu.sysfs_path}"
        if not os.path.isdir(gpu.sysfs_path):
            raise PartitionFailed(f"{where} is no longer on this node; no {profile.name} partition was made")
        wanted = range(start, start + profile.memory_slices)
        for other in self.existing(gpu):
            common = sorted(set(wanted) & set(other.slices))
            if common:
                # NVML's answer to an occupied placement: NVML_ERROR_INSUFFICIENT_RESOURCES
                raise PartitionFailed(
                    f"{where} has no room for a {profile.name} partition at slice {start}: memory slice "
                    f"{common[0]} is taken by partition {other.uuid} ({other.profile} at {other.start})"
                )
        used, minor = self._minors_in_use(), _FIRST_MINOR
        while minor in used:
            minor += 1
        uuid = self._new_uuid()
        mig = self._mig(gpu)
        final = mig / f"{profile.label}-{start}"
        temp = mig / f".new-{profile.label}-{start}-{uuidlib.uuid4().hex[:8]}"
        try:
            temp.mkdir(parents=True)
            files = {
                "uuid": uuid,
                "profile": profile.name,
                "start": str(start),
                "size": str(profile.memory_slices),
                "minor": str(minor),
                "dev": f"/dev/nvidia-caps/nvidia-cap{minor}",
            }
            for name, value in files.items():
                (temp / name).write_text(value + "\n")
            # whole or not at all: a scanner never sees half a partition
            os.rename(temp, final)
        except OSError as err:
            shutil.rmtree(temp, ignore_errors=True)
            raise PartitionFailed(
                f"{where}: the {profile.name} partition at slice {start} could not be written "
                f"({err.strerror or err}); nothing was left behind"
            ) from err
        made = self._read(gpu, final)
        if made is None:  # cannot happen unless someone edits the tree meanwhile
            raise PartitionFailed(f"{where}: the {profile.name} partition at slice {start} vanished")
        log.info("partition created", gpu=made.gpu, profile=profile.name, start=start, uuid=uuid)
        return made

    def destroy(self, partition: Partition) -> None:
        if partition.path is None:
            return
        path = Path(partition.path)
        gone = path.with_name(f".gone-{path.name}-{uuidlib.uuid4().hex[:8]}")
        try:
            os.rename(path, gone)
        except FileNotFoundError:
            return  # already gone, or its GPU left the host with it
        shutil.rmtree(gone, ignore_errors=True)
        log.info("partition destroyed", gpu=partition.gpu, profile=partition.profile, uuid=partition.uuid)

    def reset(self, gpu: HostDevice) -> list[Partition]:
        found = self.existing(gpu)
        for partition in found:
            self.destroy(partition)
        with contextlib.suppress(OSError):
            for name in listdir(self._mig(gpu)):
                if name.startswith("."):  # a create or destroy interrupted by a crash
                    shutil.rmtree(self._mig(gpu) / name, ignore_errors=True)
        return found
