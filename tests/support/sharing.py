"""A node with partitionable GPUs and a CXL memory pool behind the manager stand-in, for the plugin's
tests of GPU partitions and memory shares (tests/integration/plugin/test_sharing.py, the crash
matrix's memory points): the plugin process, the API test server, the stand-in
(:class:`fabric_dra_testbed.standins.InventoryServer`) binding into the node's emulated host view.

    with sharing_stack() as sharing:
        ref = asyncio.run(sharing.claim_partition("c", "gpu0-1g10gb-3"))
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.plugin import cdi
from dra_driver.plugin.backend import identity_of
from dra_driver.plugin.hostdev import HostDevice, HostScanner
from fabric_dra_testbed.standins import EmulatedHosts, InventoryServer, make_device, make_inventory, make_pool
from kube_standin.kubelet_client import ClaimRef as KubeletClaim
from kube_standin.kubelet_client import DRAPluginClient, PluginManager
from manager_api.models import Device
from manager_api.partitions import BUILTIN_TABLES
from tests.support.cdischema import assert_valid_cdi_spec
from tests.support.plugin import DRIVER, ClaimRef, PluginStack, short_dir

__all__ = [
    "GIB",
    "H100",
    "NODE",
    "Sharing",
    "blocks_of_node",
    "env_of",
    "kubelet_claim",
    "plugin_of",
    "sharing_stack",
]

NODE = "node-a"
GIB = 1 << 30
H100 = BUILTIN_TABLES["h100-80gb"]


@dataclass
class Sharing:
    hosts: EmulatedHosts
    manager: InventoryServer
    stack: PluginStack

    @property
    def sysfs(self) -> Path:
        return self.hosts.sysfs(NODE)

    def device(self, name: str) -> Device:
        return next(d for d in self.manager.inventory.devices if d.name == name)

    def gpu(self, name: str) -> HostDevice | None:
        return HostScanner(self.sysfs, real_host=False).find(identity_of(self.device(name)))

    def partitions(self, gpu: str) -> dict[str, dict[str, str]]:
        """Directory name → files of every partition on the GPU (none while it is not here)."""
        host = self.gpu(gpu)
        mig = Path(host.sysfs_path) / "mig" if host is not None else None
        if mig is None or not mig.is_dir():
            return {}
        return {
            d.name: {f.name: f.read_text().strip() for f in d.iterdir()}
            for d in sorted(mig.iterdir())
            if not d.name.startswith(".")
        }

    def spec(self, ref: ClaimRef) -> dict[str, Any]:
        (path,) = cdi.spec_files_of_claim(self.stack.cdi_root, DRIVER, ref.uid)
        cdi.validate_spec(cdi.CdiSpec.model_validate_json(path.read_text()))
        return assert_valid_cdi_spec(path)

    async def claim_partition(self, name: str, partition: str) -> ClaimRef:
        return await self.stack.create_claim(name, [("gpu", partition)], pool="fabric-pcie")

    async def claim_share(self, name: str, share: str, memory: str, mode: str | None = None) -> ClaimRef:
        result = {
            "request": "memory",
            "driver": DRIVER,
            "pool": "fabric-cxl",
            "device": "cxlpool0",
            "shareID": share,
            "consumedCapacity": {f"{DRIVER}/memory": memory},
        }
        config = []
        if mode is not None:
            parameters = {"apiVersion": "fabric-dra.io/v1alpha1", "kind": "MemoryConfig", "mode": mode}
            config.append({"source": "FromClaim", "opaque": {"driver": DRIVER, "parameters": parameters}})
        return await self.stack.create_claim(name, [], results=[result], config=config)

    def entry(self, ref: ClaimRef) -> dict[str, Any] | None:
        """The claim's entry in the plugin's checkpoint file."""
        path = self.stack.plugin_dir / "checkpoint.json"
        claims: dict[str, Any] = json.loads(path.read_text())["data"]["claims"] if path.exists() else {}
        return claims.get(ref.uid)

    def shares(self) -> list[str]:
        pool = self.device("cxlpool0").memory_pool
        assert pool is not None
        return [s.share_id for s in pool.shares]


@contextlib.contextmanager
def sharing_stack(*, gpus: int = 3) -> Iterator[Sharing]:
    """The stand-in, the node's host view, the API test server and the plugin (started)."""
    root = short_dir("fds-")
    hosts = EmulatedHosts(root / "emu", [NODE])
    devices = [
        *(make_device(f"gpu{i}", partition_table=H100) for i in range(gpus)),
        make_pool("cxlpool0", 64 * GIB, serial="0xc0ffee000001"),
    ]
    inventory = make_inventory(devices, pools={"fabric-pcie": [NODE], "fabric-cxl": [NODE]})
    manager = InventoryServer(inventory, hosts=hosts).start()
    try:
        (root / "k").mkdir()
        stack = PluginStack(
            root / "k", node=NODE, backend="fabric", manager_url=manager.url, sysfs_root=hosts.sysfs(NODE)
        )
        with stack:
            yield Sharing(hosts, manager, stack)
    finally:
        manager.stop()
        shutil.rmtree(root, ignore_errors=True)


def kubelet_claim(ref: ClaimRef) -> KubeletClaim:
    return KubeletClaim(ref.namespace, ref.name, ref.uid)


async def plugin_of(kubelet: PluginManager) -> DRAPluginClient:
    return await kubelet.wait_for_plugin(DRIVER)


def env_of(spec: dict[str, Any], index: int = 0) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["devices"][index]["containerEdits"]["env"])


def blocks_of_node(sharing: Sharing, node: int) -> dict[str, str]:
    """memory<B> → its state, of every block of NUMA node ``node``."""
    base = sharing.sysfs / "devices" / "system" / "node" / f"node{node}"
    return {
        link.name: (link / "state").read_text().strip()
        for link in sorted(base.iterdir())
        if link.name.startswith("memory")
    }
