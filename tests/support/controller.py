"""Test support for the controller: inventory factories and a small real HTTP stand-in for the
fabric manager's inventory and attachment endpoints (they live in :mod:`fabric_dra_testbed.standins`,
shared with the benchmarks). Tests that need the real manager and emulator start them as processes
instead (:mod:`fabric_dra_testbed.stack`).
"""

from __future__ import annotations

from datetime import UTC, datetime

from fabric_dra_testbed.standins import (
    InventoryServer,
    inventory_server,
    make_device,
    make_inventory,
    make_pool,
)

__all__ = ["InventoryServer", "inventory_server", "make_device", "make_inventory", "make_pool", "utc_now"]


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
