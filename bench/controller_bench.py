"""The controller's cost per inventory change at 10,100 devices: process CPU and slices written.

Real processes: the API test server, the manager stand-in of :mod:`fabric_dra_testbed.standins`
(which serves the inventory and its change feed from the manager's own history class) and
``fabric-dra controller --device-taints on``. The inventory has the shape of the restart bench's
generated fabric (bench.restart_bench): 100 nodes, 10,000 GPUs and 100 NVMe drives in one pool.
Each controller measured publishes it whole first; then ``changes`` times one device's health
changes (a GPU turns Critical, or healthy again) and the clock waits until the controller reports
that version synced. Per change: the controller's CPU (user + system, /proc/PID/stat, less what
answering the bench's /status polls costs it, measured idle first), the slices written, the wall
time to synced (polled every 50 ms).

Controllers measured, in turns, each with a driver name of its own on the same API server:

- ``changes``: this tree, following the change feed (the default);
- ``full``: this tree with ``--inventory-feed full``: the whole inventory read on every change;
- with ``--baseline REF``, the controller of that commit (``git archive``, run with ``PYTHONPATH``),
  against a stand-in serving the inventory without the change feed, as a manager of then did.

Also the change feed at a tenth of the devices (1,010), for proportionality.

Target (issue 37, "Controller cost per change"): proportional to what changed — one slice written
per device change; CPU per change a small fraction of the full read's, a tenth of the 206 ms it was
(3190147), and about the same at 1,010 devices as at 10,100.

``python -m bench --only controller``; ``python -m bench.controller_bench [--quick] [--baseline
REF] [--changes N]`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from bench.common import BenchContext, check, checkout_tree, cpu_seconds, progress, work_dir
from fabric_dra_testbed.stack import Stack
from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory
from manager_api.models import Device, DeviceType, Health, Inventory

__all__ = ["run"]

NODES = 100
GPUS = 10_000
DRIVES = 100
POOL = "fabric-pcie"


def inventory(gpus: int = GPUS, drives: int = DRIVES) -> Inventory:
    """The restart bench's fabric as an inventory: ``gpus`` GPUs and ``drives`` NVMe drives."""
    devices = [
        make_device(f"gpu-{i:05d}", switch=f"Switch{i // 100}", port=f"P{i % 100}") for i in range(gpus)
    ] + [make_device(f"nvme-{i:03d}", type=DeviceType.NVME, switch="Switch-nvme") for i in range(drives)]
    return make_inventory(devices, pools={POOL: [f"node-{n:03d}" for n in range(NODES)]})


#: how often the controller's /status is asked: each answer costs it CPU too, subtracted below
POLL_SECONDS = 0.05


def _wait(done: Callable[[], bool], timeout: float, what: str) -> int:
    """Ask ``done`` every POLL_SECONDS until it holds; how many times it was asked."""
    deadline = time.monotonic() + timeout
    asked = 1
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL_SECONDS)
        asked += 1
    return asked


def _health_change(index: int, gpus: int = GPUS) -> Callable[[list[Device]], list[Device]]:
    """Change ``index``: GPU ``index // 2`` turns Critical (even) or healthy again (odd)."""
    name = f"gpu-{(index // 2) * 97 % gpus:05d}"
    health = Health.CRITICAL if index % 2 == 0 else Health.OK
    return lambda devices: [d.model_copy(update={"health": health}) if d.name == name else d for d in devices]


