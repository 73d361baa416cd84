"""Claims with odd allocations sent to a real plugin through the kubelet-protocol client, with the
real emulator, manager and API test server behind it: results of other drivers, unknown devices
and pools, 32 results in one claim, admin access, duplicate results, a wrong UID, claims not
allocated, not reserved, or deleted while the plugin prepares them — and, drawn by Hypothesis,
mixtures of all of these.

Each claim gets a clear per-claim error or a correct result (exactly this driver's devices, each
with a CDI device), never a failed call; after the kubelet's unprepare nothing stays bound in the
fabric, no CDI spec and no checkpoint entry remain.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from hypothesis import given
from hypothesis import strategies as st

from dra_driver.plugin import cdi
from fabric_dra_testbed.stack import Role
from kube_standin.kubelet_client import ClaimRef, DRAPluginClient, PrepareResult
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device, DeviceType
from plumbing import procs
from plumbing.kube import KubeClient
from plumbing.kube.resources import RESOURCE_CLAIMS
from tests.fuzz.budget import fuzz_settings
from tests.support.kubelet import running_kubelet
from tests.support.plugin import DRIVER, PluginStack, short_dir, start_fabric

NAMESPACE = "default"
OTHER_DRIVER = "gpu.example.com"


@dataclass
class Odd:
    root: Path
    emulator: Role
    manager: Role
    stack: PluginStack
    devices: list[Device]  # free devices this node can have

    @property
    def node(self) -> str:
        return self.stack.node

    def bound(self) -> dict[str, str]:
        """Target → host, from the emulator's binding table (operations in flight included)."""
        table = httpx.get(f"{self.emulator.address}/redfish/v1/Oem/FabricDRA/Bindings", timeout=30).json()
        found = {b["Target"]: b["Host"] for b in table["Bindings"]}
        found.update({f"{t['Target']} ({t['Operation']})": t["Host"] for t in table["InFlight"]})
        return found


@pytest.fixture(scope="module")
def odd() -> Iterator[Odd]:
    root = short_dir("fdo-")
    topology = root / "topology.yaml"
    generated = procs.run(
        [
            *("emulator", "topology", "generate", "--hosts", "2"),
            *("--gpus", "24", "--nvme", "6", "--nics", "2", "--fpgas", "2", "--cxl-devices", "1"),
            *("--chunks", "4", "--output-file", str(topology)),
        ]
    )
    assert generated.returncode == 0, generated.stderr
    fabric = start_fabric(root, topology=topology)
    try:

        async def discover() -> tuple[str, str, list[Device]]:
            async with ManagerClient(fabric.manager.address) as client:
                node = next(n for n in await client.nodes() if n.pools)
                devices = [
                    d
                    for d in await client.devices()
                    if d.pool in node.pools
                    and d.state is BindingState.FREE
                    and d.type is not DeviceType.OTHER
                ]
            return node.name, node.host, devices

        node, host, devices = asyncio.run(discover())
        (root / "k").mkdir()
        stack = PluginStack(
            root / "k",
            node=node,
            backend="fabric",
            manager_url=fabric.manager.address,
            sysfs_root=fabric.sysfs_root(host),
        )
        with stack:
            yield Odd(root, fabric.emulator, fabric.manager, stack, devices)
    finally:
        fabric.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture
async def plugin(odd: Odd) -> AsyncIterator[DRAPluginClient]:
    async with running_kubelet(odd.stack.registry_dir, watch_health=False) as kubelet:
        yield await kubelet.wait_for_plugin(DRIVER, within=60)


@pytest_asyncio.fixture
async def kube(odd: Odd) -> AsyncIterator[KubeClient]:
    async with odd.stack.kube() as client:
        yield client


async def make_claim(
    kube: KubeClient,
    odd: Odd,
    results: Sequence[dict[str, Any]],
    *,
    allocated: bool = True,
    reserved: bool = True,
) -> ClaimRef:
    """A ResourceClaim whose status says exactly ``results`` (each {request, driver, pool, device,
    adminAccess?}); the API test server validates it as a real one would."""
    name = f"odd-{uuid.uuid4().hex[:10]}"
    requests = sorted({r["request"] for r in results}) or ["r0"]
    admin = {r["request"] for r in results if r.get("adminAccess")}
    created = await kube.create(
        RESOURCE_CLAIMS,
        {
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "devices": {
                    "requests": [
                        {
                            "name": r,
                            "exactly": {
                                "deviceClassName": "cohdi-pcie-device",
                                **({"adminAccess": True} if r in admin else {}),
                            },
                        }
                        for r in requests
                    ]
                }
            },
        },
        NAMESPACE,
    )
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {
            "devices": {"results": list(results)},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [odd.node]}]}
                ]
            },
        }
        if reserved:
            status["reservedFor"] = [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}]
    if status:
        created["status"] = status
        created = await kube.replace(RESOURCE_CLAIMS, created, subresource="status")
    return ClaimRef(NAMESPACE, name, created["metadata"]["uid"])


