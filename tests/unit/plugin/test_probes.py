"""The plugin's /healthz and /readyz on a real port of an in-process plugin: neither passes while
the checkpoint is loaded and reconciled, not ready until the kubelet accepted the registration,
not live when a gRPC server stops answering on its socket or the event loop that serves them is
stuck."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from dra_driver.plugin.probes import Phase, PluginProbes
from dra_driver.plugin.registration import RegistrationStatus
from dra_driver.plugin.server import PluginServer
from dra_driver.proto.dra_v1 import api_pb2 as dra_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as dra_grpc
from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from manager_api.models import Device
from tests.support.plugin import probe
from tests.unit.plugin.conftest import FakeClaims, ScriptedBackend, claim_object, make_config


async def _probe(port: int, path: str) -> tuple[int, str]:
    return await asyncio.to_thread(probe, port, path)


@pytest.fixture
async def plugin(short_tmp: Path) -> AsyncIterator[PluginServer]:
    server = PluginServer(
        make_config(short_tmp, metrics_port=0, metrics_host="127.0.0.1"),
        claims=FakeClaims(),
        backend=ScriptedBackend(),
    )
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def _notify(server: PluginServer, registered: bool, error: str = "") -> None:
    async with grpc.aio.insecure_channel(f"unix://{server.config.registration_socket}") as channel:
        await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
            reg_pb2.RegistrationStatus(plugin_registered=registered, error=error)
        )


class _SlowFabric(ScriptedBackend):
    """Reconcile at start asks the fabric for this node's bindings; this fabric answers only once
    ``answer`` is set (a manager that is slow to reply, a large checkpoint to check)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def bindings(self) -> list[Device] | None:
        self.asked.set()
        await self.answer.wait()
        return await super().bindings()


async def test_neither_live_nor_ready_while_the_checkpoint_is_reconciled(short_tmp: Path) -> None:
    """The port answers from the first moment (so the startup probe, not a refused connection,
    covers the load), but 503 until the plugin serves both gRPC sockets."""
    fabric = _SlowFabric()
    server = PluginServer(
        make_config(short_tmp, metrics_port=0, metrics_host="127.0.0.1"),
        claims=FakeClaims(),
        backend=fabric,
    )
    starting = asyncio.create_task(server.start())
    try:
        await asyncio.wait_for(fabric.asked.wait(), 15)
        port = server.metrics_port
        assert port is not None
        for path in ("/healthz", "/readyz"):
            assert await _probe(port, path) == (503, "starting: loading the checkpoint and reconciling")
        assert not server.config.registration_socket.exists()
        fabric.answer.set()
        await asyncio.wait_for(starting, 15)
        assert await _probe(port, "/healthz") == (200, "ok")
        assert await _probe(port, "/readyz") == (503, "not registered with the kubelet yet")
        await _notify(server, True)
        assert await _probe(port, "/readyz") == (200, "ok")
    finally:
        fabric.answer.set()
        if not starting.done():
            starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await server.stop()


async def test_ready_only_once_the_kubelet_accepted_the_registration(plugin: PluginServer) -> None:
    port = plugin.metrics_port
    assert port is not None
    assert await _probe(port, "/healthz") == (200, "ok")
    status, reason = await _probe(port, "/readyz")
    assert status == 503 and reason == "not registered with the kubelet yet"
    await _notify(plugin, False, "plugin name already registered")
    status, reason = await _probe(port, "/readyz")
    assert status == 503 and "the kubelet said: plugin name already registered" in reason
    await _notify(plugin, True)
    assert await _probe(port, "/readyz") == (200, "ok")
    # /metrics is still served on the same port.
    status, body = await _probe(port, "/metrics")
    assert status == 200 and "fabric_dra_plugin" in body


async def test_not_live_when_the_dra_socket_no_longer_answers(plugin: PluginServer) -> None:
    port = plugin.metrics_port
    assert port is not None
    await _notify(plugin, True)
    plugin.probes.timeout = 1.0
    plugin.config.dra_socket.unlink()  # someone cleaned the plugin directory
    status, reason = await _probe(port, "/healthz")
    assert status == 503 and reason.startswith(f"{plugin.config.dra_socket} does not answer: UNAVAILABLE")
    status, _ = await _probe(port, "/readyz")
    assert status == 503


async def test_not_live_while_the_event_loop_is_stuck(plugin: PluginServer) -> None:
    port = plugin.metrics_port
    assert port is not None
    plugin.probes.timeout = 0.5
    answers: list[tuple[int, str]] = []
    asking = threading.Thread(target=lambda: answers.append(probe(port, "/healthz")))
    asking.start()
    # Block the loop that runs both gRPC servers for longer than the probe waits.
    time.sleep(2.0)  # noqa: ASYNC251 - the point is a loop that does not run
    await asyncio.to_thread(asking.join, 15)
    ((status, reason),) = answers
    assert status == 503 and "DEADLINE_EXCEEDED" in reason
    assert await _probe(port, "/healthz") == (200, "ok")  # the loop runs again


async def test_stopping_is_live_but_not_ready(short_tmp: Path) -> None:
    probes = PluginProbes(
        dra_socket=short_tmp / "dra.sock",
        registration_socket=short_tmp / "reg.sock",
        registration=lambda: RegistrationStatus(registered=True),
    )
    assert probes.phase is Phase.STARTING
    assert (probes.live().status, probes.ready().status) == (503, 503)
    probes.phase = Phase.STOPPING
    assert (probes.live().status, probes.ready().status) == (200, 503)
    probes.phase = Phase.SERVING
    assert probes.live().status == 503  # nothing listens on those sockets
    assert probes.answer("/metrics") is None


async def test_while_an_in_flight_prepare_finishes_on_sigterm_live_but_not_ready(short_tmp: Path) -> None:
    """stop() (what SIGTERM runs) lets in-flight calls finish: meanwhile the pod must not be
    restarted (live) but gets no new work (not ready)."""
    claims, backend = FakeClaims(), ScriptedBackend()
    backend.gates["gpu-0"] = asyncio.Event()
    server = PluginServer(
        make_config(short_tmp, metrics_port=0, metrics_host="127.0.0.1"), claims=claims, backend=backend
    )
    await server.start()
    stopping: asyncio.Task[None] | None = None
    try:
        port = server.metrics_port
        assert port is not None
        await _notify(server, True)
        assert await _probe(port, "/readyz") == (200, "ok")
        uid, namespace, name = claims.add(claim_object("c1", devices=[("gpus", "gpu-0")]))
        async with grpc.aio.insecure_channel(f"unix://{server.config.dra_socket}") as channel:
            request = dra_pb2.NodePrepareResourcesRequest(
                claims=[dra_pb2.Claim(namespace=namespace, name=name, uid=uid)]
            )
            call = dra_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=45)
            for _ in range(300):  # the fabric holds the attach until the gate opens
                if backend.attach_calls:
                    break
                await asyncio.sleep(0.05)
            assert backend.attach_calls == [(uid, "gpu-0")]
            stopping = asyncio.create_task(server.stop())
            await asyncio.sleep(0)  # stop() marks the phase before its first wait
            assert server.probes.phase is Phase.STOPPING
            assert await _probe(port, "/readyz") == (503, "stopping")
            assert await _probe(port, "/healthz") == (200, "stopping")
            backend.gates["gpu-0"].set()
            response = await call
            assert response.claims[uid].error == ""
        await asyncio.wait_for(stopping, 30)
    finally:
        backend.gates["gpu-0"].set()
        if stopping is None:
            await server.stop()
        else:
            await asyncio.gather(stopping, return_exceptions=True)
