"""The kubelet's side of the DRA protocol for tests: a running plugin manager on a registry dir.

    from tests.support.kubelet import kubelet, socket_dir  # noqa: F401 - fixtures

    async def test_prepare(kubelet: PluginManager, ...) -> None:
        # start the plugin with --registry-dir kubelet.registry_dir ...
        plugin = await kubelet.wait_for_plugin("fabric-dra.io")
        results = await plugin.prepare([ClaimRef(namespace, name, uid)])

``kubelet`` registers plugins as they appear (0.1 s reconcile instead of the kubelet's 1 s,
0.2 s first retry), follows their health streams (``kubelet.health``) and records every
registration attempt (``kubelet.attempts``). Unix socket paths are limited to 107 bytes, so
``socket_dir`` is a short directory under /tmp rather than pytest's ``tmp_path``.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from kube_standin.kubelet_client import PluginManager

__all__ = ["kubelet", "running_kubelet", "short_socket_dir", "socket_dir"]


@contextlib.contextmanager
def short_socket_dir(prefix: str = "fdk-") -> Iterator[Path]:
    """A fresh directory with a short path (for unix sockets), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def running_kubelet(
    registry_dir: Path, *, watch_health: bool = True, call_timeout: float = 45.0
) -> AsyncIterator[PluginManager]:
    """A :class:`PluginManager` running on ``registry_dir`` for the duration of the block."""
    manager = PluginManager(
        registry_dir,
        reconcile_period=0.1,
        backoff_initial=0.2,
        backoff_max=1.0,
        health_retry_period=0.5,
        watch_health=watch_health,
        call_timeout=call_timeout,
    )
    task = asyncio.create_task(manager.run())
    try:
        yield manager
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    with short_socket_dir() as path:
        yield path


@pytest_asyncio.fixture
async def kubelet(socket_dir: Path) -> AsyncIterator[PluginManager]:
    """A kubelet plugin manager watching ``socket_dir / "plugins_registry"``."""
    async with running_kubelet(socket_dir / "plugins_registry") as manager:
        yield manager