def ours(device: Device, request: str = "r0") -> dict[str, Any]:
    return {"request": request, "driver": DRIVER, "pool": device.pool, "device": device.name}


async def prepare_then_unprepare(
    plugin: DRAPluginClient, odd: Odd, ref: ClaimRef, wanted: set[tuple[str, str]]
) -> PrepareResult:
    """One prepare: a clear error or exactly ``wanted`` ((pool, device)) with CDI devices; then
    the kubelet's unprepare leaves nothing behind."""
    try:
        (result,) = (await plugin.node_prepare_resources([ref])).values()
        if result.error:
            assert ref.name in result.error or "ResourceClaim" in result.error, result.error
            assert "failed unexpectedly" not in result.error and "Error(" not in result.error, result.error
        else:
            assert {(d.pool, d.device) for d in result.devices} == wanted
            assert all(len(d.cdi_device_ids) == 1 for d in result.devices)
            names = {d.device for d in result.devices}
            assert {n for n, h in odd.bound().items() if n in names} == names
    finally:  # as the kubelet does when the pod goes, whatever happened
        errors = await plugin.node_unprepare_resources([ref])
    assert errors == {ref.uid: ""}
    await assert_nothing_left(odd, ref)
    return result


async def assert_nothing_left(odd: Odd, ref: ClaimRef) -> None:
    assert odd.bound() == {}, odd.bound()
    assert cdi.spec_files_of_claim(odd.stack.cdi_root, DRIVER, ref.uid) == []
    checkpoint = odd.stack.plugin_dir / "checkpoint.json"
    if checkpoint.exists():
        assert ref.uid not in json.loads(checkpoint.read_text())["data"]["claims"]


# -- one of each ---------------------------------------------------------------------------------


async def test_results_of_other_drivers_are_left_alone(
    odd: Odd, plugin: DRAPluginClient, kube: KubeClient
) -> None:
    gpu = odd.devices[0]
    only_other = await make_claim(
        kube, odd, [{"request": "r0", "driver": OTHER_DRIVER, "pool": "p", "device": "x"}]
    )
    result = await prepare_then_unprepare(plugin, odd, only_other, set())
    assert result.ok and result.devices == ()
    mixed = await make_claim(
        kube,
        odd,
        [ours(gpu), {"request": "r1", "driver": OTHER_DRIVER, "pool": gpu.pool, "device": gpu.name}],
    )
    result = await prepare_then_unprepare(plugin, odd, mixed, {(gpu.pool, gpu.name)})
    assert result.ok


async def test_an_unknown_device_is_a_clear_error(
    odd: Odd, plugin: DRAPluginClient, kube: KubeClient
) -> None:
    ref = await make_claim(
        kube, odd, [{"request": "r0", "driver": DRIVER, "pool": "fabric-pcie", "device": "gpu999"}]
    )
    result = await prepare_then_unprepare(plugin, odd, ref, set())
    assert "gpu999" in result.error


async def test_a_device_in_an_unknown_pool_is_a_clear_error(
    odd: Odd, plugin: DRAPluginClient, kube: KubeClient
) -> None:
    gpu = odd.devices[0]
    ref = await make_claim(
        kube, odd, [{"request": "r0", "driver": DRIVER, "pool": "no-such-pool", "device": gpu.name}]
    )
    result = await prepare_then_unprepare(plugin, odd, ref, set())
    assert "no-such-pool" in result.error


async def test_thirty_two_results_in_one_claim(odd: Odd, plugin: DRAPluginClient, kube: KubeClient) -> None:
    devices = odd.devices[:32]
    assert len(devices) == 32
    ref = await make_claim(kube, odd, [ours(d, f"r{i}") for i, d in enumerate(devices)])
    result = await prepare_then_unprepare(plugin, odd, ref, {(d.pool, d.name) for d in devices})
    assert result.ok, result.error


async def test_admin_access_is_refused(odd: Odd, plugin: DRAPluginClient, kube: KubeClient) -> None:
    ref = await make_claim(kube, odd, [{**ours(odd.devices[0]), "adminAccess": True}])
    result = await prepare_then_unprepare(plugin, odd, ref, set())
    assert "admin access" in result.error


