"""The kubelet-protocol client against a tiny DRA plugin served here on real unix sockets."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from dra_driver.proto.dra_v1 import api_pb2 as v1_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as v1_grpc
from dra_driver.proto.dra_v1beta1 import api_pb2 as v1beta1_pb2
from dra_driver.proto.dra_v1beta1 import api_pb2_grpc as v1beta1_grpc
from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from kube_standin.kubelet_client import ClaimRef, DraCallError, PluginManager
from tests.support.kubelet import kubelet, running_kubelet, socket_dir
from tests.support.waiting import eventually

__all__ = ["kubelet", "socket_dir"]

Ctx = Any


@dataclass
class TinyPlugin:
    """A DRA plugin of a few lines: registration, both DRA versions, health; records every call."""

    root: Path
    driver: str = "tiny.example.com"
    plugin_type: str = "DRAPlugin"
    versions: Sequence[str] = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
    endpoint_override: str | None = None
    prepare_delay: float = 0.0
    fail_claims: set[str] = field(default_factory=set)
    skip_claims: set[str] = field(default_factory=set)
    notifications: list[tuple[bool, str]] = field(default_factory=list)
    calls: list[tuple[str, str, list[tuple[str, str, str]]]] = field(default_factory=list)
    health: asyncio.Queue[list[tuple[str, str, health_pb2.HealthStatus.ValueType]]] = field(
        default_factory=asyncio.Queue
    )
    server: grpc.aio.Server | None = None

    @property
    def registration_socket(self) -> Path:
        return self.root / "plugins_registry" / f"{self.driver}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        return self.root / "plugins" / self.driver / "dra.sock"

    async def start(self) -> TinyPlugin:
        self.registration_socket.parent.mkdir(parents=True, exist_ok=True)
        self.dra_socket.parent.mkdir(parents=True, exist_ok=True)
        plugin = self
        server = grpc.aio.server()

        class Registration(reg_grpc.RegistrationServicer):
            async def GetInfo(self, request: Any, context: Ctx) -> reg_pb2.PluginInfo:
                endpoint = (
                    plugin.endpoint_override
                    if plugin.endpoint_override is not None
                    else str(plugin.dra_socket)
                )
                return reg_pb2.PluginInfo(
                    type=plugin.plugin_type,
                    name=plugin.driver,
                    endpoint=endpoint,
                    supported_versions=plugin.versions,
                )

            async def NotifyRegistrationStatus(
                self, request: Any, context: Ctx
            ) -> reg_pb2.RegistrationStatusResponse:
                plugin.notifications.append((request.plugin_registered, request.error))
                return reg_pb2.RegistrationStatusResponse()

        def servicer(version: str, pb: Any) -> Any:
            class DRA:
                async def NodePrepareResources(self, request: Any, context: Ctx) -> Any:
                    plugin.calls.append(
                        (version, "prepare", [(c.namespace, c.name, c.uid) for c in request.claims])
                    )
                    if plugin.prepare_delay:
                        await asyncio.sleep(plugin.prepare_delay)
                    response = pb.NodePrepareResourcesResponse()
                    for claim in request.claims:
                        if claim.uid in plugin.skip_claims:
                            continue
                        answer = response.claims[claim.uid]
                        if claim.uid in plugin.fail_claims:
                            answer.error = "device busy, try again"
                        else:
                            answer.devices.append(
                                pb.Device(
                                    request_names=["gpu"],
                                    pool_name="pool-a",
                                    device_name=f"dev-{claim.name}",
                                    cdi_device_ids=[f"k8s.tiny.example.com/gpu={claim.uid}"],
                                )
                            )
                    return response

                async def NodeUnprepareResources(self, request: Any, context: Ctx) -> Any:
                    plugin.calls.append(
                        (version, "unprepare", [(c.namespace, c.name, c.uid) for c in request.claims])
                    )
                    response = pb.NodeUnprepareResourcesResponse()
                    for claim in request.claims:
                        response.claims[claim.uid].error = (
                            "still busy" if claim.uid in plugin.fail_claims else ""
                        )
                    return response

            return DRA()

        class Health(health_grpc.DRAResourceHealthServicer):
            async def NodeWatchResources(self, request: Any, context: Ctx) -> AsyncIterator[Any]:
                while True:
                    batch = await plugin.health.get()
                    yield health_pb2.NodeWatchResourcesResponse(
                        devices=[
                            health_pb2.DeviceHealth(
                                device=health_pb2.DeviceIdentifier(pool_name=pool, device_name=device),
                                health=state,
                                last_updated_time=1,
                            )
                            for pool, device, state in batch
                        ]
                    )

        reg_grpc.add_RegistrationServicer_to_server(Registration(), server)
        v1_grpc.add_DRAPluginServicer_to_server(servicer("v1", v1_pb2), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(servicer("v1beta1", v1beta1_pb2), server)
        health_grpc.add_DRAResourceHealthServicer_to_server(Health(), server)
        # Like a real plugin: the DRA socket first, the registration socket last.
        server.add_insecure_port(f"unix://{self.dra_socket}")
        server.add_insecure_port(f"unix://{self.registration_socket}")
        await server.start()
        self.server = server
        return self

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)
            self.server = None
        for path in (self.registration_socket, self.dra_socket):
            path.unlink(missing_ok=True)


CLAIM_A = ClaimRef("team-a", "claim-a", "3f1d2c4e-0000-4000-8000-00000000000a")
CLAIM_B = ClaimRef("team-a", "claim-b", "3f1d2c4e-0000-4000-8000-00000000000b")


async def test_registers_and_prepares_over_v1(kubelet: PluginManager, socket_dir: Path) -> None:
    plugin = await TinyPlugin(socket_dir).start()
    try:
        client = await kubelet.wait_for_plugin(plugin.driver, within=10)
        assert client.chosen_service == "v1.DRAPlugin"
        assert plugin.notifications == [(True, "")]
        results = await client.prepare([CLAIM_A, CLAIM_B])
        assert results[CLAIM_A.uid].devices[0].cdi_device_ids == (f"k8s.tiny.example.com/gpu={CLAIM_A.uid}",)
        assert results[CLAIM_B.uid].devices[0].device == "dev-claim-b"
        await client.unprepare([CLAIM_A, CLAIM_B])
        # The kubelet sends nothing but namespace, name and UID.
        assert plugin.calls == [
            ("v1", "prepare", [("team-a", "claim-a", CLAIM_A.uid), ("team-a", "claim-b", CLAIM_B.uid)]),
            ("v1", "unprepare", [("team-a", "claim-a", CLAIM_A.uid), ("team-a", "claim-b", CLAIM_B.uid)]),
        ]
    finally:
        await plugin.stop()


async def test_a_v1beta1_only_plugin_is_called_over_v1beta1(kubelet: PluginManager, socket_dir: Path) -> None:
    plugin = await TinyPlugin(socket_dir, versions=["v1beta1.DRAPlugin"]).start()
    try:
        client = await kubelet.wait_for_plugin(plugin.driver, within=10)
        assert client.chosen_service == "v1beta1.DRAPlugin"
        results = await client.prepare([CLAIM_A])
        assert results[CLAIM_A.uid].ok
        assert [c[0] for c in plugin.calls] == ["v1beta1"]
    finally:
        await plugin.stop()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"plugin_type": "CSIPlugin"}, "no handler registered for plugin type: CSIPlugin"),
        (
            {"versions": ["v1alpha4.Node"]},
            "plugin validation failed with err: invalid supported gRPC versions",
        ),
        ({"versions": []}, "empty list of supported gRPC services"),
    ],
)
async def test_an_invalid_plugin_is_told_why(
    kubelet: PluginManager, socket_dir: Path, overrides: dict[str, Any], expected: str
) -> None:
    plugin = await TinyPlugin(socket_dir, **overrides).start()
    try:
        await eventually(lambda: len(plugin.notifications) >= 2, what="a retried rejection", within=10)
        registered, error = plugin.notifications[0]
        assert not registered
        assert expected in error
        assert kubelet.plugin(plugin.driver) is None
        assert all(expected in a.error for a in kubelet.attempts if not a.registered), kubelet.attempts
    finally:
        await plugin.stop()


async def test_claim_errors_deadlines_and_omissions_fail_the_call(
    kubelet: PluginManager, socket_dir: Path
) -> None:
    plugin = await TinyPlugin(socket_dir, fail_claims={CLAIM_B.uid}, skip_claims=set()).start()
    try:
        client = await kubelet.wait_for_plugin(plugin.driver, within=10)
        raw = await client.node_prepare_resources([CLAIM_A, CLAIM_B])
        assert raw[CLAIM_A.uid].ok and raw[CLAIM_B.uid].error == "device busy, try again"
        with pytest.raises(
            DraCallError, match="NodePrepareResources failed for claim team-a/claim-b: device busy"
        ):
            await client.prepare([CLAIM_A, CLAIM_B])
        with pytest.raises(
            DraCallError, match="NodeUnprepareResources failed for claim team-a/claim-b: still busy"
        ):
            await client.unprepare([CLAIM_B])
        plugin.fail_claims.clear()
        plugin.skip_claims.add(CLAIM_B.uid)
        with pytest.raises(DraCallError, match="left out 1 claims"):
            await client.prepare([CLAIM_A, CLAIM_B])
        plugin.prepare_delay = 2.0
        with pytest.raises(DraCallError) as failure:
            await client.prepare([CLAIM_A], deadline=0.2)
        assert failure.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
    finally:
        await plugin.stop()


async def test_removed_and_recreated_sockets_deregister_and_register_again(
    kubelet: PluginManager, socket_dir: Path
) -> None:
    plugin = await TinyPlugin(socket_dir).start()
    await kubelet.wait_for_plugin(plugin.driver, within=10)
    await plugin.stop()
    await eventually(lambda: kubelet.plugin(plugin.driver) is None, what="deregistration", within=10)
    await plugin.start()
    client = await kubelet.wait_for_plugin(plugin.driver, within=10)
    try:
        assert (await client.prepare([CLAIM_A]))[CLAIM_A.uid].ok
        assert [ok for ok, _ in plugin.notifications] == [True, True]
    finally:
        await plugin.stop()


async def test_health_stream_is_followed(kubelet: PluginManager, socket_dir: Path) -> None:
    plugin = await TinyPlugin(socket_dir).start()
    try:
        await kubelet.wait_for_plugin(plugin.driver, within=10)
        await plugin.health.put(
            [("pool-a", "gpu-0", health_pb2.HEALTHY), ("pool-a", "gpu-1", health_pb2.UNHEALTHY)]
        )
        await eventually(lambda: len(kubelet.health) == 2, what="two health reports", within=10)
        assert kubelet.health[(plugin.driver, "pool-a", "gpu-1")].health == "Unhealthy"
        await plugin.health.put([("pool-a", "gpu-1", health_pb2.HEALTHY)])
        await eventually(
            lambda: kubelet.health[(plugin.driver, "pool-a", "gpu-1")].health == "Healthy",
            what="recovery",
            within=10,
        )
    finally:
        await plugin.stop()


async def test_claims_go_only_to_the_drivers_they_are_allocated_to(socket_dir: Path) -> None:
    ours = TinyPlugin(socket_dir, driver="ours.example.com")
    theirs = TinyPlugin(socket_dir, driver="theirs.example.com")
    await ours.start()
    await theirs.start()

    def claim(ref: ClaimRef, drivers: list[str]) -> dict[str, Any]:
        results = [{"request": "r", "driver": d, "pool": "p", "device": "d"} for d in drivers]
        return {
            "metadata": {"namespace": ref.namespace, "name": ref.name, "uid": ref.uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    try:
        async with running_kubelet(socket_dir / "plugins_registry", watch_health=False) as manager:
            await manager.wait_for_plugin("ours.example.com", within=10)
            await manager.wait_for_plugin("theirs.example.com", within=10)
            results = await manager.prepare_claims(
                [
                    claim(CLAIM_A, ["ours.example.com"]),
                    claim(CLAIM_B, ["theirs.example.com", "ours.example.com"]),
                ]
            )
        assert set(results[CLAIM_A.uid]) == {"ours.example.com"}
        assert set(results[CLAIM_B.uid]) == {"ours.example.com", "theirs.example.com"}
        assert [names for _, _, names in ours.calls] == [
            [("team-a", "claim-a", CLAIM_A.uid), ("team-a", "claim-b", CLAIM_B.uid)]
        ]
        assert [names for _, _, names in theirs.calls] == [[("team-a", "claim-b", CLAIM_B.uid)]]
    finally:
        await ours.stop()
        await theirs.stop()


async def test_command_line_prepares_and_unprepares(socket_dir: Path) -> None:
    plugin = await TinyPlugin(socket_dir).start()
    base = [sys.executable, "-m", "kube_standin", "kubelet"]
    registry = ["--registry-dir", str(socket_dir / "plugins_registry"), "--driver", plugin.driver]
    claim = f"{CLAIM_A.namespace}/{CLAIM_A.name}/{CLAIM_A.uid}"

    async def run(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            *base, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=dict(os.environ)
        )
        out, err = await proc.communicate()
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    try:
        code, out, err = await run("prepare", *registry, "--claim", claim)
        assert code == 0, err
        answer = json.loads(out)
        assert answer["service"] == "v1.DRAPlugin"
        assert answer["claims"][CLAIM_A.uid]["devices"][0]["cdiDeviceIDs"] == [
            f"k8s.tiny.example.com/gpu={CLAIM_A.uid}"
        ]
        plugin.fail_claims.add(CLAIM_A.uid)
        code, out, _ = await run("unprepare", *registry, "--claim", claim)
        assert code == 1
        assert json.loads(out)["claims"][CLAIM_A.uid]["error"] == "still busy"
        code, out, _ = await run("info", str(plugin.registration_socket))
        assert json.loads(out)["supportedVersions"][0] == "v1.DRAPlugin"
        code, _, err = await run("prepare", *registry, "--claim", "not-a-claim")
        assert code == 1 and "expected NAMESPACE/NAME" in err and "Traceback" not in err
    finally:
        await plugin.stop()
