"""``fabric-dra plugin`` started with relative directories (``--plugin-dir rel/plug``) serves on the
sockets those name, resolved against its working directory — it once failed to bind
``unix://rel/plug/dra.sock``, whose ``rel`` gRPC reads as a host name."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fabric_dra_testbed.stack import short_dir


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_dir("fdra-rel-")  # unix socket paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_relative_directories_are_resolved_against_the_working_directory(workdir: Path) -> None:
    kubeconfig = workdir / "kubeconfig"
    # No API server is needed to serve the kubelet's sockets; the plugin only logs that it cannot reach it.
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    log = (workdir / "plugin.log").open("w")
    plugin = subprocess.Popen(
        [
            *(sys.executable, "-m", "fabric_dra", "plugin", "--node-name", "n1", "--device-backend", "noop"),
            *("--plugin-dir", "rel/plug", "--registry-dir", "rel/reg", "--cdi-root", "rel/cdi"),
            *("--sysfs-root", "/sys", "--kubeconfig", "kubeconfig"),
        ],
        cwd=workdir,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if k not in ("PLUGIN_DIR", "REGISTRY_DIR", "CDI_ROOT")},
    )
    try:
        deadline = time.monotonic() + 60
        sockets = [workdir / "rel" / "plug" / "dra.sock", workdir / "rel" / "reg" / "fabric-dra.io-reg.sock"]
        while not all(s.is_socket() for s in sockets):
            text = (workdir / "plugin.log").read_text()
            assert plugin.poll() is None, f"the plugin exited {plugin.returncode}: {text}"
            assert time.monotonic() < deadline, f"no sockets after 60 s: {text}"
            time.sleep(0.1)
        text = (workdir / "plugin.log").read_text()
        assert f"dra_socket={workdir}/rel/plug/dra.sock" in text, text
        assert "Traceback" not in text
    finally:
        plugin.send_signal(signal.SIGTERM)
        try:
            plugin.wait(timeout=20)
        except subprocess.TimeoutExpired:
            plugin.kill()
            plugin.wait(timeout=10)
        log.close()
