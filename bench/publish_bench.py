"""Section 4 — ResourceSlice publishing: 128, 1,280 and 10,000 devices over 4 fabrics, then
unchanged resyncs.

Real processes, fresh for each size: the API test server (strict validation of every slice for
Kubernetes 1.34 to 1.37) and ``fabric-dra controller``, fed by the HTTP inventory stand-in of
:mod:`fabric_dra_testbed.standins`. The controller first publishes the four pools empty; the clock
starts when the full inventory is served and stops when the controller reports that inventory
version synced (every slice acknowledged by the API server). Then the slices are checked complete and
consistent, the server's write counter is reset, and three periodic resyncs run (period 1 s).
Targets: 10,000 devices in <= 5 s, 0 writes on an unchanged resync.

With ``--partitions`` every GPU of the inventory (three devices in four) is partitionable into seven
one-slice partitions (the ``1g.10gb`` placements of the illustrative H100 table): it is published as
eight devices consuming its counter set, with binding conditions, in 1.36's layout (counter slices
of their own). No target: a figure of what partitions cost.

``python -m bench --only publish``; ``python -m bench.publish_bench [--quick] [--partitions]`` prints
JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import BenchContext, check, progress
from fabric_dra_testbed.stack import ApiServerHooks as TestHooks
from fabric_dra_testbed.stack import Stack
from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory
from manager_api.models import DeviceType
from manager_api.partitions import BUILTIN_TABLES, PartitionTable

__all__ = ["run"]

FABRICS = 4
DRIVER = "fabric-dra.io"


def _wait(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.01)
    raise RuntimeError(f"timed out waiting for {what}")


def _seven_slices() -> PartitionTable:
    """The H100 table with its one-slice profile only: seven placements."""
    table = BUILTIN_TABLES["h100-80gb"]
    return table.model_copy(update={"profiles": [p for p in table.profiles if p.name == "1g.10gb"]})


def _inventory(devices_total: int, version: int, partitions: bool = False) -> Any:
    per_fabric = devices_total // FABRICS
    pools = {f"fabric-f{f}": [f"node-{f}-{n}" for n in range(8)] for f in range(FABRICS)}
    devices = []
    for f in range(FABRICS):
        for i in range(per_fabric if devices_total else 0):
            kind = DeviceType.GPU if i % 4 else DeviceType.NVME
            devices.append(
                make_device(
                    f"f{f}-dev-{i:05d}",
                    pool=f"fabric-f{f}",
                    fabric=f"F{f}",
                    type=kind,
                    switch=f"Switch{i // 16}",
                    port=f"P{i % 16}",
                    uuid=f"00000000-0000-4000-8000-{f:04d}{i:08d}",
                    partition_table=_seven_slices() if partitions and kind is DeviceType.GPU else None,
                )
            )
    return make_inventory(devices, pools=pools, version=version)


def _counts(hooks: TestHooks) -> dict[str, Any]:
    return hooks.requests()


def _reconcile_totals(base_url: str) -> tuple[float, float]:
    """(passes, seconds) of the controller's slice reconcile histogram."""
    count = total = 0.0
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith("fabric_dra_controller_slice_reconcile_seconds_count"):
            count = float(line.split()[-1])
        elif line.startswith("fabric_dra_controller_slice_reconcile_seconds_sum"):
            total = float(line.split()[-1])
    return count, total


