"""Two Redfish services, two fabric managers, one controller and one plugin (issue 37, "Several
Redfish services"), all real processes.

Service A is the packaged emulator (PCIe GPUs, NVMe, a CXL switch), served with ``$expand`` and
ETags; service B is a CXL memory appliance of its own (two expanders of pre-made chunks), with
other credentials and the quirk profile ``behaviour: {expand: unsupported, etags: omitted}``. Its
manager runs with ``--fabric-name appliance``, so its pool ``appliance-cxl`` does not collide with
A's ``fabric-cxl``. The node's sysfs is one tree made of both emulators' views of the host (A's PCIe
bus, B's CXL and DAX buses), as one kernel sees the devices of both fabrics.

* the controller publishes both managers' pools;
* one claim holding a GPU of A and a memory chunk of B is prepared on the node: each attach
  reaches its own manager (each emulator binds only its device);
* B's manager stopped: after the grace, every device of B's pool is tainted
  ``fabric-dra.io/fabric-unavailable`` and the manager's ``up`` metric is 0; A's pools are
  untouched, and a new claim on A's GPU still prepares;
* B's manager back: the taint is gone, and the first claim unprepares from both fabrics;
* a third manager on B without its own ``--fabric-name`` reports ``fabric-cxl`` as A's does: a
  controller given A and it publishes that pool with A's devices only, one log line, one metric.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fabric_dra_testbed.stack import Controller, Emulator, Manager, Stack, managers_args
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, DeviceType
from plumbing.kube.resources import RESOURCE_SLICES
from tests.support.plugin import DRIVER, ClaimRef, PluginStack, short_dir
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow(seconds=30), pytest.mark.timeout(240)]

NODE = "kind-worker"
DEFAULT_TOPOLOGY = Path(__file__).parents[3] / "emulator" / "topology" / "default.yaml"
TAINT = f"{DRIVER}/fabric-unavailable"
GPU_POOL, MEMORY_POOL = "fabric-pcie", "appliance-cxl"


def _appliance_topology(path: Path) -> Path:
    """A CXL memory appliance on the same hosts as the packaged topology, as another vendor's
    service: no ``$expand``, no ETags, its own device Ids and serials."""
    default = yaml.safe_load(DEFAULT_TOPOLOGY.read_text())
    topology = {
        "version": 1,
        "service": {"uuid": "5d0e6a52-8c2f-4d8e-9f0b-3a1c7e2b9d41"},
        "behaviour": {"expand": "unsupported", "etags": "omitted"},
        "hosts": default["hosts"],
        "models": {"cxl-64g": default["models"]["cxl-64g"]},
        "cxl": {
            "switches": [
                {
                    "id": "appliance-switch0",
                    "devices": [
                        {"id": "appliance0", "model": "cxl-64g", "serial": "0000beef00000001", "chunks": 4},
                        {"id": "appliance1", "model": "cxl-64g", "serial": "0000beef00000002", "chunks": 4},
                    ],
                }
            ]
        },
    }
    path.write_text(yaml.safe_dump(topology))
    return path


def _merged_host_view(root: Path, pcie: Path, cxl: Path) -> Path:
    """One host's sysfs made of two emulators' trees: A's PCIe bus, IOMMU groups and DMI, B's CXL
    and DAX buses and its memory devices (each emulator writes only its own tree)."""
    sys = root / "sys"
    (sys / "bus").mkdir(parents=True)
    (sys / "bus" / "pci").symlink_to(pcie / "bus" / "pci")
    for bus in ("cxl", "dax"):
        (sys / "bus" / bus).symlink_to(cxl / "bus" / bus)
    (sys / "devices").symlink_to(cxl / "devices")
    for top in ("kernel", "class"):
        (sys / top).symlink_to(pcie / top)
    return sys


@dataclass
class TwoServices:
    stack: Stack
    gpus: Manager
    memory: Manager
    emulators: tuple[Emulator, Emulator]
    plugin: PluginStack
    controller: Controller

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.controller.port}/metrics", timeout=5).text

    def managers_status(self) -> dict[str, Any]:
        status: dict[str, Any] = httpx.get(
            f"http://127.0.0.1:{self.controller.port}/status", timeout=5
        ).json()
        managers: dict[str, Any] = status["managers"]
        return managers


@pytest.fixture(scope="module")
def services() -> Iterator[TwoServices]:
    root = short_dir("fd2-")
    stack = Stack(root, logs_dir=root)
    try:
        emu_a = stack.emulator(name="emu-a")
        emu_b = stack.emulator(name="emu-b", topology=_appliance_topology(root / "appliance.yaml"))
        # each manager logs in to its own service with that service's generated credentials
        gpus = stack.manager(emu_a, name="mgr-a", insecure_no_auth=True)
        memory = stack.manager(
            emu_b, name="mgr-b", insecure_no_auth=True, args=["--fabric-name", "appliance"]
        )
        sysfs = _merged_host_view(root / "view", emu_a.sysfs(NODE), emu_b.sysfs(NODE))
        managers = managers_args({"gpus": gpus, "memory": memory})
        (root / "k").mkdir()
        with PluginStack(
            root / "k", node=NODE, backend="fabric", sysfs_root=sysfs, extra_args=managers
        ) as plugin:
            controller = plugin.stack.controller(
                None,
                plugin.kubeconfig,
                args=[*managers, "--device-taints", "on", "--manager-down-grace", "1"],
            )
            yield TwoServices(stack, gpus, memory, (emu_a, emu_b), plugin, controller)
    finally:
        stack.stop()
        shutil.rmtree(root, ignore_errors=True)


def _devices(manager: Manager) -> list[Device]:
    async def fetch() -> list[Device]:
        async with ManagerClient(manager.url) as client:
            return await client.devices()

    return asyncio.run(fetch())


def _free(manager: Manager, pool: str, device_type: DeviceType) -> list[Device]:
    return [
        d
        for d in _devices(manager)
        if d.pool == pool
        and d.type is device_type
        and d.state is BindingState.FREE
        and d.memory_pool is None
        and d.managed
        and d.partition_table is None
    ]


def _slices(services: TwoServices) -> dict[str, list[dict[str, Any]]]:
    """Pool → its published devices."""

    async def fetch() -> list[dict[str, Any]]:
        async with services.plugin.kube() as kube:
            items, _ = await kube.list_all(RESOURCE_SLICES)
            return items

    pools: dict[str, list[dict[str, Any]]] = {}
    for item in asyncio.run(fetch()):
        spec = item["spec"]
        pools.setdefault(spec["pool"]["name"], []).extend(spec.get("devices") or [])
    return pools


def _tainted(devices: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for d in devices if any(t["key"] == TAINT for t in d.get("taints") or [])]


def _prepare(services: TwoServices, name: str, gpu: Device, extra: list[dict[str, Any]]) -> ClaimRef:
    async def go() -> ClaimRef:
        ref = await services.plugin.create_claim(name, [("gpu", gpu.name)], pool=gpu.pool, results=extra)
        answer = (await services.plugin.prepare([ref])).claims[ref.uid]
        assert not answer.error, answer.error
        assert {(d.pool_name, d.device_name) for d in answer.devices} == {(gpu.pool, gpu.name)} | {
            (r["pool"], r["device"]) for r in extra
        }
        return ref

    return asyncio.run(go())


def _bound_to_node(manager: Manager, device: str, claim: ClaimRef) -> bool:
    found = next(d for d in _devices(manager) if d.name == device)
    return found.state is BindingState.BOUND and found.node == NODE and found.claim_uid == claim.uid


def _pools_where(services: TwoServices, check: Callable[[dict[str, list[dict[str, Any]]]], bool]) -> Any:
    """The published pools once ``check`` holds of them, else None (for :func:`wait_until`)."""
    found = _slices(services)
    return found if check(found) else None


def test_two_services_one_down(services: TwoServices) -> None:
    pools = wait_until(
        lambda: _pools_where(services, lambda p: {GPU_POOL, MEMORY_POOL, "fabric-cxl"} <= set(p)),
        timeout=60,
        what="slices of both managers' pools",
    )
    assert not any(_tainted(devices) for devices in pools.values())

    gpu, later_gpu = _free(services.gpus, GPU_POOL, DeviceType.GPU)[:2]
    (chunk, *_) = _free(services.memory, MEMORY_POOL, DeviceType.CXL_MEMORY)
    memory_result = {"request": "mem", "driver": DRIVER, "pool": MEMORY_POOL, "device": chunk.name}
    first = _prepare(services, "two-fabrics", gpu, [memory_result])
    assert _bound_to_node(services.gpus, gpu.name, first), "the GPU's attach did not reach its manager"
    assert _bound_to_node(services.memory, chunk.name, first), "the chunk's attach did not reach its manager"
    emu_a, emu_b = services.emulators
    assert (emu_a.bound_hosts(), emu_b.bound_hosts()) == ({gpu.name: NODE}, {chunk.name: NODE})

    services.memory.stop()
    wait_until(
        lambda: 'fabric_dra_controller_manager_up{manager="memory"} 0.0' in services.metrics(),
        timeout=30,
        what="the controller to count the memory manager down",
    )

    def all_tainted(pools: dict[str, list[dict[str, Any]]]) -> bool:
        devices = pools.get(MEMORY_POOL) or []
        return bool(devices) and len(_tainted(devices)) == len(devices)

    pools = wait_until(
        lambda: _pools_where(services, all_tainted), timeout=30, what=f"every device of {MEMORY_POOL} tainted"
    )
    assert _tainted(pools[GPU_POOL]) == [] and _tainted(pools["fabric-cxl"]) == []
    assert 'fabric_dra_controller_manager_up{manager="gpus"} 1.0' in services.metrics()
    status = services.managers_status()
    assert (status["gpus"]["up"], status["memory"]["up"]) == (True, False)
    assert (status["gpus"]["publisher"], status["memory"]["publisher"]) == ("default.gpus", "default.memory")
    assert MEMORY_POOL in status["memory"]["pools"] and status["memory"]["inventoryError"]
    second = _prepare(services, "one-fabric-while-other-down", later_gpu, [])
    assert _bound_to_node(services.gpus, later_gpu.name, second)

    services.memory.start()
    wait_until(
        lambda: _pools_where(services, lambda p: bool(p.get(MEMORY_POOL)) and not _tainted(p[MEMORY_POOL])),
        timeout=60,
        what=f"the taint gone from {MEMORY_POOL}",
    )

    async def unprepare() -> None:
        answer = await services.plugin.unprepare([first, second])
        assert not any(c.error for c in answer.claims.values()), answer

    asyncio.run(unprepare())
    freed = {d.name: d.state for d in _devices(services.gpus) + _devices(services.memory)}
    assert (freed[gpu.name], freed[later_gpu.name], freed[chunk.name]) == (BindingState.FREE,) * 3


def test_a_pool_two_services_both_report_is_published_from_the_first_listed_only(
    services: TwoServices,
) -> None:
    """The appliance's manager without its own --fabric-name calls its pool fabric-cxl, as the GPU
    service's manager does: a controller given both publishes fabric-cxl with the first-listed
    manager's devices only, says so in one log line and counts it. (Its own driver name keeps its
    slices apart from the first controller's.)"""
    stack, driver = services.stack, "collide.fabric-dra.io"
    clashing = stack.manager(services.emulators[1], name="mgr-clash", insecure_no_auth=True)
    controller = stack.controller(
        None,
        services.plugin.kubeconfig,
        name="controller-clash",
        args=[*managers_args({"gpus": services.gpus, "clash": clashing}), "--driver-name", driver],
    )
    gpus_cxl = {d.name for d in _devices(services.gpus) if d.pool == "fabric-cxl"}
    clash_cxl = {d.name for d in _devices(clashing) if d.pool == "fabric-cxl"}
    assert gpus_cxl and clash_cxl and not gpus_cxl & clash_cxl

    async def published() -> dict[str, set[str]]:
        async with services.plugin.kube() as kube:
            items, _ = await kube.list_all(RESOURCE_SLICES, field_selector=f"spec.driver={driver}")
        pools: dict[str, set[str]] = {}
        for item in items:
            names = {d["name"] for d in item["spec"].get("devices") or []}
            pools.setdefault(item["spec"]["pool"]["name"], set()).update(names)
        return pools

    def both_pools() -> dict[str, set[str]] | None:
        found = asyncio.run(published())
        return found if {"fabric-pcie", "fabric-cxl"} <= set(found) else None

    pools = wait_until(both_pools, timeout=60, what="the colliding controller's slices")
    assert pools["fabric-cxl"] == gpus_cxl  # none of the clashing manager's devices
    log = controller.role.log_since_start()
    assert log.count("two fabric managers report the same pool") == 1, log
    metrics = httpx.get(f"http://127.0.0.1:{controller.port}/metrics", timeout=5).text
    assert 'fabric_dra_controller_pool_collisions{pool="fabric-cxl",refused="clash"} 1.0' in metrics
    controller.role.stop()
    clashing.stop()