async def test_one_device_twice_is_one_device_for_both_requests(
    odd: Odd, plugin: DRAPluginClient, kube: KubeClient
) -> None:
    gpu = odd.devices[0]
    ref = await make_claim(kube, odd, [ours(gpu, "a"), ours(gpu, "b")])
    (result,) = (await plugin.node_prepare_resources([ref])).values()
    assert result.ok, result.error
    (device,) = result.devices
    assert sorted(device.request_names) == ["a", "b"]
    assert await plugin.node_unprepare_resources([ref]) == {ref.uid: ""}
    await assert_nothing_left(odd, ref)


async def test_wrong_uid_unallocated_and_unreserved_claims_are_clear_errors(
    odd: Odd, plugin: DRAPluginClient, kube: KubeClient
) -> None:
    gpu = odd.devices[0]
    real = await make_claim(kube, odd, [ours(gpu)])
    wrong = ClaimRef(real.namespace, real.name, str(uuid.uuid4()))
    assert "replaced" in (await prepare_then_unprepare(plugin, odd, wrong, set())).error
    unallocated = await make_claim(kube, odd, [ours(gpu)], allocated=False)
    assert "not allocated" in (await prepare_then_unprepare(plugin, odd, unallocated, set())).error
    unreserved = await make_claim(kube, odd, [ours(gpu)], reserved=False)
    assert "not reserved" in (await prepare_then_unprepare(plugin, odd, unreserved, set())).error
    missing = ClaimRef(NAMESPACE, "never-created", str(uuid.uuid4()))
    assert "deleted" in (await prepare_then_unprepare(plugin, odd, missing, set())).error


@pytest.mark.parametrize("delay", [0.0, 0.005, 0.02, 0.05])
async def test_a_claim_deleted_while_it_is_prepared(
    odd: Odd, plugin: DRAPluginClient, kube: KubeClient, delay: float
) -> None:
    devices = odd.devices[:3]
    ref = await make_claim(kube, odd, [ours(d, f"r{i}") for i, d in enumerate(devices)])

    async def delete() -> None:
        await asyncio.sleep(delay)
        await kube.delete(RESOURCE_CLAIMS, ref.name, NAMESPACE)

    answers, _ = await asyncio.gather(plugin.node_prepare_resources([ref]), delete())
    result = answers[ref.uid]
    if result.error:
        assert "deleted" in result.error or ref.name in result.error, result.error
    else:
        assert {d.device for d in result.devices} == {d.name for d in devices}
    assert await plugin.node_unprepare_resources([ref]) == {ref.uid: ""}
    await assert_nothing_left(odd, ref)


# -- mixtures ------------------------------------------------------------------------------------


@st.composite
def mixtures(draw: st.DrawFn, devices: list[Device]) -> list[dict[str, Any]]:
    results = []
    for index in range(draw(st.integers(1, 6))):
        kind = draw(
            st.sampled_from(
                ["ours", "ours", "ours", "other-driver", "unknown-device", "unknown-pool", "admin"]
            )
        )
        device = draw(st.sampled_from(devices[:8]))
        request = draw(st.sampled_from([f"r{index}", "r0"]))
        result = ours(device, request)
        if kind == "other-driver":
            result["driver"] = OTHER_DRIVER
        elif kind == "unknown-device":
            result["device"] = f"{device.name}-gone"
        elif kind == "unknown-pool":
            result["pool"] = "no-such-pool"
        elif kind == "admin":
            result["adminAccess"] = True
        results.append(result)
    return results


def test_mixtures_of_odd_results(odd: Odd) -> None:
    """Two claims at once, each a random mixture: each claim is answered on its own."""

    @given(first=mixtures(odd.devices), second=mixtures(odd.devices))
    @fuzz_settings(12)
    def run(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> None:
        asyncio.run(scenario(first, second))

    async def scenario(first: list[dict[str, Any]], second: list[dict[str, Any]]) -> None:
        async with (
            odd.stack.kube() as kube,
            running_kubelet(odd.stack.registry_dir, watch_health=False) as kubelet,
        ):
            plugin = await kubelet.wait_for_plugin(DRIVER, within=60)
            refs = [await make_claim(kube, odd, results) for results in (first, second)]
            answers = await plugin.node_prepare_resources(refs)
            assert set(answers) == {r.uid for r in refs}
            for ref, results in zip(refs, (first, second), strict=True):
                answer = answers[ref.uid]
                mine = {(r["pool"], r["device"]) for r in results if r["driver"] == DRIVER}
                if answer.error:
                    assert ref.name in answer.error or "ResourceClaim" in answer.error, answer.error
                    assert "failed unexpectedly" not in answer.error and "Error(" not in answer.error
                else:
                    assert {(d.pool, d.device) for d in answer.devices} == mine
                    assert not any(r.get("adminAccess") for r in results if r["driver"] == DRIVER)
            assert await plugin.node_unprepare_resources(refs) == {r.uid: "" for r in refs}
            for ref in refs:
                await assert_nothing_left(odd, ref)

    run()
