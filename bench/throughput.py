"""Section 2 — throughput: claims per second at concurrency 1, 8, 32 and 64, on one node and
across 10 emulated nodes (instant emulator, generated topology of 11 hosts and 72 GPUs).

A *claim* here is its whole life on the node: NodePrepareResources (claim read, attach through
the manager, wait until the node's sysfs shows it, CDI spec, checkpoint) and then
NodeUnprepareResources (detach, CDI removal, checkpoint). ``C`` workers run at once, each on its
own GPU and its own pre-created claims, for a fixed time; claims/s = completed lives / seconds.
On 10 nodes worker ``w`` runs on node ``w mod 10``, each node's plugin called through its own
kubelet connection. Target: >= 100 claims/s across 10 nodes at concurrency 32.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench.common import (
    BenchContext,
    ClaimSpec,
    check,
    cpu_seconds,
    create_claims,
    histogram_sums,
    host_name,
    progress,
    summary_ms,
)
from kube_standin.kubelet_client import ClaimRef, DRAPluginClient

__all__ = ["run"]

LEVELS = (1, 8, 32, 64)
_CLAIMS_PER_WORKER = 4


async def _layout(
    ctx: BenchContext, name: str, nodes: int
) -> tuple[list[DRAPluginClient], list[tuple[int, list[ClaimRef]]]]:
    """Plugins of ``nodes`` nodes with their kubelet clients, and for each of 64 workers its node
    index and claims."""
    stack = ctx.fabric()
    assert stack.api is not None
    plugins = [ctx.plugin(host_name(i)) for i in range(nodes)]
    specs: list[ClaimSpec] = []
    for w in range(max(LEVELS)):
        node = plugins[w % nodes].node
        prefix = f"tp-{name.replace('_', '-')}-{w}"
        specs += [ClaimSpec(f"{prefix}-{i}", node, f"gpu{w}") for i in range(_CLAIMS_PER_WORKER)]
    async with stack.api.client() as kube:
        uids = await create_claims(kube, specs, concurrency=16)
    refs = [ClaimRef("default", s.name, uid) for s, uid in zip(specs, uids, strict=True)]
    workers = [
        (w % nodes, refs[w * _CLAIMS_PER_WORKER : (w + 1) * _CLAIMS_PER_WORKER]) for w in range(max(LEVELS))
    ]
    clients = [await p.kubelet() for p in plugins]
    return clients, workers


async def _level(
    clients: list[DRAPluginClient], workers: list[tuple[int, list[ClaimRef]]], level: int, seconds: float
) -> dict[str, Any]:
    lives: list[float] = []
    errors: list[str] = []
    deadline = time.perf_counter() + seconds

    async def worker(node: int, refs: list[ClaimRef]) -> None:
        kubelet = clients[node]
        turn = 0
        while time.perf_counter() < deadline and len(errors) < 20:
            ref = refs[turn % len(refs)]
            turn += 1
            started = time.perf_counter()
            prepared = await kubelet.node_prepare_resources([ref])
            if prepared[ref.uid].error:
                errors.append(prepared[ref.uid].error)
            unprepared = await kubelet.node_unprepare_resources([ref])
            if unprepared[ref.uid]:
                errors.append(unprepared[ref.uid])
                await asyncio.sleep(0.5)  # the kubelet would retry later
                continue
            if not prepared[ref.uid].error:
                lives.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(worker(node, refs) for node, refs in workers[:level]))
    elapsed = time.perf_counter() - started
    return {
        "concurrency": level,
        "claims": len(lives),
        "seconds": round(elapsed, 2),
        "claims_per_s": round(len(lives) / elapsed, 1),
        "claim_life": summary_ms(lives),
        "errors": len(errors),
        "first_errors": errors[:3],
    }


async def _measure(ctx: BenchContext) -> dict[str, Any]:
    seconds = 1.5 if ctx.quick else 5.0
    stack = ctx.fabric()
    out: dict[str, Any] = {}
    for name, nodes in (("one_node", 1), ("ten_nodes", 10)):
        clients, workers = await _layout(ctx, name, nodes)
        pids = {
            "plugins": [stack.plugins[host_name(i)].pid for i in range(nodes)],
            "manager": [stack.manager.pid] if stack.manager else [],
            "emulator": [stack.emulator.pid] if stack.emulator else [],
            "api_server": [stack.api.process.pid] if stack.api else [],
        }
        rows = []
        try:
            for level in LEVELS:
                progress("throughput", f"{name}: concurrency {level} for {seconds:g} s")
                cpu_before = {k: sum(cpu_seconds(p) for p in v) for k, v in pids.items()}
                redfish_before = _redfish_requests(stack)
                row = await _level(clients, workers, level, seconds)
                claims = max(1, row["claims"])
                redfish = _per_claim(redfish_before, _redfish_requests(stack), claims)
                row["redfish_requests_per_claim"] = redfish
                row["cpu_ms_per_claim"] = {
                    k: round((sum(cpu_seconds(p) for p in v) - cpu_before[k]) / claims * 1000, 2)
                    for k, v in pids.items()
                }
                rows.append(row)
        finally:
            for client in clients:
                await client.close()
        out[name] = rows
    return out


def _redfish_requests(stack: Any) -> dict[str, float]:
    """The manager's Redfish requests so far, by method and resource kind (its
    ``fabric_dra_redfish_request_duration_seconds`` histogram); empty without a manager."""
    if stack.manager_handle is None:
        return {}
    sums = histogram_sums(
        stack.manager_handle.url, "fabric_dra_redfish_request_duration_seconds", ("method", "resource")
    )
    return {key: count for key, (count, _) in sums.items()}


def _per_claim(before: dict[str, float], after: dict[str, float], claims: int) -> dict[str, float]:
    """Requests per claim between two reads of :func:`_redfish_requests`, and their total."""
    out = {k: round((v - before.get(k, 0.0)) / claims, 2) for k, v in sorted(after.items())}
    out = {k: v for k, v in out.items() if v}
    out["total"] = round(sum(out.values()), 2)
    return out


def run(ctx: BenchContext) -> dict[str, Any]:
    figures = asyncio.run(_measure(ctx))
    ten = {row["concurrency"]: row for row in figures["ten_nodes"]}
    checks = [
        check("claims/s across 10 nodes, concurrency 32", ten[32]["claims_per_s"], 100, "/s", at_most=False)
    ]
    errors = sum(r["errors"] for rows in figures.values() for r in rows)
    checks.append(check("failed prepare/unprepare calls", errors, 0, "calls"))
    return {"figures": figures, "checks": checks}
