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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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
