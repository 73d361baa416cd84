"""The plugin's readiness follows the kubelet's registration, on real processes: the
`fabric-dra plugin` command with its metrics port, and the kubelet's plugin manager (kube_standin)
on the same registry directory. This is what the DaemonSet's probes ask (deploy/base/plugin.yaml):
a rolling update with maxSurge waits for the new pod's readiness before it stops the old pod, so
readiness must mean "the kubelet can call this plugin"."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from kube_standin.kubelet_client import PluginManager
from tests.support.kubelet import running_kubelet
from tests.support.plugin import DRIVER, PluginStack, free_port, probe, short_dir


async def _until(port: int, path: str, status: int, within: float = 20.0) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got, reason = await asyncio.to_thread(probe, port, path)
        if got == status:
            return reason
        assert loop.time() < deadline, f"{path} still answers {got} {reason!r}, not {status}"
        await asyncio.sleep(0.1)


def _registered_sockets(kubelet: PluginManager) -> set[str]:
    return {Path(a.socket).name for a in kubelet.attempts if a.registered}


async def test_ready_once_registered_and_a_surge_pod_waits_for_its_own_registration() -> None:
    root = short_dir()
    old_port, new_port = free_port(), free_port()
    try:
        # A short node name: the surge pod's registration socket name carries a 36-character pod UID,
        # and a unix socket path has at most 107 bytes.
        with PluginStack(root, node="n1", backend="noop", metrics_port=old_port) as stack:
            # Serving, but no kubelet has registered it: live, not ready.
            assert await asyncio.to_thread(probe, old_port, "/healthz") == (200, "ok")
            assert await _until(old_port, "/readyz", 503) == "not registered with the kubelet yet"
            async with running_kubelet(stack.registry_dir) as kubelet:
                await kubelet.wait_for_plugin(DRIVER, within=30)
                assert await _until(old_port, "/readyz", 200) == "ok"

                # The DaemonSet's surge pod: same host directories, its own socket names (POD_UID).
                uid = "0c4f6a52-8d0e-4c1e-9a7b-2f0c3b1d5e6a"
                new = stack.stack.plugin(
                    stack.node,
                    None,
                    stack.kubeconfig,
                    name="plugin-new",
                    dirs=stack.dirs,
                    backend="noop",
                    metrics_port=new_port,
                    env={"POD_UID": uid},
                )
                try:
                    assert await _until(new_port, "/readyz", 200) == "ok"
                    assert f"{DRIVER}-{uid}-reg.sock" in _registered_sockets(kubelet)
                    # The old pod is still ready beside it: the kubelet can call either.
                    assert await asyncio.to_thread(probe, old_port, "/readyz") == (200, "ok")
                finally:
                    new.role.stop()
                # A DRA socket that stops answering makes the plugin not live (and not ready).
                stack.dra_socket.unlink()
                reason = await _until(old_port, "/healthz", 503)
                assert reason.startswith(f"{stack.dra_socket} does not answer")
                await _until(old_port, "/readyz", 503)
    finally:
        shutil.rmtree(root, ignore_errors=True)
