"""Section 1 — prepare and unprepare latency of one-device claims against the ``instant`` emulator,
broken down into the plugin's phases; and 50 concurrent claims on one node.

Real processes: API test server, emulator (instant), fabric manager, ``fabric-dra plugin`` for node
``kind-worker``; the kubelet-protocol client registers the plugin and calls it over its unix
socket. Around every call the plugin's phase histograms are read (outside the timed window), so
each call has its own breakdown: claim read, checkpoint, attach request (REST call to the manager,
which binds over Redfish), visibility wait (until the node's emulated sysfs shows the device), CDI
write; for unprepare: detach request, CDI removal, checkpoint.

Plugin overhead = prepare latency seen by the kubelet - attach request - visibility wait (the
fabric's part); targets: p50 <= 10 ms, p99 <= 50 ms.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import BenchContext, ClaimSpec, check, create_claims, phase_delta, progress, summary_ms
from kube_standin.kubelet_client import ClaimRef

__all__ = ["run"]

_PREPARE_PHASES = ("claim_read", "checkpoint", "attach", "visible", "cdi_write")
_UNPREPARE_PHASES = ("detach", "cdi_remove", "checkpoint", "host_removal")


async def _measure(ctx: BenchContext, iterations: int) -> dict[str, Any]:
    stack = ctx.fabric()
    plugin = ctx.plugin("kind-worker")
    assert stack.api is not None
    async with stack.api.client() as kube:
        warm = await create_claims(kube, [ClaimSpec(f"lat-warm-{i}", plugin.node, "gpu0") for i in range(5)])
        specs = [ClaimSpec(f"lat-{i}", plugin.node, "gpu0") for i in range(iterations)]
        uids = await create_claims(kube, specs)
        many_specs = [ClaimSpec(f"lat-many-{i}", plugin.node, f"gpu{i}") for i in range(50)]
        many = await create_claims(kube, many_specs)
    refs = [ClaimRef("default", s.name, uid) for s, uid in zip(specs, uids, strict=True)]
    warm_refs = [ClaimRef("default", f"lat-warm-{i}", uid) for i, uid in enumerate(warm)]
    many_refs = [ClaimRef("default", s.name, uid) for s, uid in zip(many_specs, many, strict=True)]

    kubelet = await plugin.kubelet()
    try:
        for ref in warm_refs:
            await kubelet.prepare([ref])
            await kubelet.unprepare([ref])
        progress("latency", f"{iterations} prepare/unprepare pairs, one at a time")
        prepare: list[float] = []
        unprepare: list[float] = []
        overhead: list[float] = []
        phases: dict[str, list[float]] = {f"prepare.{p}": [] for p in _PREPARE_PHASES}
        phases.update({f"unprepare.{p}": [] for p in _UNPREPARE_PHASES})
        for ref in refs:
            before = plugin.phases()
            started = time.perf_counter()
            await kubelet.prepare([ref])
            prepared = time.perf_counter()
            middle = plugin.phases()
            await kubelet.unprepare([ref])
            ended = time.perf_counter()
            after = plugin.phases()
            spent = phase_delta(before, middle)
            undone = phase_delta(middle, after)
            prepare.append(prepared - started)
            unprepare.append(ended - prepared)
            overhead.append(prepared - started - spent.get("attach", 0.0) - spent.get("visible", 0.0))
            for p in _PREPARE_PHASES:
                phases[f"prepare.{p}"].append(spent.get(p, 0.0))
            for p in _UNPREPARE_PHASES:
                phases[f"unprepare.{p}"].append(undone.get(p, 0.0))

        progress("latency", "50 concurrent one-device claims on one node")
        started = time.perf_counter()
        answers = await asyncio.gather(*(kubelet.node_prepare_resources([r]) for r in many_refs))
        wall = time.perf_counter() - started
        errors = [a[r.uid].error for a, r in zip(answers, many_refs, strict=True) if a[r.uid].error]
        unprepared = await asyncio.gather(*(kubelet.node_unprepare_resources([r]) for r in many_refs))
        errors += [u[r.uid] for u, r in zip(unprepared, many_refs, strict=True) if u[r.uid]]
    finally:
        await kubelet.close()
    return {
        "prepare": summary_ms(prepare),
        "unprepare": summary_ms(unprepare),
        "plugin_overhead": summary_ms(overhead),
        "phases_p50_ms": {k: summary_ms(v)["p50_ms"] for k, v in phases.items() if any(v)},
        "phases_p99_ms": {k: summary_ms(v)["p99_ms"] for k, v in phases.items() if any(v)},
        "concurrent_50": {
            "claims": len(many_refs),
            "succeeded": len(many_refs) - len(errors),
            "prepare_wall_ms": round(wall * 1000, 1),
            "errors": errors[:3],
        },
    }


def run(ctx: BenchContext) -> dict[str, Any]:
    figures = asyncio.run(_measure(ctx, 30 if ctx.quick else 300))
    overhead = figures["plugin_overhead"]
    return {
        "figures": figures,
        "checks": [
            check("plugin overhead p50 (prepare - attach - visible)", overhead["p50_ms"], 10, "ms"),
            check("plugin overhead p99", overhead["p99_ms"], 50, "ms"),
            check(
                "50 concurrent one-device claims on one node succeed",
                figures["concurrent_50"]["succeeded"],
                50,
                "claims",
                at_most=False,
            ),
        ],
    }
