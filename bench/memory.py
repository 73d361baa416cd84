"""Section 5 — resident memory (``VmRSS``): the plugin idle and after 1,000 prepare/unprepare
cycles; the fabric manager and the emulator.

The plugin measured is a fresh ``fabric-dra plugin`` (fabric backend) for its own node
(``kind-worker11``) of the shared instant-emulator stack. Idle = serving, registered with the
kubelet-protocol client, nothing prepared yet. Then 1,000 one-device claims (each its own
ResourceClaim) go through prepare and unprepare one after another, and the RSS is read again.
The manager's and emulator's RSS are read at the same two moments; when the throughput section
ran before, they have served that load too. Targets: idle plugin <= 80 MiB, growth
<= 5 MiB after 1,000 cycles.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import BenchContext, ClaimSpec, check, create_claims, host_name, progress, rss_mib
from kube_standin.kubelet_client import ClaimRef

__all__ = ["run"]

_HOST = host_name(10)


async def _measure(ctx: BenchContext, cycles: int) -> dict[str, Any]:
    stack = ctx.fabric()
    assert stack.api is not None and stack.manager is not None and stack.emulator is not None
    plugin = ctx.plugin(_HOST)
    kubelet = await plugin.kubelet()
    try:
        await asyncio.sleep(1.0)  # let start-up work (reconcile, first inventory read) settle
        idle = {
            "plugin": rss_mib(plugin.pid),
            "manager": rss_mib(stack.manager.pid),
            "emulator": rss_mib(stack.emulator.pid),
        }
        progress("memory", f"creating {cycles} claims")
        async with stack.api.client() as kube:
            specs = [ClaimSpec(f"mem-{i}", plugin.node, f"gpu{i % 8}") for i in range(cycles)]
            uids = await create_claims(kube, specs, concurrency=16)
        progress("memory", f"{cycles} prepare/unprepare cycles")
        started = time.perf_counter()
        for spec, uid in zip(specs, uids, strict=True):
            ref = ClaimRef("default", spec.name, uid)
            await kubelet.prepare([ref])
            await kubelet.unprepare([ref])
        seconds = time.perf_counter() - started
        await asyncio.sleep(1.0)
        after = {
            "plugin": rss_mib(plugin.pid),
            "manager": rss_mib(stack.manager.pid),
            "emulator": rss_mib(stack.emulator.pid),
        }
    finally:
        await kubelet.close()
    return {
        "cycles": cycles,
        "cycles_seconds": round(seconds, 1),
        "rss_idle_mib": idle,
        "rss_after_mib": after,
        "plugin_growth_mib": round(after["plugin"] - idle["plugin"], 1),
    }


def run(ctx: BenchContext) -> dict[str, Any]:
    figures = asyncio.run(_measure(ctx, 200 if ctx.quick else 1000))
    return {
        "figures": figures,
        "checks": [
            check("plugin RSS idle", figures["rss_idle_mib"]["plugin"], 80, "MiB"),
            check(
                f"plugin RSS growth after {figures['cycles']} cycles", figures["plugin_growth_mib"], 5, "MiB"
            ),
        ],
    }
