"""The API test server as a real process, a tiny fake DRA plugin on unix sockets, and the
stand-in cluster running in the test's event loop."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from dra_driver.plugin.prepare_errors import attach_failure
from dra_driver.proto.dra_v1 import api_pb2 as dra_v1
from dra_driver.proto.dra_v1 import api_pb2_grpc as dra_v1_grpc
from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc
from fabric_dra_testbed.stack import Stack
from manager_api.errors import DeviceBusy
from plumbing.kube import KubeClient, KubeConfig

DRIVER = "fabric-dra.io"


@pytest.fixture(scope="session")
def apiserver_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API test server (kube_standin.apiserver), schemas of Kubernetes 1.34, the feature gates
    of a default 1.36 server (binding conditions and device taints on), answering requests
    without a token too (the stand-in cluster and ``explain`` here connect without one)."""
    root = tmp_path_factory.mktemp("apiserver")
    with Stack(root, logs_dir=root) as stack:
        server = stack.apiserver(
            root=root,
            validate_versions="1.34",
            extra_args=["--allow-anonymous", "--server-version", "1.36.2"],
        )
        yield server.url


@pytest.fixture
async def kube(apiserver_url: str) -> AsyncIterator[KubeClient]:
    async with KubeClient(KubeConfig(server=apiserver_url)) as client:
        yield client


@dataclass
class FakePlugin:
    """A DRA plugin that records calls; ``prepare_error`` makes every prepare fail with it.

    With ``fabric`` (claim UID → the node its device is bound to, shared by the plugins of
    several nodes) it binds a claim's device to the first node that prepares it, as the fabric
    does, and answers a prepare on any other node with the real plugin's message for that."""

    registry_dir: Path
    plugin_dir: Path
    prepared: list[str] = field(default_factory=list)
    unprepared: list[str] = field(default_factory=list)
    prepare_error: str = ""
    fabric: dict[str, str] | None = None
    #: the node this plugin serves; set by the stand-in cluster's set-up
    node: str = ""
    #: what the real plugin does at prepare time: attach the claim's devices; an error to answer, or ""
    attach: Callable[[dra_v1.Claim, str], Awaitable[str]] | None = None


class _Registration(reg_grpc.RegistrationServicer):
    def __init__(self, plugin: FakePlugin) -> None:
        self.plugin = plugin

    async def GetInfo(self, request: reg.InfoRequest, context: object) -> reg.PluginInfo:
        return reg.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint=str(self.plugin.plugin_dir / "dra.sock"),
            supported_versions=["v1.DRAPlugin"],
        )

    async def NotifyRegistrationStatus(
        self, request: reg.RegistrationStatus, context: object
    ) -> reg.RegistrationStatusResponse:
        return reg.RegistrationStatusResponse()


class _Dra(dra_v1_grpc.DRAPluginServicer):
    def __init__(self, plugin: FakePlugin) -> None:
        self.plugin = plugin

    async def NodePrepareResources(
        self, request: dra_v1.NodePrepareResourcesRequest, context: object
    ) -> dra_v1.NodePrepareResourcesResponse:
        response = dra_v1.NodePrepareResourcesResponse()
        for claim in request.claims:
            if self.plugin.prepare_error:
                response.claims[claim.uid].error = self.plugin.prepare_error
                continue
            if self.plugin.attach is not None and (
                error := await self.plugin.attach(claim, self.plugin.node)
            ):
                response.claims[claim.uid].error = error
                continue
            fabric, node = self.plugin.fabric, self.plugin.node
            holder = fabric.setdefault(claim.uid, node) if fabric is not None else node
            if holder != node:
                busy = DeviceBusy(
                    "device d is bound to another node", device="d", held_by=f"{holder}/{claim.uid}"
                )
                response.claims[claim.uid].error = attach_failure(busy, "d", node, claim.uid)
                continue
            self.plugin.prepared.append(claim.uid)
            response.claims[claim.uid].devices.append(
                dra_v1.Device(
                    pool_name="p", device_name="d", cdi_device_ids=[f"k8s.fabric-dra.io/gpu={claim.uid}"]
                )
            )
        return response

    async def NodeUnprepareResources(
        self, request: dra_v1.NodeUnprepareResourcesRequest, context: object
    ) -> dra_v1.NodeUnprepareResourcesResponse:
        response = dra_v1.NodeUnprepareResourcesResponse()
        for claim in request.claims:
            self.plugin.unprepared.append(claim.uid)
            response.claims[claim.uid].error = ""
        return response


@pytest.fixture
async def fake_plugin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FakePlugin]:
    async with serve_fake_plugin(Path(tmp_path_factory.mktemp("node"))) as plugin:
        yield plugin


@pytest.fixture
async def second_fake_plugin(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FakePlugin]:
    async with serve_fake_plugin(Path(tmp_path_factory.mktemp("node"))) as plugin:
        yield plugin


@contextlib.asynccontextmanager
async def serve_fake_plugin(base: Path) -> AsyncIterator[FakePlugin]:
    plugin = FakePlugin(base / "registry", base / "plugin")
    plugin.registry_dir.mkdir()
    plugin.plugin_dir.mkdir()
    registration = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(_Registration(plugin), registration)
    registration.add_insecure_port(f"unix://{plugin.registry_dir / (DRIVER + '-reg.sock')}")
    dra = grpc.aio.server()
    dra_v1_grpc.add_DRAPluginServicer_to_server(_Dra(plugin), dra)
    dra.add_insecure_port(f"unix://{plugin.plugin_dir / 'dra.sock'}")
    await registration.start()
    await dra.start()
    try:
        yield plugin
    finally:
        await registration.stop(None)
        await dra.stop(None)
