"""The kubelet-protocol client against the real `fabric-dra plugin` process: registration,
prepare, unprepare and the health stream, over the plugin's own sockets."""

from __future__ import annotations

import asyncio
import shutil

from kube_standin.kubelet_client import ClaimRef
from tests.support.kubelet import running_kubelet


async def test_the_plugin_registers_prepares_and_reports_health() -> None:
    from tests.support.plugin import PluginStack, short_dir

    root = short_dir()
    try:
        with PluginStack(root, backend="noop") as stack:
            async with running_kubelet(stack.registry_dir) as kubelet:
                plugin = await kubelet.wait_for_plugin("fabric-dra.io", within=30)
                assert plugin.chosen_service == "v1.DRAPlugin"
                attempt = next(a for a in kubelet.attempts if a.registered)
                assert "v1beta1.DRAPlugin" in attempt.supported_versions
                theirs = await stack.create_claim("c1", [("gpu", "gpu-0")])
                claim = ClaimRef(theirs.namespace, theirs.name, theirs.uid)
                prepared = await plugin.prepare([claim])
                device = prepared[claim.uid].devices[0]
                assert (device.pool, device.device, device.request_names) == (
                    "fabric-pcie",
                    "gpu-0",
                    ("gpu",),
                )
                assert device.cdi_device_ids and all(claim.uid in cdi for cdi in device.cdi_device_ids)
                loop = asyncio.get_running_loop()
                deadline = loop.time() + 15
                while ("fabric-dra.io", "fabric-pcie", "gpu-0") not in kubelet.health:
                    assert loop.time() < deadline, "no health report for the prepared device"
                    await asyncio.sleep(0.05)
                await plugin.unprepare([claim])
                await plugin.unprepare([claim])  # again: unprepare is idempotent
    finally:
        shutil.rmtree(root, ignore_errors=True)
