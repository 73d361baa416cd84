"""The kubelet plugin's CPU per inventory change as its device health follows the fabric (issue 37).

The manager stand-in (``fabric_dra_testbed.standins.InventoryServer``, the change feed served with
the manager's own history class) holds a generated inventory of ``--devices`` GPUs (1,200: the
burst bench's fabric); one device's health changes ``--changes`` times, and after each change the
plugin's fabric backend takes the new view as its health monitor does (``watch_devices`` with the
version it last saw), measured two ways on the same manager:

- ``full_read``: the read before the change feed, the whole inventory on every version
  (``GET /api/v1/inventory?after=V``, parsed, then the devices by name);
- ``change_feed``: this tree, :class:`~dra_driver.plugin.backend.FabricBackend` following the change
  feed through :class:`~manager_api.feed.InventoryFeed` (the whole inventory once, then only what
  changed).

CPU is the event loop thread's own (``time.thread_time``) around each read: the HTTP client, the
JSON parse and validation, the change applied, the view built; the stand-in serves from threads of
its own, which are not counted. ``python -m bench.plugin_feed_bench [--devices N] [--changes N]``
prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from dra_driver.plugin.backend import FabricBackend
from dra_driver.plugin.hostdev import HostScanner
from fabric_dra_testbed.standins import InventoryServer, make_device, make_inventory
from manager_api.client import ManagerClient
from manager_api.models import Device, Health

__all__ = ["measure", "run"]

NODE = "node-0"


def _inventory(devices: int) -> Any:
    """``devices`` GPUs, 16 a switch, the first few bound to this node."""
    return make_inventory(
        [
            make_device(f"gpu-{i:05d}", switch=f"Switch{i // 16}", node=NODE if i < 8 else None)
            for i in range(devices)
        ]
    )


def _change(manager: InventoryServer, index: int) -> None:
    """One device's health turns (Critical, then OK again): one device changed per version."""
    name = f"gpu-{(index // 2) * 97 % len(manager.inventory.devices):05d}"
    health = Health.CRITICAL if index % 2 == 0 else Health.OK
    manager.update_devices(
        lambda devices: [d.model_copy(update={"health": health}) if d.name == name else d for d in devices]
    )


async def _per_change(
    manager: InventoryServer, changes: int, read: Callable[[int], Awaitable[tuple[int, dict[str, Device]]]]
) -> list[float]:
    """The event loop thread's CPU seconds for each read that brings one change."""
    version, _ = await read(-1)
    spent = []
    for index in range(changes):
        _change(manager, index)
        began = time.thread_time()
        version, devices = await read(version)
        spent.append(time.thread_time() - began)
        if version != manager.inventory.version or len(devices) != len(manager.inventory.devices):
            raise RuntimeError(f"read version {version}, the manager is at {manager.inventory.version}")
    return spent


async def _measure(manager: InventoryServer, changes: int, root: Path) -> dict[str, list[float]]:
    client = ManagerClient(manager.url)

    async def whole(after: int) -> tuple[int, dict[str, Device]]:
        inventory = await client.inventory(after=None if after < 0 else after, timeout_seconds=30)
        return inventory.version, {d.name: d for d in inventory.devices}

    backend = FabricBackend(
        ManagerClient(manager.url),
        HostScanner(root, real_host=False),
        node=NODE,
        visible_timeout=1,
        host_removal=False,
    )

    async def feed(after: int) -> tuple[int, dict[str, Device]]:
        view = await backend.watch_devices(None if after < 0 else after, 30)
        if view is None:
            raise RuntimeError("the fabric backend follows no fabric")
        return view

    try:
        return {
            "full_read": await _per_change(manager, changes, whole),
            "change_feed": await _per_change(manager, changes, feed),
        }
    finally:
        await client.aclose()
        await backend.aclose()


def measure(devices: int = 1200, changes: int = 40) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as root, InventoryServer(_inventory(devices)) as manager:
        spent = asyncio.run(_measure(manager, changes, Path(root)))
    figures: dict[str, Any] = {"devices": devices, "changes": changes}
    for mode, seconds in spent.items():
        figures[mode] = {
            "cpu_ms_per_change_p50": round(statistics.median(seconds) * 1000, 2),
            "cpu_ms_per_change_mean": round(statistics.fmean(seconds) * 1000, 2),
            "cpu_ms_per_change_max": round(max(seconds) * 1000, 2),
        }
    figures["ratio_p50"] = round(
        figures["change_feed"]["cpu_ms_per_change_p50"] / figures["full_read"]["cpu_ms_per_change_p50"], 3
    )
    return figures


def run(ctx: Any) -> dict[str, Any]:
    """The section for ``python -m bench --only plugin-feed``."""
    figures = measure(devices=200 if ctx.quick else 1200, changes=10 if ctx.quick else 40)
    return {
        **figures,
        "checks": [
            {
                "name": f"plugin CPU per change, change feed vs full read ({figures['devices']} devices)",
                "target": "<= 0.25",
                "measured": figures["ratio_p50"],
                "unit": "",
                "pass": figures["ratio_p50"] <= 0.25,
            }
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description="The kubelet plugin's CPU per inventory change: change feed against full reads."
    )
    parser.add_argument("--devices", type=int, default=1200, help="GPUs in the inventory (default 1200)")
    parser.add_argument("--changes", type=int, default=40, help="one-device changes measured (default 40)")
    args = parser.parse_args()
    if args.devices < 1 or args.changes < 1:
        parser.error("--devices and --changes must be at least 1")
    print(json.dumps(measure(args.devices, args.changes), indent=2))


if __name__ == "__main__":
    main()
