"""A node that registers after the manager started gets its fabric host mapped from the Node watch,
not at the next full resync: the resync here is an hour away, so only the watch can explain it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from plumbing.kube.resources import NODES
from tests.support.apiserver import start_apiserver
from tests.support.emulator import run_emulator
from tests.support.fabric_manager import running_manager


def _nodes(manager_url: str) -> dict[str, Any]:
    return {n["name"]: n for n in httpx.get(f"{manager_url}/api/v1/nodes", timeout=10).json()}


def _wait_until(predicate: Any, what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


def test_nodes_joining_and_leaving_are_mapped_without_a_resync(tmp_path: Path) -> None:
    with (
        run_emulator(tmp_path, extra_args=["--insecure-no-auth"]) as emu,
        start_apiserver(tmp_path / "api") as api,
    ):
        uuid = httpx.get(f"{emu.url}/redfish/v1/Systems/kind-worker2", timeout=10).json()["UUID"]
        args = [
            *("--redfish-auth", "none", "--insecure-no-auth", "--state-dir", str(tmp_path)),
            *("--kubeconfig", str(api.kubeconfig), "--resync-seconds", "3600", "--poll-seconds", "3600"),
        ]
        with running_manager(tmp_path, emu.url, args=args) as manager:
            assert _nodes(manager.address) == {}  # no Node objects yet: no host is a node

            async def register(name: str) -> None:
                async with api.client() as kube:
                    node = await kube.create(NODES, {"metadata": {"name": name}})
                    node["status"] = {
                        "nodeInfo": {
                            "systemUUID": uuid,
                            "machineID": "",
                            "bootID": "",
                            "kernelVersion": "",
                            "osImage": "",
                            "kubeletVersion": "",
                            "containerRuntimeVersion": "",
                            "kubeProxyVersion": "",
                            "operatingSystem": "linux",
                            "architecture": "amd64",
                        }
                    }
                    await kube.replace(NODES, node, subresource="status")

            async def deregister(name: str) -> None:
                async with api.client() as kube:
                    await kube.delete(NODES, name)

            # The first round may overlap the manager's start-up passes; the second cannot.
            for name in ("gpu-node-7", "gpu-node-8"):
                asyncio.run(register(name))
                _wait_until(lambda n=name: n in _nodes(manager.address), f"{name} is mapped")
                assert _nodes(manager.address)[name]["host"] == "kind-worker2"
                asyncio.run(deregister(name))
                _wait_until(lambda: _nodes(manager.address) == {}, f"{name} is unmapped after deletion")
