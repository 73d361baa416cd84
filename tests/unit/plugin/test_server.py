"""The plugin's gRPC surface on real unix sockets, as the kubelet sees it (in-process server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.config import PluginConfig
from dra_driver.plugin.server import PluginError, PluginServer
from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from dra_driver.proto.dra_v1 import api_pb2 as v1_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as v1_grpc
from dra_driver.proto.dra_v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver.proto.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from tests.unit.plugin.conftest import DRIVER, FakeClaims, ScriptedBackend, claim_object, make_config


@pytest.fixture
async def running(short_tmp: Path) -> AsyncIterator[tuple[PluginServer, FakeClaims, ScriptedBackend]]:
    claims, backend = FakeClaims(), ScriptedBackend()
    server = PluginServer(
        make_config(short_tmp, ready_file=short_tmp / "ready"), claims=claims, backend=backend
    )
    await server.start()
    try:
        yield server, claims, backend
    finally:
        await server.stop()


async def test_registration_answers_like_a_dra_plugin(
    running: tuple[PluginServer, FakeClaims, ScriptedBackend],
) -> None:
    server, _, _ = running
    cfg = server.config
    assert cfg.ready_file is not None and cfg.ready_file.read_text().strip() == str(cfg.dra_socket)
    async with grpc.aio.insecure_channel(f"unix://{cfg.registration_socket}") as channel:
        stub = reg_grpc.RegistrationStub(channel)
        info = await stub.GetInfo(reg_pb2.InfoRequest())
        assert info.type == "DRAPlugin"
        assert info.name == DRIVER
        assert info.endpoint == str(cfg.dra_socket)
        assert list(info.supported_versions) == [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1alpha1.DRAResourceHealth",
        ]
        await stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=False, error="boom"))
        assert server.registration is not None
        assert server.registration.status.last_error == "boom" and not server.registration.status.registered
        await stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True))
        assert server.registration.status.registered and server.registration.status.rejected_since is None


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_prepare_and_unprepare_over_the_socket(
    running: tuple[PluginServer, FakeClaims, ScriptedBackend], version: str
) -> None:
    server, claims, backend = running
    pb, grpc_mod = (v1_pb2, v1_grpc) if version == "v1" else (v1beta1_pb2, v1beta1_grpc)
    uid, ns, name = claims.add(claim_object("c1", devices=[("gpus/large", "gpu-0")]))
    async with grpc.aio.insecure_channel(f"unix://{server.config.dra_socket}") as channel:
        stub = grpc_mod.DRAPluginStub(channel)
        claim = pb.Claim(namespace=ns, name=name, uid=uid)
        response = await stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=[claim]), timeout=45)
        result = response.claims[uid]
        assert result.error == ""
        (device,) = result.devices
        assert list(device.request_names) == ["gpus"]
        assert (device.pool_name, device.device_name) == ("fabric-pcie", "gpu-0")
        assert list(device.cdi_device_ids) == [f"k8s.fabric-dra.io/gpu={uid}-gpu-0"]
        assert cdi.spec_files_of_claim(server.config.cdi_root, DRIVER, uid)

        response = await stub.NodeUnprepareResources(
            pb.NodeUnprepareResourcesRequest(claims=[claim]), timeout=45
        )
        assert response.claims[uid].error == ""
        assert backend.attached == {}
        assert cdi.spec_files_of_claim(server.config.cdi_root, DRIVER, uid) == []


async def test_health_stream_reports_prepared_devices(
    running: tuple[PluginServer, FakeClaims, ScriptedBackend],
) -> None:
    server, claims, _ = running
    uid, ns, name = claims.add(claim_object("c1", devices=[("gpu", "gpu-0")]))
    async with grpc.aio.insecure_channel(f"unix://{server.config.dra_socket}") as channel:
        stream = health_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            health_pb2.NodeWatchResourcesRequest()
        )
        first = await asyncio.wait_for(stream.read(), 10)
        assert isinstance(first, health_pb2.NodeWatchResourcesResponse)
        assert list(first.devices) == []
        stub = v1_grpc.DRAPluginStub(channel)
        claim = v1_pb2.Claim(namespace=ns, name=name, uid=uid)
        await stub.NodePrepareResources(v1_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=45)
        update = await asyncio.wait_for(stream.read(), 10)
        assert isinstance(update, health_pb2.NodeWatchResourcesResponse)
        (device,) = update.devices
        assert (device.device.pool_name, device.device.device_name) == ("fabric-pcie", "gpu-0")
        # The scripted backend follows no fabric inventory: health cannot be known, and says so.
        assert device.health == health_pb2.UNKNOWN
        assert abs(device.last_updated_time - time.time()) < 60
        stream.cancel()


async def test_sockets_are_cleaned_at_start_and_removed_on_stop(short_tmp: Path) -> None:
    cfg = make_config(short_tmp)
    for stale in (cfg.registration_socket, cfg.dra_socket):
        stale.parent.mkdir(parents=True, exist_ok=True)
        stale.write_text("left over by a crashed instance")
    neighbour = cfg.registry_dir / "other-driver.example.com-reg.sock"
    neighbour.write_text("another plugin's socket")
    server = PluginServer(cfg, claims=FakeClaims(), backend=ScriptedBackend())
    await server.start()
    assert cfg.registration_socket.is_socket() and cfg.dra_socket.is_socket()
    await server.stop()
    assert not cfg.registration_socket.exists() and not cfg.dra_socket.exists()
    assert neighbour.read_text() == "another plugin's socket"


async def test_vanished_registration_socket_is_recreated(
    running: tuple[PluginServer, FakeClaims, ScriptedBackend],
) -> None:
    server, _, _ = running
    server.config.registration_socket.unlink()
    for _ in range(100):
        await asyncio.sleep(0.05)
        if server.config.registration_socket.exists():
            break
    async with grpc.aio.insecure_channel(f"unix://{server.config.registration_socket}") as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest(), timeout=5)
        assert info.name == DRIVER


async def test_persistent_rejection_stops_the_plugin_with_status_1(short_tmp: Path) -> None:
    cfg: PluginConfig = make_config(short_tmp, registration_timeout=0.5)
    server = PluginServer(cfg, claims=FakeClaims(), backend=ScriptedBackend())
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix://{cfg.registration_socket}") as channel:
            await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                reg_pb2.RegistrationStatus(plugin_registered=False, error="version not supported")
            )
        await asyncio.wait_for(server.stopped.wait(), 10)
        assert server.exit_code == 1
    finally:
        await server.stop()


async def test_too_long_socket_path_is_a_clear_error(short_tmp: Path) -> None:
    cfg = make_config(short_tmp, plugin_dir=short_tmp / ("x" * 120))
    with pytest.raises(PluginError, match="unix socket allows; pass a shorter --plugin-dir"):
        await PluginServer(cfg, claims=FakeClaims(), backend=ScriptedBackend()).start()
