"""Shapes of Redfish services that compose and describe devices unlike the emulator's default.

Each test starts the emulator over TLS with a ``behaviour`` (docs/emulator.md "Behaviours") that
makes it act like a kind of service met in the wild, runs the real manager against it, and checks
the manager's answers against the emulator's own binding table; the operator's view is read the
way an operator reads it (``/readyz``, ``fabric-dra status``, ``fabric-dra explain``, the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dra_driver.controller.devices import PublishPolicy, WithheldReason, to_dra_device
from fabric_dra_testbed.stack import Role
from manager_api.client import ManagerClient
from manager_api.devices import DeviceType
from manager_api.errors import DeviceBusy
from manager_api.models import AttachmentState, BindingState
from plumbing import procs
from tests.integration.fabric.conftest import (
    NODES,
    OPERATOR_TOKEN,
    FabricAdmin,
    Tls,
    manager_for,
    plugin_token,
    tls_emulator,
)
from tests.integration.fabric.test_wild_services import topology_with
from tests.support.uids import claim_uid

pytestmark = pytest.mark.slow(seconds=20)

CLASSES = Path(__file__).resolve().parents[3] / "deploy" / "base" / "deviceclasses.yaml"
COMPOSITION = ("--binding-style", "composition")


@contextlib.asynccontextmanager
async def shaped_service(
    tmp: Path, tls: Tls, node: str, manager_flags: Sequence[str], **behaviour: Any
) -> AsyncIterator[tuple[FabricAdmin, Role, ManagerClient]]:
    """An emulator with ``behaviour`` over TLS, a manager in front of it, and a client with
    ``node``'s plugin token."""
    with (
        tls_emulator(tmp / "fabric", tls, topology=topology_with(tmp, **behaviour)) as fabric,
        manager_for(fabric, tmp / "manager", *manager_flags) as manager,
    ):
        async with ManagerClient(manager.address, token=plugin_token(node)) as plugin:
            yield fabric, manager, plugin


def fabric_dra(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    """``fabric-dra ARGS`` as an operator runs it, with the operator's token in a file."""
    token = tmp / "operator-token"
    token.write_text(OPERATOR_TOKEN + "\n")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    return procs.run([*args, "--token-file", str(token)], env=environment)


def readyz(manager: Role) -> tuple[int, dict[str, Any]]:
    response = httpx.get(f"{manager.address}/readyz", timeout=10)
    body: dict[str, Any] = response.json()
    return response.status_code, body


async def test_composition_by_patch_of_resource_blocks(tmp_path: Path, tls: Tls) -> None:
    """A service without AddResourceBlock whose systems are composed by a PATCH of
    Links.ResourceBlocks (with If-Match, which it requires): every host is in the pool, and
    attaches — two to one host at once, so one PATCH meets the other's change — and detaches
    are made and confirmed."""
    node = NODES[2]
    async with shaped_service(tmp_path, tls, node, COMPOSITION, composition="patch") as (
        fabric,
        manager,
        plugin,
    ):
        inventory = await plugin.inventory()
        pools = {p.pool: p for p in inventory.pools}
        assert sorted(pools["fabric-pcie"].nodes) == sorted(NODES)
        assert not inventory.notices
        system = fabric.get(f"/redfish/v1/Systems/{node}")
        assert "Actions" not in system  # the emulator offers no action to fall back on

        claims = [claim_uid("claim-gpu4"), claim_uid("claim-gpu5")]
        attached = await asyncio.gather(
            plugin.attach("gpu4", node, claims[0], wait_seconds=30),
            plugin.attach("gpu5", node, claims[1], wait_seconds=30),
        )
        assert [a.state for a in attached] == [AttachmentState.ATTACHED] * 2
        assert fabric.bound_hosts() == {"gpu4": node, "gpu5": node}
        assert {b["Style"] for b in fabric.get("/redfish/v1/Oem/FabricDRA/Bindings")["Bindings"]} == {
            "composition"
        }
        for device, claim in zip(("gpu4", "gpu5"), claims, strict=True):
            detached = await plugin.detach(device, node, claim, wait_seconds=30)
            assert detached.state == AttachmentState.DETACHED
        assert fabric.bound_hosts() == {}
        assert (await plugin.device("gpu4")).state == BindingState.FREE
        assert "Traceback" not in manager.log_since_start()


@pytest.mark.parametrize("composition", ["actions", "patch"])
async def test_composition_cycles_are_confirmed(tmp_path: Path, tls: Tls, composition: str) -> None:
    """Attach/detach cycles by either way of composing: every "attached" and "detached" answer
    matches the emulator's binding table, and nothing is left bound (the printed time per
    cycle compares the two ways)."""
    node, device, cycles = NODES[1], "nvme1", 20
    async with shaped_service(tmp_path, tls, node, COMPOSITION, composition=composition) as (
        fabric,
        _,
        plugin,
    ):
        wrong = 0
        started = time.monotonic()
        for cycle in range(cycles):
            claim = claim_uid(f"claim-{cycle}")
            attached = await plugin.attach(device, node, claim, wait_seconds=20)
            wrong += attached.state != AttachmentState.ATTACHED or fabric.bound_hosts() != {device: node}
            detached = await plugin.detach(device, node, claim, wait_seconds=20)
            wrong += detached.state != AttachmentState.DETACHED or fabric.bound_hosts() != {}
        elapsed = time.monotonic() - started
        print(
            f"composition by {composition}: {cycles} cycles in {elapsed:.1f}s "
            f"({elapsed / cycles * 1000:.0f} ms each)"
        )
        assert wrong == 0
        assert (await plugin.device(device)).state == BindingState.FREE


async def test_storage_blocks_through_storage_and_drives(tmp_path: Path, tls: Tls) -> None:
    """NVMe resource blocks that list only a Storage subsystem (whose Drives are the drives):
    described as NVMe drives with model, serial and their capacity as storage (not memory), and
    fabric-dra's NVMe DeviceClass selects them."""
    node = NODES[0]
    async with shaped_service(tmp_path, tls, node, COMPOSITION, storageBlocks="storage") as (
        fabric,
        manager,
        plugin,
    ):
        assert (
            "Drives" not in fabric.get("/redfish/v1/CompositionService/ResourceBlocks/nvme0")
            or not (fabric.get("/redfish/v1/CompositionService/ResourceBlocks/nvme0")["Drives"])
        )
        nvme = await plugin.device("nvme0")
        assert (nvme.type, nvme.model, nvme.serial, nvme.vendor) == (
            DeviceType.NVME,
            "PM1743 3.84TB",
            "S6EUNG0T500001",
            "Samsung Electronics",
        )
        assert (nvme.capacity_bytes, nvme.memory_bytes) == (3840755982336, None)
        assert nvme.binding_style == "composition"

        claim = tmp_path / "claim.yaml"
        claim.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceClaim",
                    "metadata": {"name": "scratch", "namespace": "team"},
                    "spec": {
                        "devices": {
                            "requests": [
                                {"name": "d", "exactly": {"deviceClassName": "fabric-nvme", "count": 2}}
                            ]
                        }
                    },
                }
            )
        )
        explained = fabric_dra(
            "explain", "--manager-url", manager.address, "--classes", str(CLASSES), str(claim), tmp=tmp_path
        )
        assert explained.returncode == 0, explained.stdout + explained.stderr
        assert "ResourceClaim team/scratch: fits on" in explained.stdout

        attached = await plugin.attach("nvme0", node, claim_uid("claim-1"), wait_seconds=20)
        assert attached.state == AttachmentState.ATTACHED
        assert fabric.bound_hosts() == {"nvme0": node}
        await plugin.detach("nvme0", node, claim_uid("claim-1"), wait_seconds=20)
        assert fabric.bound_hosts() == {}


