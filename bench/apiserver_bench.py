"""API test server benchmark: what strict validation costs, and 10,000 devices through real HTTP.

* ``validate_ms``: CPU time to validate one 128-device ResourceSlice against the schemas of
  Kubernetes 1.34-1.37 (in process, after warm-up), and per single release.
* ``create_10k_s``: wall time to create 79 slices (10,000 devices) through ``KubeClient``,
  one at a time and 8 at a time, against the server as a real process; plus the time to list
  them all back and to replace them unchanged (no-op updates).

``python -m bench.apiserver_bench [--quick]`` prints the figures as JSON; :func:`run` returns them.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import BenchContext
from fabric_dra_testbed.stack import Stack
from fabric_dra_testbed.standins import resource_slice
from kube_standin.apiserver.schemas import DEFAULT_VERSIONS, SchemaCatalog
from plumbing.kube import KubeClient
from plumbing.kube.resources import RESOURCE_SLICES

__all__ = ["run"]

DEVICES = 10_000
PER_SLICE = 128


def _slices(prefix: str) -> list[dict[str, Any]]:
    out = []
    count = -(-DEVICES // PER_SLICE)
    for index in range(count):
        devices = min(PER_SLICE, DEVICES - index * PER_SLICE)
        piece = resource_slice(f"{prefix}-{index}", devices=devices)
        piece["spec"]["pool"]["name"] = prefix
        piece["spec"]["pool"]["resourceSliceCount"] = count
        for number, device in enumerate(piece["spec"]["devices"]):
            device["name"] = f"dev-{index}-{number}"
        out.append(piece)
    return out


def _validation_cost(rounds: int) -> dict[str, float]:
    full = resource_slice(devices=PER_SLICE)
    out: dict[str, float] = {}
    for label, versions in (("all", DEFAULT_VERSIONS), ("1.34", ("1.34",))):
        catalog = SchemaCatalog(versions)
        catalog.validate(full)
        start = time.process_time()
        for _ in range(rounds):
            catalog.validate(full)
        out[label] = round((time.process_time() - start) / rounds * 1000, 3)
    return out


async def _create(kube: KubeClient, slices: list[dict[str, Any]], concurrency: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(piece: dict[str, Any]) -> None:
        async with gate:
            await kube.create(RESOURCE_SLICES, piece)

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in slices))
    return time.perf_counter() - start


async def _through_http(url: str, token: str) -> dict[str, float]:
    from plumbing.kube import KubeConfig

    async with KubeClient(KubeConfig(server=url, token=token)) as kube:
        sequential = await _create(kube, _slices("seq"), 1)
        parallel = await _create(kube, _slices("par"), 8)
        start = time.perf_counter()
        items, _ = await kube.list_all(RESOURCE_SLICES, field_selector="spec.pool.name=seq")
        listed = time.perf_counter() - start
        assert sum(len(i["spec"]["devices"]) for i in items) == DEVICES
        start = time.perf_counter()
        for item in items:
            unchanged = copy.deepcopy(item)
            unchanged.update(apiVersion="resource.k8s.io/v1", kind="ResourceSlice")
            await kube.replace(RESOURCE_SLICES, unchanged)
        noop = time.perf_counter() - start
    return {
        "create_10k_sequential_s": round(sequential, 3),
        "create_10k_8_parallel_s": round(parallel, 3),
        "list_10k_s": round(listed, 3),
        "replace_unchanged_10k_s": round(noop, 3),
    }


def measure(quick: bool = False) -> dict[str, Any]:
    results: dict[str, Any] = {"validate_128_device_slice_cpu_ms": _validation_cost(10 if quick else 100)}
    root = Path(tempfile.mkdtemp(prefix="apiserver-bench-"))
    try:
        with Stack(root) as stack:
            server = stack.apiserver()
            results.update(asyncio.run(_through_http(server.url, server.admin_token)))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def run(ctx: BenchContext) -> dict[str, Any]:
    """Extra section ``apiserver`` of ``python -m bench`` (figures only, no targets of its own)."""
    return {"figures": measure(ctx.quick), "checks": []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer validation rounds")
    args = parser.parse_args()
    print(json.dumps(measure(quick=args.quick), indent=2))


if __name__ == "__main__":
    main()
