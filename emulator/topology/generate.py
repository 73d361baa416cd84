"""Deterministic topologies of any size, for load tests (e.g. 50 hosts and 200 devices).

Hosts are named like kind's workers (``kind-worker``, ``kind-worker2``, ...). PCIe devices are
dealt round-robin by type onto switches of ``devices_per_switch`` each, so every switch holds a
mix; GPUs alternate between two models (with ``partitionable_gpus``, every third is a partitionable
A100 and the H100 model names its partition table). CXL devices have pre-made chunks, or are
pools whose chunks clients create (``cxl_pools``). Serial numbers and UUIDs are derived from ``seed`` with
UUIDv5 / BLAKE2, so the same spec always yields the same file.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from plumbing.names import DNS1123_LABEL_PATTERN

__all__ = ["GenerateSpec", "generate_topology", "generate_topology_yaml"]

_MODELS: dict[str, dict[str, Any]] = {
    "h100": {
        "type": "gpu",
        "manufacturer": "NVIDIA Corporation",
        "model": "NVIDIA H100 PCIe",
        "vendorId": "0x10de",
        "deviceId": "0x2331",
        "subsystemId": "0x1626",
        "classCode": "0x030200",
        "memory": "80GiB",
        "pcieGeneration": 5,
        "pcieWidth": 16,
    },
    "l40s": {
        "type": "gpu",
        "manufacturer": "NVIDIA Corporation",
        "model": "NVIDIA L40S",
        "vendorId": "0x10de",
        "deviceId": "0x26b9",
        "subsystemId": "0x1851",
        "classCode": "0x030200",
        "memory": "48GiB",
        "pcieGeneration": 4,
        "pcieWidth": 16,
    },
    "pm1743": {
        "type": "nvme",
        "manufacturer": "Samsung Electronics",
        "model": "PM1743 3.84TB",
        "vendorId": "0x144d",
        "deviceId": "0xa826",
        "classCode": "0x010802",
        "memory": 3840755982336,
        "pcieGeneration": 5,
        "pcieWidth": 4,
    },
    "cx7": {
        "type": "nic",
        "manufacturer": "Mellanox Technologies",
        "model": "ConnectX-7 200GbE",
        "vendorId": "0x15b3",
        "deviceId": "0x1021",
        "subsystemId": "0x0041",
        "classCode": "0x020000",
        "pcieGeneration": 5,
        "pcieWidth": 16,
    },
    "u55c": {
        "type": "fpga",
        "manufacturer": "Xilinx",
        "model": "Alveo U55C",
        "vendorId": "0x10ee",
        "deviceId": "0x505c",
        "classCode": "0x120000",
        "memory": "16GiB",
        "pcieGeneration": 4,
        "pcieWidth": 16,
    },
    "a100": {
        "type": "gpu",
        "manufacturer": "NVIDIA Corporation",
        "model": "NVIDIA A100-PCIE-40GB",
        "vendorId": "0x10de",
        "deviceId": "0x20f1",
        "subsystemId": "0x145f",
        "classCode": "0x030200",
        "memory": "40GiB",
        "pcieGeneration": 4,
        "pcieWidth": 16,
        "partitions": "a100-40gb",
    },
    "cxl-256g": {
        "type": "cxl-memory",
        "manufacturer": "fabric-dra",
        "model": "CXL Type-3 memory pool 256GiB",
        "vendorId": "0x8086",
        "deviceId": "0x0d93",
        "classCode": "0x050210",
        "memory": "256GiB",
        "pcieGeneration": 5,
        "pcieWidth": 16,
    },
    "cxl-64g": {
        "type": "cxl-memory",
        "manufacturer": "fabric-dra",
        "model": "CXL Type-3 memory expander 64GiB",
        "vendorId": "0x8086",
        "deviceId": "0x0d93",
        "classCode": "0x050210",
        "memory": "64GiB",
        "pcieGeneration": 5,
        "pcieWidth": 8,
    },
}


class GenerateSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    hosts: int = Field(default=4, ge=1, le=1000)
    gpus: int = Field(default=8, ge=0, le=10000)
    nvme: int = Field(default=2, ge=0, le=10000)
    nics: int = Field(default=1, ge=0, le=10000)
    fpgas: int = Field(default=1, ge=0, le=10000)
    cxl_devices: int = Field(default=2, ge=0, le=1000)
    chunks: int = Field(default=4, ge=1, le=64)
    cxl_pools: int = Field(default=0, ge=0, le=1000)
    #: the H100 model names its partition table, and every third GPU is a partitionable A100
    partitionable_gpus: bool = False
    devices_per_switch: int = Field(default=16, ge=1, le=1000)
    host_prefix: str = Field(default="kind-worker", pattern=DNS1123_LABEL_PATTERN, max_length=40)
    seed: str = "fabric-dra"

    @model_validator(mode="after")
    def _something_to_bind(self) -> GenerateSpec:
        if self.gpus + self.nvme + self.nics + self.fpgas + self.cxl_devices + self.cxl_pools == 0:
            raise ValueError("a topology needs at least one device")
        return self


def _gpu_model(spec: GenerateSpec, i: int) -> str:
    """GPUs alternate H100 and L40S; with partitionable GPUs every third is an A100 instead."""
    if spec.partitionable_gpus and i % 3 == 2:
        return "a100"
    return "h100" if i % 2 == 0 else "l40s"


def _hex_serial(seed: str, name: str) -> str:
    return hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=8).hexdigest()


def generate_topology(spec: GenerateSpec) -> dict[str, Any]:
    namespace = uuid.uuid5(uuid.NAMESPACE_URL, f"fabric-dra:topology:{spec.seed}")
    hosts = [
        {
            "name": spec.host_prefix if i == 0 else f"{spec.host_prefix}{i + 1}",
            "uuid": str(uuid.uuid5(namespace, f"host/{i}")),
            "numaNode": i % 2,
        }
        for i in range(spec.hosts)
    ]
    # deal devices round-robin by type so every switch gets a mix of kinds
    queues: list[list[tuple[str, str]]] = [
        [(f"gpu{i}", _gpu_model(spec, i)) for i in range(spec.gpus)],
        [(f"nvme{i}", "pm1743") for i in range(spec.nvme)],
        [(f"nic{i}", "cx7") for i in range(spec.nics)],
        [(f"fpga{i}", "u55c") for i in range(spec.fpgas)],
    ]
    dealt: list[tuple[str, str]] = []
    while any(queues):
        for queue in queues:
            if queue:
                dealt.append(queue.pop(0))
    switches: list[dict[str, Any]] = []
    for n, start in enumerate(range(0, len(dealt), spec.devices_per_switch)):
        devices = []
        for device_id, model in dealt[start : start + spec.devices_per_switch]:
            device: dict[str, Any] = {
                "id": device_id,
                "model": model,
                "serial": _hex_serial(spec.seed, device_id),
            }
            if _MODELS[model]["type"] == "gpu":
                device["uuid"] = str(uuid.uuid5(namespace, f"device/{device_id}"))
            devices.append(device)
        switches.append({"id": f"switch{n}", "devices": devices})
    cxl: dict[str, Any] = {"switches": []}
    memory: list[dict[str, Any]] = [
        {
            "id": f"cxlmem{i}",
            "model": "cxl-64g",
            "serial": _hex_serial(spec.seed, f"cxlmem{i}"),
            "chunks": spec.chunks,
        }
        for i in range(spec.cxl_devices)
    ]
    memory += [
        {
            "id": f"cxlpool{i}",
            "model": "cxl-256g",
            "serial": _hex_serial(spec.seed, f"cxlpool{i}"),
            "pool": {"minChunkMiB": 1024, "incrementMiB": 1024},
        }
        for i in range(spec.cxl_pools)
    ]
    if memory:
        cxl["switches"].append({"id": "cxlswitch0", "devices": memory})
    used = {m for _, m in dealt} | {d["model"] for d in memory}
    models = {k: dict(v) for k, v in _MODELS.items() if k in used}
    if spec.partitionable_gpus and "h100" in models:
        models["h100"]["partitions"] = "h100-80gb"
    return {
        "version": 1,
        "service": {"uuid": str(uuid.uuid5(namespace, "service"))},
        "hosts": hosts,
        "models": models,
        "pcie": {"switches": switches},
        "cxl": cxl,
    }


def generate_topology_yaml(spec: GenerateSpec) -> str:
    header = (
        "# Generated by `fabric-dra emulator topology generate` "
        f"--hosts {spec.hosts} --gpus {spec.gpus} --nvme {spec.nvme} --nics {spec.nics} --fpgas {spec.fpgas} "
        f"--cxl-devices {spec.cxl_devices} --chunks {spec.chunks} "
        + (f"--cxl-pools {spec.cxl_pools} " if spec.cxl_pools else "")
        + ("--partitionable-gpus " if spec.partitionable_gpus else "")
        + f"--devices-per-switch {spec.devices_per_switch} "
        f"--seed {spec.seed}\n"
    )
    return header + yaml.safe_dump(generate_topology(spec), sort_keys=False, width=120)
