"""Plugin benchmark: the plugin's own overhead, 50 concurrent claims on one node, idle RSS.

Real processes throughout: the API test server and ``fabric-dra plugin``, called over the DRA
unix socket the way the kubelet calls it. Two backends:

- ``noop``: no fabric at all — a prepare+unprepare pair is pure plugin work (claim GET, checkpoint
  commits, CDI write/remove, gRPC); target p50 <= 3 ms at concurrency 1.
- ``fabric``: the ``instant`` emulator + fabric manager, when those roles are in this build; the
  overhead is prepare latency minus the plugin's own ``attach`` + ``visible`` phase time (read
  from its Prometheus histograms); targets p50 <= 10 ms, p99 <= 50 ms.

``python -m bench.plugin_bench [--quick]`` prints the figures as JSON; :func:`run` returns them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import time
import urllib.request
from typing import Any

from tests.support.plugin import (
    ClaimRef,
    PluginStack,
    fabric_roles_present,
    free_port,
    rss_kib,
    short_dir,
    start_fabric,
)

__all__ = ["run"]


def _percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(pct / 100 * (len(ordered) - 1))))
    return ordered[index]


def _ms(values: list[float]) -> dict[str, float]:
    return {
        "p50_ms": round(_percentile(values, 50) * 1000, 3),
        "p99_ms": round(_percentile(values, 99) * 1000, 3),
        "mean_ms": round(statistics.fmean(values) * 1000, 3),
        "n": len(values),
    }


def _phase_sums(port: int) -> dict[str, tuple[float, float]]:
    """``{phase: (count, seconds)}`` scraped from the plugin's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line.startswith("fabric_dra_plugin_phase_seconds_"):
            continue
        name, _, value = line.rpartition(" ")
        phase = name.split('phase="', 1)[1].split('"', 1)[0]
        entry = out.setdefault(phase, [0.0, 0.0])
        if name.startswith("fabric_dra_plugin_phase_seconds_count"):
            entry[0] = float(value)
        elif name.startswith("fabric_dra_plugin_phase_seconds_sum"):
            entry[1] = float(value)
    return {k: (v[0], v[1]) for k, v in out.items()}


async def _pairs(stack: PluginStack, refs: list[ClaimRef]) -> tuple[list[float], list[float], list[float]]:
    prepare, unprepare, pair = [], [], []
    async with stack.caller() as kubelet:
        for ref in refs:
            t0 = time.perf_counter()
            response = await kubelet.prepare([ref])
            t1 = time.perf_counter()
            if response.claims[ref.uid].error:
                raise RuntimeError(f"prepare failed: {response.claims[ref.uid].error}")
            response_u = await kubelet.unprepare([ref])
            t2 = time.perf_counter()
            if response_u.claims[ref.uid].error:
                raise RuntimeError(f"unprepare failed: {response_u.claims[ref.uid].error}")
            prepare.append(t1 - t0)
            unprepare.append(t2 - t1)
            pair.append(t2 - t0)
    return prepare, unprepare, pair


async def _concurrent(stack: PluginStack, refs: list[ClaimRef]) -> dict[str, Any]:
    async with stack.caller() as kubelet:
        t0 = time.perf_counter()
        responses = await asyncio.gather(*(kubelet.prepare([r]) for r in refs))
        elapsed = time.perf_counter() - t0
        unprepared = await asyncio.gather(*(kubelet.unprepare([r]) for r in refs))
    failed = [
        r.claims[ref.uid].error for r, ref in zip(responses, refs, strict=True) if r.claims[ref.uid].error
    ]
    failed += [
        u.claims[ref.uid].error for u, ref in zip(unprepared, refs, strict=True) if u.claims[ref.uid].error
    ]
    return {
        "claims": len(refs),
        "succeeded": len(refs) - len(failed),
        "wall_ms": round(elapsed * 1000, 1),
        "errors": failed[:3],
    }


