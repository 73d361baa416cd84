"""Shared pytest configuration: markers for what this machine may lack, and common paths."""

from __future__ import annotations

import os
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def redfish_reference_dir() -> Path:
    """DMTF's CSDL schemas, registries and mockups; never copied into this repository."""
    return Path(os.environ.get("FABRIC_DRA_REDFISH_DIR", REPO_ROOT.parent / "shared" / "redfish"))


@cache
def docker_engine_reason() -> str | None:
    """Why kind cannot run here, or None when it can."""
    if shutil.which("kind") is None:
        return "the kind binary is not installed"
    return docker_reason()


@cache
def docker_reason() -> str | None:
    """Why no container image can be built or run here, or None when it can."""
    if shutil.which("docker") is None:
        return "the docker client is not installed"
    try:
        probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"docker info failed: {err}"
    if probe.returncode != 0:
        return "no Docker engine is reachable (docker info failed)"
    return None


def _slow_modules_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: the modules holding a test marked ``slow`` first, the costliest
    (``slow(seconds=N)``, N its rough cost from a ``--durations`` run) leading, each module kept
    whole (its module-scoped stack starts once per worker), the order otherwise kept.

    Why: ``--dist worksteal`` hands each worker a contiguous share of this order and lets an idle
    worker take the tail of another's queue. A minutes-long test left near the end runs alone
    while the other workers wait; started first, it runs beside everything else. Every worker
    collects the same order, as xdist requires."""
    cost: dict[Path, float] = {}
    for item in items:
        if (marker := item.get_closest_marker("slow")) is not None:
            cost[item.path] = max(cost.get(item.path, 0.0), float(marker.kwargs.get("seconds", 0.0)))
    items.sort(key=lambda item: (item.path not in cost, -cost.get(item.path, 0.0)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _slow_modules_first(items)
    kind_reason = None
    for item in items:
        # Markers, not keywords: a parameter id that happens to read "kind" must not skip a test.
        if item.get_closest_marker("kind") is not None:
            kind_reason = kind_reason or docker_engine_reason()
            if kind_reason:
                item.add_marker(pytest.mark.skip(reason=f"needs Docker + kind: {kind_reason}"))
        if item.get_closest_marker("docker") is not None and (docker := docker_reason()):
            item.add_marker(pytest.mark.skip(reason=f"needs a Docker engine: {docker}"))
        if item.get_closest_marker("hardware") is not None and not os.environ.get("FABRIC_DRA_REDFISH_URL"):
            item.add_marker(
                pytest.mark.skip(reason="needs a real PCIe/CXL fabric: set FABRIC_DRA_REDFISH_URL")
            )


@pytest.fixture(scope="session")
def redfish_dir() -> Path:
    path = redfish_reference_dir()
    if not (path / "csdl").is_dir():
        pytest.skip(f"DMTF Redfish schemas not found at {path} (set FABRIC_DRA_REDFISH_DIR)")
    return path
