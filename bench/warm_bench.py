"""Warm devices — pod start (NodePrepareResources) with and without a warm pool, realistic emulator.

The same stack as section 6 (API test server, the emulator's ``realistic`` profile: a GPU hot-add
takes 3 ± 1 s, an unbind 1.5 ± 0.5 s; the fabric manager; one plugin per node), run three ways:

* **cold** — no warm pool: each claim is allocated a free GPU, and its prepare waits for the
  hot-add.
* **warm hit** — ``--warm-mode fixed --warm-size 1``: each claim is allocated the GPU warm on its
  own node (what the allocator picks when warm devices are published node-local first; see
  docs/manager.md, "What the scheduler guarantees"); its prepare is one ledger write, the
  visibility check, CDI and checkpoint. The next claim on that node waits until the pool refilled,
  so every claim here is a hit.
* **warm miss** — the same pool, each claim allocated the GPU warm on *another* node: the manager
  detaches it there and attaches it here (an unbind, then a hot-add).

Attach-to-ready is the kubelet's prepare call, from sending it to the answer, as in section 6.
Claims are prepared one after another, the nodes taking turns; each unprepare runs while the next
claim is prepared.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from bench.common import (
    BenchContext,
    ClaimSpec,
    FabricStack,
    PluginProcess,
    check,
    create_claims,
    host_name,
    progress,
    summary_ms,
)
from kube_standin.kubelet_client import ClaimRef, DRAPluginClient

__all__ = ["run"]

_NODES = 4
_WARM = [
    *("--warm-mode", "fixed"),
    *("--warm-size", "1"),
    *("--warm-device-type", "gpu"),
    *("--warm-interval-seconds", "0.2"),
]


async def _devices(stack: FabricStack) -> list[dict[str, Any]]:
    assert stack.manager is not None
    async with httpx.AsyncClient(timeout=30) as http:
        found: list[dict[str, Any]] = (await http.get(f"{stack.manager.address}/api/v1/devices")).json()
        return found


async def _pick(stack: FabricStack, kind: str, node: str, taken: set[str]) -> str:
    """The GPU a claim on ``node`` is allocated: free (cold), warm there (hit) or warm on another
    node (miss); waits up to 30 s for the pool to offer one."""
    deadline = time.monotonic() + 30.0
    while True:
        for device in sorted(await _devices(stack), key=lambda d: str(d["name"])):
            name, state, on = str(device["name"]), device["state"], device.get("node")
            if not name.startswith("gpu") or name in taken:
                continue
            if (
                (kind == "cold" and state == "free")
                or (kind == "hit" and state == "warm" and on == node)
                or (kind == "miss" and state == "warm" and on != node)
            ):
                return name
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {kind} GPU for {node} within 30 s")
        await asyncio.sleep(0.1)


async def _prepare_series(
    stack: FabricStack, plugins: list[PluginProcess], kind: str, claims: int
) -> list[float]:
    """Attach-to-ready of ``claims`` claims, each allocated a GPU of ``kind`` (cold, hit, miss)."""
    assert stack.api is not None
    clients: list[DRAPluginClient] = [await p.kubelet() for p in plugins]
    seconds: list[float] = []
    releases: list[asyncio.Task[None]] = []
    try:
        for index in range(claims):
            node = index % _NODES
            progress("warm", f"{kind}: claim {index + 1} of {claims} on {plugins[node].node}")
            device = await _pick(stack, kind, plugins[node].node, set())
            spec = ClaimSpec(f"warm-{kind}-{index}", plugins[node].node, device)
            async with stack.api.client() as kube:
                (uid,) = await create_claims(kube, [spec])
            ref = ClaimRef("default", spec.name, uid)
            started = time.perf_counter()
            await clients[node].prepare([ref])
            seconds.append(time.perf_counter() - started)
            releases.append(asyncio.create_task(clients[node].unprepare([ref])))
        await asyncio.gather(*releases)
    finally:
        for client in clients:
            await client.close()
    return seconds


async def _measure(stack: FabricStack, kinds: tuple[str, ...], claims: int) -> dict[str, list[float]]:
    plugins = [stack.plugin(host_name(i)) for i in range(_NODES)]
    return {kind: await _prepare_series(stack, plugins, kind, claims) for kind in kinds}


def run(ctx: BenchContext) -> dict[str, Any]:
    claims = 2 if ctx.quick else 12
    progress("warm", "cold: API test server, realistic emulator, manager without a warm pool")
    with FabricStack(ctx.root / "warm-off", hosts=_NODES, gpus=_NODES * 3, latency="realistic") as stack:
        cold = asyncio.run(_measure(stack, ("cold",), claims))["cold"]
    progress("warm", "warm: the same with --warm-mode fixed --warm-size 1")
    with FabricStack(
        ctx.root / "warm-fixed", hosts=_NODES, gpus=_NODES * 3, latency="realistic", manager_args=_WARM
    ) as stack:
        warm = asyncio.run(_measure(stack, ("hit", "miss"), claims))
    hit = summary_ms(warm["hit"])
    figures: dict[str, Any] = {
        "claims_each": claims,
        "cold_attach_to_ready": summary_ms(cold),
        "warm_hit_attach_to_ready": hit,
        "warm_miss_attach_to_ready": summary_ms(warm["miss"]),
    }
    return {
        "figures": figures,
        "checks": [
            check("warm hit attach-to-ready p50 (realistic)", hit["p50_ms"], 100.0, "ms"),
            check("warm hit attach-to-ready p99 (realistic)", hit["p99_ms"], 250.0, "ms"),
        ],
    }
