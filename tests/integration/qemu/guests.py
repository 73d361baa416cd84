"""What every QEMU-host test module needs on this machine: the tools or a clear skip, the project
byte-compiled for the guest, and the guest's environment."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

from emulator.qemu.image import missing_tools

REPO = Path(__file__).resolve().parents[3]
#: the guest's Python has no byte-code cache prefix: it reads the ``__pycache__`` directories
#: that :func:`compile_for_guest` fills
GUEST_ENV = {"PYTHONPATH": str(REPO)}


def skip_without_tools() -> None:
    """Skip the calling module where QEMU, a kernel, a static busybox or udev is missing.
    .ci/run installs them and sets FABRIC_DRA_REQUIRE_TOOLS, with which their absence fails the
    run instead of skipping it."""
    missing = missing_tools()
    if not missing:
        return
    why = "QEMU hosts cannot run here: missing " + "; ".join(missing)
    if os.environ.get("FABRIC_DRA_REQUIRE_TOOLS"):
        pytest.fail(f"$FABRIC_DRA_REQUIRE_TOOLS is set but {why}", pytrace=False)
    pytest.skip(why, allow_module_level=True)


def compile_for_guest() -> None:
    """Byte-compile the project's packages into their ``__pycache__`` directories. The guest's
    root is this machine's, read-only, and a checkout run with ``PYTHONDONTWRITEBYTECODE`` (or a
    ``PYTHONPYCACHEPREFIX`` the guest does not share) holds no byte-code where the guest looks:
    it would compile every module on every import, under emulation (minutes). The virtualenv's
    packages were compiled by pip."""
    import compileall

    prefix, sys.pycache_prefix = sys.pycache_prefix, None
    try:
        for package in ("plumbing", "manager_api", "dra_driver", "fabric_dra", "testbed/kube_standin"):
            compileall.compile_dir(str(REPO / package), quiet=1)
    finally:
        sys.pycache_prefix = prefix


def tail(path: Path, lines: int = 40) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return f"(no {path})"
