"""The manager's own cost of a discovery pass at fleet scale, measured in-process.

The ``instant`` emulator (its own process) serves a generated fabric (``--hosts``, ``--gpus``,
``--nvme``; ``--bindings`` of its devices bound to the hosts first, round robin); this process runs
:class:`fabric.backends.discovery.Discovery` over it as the manager does at start: a first full pass,
then ``--passes`` more (each revalidated with ``If-None-Match``). For each pass: this process's CPU
(``time.process_time``: the manager's part, not the emulator's, whose rendering is most of the wall
time), the wall time, the Redfish requests and 304s. With ``--tracemalloc``: peak and held Python
memory of each pass (tracemalloc slows the CPU figures, so measure CPU in a run without it), and the
largest holders after the last pass by file:line. With ``--inventory`` each pass's snapshot is loaded
into the manager's :class:`fabric.state.inventory.Inventory` and rendered as the manager serves it
(its CPU counted in the pass's, its memory in what is held). RSS of this process at the end (it also
holds what the bench imports).

``python -m bench.discovery_pass_bench --hosts 100 --gpus 10000 --nvme 100`` prints JSON (minutes:
the emulator renders every expanded answer).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench.common import generate_topology, host_name, rss_mib, work_dir
from bench.restart_bench import _bind_direct
from fabric.backends.discovery import Discovery
from fabric.redfish.client import RedfishClient, RedfishSettings
from fabric.service.config import load_credentials
from fabric.state.inventory import Inventory
from fabric_dra_testbed.stack import Stack

__all__ = ["measure"]


async def _passes(url: str, state_dir: Path, passes: int, trace: bool, render: bool) -> dict[str, Any]:
    credentials = load_credentials(state_dir / "credentials.json")
    if credentials is None:
        raise RuntimeError(f"no credentials in {state_dir}")
    client = RedfishClient(
        RedfishSettings(
            base_url=url,
            username=credentials.username,
            password=credentials.password,
            read_timeout=600,
        )
    )
    out: list[dict[str, Any]] = []
    try:
        discovery = Discovery(client)
        inventory = Inventory() if render else None
        for _ in range(1 + passes):
            gc.collect()
            if trace:
                tracemalloc.reset_peak()
            cpu, wall = time.process_time(), time.perf_counter()
            snapshot = await discovery.scan()
            if inventory is not None:
                inventory.load(snapshot, {h: h for h in snapshot.hosts}, snapshot.started_at)
                inventory.snapshot_json()
            figures: dict[str, Any] = {
                "cpu_s": round(time.process_time() - cpu, 2),
                "wall_s": round(time.perf_counter() - wall, 1),
                "devices": len(snapshot.devices),
                "gets": snapshot.gets,
                "not_modified": snapshot.not_modified,
            }
            if trace:
                del snapshot
                gc.collect()
                held, peak = tracemalloc.get_traced_memory()
                figures |= {"held_mib": round(held / 2**20, 1), "peak_mib": round(peak / 2**20, 1)}
            out.append(figures)
        top: list[str] = []
        if trace:
            stats = tracemalloc.take_snapshot().statistics("lineno")[:12]
            top = [
                f"{s.traceback[0].filename}:{s.traceback[0].lineno} {s.size / 2**20:.1f} MiB" for s in stats
            ]
    finally:
        await client.aclose()
    return {"passes": out, "largest_held": top}


def measure(
    hosts: int, gpus: int, nvme: int, bindings: int, passes: int, trace: bool, render: bool = False
) -> dict[str, Any]:
    with work_dir("discovery-pass-") as root, Stack(root) as stack:
        topology = generate_topology(root / "topology.yaml", hosts=hosts, gpus=gpus, nvme=nvme)
        emulator = stack.emulator(latency="instant", topology=topology)
        devices = [*(f"gpu{i}" for i in range(gpus)), *(f"nvme{i}" for i in range(nvme))][:bindings]
        asyncio.run(_bind_direct(emulator, [(d, host_name(i % hosts)) for i, d in enumerate(devices)], 4))
        if trace:
            tracemalloc.start()
        figures = asyncio.run(_passes(emulator.url, emulator.state_dir, passes, trace, render))
        figures["rss_mib"] = rss_mib(__import__("os").getpid())
        return {"hosts": hosts, "devices": gpus + nvme, "bindings": bindings, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=20, help="hosts of the generated fabric (20)")
    parser.add_argument("--gpus", type=int, default=1_900, help="GPUs of the generated fabric (1,900)")
    parser.add_argument("--nvme", type=int, default=100, help="NVMe drives of the generated fabric (100)")
    parser.add_argument("--bindings", type=int, default=0, help="devices bound before the passes (0)")
    parser.add_argument("--passes", type=int, default=1, help="passes after the first (1)")
    parser.add_argument("--tracemalloc", action="store_true", help="measure Python memory (slows CPU)")
    parser.add_argument(
        "--inventory", action="store_true", help="load each pass into the manager's inventory and render it"
    )
    args = parser.parse_args()
    if min(args.hosts, args.gpus + args.nvme) < 1 or args.bindings < 0 or args.passes < 0:
        parser.error("hosts and devices must be at least 1, bindings and passes at least 0")
    figures = measure(
        args.hosts, args.gpus, args.nvme, args.bindings, args.passes, args.tracemalloc, args.inventory
    )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