async def test_block_composed_into_two_systems(tmp_path: Path, tls: Tls) -> None:
    """A block the service says is composed into two systems at once: the inventory and
    ``fabric-dra status`` name both holders, it is never published, and an attach is refused
    without touching the fabric."""
    holders = [NODES[0], NODES[1]]
    node = NODES[2]
    async with shaped_service(tmp_path, tls, node, COMPOSITION, sharedBlocks={"nvme0": holders}) as (
        fabric,
        manager,
        plugin,
    ):
        shared = await plugin.device("nvme0")
        assert (shared.state, shared.managed, shared.holders) == (BindingState.BOUND, False, holders)
        policy = PublishPolicy(driver="fabric-dra.io", device_taints=True, binding_conditions=False)
        withheld = to_dra_device(shared, policy)
        assert (withheld.device, withheld.withheld) == (None, WithheldReason.UNMANAGED)

        with pytest.raises(DeviceBusy):
            await plugin.attach("nvme0", node, claim_uid("claim-1"), wait_seconds=20)
        assert fabric.bound_hosts() == {}

        status = fabric_dra("status", "--manager-url", manager.address, tmp=tmp_path)
        assert status.returncode == 0, status.stderr
        row = next(line for line in status.stdout.splitlines() if " nvme0 " in line)
        assert row.startswith(f"{holders[0]}, {holders[1]} ")
        document = yaml.safe_load(
            fabric_dra("status", "--manager-url", manager.address, "-o", "yaml", tmp=tmp_path).stdout
        )
        [binding] = [b for b in document["bindings"] if b["name"] == "nvme0"]
        assert binding["holders"] == holders


async def test_blocks_only_in_a_root_collection(tmp_path: Path, tls: Tls) -> None:
    """An expansion enclosure's service: its blocks only in the root's ResourceBlocks, no
    CompositionService, no systems. The blocks are in the inventory, none is offered, and
    ``/readyz``, ``fabric-dra status`` and the log at start say what was found and why none is
    poolable, naming the setting to change."""
    async with shaped_service(tmp_path, tls, NODES[0], (), resourceBlocks="root-only") as (
        fabric,
        manager,
        plugin,
    ):
        root = fabric.get("/redfish/v1/")
        assert "CompositionService" not in root and "Systems" not in root
        inventory = await plugin.inventory()
        devices = {d.name: d for d in inventory.devices}
        assert {"gpu0", "nvme0", "nic0", "fpga0"} <= set(devices)
        assert devices["gpu0"].redfish_uri == "/redfish/v1/ResourceBlocks/gpu0"
        assert devices["gpu0"].model == "NVIDIA H100 PCIe"
        assert {d.state for d in inventory.devices} == {BindingState.UNAVAILABLE}
        assert all(not p.nodes for p in inventory.pools)

        [notice] = inventory.notices
        assert "root ResourceBlocks collection" in notice and "no host" in notice
        assert "--redfish-url" in notice and f"{len(devices)} resource block(s)" in notice

        code, body = readyz(manager)
        assert (code, body["status"], body["detail"]) == (200, "ready", [notice])

        status = fabric_dra("status", "--manager-url", manager.address, tmp=tmp_path)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith("NOTICES\n- the Redfish service lists")

        logged = [line for line in manager.log_since_start().splitlines() if "cannot offer" in line]
        assert len(logged) == 1 and "root ResourceBlocks" in logged[0]
