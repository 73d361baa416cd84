"""Section 6 — attach-to-ready with the emulator's ``realistic`` latency profile, and fabric-dra's
share of it.

The emulator's realistic profile answers binds with ``202 Accepted`` and a task that takes what a
hot-add takes (a GPU about 3 s, ± 1 s), and every read a few milliseconds. Attach-to-ready is
the kubelet's NodePrepareResources call for a one-GPU claim, from sending it to the answer (the
device bound, visible in the node's sysfs, CDI spec written, checkpoint durable). The fabric's
own part is its bind task, from the task's ``StartTime`` to its ``EndTime`` (the emulator's task
resource, found through the manager's operation record). Everything else is fabric-dra's:
claim read, REST to the manager, ledger writes, the Redfish reads before the bind, noticing the
task ended, the visibility check, CDI and checkpoint.

    share = (attach-to-ready - bind task) / attach-to-ready        target: < 1 %

Claims are prepared one after another (each on its own GPU, the nodes taking turns), as one
pod's start would see it; each claim's unprepare runs while the next one is prepared.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import httpx

from bench.common import (
    BenchContext,
    ClaimSpec,
    FabricStack,
    check,
    create_claims,
    host_name,
    phase_delta,
    progress,
    summary_ms,
)
from kube_standin.kubelet_client import ClaimRef

__all__ = ["run"]

_NODES = 4


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def _task_seconds(stack: FabricStack, claim_uids: set[str]) -> dict[str, float]:
    """claim UID → seconds its bind task ran on the fabric."""
    assert stack.manager is not None and stack.emulator is not None
    out: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=30) as http:
        operations = (await http.get(f"{stack.manager.address}/api/v1/operations")).json()
        for op in operations:
            if op["kind"] != "attach" or op["claimUid"] not in claim_uids or not op.get("redfishTask"):
                continue
            task_id = op["redfishTask"].rstrip("/").rsplit("/", 1)[-1]
            task = (await http.get(f"{stack.emulator.address}/redfish/v1/TaskService/Tasks/{task_id}")).json()
            if task.get("TaskState") == "Completed" and task.get("EndTime"):
                out[op["claimUid"]] = _seconds(task["EndTime"]) - _seconds(task["StartTime"])
    return out


async def _measure(ctx: BenchContext, stack: FabricStack, claims: int) -> dict[str, Any]:
    assert stack.api is not None
    plugins = [stack.plugin(host_name(i)) for i in range(_NODES)]
    specs = [ClaimSpec(f"real-{i}", plugins[i % _NODES].node, f"gpu{i}") for i in range(claims)]
    async with stack.api.client() as kube:
        uids = await create_claims(kube, specs)
    refs = [ClaimRef("default", s.name, u) for s, u in zip(specs, uids, strict=True)]
    clients = [await p.kubelet() for p in plugins]
    ready: dict[str, float] = {}
    phases: dict[str, dict[str, float]] = {}
    releases: list[asyncio.Task[None]] = []
    try:
        for index, ref in enumerate(refs):
            node = index % _NODES
            progress("realistic", f"claim {index + 1} of {claims} on {plugins[node].node}")
            before = plugins[node].phases()
            started = time.perf_counter()
            await clients[node].prepare([ref])
            ready[ref.uid] = time.perf_counter() - started
            phases[ref.uid] = phase_delta(before, plugins[node].phases())
            # The unbind (a task too) runs while the next claim is prepared on another node.
            releases.append(asyncio.create_task(clients[node].unprepare([ref])))
        await asyncio.gather(*releases)
    finally:
        for client in clients:
            await client.close()
    tasks = await _task_seconds(stack, set(ready))
    measured = [uid for uid in ready if uid in tasks]
    total = [ready[u] for u in measured]
    fabric = [tasks[u] for u in measured]
    ours = [ready[u] - tasks[u] for u in measured]
    shares = [(ready[u] - tasks[u]) / ready[u] for u in measured]
    keys = ("claim_read", "attach", "visible", "cdi_write", "checkpoint")
    return {
        "claims": len(ready),
        "claims_with_task_times": len(measured),
        "attach_to_ready": summary_ms(total),
        "fabric_bind_task": summary_ms(fabric),
        "fabric_dra": summary_ms(ours),
        "share_percent": {
            "aggregate": round(100 * sum(ours) / sum(total), 3) if total else None,
            "p50": round(100 * sorted(shares)[len(shares) // 2], 3) if shares else None,
            "max": round(100 * max(shares), 3) if shares else None,
        },
        "plugin_phases_p50_ms": {
            k: summary_ms([phases[u].get(k, 0.0) for u in measured]).get("p50_ms") for k in keys
        },
    }


def run(ctx: BenchContext) -> dict[str, Any]:
    root = ctx.root / "realistic"
    progress("realistic", "starting the API test server, the realistic emulator and the fabric manager")
    with FabricStack(root, hosts=_NODES, gpus=_NODES * 3, latency="realistic") as stack:
        figures = asyncio.run(_measure(ctx, stack, 2 if ctx.quick else 12))
    aggregate = figures["share_percent"]["aggregate"]
    return {
        "figures": figures,
        "checks": [
            check(
                "fabric-dra's share of attach-to-ready (realistic)",
                aggregate if aggregate is not None else 100.0,
                1.0,
                "%",
            )
        ],
    }
