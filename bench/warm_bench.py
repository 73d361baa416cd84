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
* **auto, steady** — ``--warm-mode auto``: claims arrive as a Poisson process over the nodes, each
  held a few seconds; a claim is allocated the GPU warm on its node when there is one, else a free
  one. Reported: attach-to-ready, the hit rate, and warm device-seconds per bound device-second
  (from the manager's ``fabric_dra_device_seconds_total``).

Attach-to-ready is the kubelet's prepare call, from sending it to the answer, as in section 6.
Claims are prepared one after another, the nodes taking turns; each unprepare runs while the next
claim is prepared.
"""

from __future__ import annotations

import asyncio
import random
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
_AUTO = [
    *("--warm-mode", "auto"),
    *("--warm-device-type", "gpu"),
    *("--warm-interval-seconds", "0.2"),
    *("--warm-rate-half-life-seconds", "30"),
    *("--warm-idle-ttl-seconds", "60"),
]
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


async def _pick(stack: FabricStack, kind: str, node: str, taken: set[str], *, wait: float = 30.0) -> str:
    """The GPU a claim on ``node`` is allocated: free (cold), warm there (hit) or warm on another
    node (miss); waits up to ``wait`` seconds for the pool to offer one."""
    deadline = time.monotonic() + wait
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
            raise RuntimeError(f"no {kind} GPU for {node} within {wait:g} s")
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


async def _metric(stack: FabricStack, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``, from the manager."""
    assert stack.manager is not None
    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(f"{stack.manager.address}/metrics")).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _steady(stack: FabricStack, claims: int, rate: float, hold: float) -> dict[str, Any]:
    """Poisson arrivals (``rate`` claims/s over all nodes, a random node each), each claim held
    ``hold`` seconds. A claim is allocated the GPU warm on its node when there is one (the
    publication docs/manager.md describes makes the allocator meet it first), else a free GPU."""
    api = stack.api
    assert api is not None
    plugins = [stack.plugin(host_name(i)) for i in range(_NODES)]
    clients = [await p.kubelet() for p in plugins]
    rng = random.Random(20)
    taken: set[str] = set()
    gate = asyncio.Lock()
    seconds: list[float] = []
    hits = 0

    async def one(index: int, node: int) -> None:
        nonlocal hits
        async with gate:  # two claims never pick the same device
            try:
                device = await _pick(stack, "hit", plugins[node].node, taken, wait=0.0)
                hits += 1
            except RuntimeError:
                device = await _pick(stack, "cold", plugins[node].node, taken)
            taken.add(device)
        spec = ClaimSpec(f"warm-steady-{index}", plugins[node].node, device)
        async with api.client() as kube:
            (uid,) = await create_claims(kube, [spec])
        ref = ClaimRef("default", spec.name, uid)
        started = time.perf_counter()
        await clients[node].prepare([ref])
        seconds.append(time.perf_counter() - started)
        await asyncio.sleep(hold)
        await clients[node].unprepare([ref])
        taken.discard(device)

    warm_before = await _metric(stack, "fabric_dra_device_seconds_total", state="warm")
    bound_before = await _metric(stack, "fabric_dra_device_seconds_total", state="bound")
    tasks: list[asyncio.Task[None]] = []
    try:
        for index in range(claims):
            await asyncio.sleep(rng.expovariate(rate))
            progress("warm", f"auto, steady: claim {index + 1} of {claims}")
            tasks.append(asyncio.create_task(one(index, rng.randrange(_NODES))))
        await asyncio.gather(*tasks)
    finally:
        for client in clients:
            await client.close()
    warm = await _metric(stack, "fabric_dra_device_seconds_total", state="warm") - warm_before
    bound = await _metric(stack, "fabric_dra_device_seconds_total", state="bound") - bound_before
    return {
        "claims": claims,
        "rate_per_second": rate,
        "hold_seconds": hold,
        "attach_to_ready": summary_ms(seconds),
        "hit_rate_percent": round(100 * hits / claims, 1),
        "warm_device_seconds": round(warm, 1),
        "bound_device_seconds": round(bound, 1),
        "warm_per_bound_percent": round(100 * warm / bound, 1) if bound else None,
    }


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
    progress("warm", "auto: the same with --warm-mode auto, steady Poisson arrivals")
    with FabricStack(
        ctx.root / "warm-auto", hosts=_NODES, gpus=_NODES * 6, latency="realistic", manager_args=_AUTO
    ) as stack:
        steady = asyncio.run(_steady(stack, 8 if ctx.quick else 40, rate=0.5, hold=4.0))
    hit = summary_ms(warm["hit"])
    figures: dict[str, Any] = {
        "claims_each": claims,
        "cold_attach_to_ready": summary_ms(cold),
        "warm_hit_attach_to_ready": hit,
        "warm_miss_attach_to_ready": summary_ms(warm["miss"]),
        "auto_steady": steady,
    }
    return {
        "figures": figures,
        "checks": [
            check("warm hit attach-to-ready p50 (realistic)", hit["p50_ms"], 100.0, "ms"),
            check("warm hit attach-to-ready p99 (realistic)", hit["p99_ms"], 250.0, "ms"),
            check("auto, steady: hit rate", steady["hit_rate_percent"], 95.0, "%", at_most=False),
            check("auto, steady: attach-to-ready p50", steady["attach_to_ready"]["p50_ms"], 100.0, "ms"),
        ],
    }