def publish(devices_total: int, partitions: bool = False) -> dict[str, Any]:
    """Publish ``devices_total`` devices once, then let three unchanged resyncs run; with
    ``partitions``, each GPU with seven partitions."""
    root = Path(tempfile.mkdtemp(prefix="fdpub-", dir="/tmp"))
    try:
        with Stack(root) as stack, InventoryServer(_inventory(0, version=1)) as manager:
            server = stack.apiserver()
            hooks = server.hooks
            api = server.http(timeout=60)
            controller = stack.controller(
                None,
                server,
                args=[
                    "--manager-url",
                    manager.url,
                    "--resync-period",
                    "1",
                    "--device-taints",
                    "on",
                    *(["--binding-conditions"] if partitions else []),
                ],
                log_level="warning",
            ).role
            status_url = f"{controller.address}/status"

            def synced(version: int) -> bool:
                return bool(httpx.get(status_url, timeout=10).json().get("slicesSyncedVersion") == version)

            _wait(lambda: synced(1), 60, "the empty pools")
            full = _inventory(devices_total, version=2, partitions=partitions)
            hooks.reset_counts()
            started = time.monotonic()
            manager.set_inventory(full)
            _wait(lambda: synced(manager.inventory.version), 120, "the full publication")
            publish_seconds = time.monotonic() - started
            publish_writes = hooks.writes("resource.k8s.io/resourceslices")

            slices = api.get(
                "/apis/resource.k8s.io/v1/resourceslices", params={"fieldSelector": f"spec.driver={DRIVER}"}
            ).json()["items"]
            per_pool: dict[str, list[dict[str, Any]]] = {}
            for obj in slices:
                per_pool.setdefault(obj["spec"]["pool"]["name"], []).append(obj)
            published = sum(len(s["spec"].get("devices", [])) for s in slices)
            counter_sets = sum(len(s["spec"].get("sharedCounters", [])) for s in slices)
            consistent = all(
                len({s["spec"]["pool"]["generation"] for s in group}) == 1
                and {s["spec"]["pool"]["resourceSliceCount"] for s in group} == {len(group)}
                for group in per_pool.values()
            )

            # Unchanged resyncs: each re-lists every slice and compares; none may write.
            hooks.reset_counts()
            passes_before, seconds_before = _reconcile_totals(controller.address)

            def resyncs() -> int:
                lists = _counts(hooks)["requests"].get("resource.k8s.io/resourceslices", {}).get("list", 0)
                return int(lists) if lists >= 3 else 0

            _wait(resyncs, 60, "three resyncs")
            resync_writes = hooks.writes("resource.k8s.io/resourceslices")
            passes_after, seconds_after = _reconcile_totals(controller.address)
            passes = int(passes_after - passes_before)
            resync_seconds = (seconds_after - seconds_before) / max(1, passes)
            controller.stop()
            api.close()
        return {
            "devices": devices_total,
            "fabrics": FABRICS,
            "published_devices": published,
            "counter_sets": counter_sets,
            "slices": len(slices),
            "pools_consistent": consistent,
            "publish_seconds": round(publish_seconds, 3),
            "publish_writes": publish_writes,
            "devices_per_second": round(devices_total / publish_seconds),
            "resync_passes": passes,
            "resync_writes": resync_writes,
            "resync_pass_seconds": round(resync_seconds, 3),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


SIZES = (128, 1_280, 10_000)


def run(ctx: BenchContext) -> dict[str, Any]:
    sizes = (128,) if ctx.quick else SIZES
    figures: dict[str, Any] = {}
    checks = []
    for size in sizes:
        progress("publish", f"{size} devices")
        result = publish(size)
        figures[str(size)] = result
        checks.append(
            check(f"{size} devices published and acknowledged", result["publish_seconds"], 5.0, "s")
        )
        checks.append(
            check(f"writes on an unchanged resync ({size} devices)", result["resync_writes"], 0, "")
        )
        checks.append(
            check(f"devices in slices ({size})", result["published_devices"], size, "", at_most=False)
        )
    return {"figures": figures, "checks": checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2,000 devices instead of 10,000")
    parser.add_argument("--partitions", action="store_true", help="every GPU with seven partitions")
    parser.add_argument("--devices", type=int, help="this many inventory devices")
    args = parser.parse_args()
    count = args.devices or (2_000 if args.quick else 10_000)
    print(json.dumps(publish(count, partitions=args.partitions), indent=2))


if __name__ == "__main__":
    main()