def _noop(quick: bool) -> dict[str, Any]:
    iterations = 100 if quick else 1000
    port = free_port()
    with PluginStack(backend="noop", metrics_port=port) as stack:
        assert stack.plugin is not None
        time.sleep(1.0)
        idle_rss = rss_kib(stack.plugin.pid)

        async def scenario() -> dict[str, Any]:
            kube = stack.kube()
            try:
                warm = [
                    await stack.create_claim(f"warm-{i}", [("gpu", f"dev-{i}")], kube=kube) for i in range(20)
                ]
                refs = [
                    await stack.create_claim(f"c-{i}", [("gpu", f"dev-{i}")], kube=kube)
                    for i in range(iterations)
                ]
                many = [
                    await stack.create_claim(f"m-{i}", [("gpu", f"many-{i}")], kube=kube) for i in range(50)
                ]
            finally:
                await kube.aclose()
            await _pairs(stack, warm)
            before = _phase_sums(port)
            prepare, unprepare, pair = await _pairs(stack, refs)
            after = _phase_sums(port)
            phases = {
                k: round(
                    (after[k][1] - before.get(k, (0.0, 0.0))[1])
                    / max(1.0, after[k][0] - before.get(k, (0.0, 0.0))[0])
                    * 1000,
                    3,
                )
                for k in after
            }
            concurrent = await _concurrent(stack, many)
            return {
                "prepare": _ms(prepare),
                "unprepare": _ms(unprepare),
                "prepare_unprepare_pair": _ms(pair),
                "mean_phase_ms": phases,
                "concurrent_50": concurrent,
            }

        result = asyncio.run(scenario())
        result["idle_rss_mib"] = round(idle_rss / 1024, 1)
        result["rss_after_mib"] = round(rss_kib(stack.plugin.pid) / 1024, 1)
    return result


def _fabric_time(port: int) -> float:
    phases = _phase_sums(port)
    return sum(phases.get(p, (0.0, 0.0))[1] for p in ("attach", "visible"))


def _fabric(quick: bool) -> dict[str, Any]:
    """Against the instant emulator: overhead = prepare latency - the plugin's attach+visible time."""
    from fabric.api import BindingState, DeviceType
    from fabric.manager_client import ManagerClient

    iterations = 30 if quick else 300
    root = short_dir("fdb-")
    processes = start_fabric(root)
    try:

        async def discover() -> tuple[Any, list[Any]]:
            async with ManagerClient(processes.manager.address) as client:
                nodes = [n for n in await client.nodes() if n.pools]
                devices = await client.devices()
            node = nodes[0]
            free = [
                d
                for d in devices
                if d.state is BindingState.FREE
                and d.pool in node.pools
                and d.managed
                and d.type is not DeviceType.OTHER
            ]
            return node, free

        node, free = asyncio.run(discover())
        port = free_port()
        (root / "k").mkdir()
        with PluginStack(
            root / "k",
            node=node.name,
            backend="fabric",
            manager_url=processes.manager.address,
            sysfs_root=processes.sysfs_root(node.host),
            metrics_port=port,
        ) as stack:
            assert stack.plugin is not None
            idle_rss = rss_kib(stack.plugin.pid)
            device = free[0]

            async def scenario() -> dict[str, Any]:
                kube = stack.kube()
                try:
                    refs = [
                        await stack.create_claim(
                            f"f-{i}", [("dev", device.name)], pool=device.pool, kube=kube
                        )
                        for i in range(iterations)
                    ]
                    many = [
                        await stack.create_claim(f"fm-{i}", [("dev", d.name)], pool=d.pool, kube=kube)
                        for i, d in enumerate(free[:50])
                    ]
                finally:
                    await kube.aclose()
                latency, overhead = [], []
                async with stack.caller() as kubelet:
                    for ref in refs:
                        before = _fabric_time(port)
                        t0 = time.perf_counter()
                        response = await kubelet.prepare([ref])
                        elapsed = time.perf_counter() - t0
                        if response.claims[ref.uid].error:
                            raise RuntimeError(response.claims[ref.uid].error)
                        latency.append(elapsed)
                        overhead.append(elapsed - (_fabric_time(port) - before))
                        await kubelet.unprepare([ref])
                phases = _phase_sums(port)
                return {
                    "prepare": _ms(latency),
                    "plugin_overhead": _ms(overhead),
                    "mean_phase_ms": {k: round(v[1] / max(1.0, v[0]) * 1000, 3) for k, v in phases.items()},
                    "concurrent": await _concurrent(stack, many),
                    "idle_rss_mib": round(idle_rss / 1024, 1),
                }

            return asyncio.run(scenario())
    finally:
        processes.stop()
        shutil.rmtree(root, ignore_errors=True)


def run(quick: bool) -> dict[str, Any]:
    """Figures for the top-level bench command."""
    figures: dict[str, Any] = {"noop": _noop(quick)}
    if fabric_roles_present():
        figures["fabric_instant"] = _fabric(quick)
    else:
        figures["fabric_instant"] = "skipped: the emulator and manager roles are not in this build"
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer iterations (CI)")
    args = parser.parse_args()
    print(json.dumps(run(args.quick), indent=2))


if __name__ == "__main__":
    main()
