"""Fixtures for the plugin's unit tests: short temp dirs (unix socket paths are limited to 107
bytes), a fake sysfs tree, claims, and a device backend double for the fabric."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.plugin.backend import AttachedDevice, AttachNotes, ShareAsk
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.claims import ClaimNotFound
from dra_driver.plugin.config import DeviceBackendKind, HostMode, MemoryMode, PluginConfig
from dra_driver.plugin.hostdev import HostDevice
from dra_driver.plugin.hostmemory import MemoryRecord
from manager_api.errors import DeviceBusy, FabricError
from manager_api.models import BindingState, Device, DeviceType
from plumbing.kube.dra import ResourceClaim

DRIVER = "fabric-dra.io"
NODE = "node-a"


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="fdp-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def make_config(root: Path, **overrides: Any) -> PluginConfig:
    values: dict[str, Any] = {
        "node_name": NODE,
        "driver_name": DRIVER,
        "registry_dir": root / "reg",
        "plugin_dir": root / "plug",
        "cdi_root": root / "cdi",
        "sysfs_root": root / "sys",
        "host_mode": HostMode.EMULATED,
        "device_backend": DeviceBackendKind.FABRIC,
        "manager_url": "http://127.0.0.1:1",
    }
    values.update(overrides)
    return PluginConfig(**values)


def claim_object(
    name: str,
    uid: str | None = None,
    *,
    devices: list[tuple[str, str]] | None = None,
    driver: str = DRIVER,
    pool: str = "fabric-pcie",
    allocated: bool = True,
    reserved: bool = True,
    namespace: str = "default",
) -> dict[str, Any]:
    """A ResourceClaim as the API server returns it; ``devices`` are (request, device) pairs."""
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or str(uuid.uuid4())},
        "spec": {
            "devices": {
                "requests": [
                    {"name": r, "exactly": {"deviceClassName": "fabric-gpu"}} for r, _ in devices or []
                ]
            }
        },
        "status": {},
    }
    if allocated:
        obj["status"]["allocation"] = {
            "devices": {
                "results": [
                    {"request": r, "driver": driver, "pool": pool, "device": d} for r, d in devices or []
                ]
            }
        }
    if reserved:
        obj["status"]["reservedFor"] = [{"resource": "pods", "name": "pod-1", "uid": str(uuid.uuid4())}]
    return obj


class FakeClaims:
    """ClaimSource over a dict (the API test server replaces this in integration tests)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.reads = 0

    def add(self, obj: dict[str, Any]) -> tuple[str, str, str]:
        meta = obj["metadata"]
        self.objects[(meta["namespace"], meta["name"])] = obj
        return meta["uid"], meta["namespace"], meta["name"]

    async def get(self, namespace: str, name: str) -> ResourceClaim:
        self.reads += 1
        try:
            return ResourceClaim.model_validate(self.objects[(namespace, name)])
        except KeyError:
            raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from None


def fabric_device(name: str, **fields: Any) -> Device:
    values: dict[str, Any] = {
        "name": name,
        "pool": "fabric-pcie",
        "fabric": "PCIe",
        "type": DeviceType.GPU,
        "vendor_id": "0x10de",
        "device_id": "0x2330",
        "model": "H100",
        "serial": f"SN-{name}",
        "binding_style": "zone",
        "redfish_uri": f"/redfish/v1/Fabrics/PCIe/Endpoints/{name}",
    }
    values.update(fields)
    return Device(**values)


class ScriptedBackend:
    """A backend double: attach waits on a per-device gate (to model a slow fabric) and records calls."""

    name = "fabric"

    def __init__(self, node: str = NODE) -> None:
        self.node = node
        self.gates: dict[str, asyncio.Event] = {}
        self.busy: dict[str, str] = {}
        self.attached: dict[str, str] = {}
        self.attach_calls: list[tuple[str, str]] = []
        self.attach_pools: dict[str, str | None] = {}
        self.attach_namespaces: dict[str, str | None] = {}
        #: device key → the share asked for (None: the device whole)
        self.attach_shares: dict[str, ShareAsk | None] = {}
        self.release_calls: list[tuple[str, str]] = []
        self.root = Path("/nonexistent")

    async def attach(
        self,
        claim_uid: str,
        device: str,
        *,
        notes: AttachNotes,
        pool: str | None = None,
        namespace: str | None = None,
        share: ShareAsk | None = None,
        known: PreparedDevice | None = None,
    ) -> AttachedDevice:
        self.attach_calls.append((claim_uid, device))
        self.attach_namespaces[device] = namespace
        self.attach_pools[device] = pool
        key = device if share is None else f"{device}-{share.share_id}"
        self.attach_shares[key] = share
        if device in self.gates:
            await self.gates[device].wait()
        holder = self.attached.get(key)
        if device in self.busy or (holder is not None and holder != claim_uid):
            raise DeviceBusy(f"device {device} is held", device=device, held_by=self.busy.get(device, holder))
        self.attached[key] = claim_uid
        host = HostDevice(sysfs_path=f"{self.root}/bus/pci/devices/{key}", pci_address="0000:41:00.0")
        if share is None:
            info = fabric_device(device, state=BindingState.BOUND, node=self.node)
            return AttachedDevice(device=info, host=host)
        info = fabric_device(device, type=DeviceType.CXL_MEMORY, vendor_id=None, device_id=None)
        memory = MemoryRecord(
            mode=share.mode, dax="dax0.0", node=1 if share.mode is MemoryMode.KMEM else None
        )
        return AttachedDevice(device=info, host=host, memory=memory, share_bytes=share.memory_bytes)

    async def release(
        self, claim_uid: str, prepared: PreparedDevice, *, within: float, last_on_gpu: bool = True
    ) -> None:
        self.release_calls.append((claim_uid, prepared.device))
        if self.attached.get(prepared.key) == claim_uid:
            del self.attached[prepared.key]

    async def bindings(self) -> list[Device] | None:
        return [
            fabric_device(d, state=BindingState.BOUND, node=self.node, claim_uid=c)
            for d, c in self.attached.items()
        ]

    def blind_pools(self) -> frozenset[str]:
        return frozenset()

    def pending_error(self, claim_uid: str, device: str) -> FabricError | None:
        return None

    async def watch_devices(
        self, after: int | None, wait_seconds: float
    ) -> tuple[int, dict[str, Device]] | None:
        await asyncio.sleep(wait_seconds)
        return None

    async def aclose(self) -> None:
        return None
