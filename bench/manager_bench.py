"""Fabric manager benchmark: attach/detach latency through the REST API, concurrent throughput,
and the cost of one discovery pass — against the ``instant`` emulator, real processes throughout.

- ``attach``/``detach``: one device attached and detached again and again (REST round trip,
  intent committed to the ledger with fsync, Redfish session, zone AddEndpoint/RemoveEndpoint).
- ``parallel``: every device of the default topology attached at once (each to its own claim),
  then all detached at once: operations per second.
- ``discovery``: one full discovery pass (hosts, fabrics, endpoints, zones, connections, resource
  blocks, every device's attributes) of the default topology and of a generated 50-host,
  200-device one: seconds and Redfish GETs.

``python -m bench.manager_bench [--quick]`` prints the figures as JSON; :func:`run` returns them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import BenchContext, summary_ms
from fabric.backends.discovery import Discovery
from fabric.redfish.client import RedfishClient, RedfishSettings
from fabric.service.config import load_credentials
from fabric_dra_testbed.stack import Stack
from manager_api.client import ManagerClient

__all__ = ["run"]


async def _latency(url: str, pairs: int) -> dict[str, Any]:
    attach, detach = [], []
    async with ManagerClient(url, timeout=30) as client:
        for _ in range(pairs):
            claim = str(uuid.uuid4())  # the manager takes Kubernetes UIDs only
            started = time.perf_counter()
            await client.attach("gpu0", "kind-worker", claim, wait_seconds=30)
            attach.append(time.perf_counter() - started)
            started = time.perf_counter()
            await client.detach("gpu0", "kind-worker", claim, wait_seconds=30)
            detach.append(time.perf_counter() - started)
    return {"attach": summary_ms(attach), "detach": summary_ms(detach)}


async def _parallel(url: str, rounds: int) -> dict[str, Any]:
    nodes = ["kind-worker", "kind-worker2", "kind-worker3", "kind-worker4"]
    async with ManagerClient(url, timeout=60) as client:
        devices = [d.name for d in (await client.inventory()).devices]
        attach_s, detach_s = [], []
        for _ in range(rounds):
            work = [(d, nodes[i % len(nodes)], str(uuid.uuid4())) for i, d in enumerate(devices)]
            started = time.perf_counter()
            await asyncio.gather(*(client.attach(d, n, c, wait_seconds=30) for d, n, c in work))
            attach_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            await asyncio.gather(*(client.detach(d, n, c, wait_seconds=30) for d, n, c in work))
            detach_s.append(time.perf_counter() - started)
    return {
        "devices": len(devices),
        "attach_ops_per_s": round(len(devices) / statistics.fmean(attach_s), 1),
        "detach_ops_per_s": round(len(devices) / statistics.fmean(detach_s), 1),
    }


async def _discovery(url: str, state_dir: Path, passes: int) -> dict[str, Any]:
    credentials = load_credentials(state_dir / "credentials.json")
    assert credentials is not None
    client = RedfishClient(
        RedfishSettings(base_url=url, username=credentials.username, password=credentials.password)
    )
    try:
        discovery = Discovery(client)
        await discovery.scan()  # warm: session, connections
        seconds, gets, devices = [], 0, 0
        for _ in range(passes):
            started = time.perf_counter()
            snapshot = await discovery.scan()
            seconds.append(time.perf_counter() - started)
            gets, devices = snapshot.gets, len(snapshot.devices)
    finally:
        await client.aclose()
    return {"devices": devices, "gets": gets, **summary_ms(seconds)}


def measure(quick: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="manager-bench-") as tmp:
        root = Path(tmp)
        with Stack(root) as stack:
            emulator = stack.emulator(latency="instant")
            manager = stack.manager(emulator, state_dir=root / "m", insecure_no_auth=True)
            results["latency"] = asyncio.run(_latency(manager.url, 20 if quick else 100))
            results["parallel"] = asyncio.run(_parallel(manager.url, 1 if quick else 5))
            manager.stop()
            results["discovery_default"] = asyncio.run(
                _discovery(emulator.url, emulator.state_dir, 3 if quick else 10)
            )
        topology = root / "big.yaml"
        subprocess.run(
            [
                *(sys.executable, "-m", "fabric_dra", "emulator", "topology", "generate"),
                *("--hosts", "50", "--gpus", "150", "--nvme", "20", "--nics", "10", "--fpgas", "4"),
                *("--cxl-devices", "4", "--chunks", "4", "--output-file", str(topology)),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
        with Stack(root) as stack:
            emulator = stack.emulator(latency="instant", topology=topology, name="big")
            results["discovery_50_hosts"] = asyncio.run(
                _discovery(emulator.url, emulator.state_dir, 2 if quick else 5)
            )
    return results


def run(ctx: BenchContext) -> dict[str, Any]:
    """Extra section ``manager`` of ``python -m bench`` (figures only, no targets of its own)."""
    return {"figures": measure(ctx.quick), "checks": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    print(json.dumps(measure(parser.parse_args().quick), indent=2))


if __name__ == "__main__":
    main()