def measure_one(
    stack: Stack,
    server: Any,
    manager: InventoryServer,
    driver: str,
    changes: int,
    *,
    args: tuple[str, ...] = (),
    tree: Path | None = None,
) -> dict[str, Any]:
    """One controller over ``manager``: its first publication, then ``changes`` health changes."""
    gpus = sum(1 for d in manager.inventory.devices if d.type is DeviceType.GPU)
    env = {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"} if tree is not None else None
    controller = stack.controller(
        None,
        server,
        name=f"controller-{driver.split('.')[0]}",
        args=["--manager-url", manager.url, "--driver-name", driver, "--device-taints", "on", *args],
        log_level="warning",
        env=env,
    ).role
    status_url = f"{controller.address}/status"

    def synced() -> bool:
        status = httpx.get(status_url, timeout=30).json()
        return bool(status.get("slicesSyncedVersion") == manager.inventory.version)

    started = time.monotonic()
    _wait(synced, 600, f"the first publication by {driver}")
    first_seconds = time.monotonic() - started
    hooks = server.hooks
    # what a /status answer costs the controller: asked 40 times with nothing else to do
    idle = cpu_seconds(controller.pid)
    for _ in range(40):
        synced()
        time.sleep(POLL_SECONDS)
    per_poll = (cpu_seconds(controller.pid) - idle) / 40
    cpu_before = cpu_seconds(controller.pid)
    hooks.reset_counts()
    walls = []
    polls = 0
    for index in range(changes):
        manager.update_devices(_health_change(index, gpus))
        began = time.monotonic()
        polls += _wait(synced, 120, f"change {index} by {driver}")
        walls.append(time.monotonic() - began)
    cpu = cpu_seconds(controller.pid) - cpu_before - polls * per_poll
    writes = hooks.writes("resource.k8s.io/resourceslices")
    controller.stop()
    return {
        "first_publication_s": round(first_seconds, 2),
        "changes": changes,
        "cpu_ms_per_change": round(cpu / changes * 1000, 1),
        "status_poll_cpu_ms": round(per_poll * 1000, 2),
        "slices_written_per_change": round(writes / changes, 2),
        "wall_ms_per_change_p50": round(statistics.median(walls) * 1000, 1),
        "wall_ms_per_change_max": round(max(walls) * 1000, 1),
    }


def measure(quick: bool = False, baseline: str | None = None, changes: int | None = None) -> dict[str, Any]:
    count = changes or (6 if quick else 20)
    gpus = 2_000 if quick else GPUS
    results: dict[str, Any] = {"devices": gpus + DRIVES, "nodes": NODES}
    with work_dir("fdctl-") as root, ExitStack() as stack_exit:
        stack = stack_exit.enter_context(Stack(root))
        server = stack.apiserver()
        whole = inventory(gpus)
        progress("controller", f"{gpus + DRIVES} devices, change feed")
        with InventoryServer(whole) as manager:
            results["changes"] = measure_one(stack, server, manager, "changes.fabric-dra.io", count)
        small = inventory(gpus // 10, DRIVES // 10)
        progress("controller", f"{gpus // 10 + DRIVES // 10} devices, change feed (proportionality)")
        with InventoryServer(small) as manager:
            results["changes_tenth"] = measure_one(stack, server, manager, "tenth.fabric-dra.io", count)
            results["changes_tenth"]["devices"] = gpus // 10 + DRIVES // 10
        progress("controller", f"{gpus + DRIVES} devices, full read on every change")
        with InventoryServer(whole) as manager:
            results["full"] = measure_one(
                stack, server, manager, "full.fabric-dra.io", count, args=("--inventory-feed", "full")
            )
        if baseline:
            progress("controller", f"{gpus + DRIVES} devices, the controller of {baseline}")
            unpacked = stack_exit.enter_context(tempfile.TemporaryDirectory(prefix="controller-baseline-"))
            tree = checkout_tree(baseline, Path(unpacked))
            with InventoryServer(whole, changes=False) as manager:
                results[f"baseline {baseline}"] = measure_one(
                    stack, server, manager, "baseline.fabric-dra.io", count, tree=tree
                )
    return results


def run(ctx: BenchContext) -> dict[str, Any]:
    figures = measure(quick=ctx.quick)
    feed, full = figures["changes"], figures["full"]
    tenth = figures["changes_tenth"]
    checks = [
        check("slices written per device change (change feed)", feed["slices_written_per_change"], 1, ""),
        check(
            "controller CPU per change, change feed (206 ms at 3190147)",
            feed["cpu_ms_per_change"],
            20.6,
            "ms",
        ),
        check(
            f"controller CPU per change at {figures['devices']} devices vs {tenth['devices']}",
            feed["cpu_ms_per_change"] / max(tenth["cpu_ms_per_change"], 0.001),
            2.0,
            "x",
        ),
        check(
            "controller CPU per change, change feed vs full read",
            feed["cpu_ms_per_change"] / max(full["cpu_ms_per_change"], 0.001),
            0.25,
            "x",
        ),
    ]
    return {"figures": figures, "checks": checks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="2,100 devices and 6 changes")
    parser.add_argument("--baseline", metavar="REF", help="also measure the controller of this commit")
    parser.add_argument("--changes", type=int, help="health changes per controller (default 20)")
    args = parser.parse_args()
    print(json.dumps(measure(args.quick, args.baseline, args.changes), indent=2))


if __name__ == "__main__":
    main()
