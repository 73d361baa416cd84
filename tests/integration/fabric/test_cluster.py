"""The manager in a cluster: TokenReview-based authorisation, nodes matched by system UUID, two
replicas with a Lease-elected leader and a ConfigMap ledger, and fail-over after kill -9.

The Kubernetes API is the API test server (a real process); the fabric is the TLS emulator.
Node objects get names that differ from the Redfish hosts, so the match must come from
``status.nodeInfo.systemUUID`` = ComputerSystem ``UUID``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabric.state.ledger import ConfigMapLedgerStore, Ledger, LedgerEntry, LedgerState, shard_of
from fabric_dra_testbed.stack import Role
from kube_standin.apiserver.auth import TokenUser
from manager_api.client import ManagerClient
from manager_api.errors import DeviceBusy, NotLeader, PermissionDenied, Unauthenticated
from manager_api.models import AttachmentState, BindingState
from plumbing import procs
from plumbing.kube.client import KubeClient
from plumbing.kube.resources import LEASES, NAMESPACES, NODES, RESOURCE_CLAIMS
from tests.integration.fabric.conftest import (
    FabricAdmin,
    allocated_claim,
    assert_no_secrets,
    leader_of,
    manager_args,
)
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.fabric_manager import start_manager
from tests.support.uids import claim_uid

pytestmark = pytest.mark.slow(seconds=38)

NAMESPACE = "fabric-dra"
AUDIENCE = "fabric-dra-manager"
#: Kubernetes node name → the Redfish host (ComputerSystem) whose UUID it carries
NODE_HOSTS = {"node-a": "kind-worker", "node-b": "kind-worker2", "node-c": "kind-worker3"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, fabric: FabricAdmin) -> Iterator[ApiServerProcess]:
    with start_apiserver(tmp_path_factory.mktemp("apiserver")) as server:
        asyncio.run(_populate(server, fabric))
        yield server


async def _populate(server: ApiServerProcess, fabric: FabricAdmin) -> None:
    async with server.client() as kube:
        await kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        for node, host in NODE_HOSTS.items():
            uuid = fabric.get(f"/redfish/v1/Systems/{host}")["UUID"]
            created = await kube.create(NODES, {"metadata": {"name": node}})
            created["status"] = {"nodeInfo": _node_info(uuid.upper())}
            await kube.replace(NODES, created, subresource="status")


def _node_info(system_uuid: str) -> dict[str, str]:
    return {
        "machineID": "0" * 32,
        "systemUUID": system_uuid,
        "bootID": "1" * 32,
        "kernelVersion": "6.8.0",
        "osImage": "Debian GNU/Linux 12",
        "containerRuntimeVersion": "containerd://1.7.0",
        "kubeletVersion": "v1.34.0",
        "kubeProxyVersion": "",
        "operatingSystem": "linux",
        "architecture": "amd64",
    }


def cluster_args(fabric: FabricAdmin, work: Path, cluster: ApiServerProcess, identity: str) -> list[str]:
    return manager_args(
        fabric,
        work,
        *("--kubeconfig", str(cluster.kubeconfig), "--namespace", NAMESPACE),
        *("--leader-elect", "--identity", identity, "--ledger", "configmap"),
        *("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"),
        *("--token-audience", AUDIENCE),
        tokens=False,
    )


async def test_tokenreview_roles_and_failover(
    cluster: ApiServerProcess, fabric: FabricAdmin, tmp_path: Path
) -> None:
    plugin_a = cluster.service_account_token(
        NAMESPACE, "fabric-dra-plugin", node="node-a", audiences=[AUDIENCE]
    )
    plugin_b = cluster.service_account_token(
        NAMESPACE, "fabric-dra-plugin", node="node-b", audiences=[AUDIENCE]
    )
    unbound = cluster.service_account_token(NAMESPACE, "fabric-dra-plugin", audiences=[AUDIENCE])
    controller = cluster.service_account_token(NAMESPACE, "fabric-dra-controller", audiences=[AUDIENCE])
    stranger = cluster.service_account_token("default", "default", node="node-a", audiences=[AUDIENCE])
    wrong_audience = cluster.service_account_token(
        NAMESPACE, "fabric-dra-plugin", node="node-a", audiences=["other"]
    )
    operator = cluster.add_token(TokenUser(username="ops@example.com", groups=["fabric-dra:operators"]))

    claim_x = await allocated_claim(cluster, "claim-x", "gpu3", "node-a")
    claim_other = await allocated_claim(cluster, "claim-other", "gpu3", "node-b")

    managers: dict[str, Role] = {}
    for name in ("replica-1", "replica-2"):
        work = tmp_path / name
        work.mkdir()
        managers[name] = start_manager(
            work, fabric.url, args=cluster_args(fabric, work, cluster, name), name=name, ready=False
        )
    try:
        leader = await leader_of(managers)
        follower = next(n for n in managers if n != leader)
        url = managers[leader].address

        async with ManagerClient(managers[follower].address, token=controller) as on_follower:
            with pytest.raises(NotLeader) as not_leader:
                await on_follower.inventory()
            assert not_leader.value.retry_after
        async with httpx.AsyncClient(timeout=5) as http:
            ready = await http.get(f"{managers[follower].address}/readyz")
        assert ready.status_code == 503 and "not the leader" in ready.json()["reason"]

        async with (
            ManagerClient(url, token=plugin_a) as a,
            ManagerClient(url, token=plugin_b) as b,
            ManagerClient(url, token=operator) as ops,
        ):
            nodes = {n.name: n.host for n in await a.nodes()}
            assert nodes == NODE_HOSTS  # matched by system UUID, not by name
            attachment = await a.attach("gpu3", "node-a", claim_x, wait_seconds=20)
            assert attachment.state == AttachmentState.ATTACHED
            assert fabric.bound_hosts() == {"gpu3": "kind-worker"}
            # node B's plugin cannot attach or detach for node A
            with pytest.raises(PermissionDenied, match=r"node node-b .* not for node node-a"):
                await b.attach("gpu2", "node-a", claim_uid("claim-y"))
            with pytest.raises(PermissionDenied):
                await b.detach("gpu3", "node-a", claim_x)
            # operators read, but do not attach
            assert any(d.name == "gpu3" for d in await ops.devices())
            with pytest.raises(PermissionDenied, match="read access only"):
                await ops.attach("gpu2", "node-a", claim_uid("claim-z"))
        for token, error, text in (
            (unbound, PermissionDenied, "not bound to a pod on a node"),
            (stranger, PermissionDenied, "no fabric-dra role"),
            (wrong_audience, Unauthenticated, "not valid"),
            ("not-a-token", Unauthenticated, "not valid"),
        ):
            async with ManagerClient(url, token=token) as caller:
                with pytest.raises(error, match=text):
                    await caller.attach("gpu2", "node-a", claim_uid("claim-q"))
        assert fabric.bound_hosts() == {"gpu3": "kind-worker"}

        # The leader dies without releasing its Lease; the follower takes over with the same ledger.
        managers[leader].kill()
        assert await leader_of({follower: managers[follower]}) == follower
        async with ManagerClient(managers[follower].address, token=plugin_a) as a:
            device = await a.device("gpu3")
            assert (device.state, device.claim_uid, device.node) == (BindingState.BOUND, claim_x, "node-a")
            async with ManagerClient(managers[follower].address, token=controller) as ctl:
                with pytest.raises(DeviceBusy, match=claim_x):
                    await ctl.attach("gpu3", "node-b", claim_other)
            detached = await a.detach("gpu3", "node-a", claim_x, wait_seconds=20)
            assert detached.state == AttachmentState.DETACHED
        assert fabric.bound_hosts() == {}

        async with cluster.client() as kube:
            await _check_cluster_objects(kube, follower)
    finally:
        for process in managers.values():
            process.stop()
    assert_no_secrets(
        [tmp_path / n / f"{n}.log" for n in managers],
        fabric.emulator.password,
        plugin_a,
        controller,
        operator,
    )


async def _check_cluster_objects(kube: KubeClient, leader: str) -> None:
    lease = await kube.get(LEASES, "fabric-dra-manager", NAMESPACE)
    assert lease["spec"]["holderIdentity"] == leader
    # The last detach's outcome is written after its answer (its intent was durable before).
    for _ in range(100):
        entries = await ConfigMapLedgerStore(
            kube, name="fabric-dra-manager-ledger", namespace=NAMESPACE
        ).load()
        if not entries:
            break
        await asyncio.sleep(0.05)
    assert entries == {}


def test_refuses_to_start_without_authentication(fabric: FabricAdmin, tmp_path: Path) -> None:
    result = procs.run(
        ["manager", "serve", "--redfish-url", fabric.url, *manager_args(fabric, tmp_path, tokens=False)]
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "fabric-dra: error: refusing to start without authentication: give --static-tokens FILE, or "
        "Kubernetes API access for TokenReview (--kubeconfig, or run in a pod), or --insecure-no-auth "
        "for local development"
    ]


async def test_devices_of_deleted_claims_are_detached(
    cluster: ApiServerProcess, fabric: FabricAdmin, tmp_path: Path
) -> None:
    controller = cluster.service_account_token(NAMESPACE, "fabric-dra-controller", audiences=[AUDIENCE])
    async with cluster.client() as kube:
        claim = await kube.create(
            RESOURCE_CLAIMS,
            {
                "metadata": {"name": "training", "namespace": "default"},
                "spec": {
                    "devices": {"requests": [{"name": "nvme", "exactly": {"deviceClassName": "fabric-nvme"}}]}
                },
            },
            "default",
        )
        # allocated to nvme0 and reserved for a pod: the claim explains that binding
        claim["status"] = {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": "nvme",
                            "driver": "fabric-dra.io",
                            "pool": "fabric-pcie",
                            "device": "nvme0",
                        }
                    ]
                }
            },
            "reservedFor": [{"resource": "pods", "name": "training-0", "uid": "6f1d1f0e-pod"}],
        }
        await kube.replace(RESOURCE_CLAIMS, claim, subresource="status")
    live_uid = claim["metadata"]["uid"]
    # attached while its claim exists, then the claim is deleted: an orphan
    deleted_uid = await allocated_claim(cluster, "a-claim-that-was-deleted", "nvme1")
    args = manager_args(
        fabric,
        tmp_path,
        *("--kubeconfig", str(cluster.kubeconfig), "--namespace", NAMESPACE, "--token-audience", AUDIENCE),
        *("--orphan-grace-seconds", "0.5", "--orphan-interval-seconds", "0.5"),
        *("--plugin-report-ttl-seconds", "0.5"),
        tokens=False,
    )
    manager = start_manager(tmp_path, fabric.url, args=args)
    try:
        async with ManagerClient(manager.address, token=controller) as client:
            await client.attach("nvme0", "node-c", live_uid, wait_seconds=20)
            await client.attach("nvme1", "node-c", deleted_uid, wait_seconds=20)
            assert fabric.bound_hosts() == {"nvme0": "kind-worker3", "nvme1": "kind-worker3"}
            async with cluster.client() as kube:
                await kube.delete(RESOURCE_CLAIMS, "a-claim-that-was-deleted", "default")
            deadline = time.monotonic() + 20
            while (await client.device("nvme1")).state != BindingState.FREE:
                assert time.monotonic() < deadline, "the orphaned device was not detached"
                await asyncio.sleep(0.2)
            assert fabric.bound_hosts() == {"nvme0": "kind-worker3"}  # its claim uses it: kept
            await client.detach("nvme0", "node-c", live_uid, wait_seconds=20)
        assert "detaching an orphaned binding" in manager.log_file.read_text()
    finally:
        manager.stop()


async def test_configmap_ledger_survives_a_deposed_leaders_late_write(cluster: ApiServerProcess) -> None:
    # devices whose entries share a shard (one ConfigMap): gpu0 and its neighbours
    gpu0, stale_only, mine_too, racer = [
        d for d in (f"gpu{i}" for i in range(10_000)) if shard_of(d) == shard_of("gpu0")
    ][:4]
    async with cluster.client() as kube:
        mine = ConfigMapLedgerStore(kube, name="ledger-conflict", namespace=NAMESPACE)
        ledger = Ledger(mine)
        await ledger.load()
        ledger.put(_entry(gpu0, claim_uid("claim-1")))
        await ledger.commit()
        # the previous leader's last write lands after this replica took over
        late = ConfigMapLedgerStore(kube, name="ledger-conflict", namespace=NAMESPACE)
        stale = await late.load()
        stale[stale_only] = _entry(stale_only, "stale")
        await late.save(stale, [stale_only])
        ledger.put(_entry(mine_too, claim_uid("claim-2")))
        await ledger.commit()  # conflicts once, then this replica's view wins
        reread = await ConfigMapLedgerStore(kube, name="ledger-conflict", namespace=NAMESPACE).load()
        assert sorted(reread) == sorted([gpu0, mine_too])
        # a replica writing now (a second conflict on the same write) makes this one step back
        racing = ConfigMapLedgerStore(kube, name="ledger-conflict", namespace=NAMESPACE)
        racing_view = await racing.load()
        real_get = kube.get

        async def get_then_race(*args: Any, **kwargs: Any) -> dict[str, Any]:
            current = await real_get(*args, **kwargs)
            await racing.save({**racing_view, racer: _entry(racer, "racing")}, [racer])
            return current

        await racing.save({**racing_view, racer: _entry(racer, "racing")}, [racer])
        kube.get = get_then_race  # type: ignore[method-assign]
        ledger.put(_entry(mine_too, claim_uid("claim-3")))
        with pytest.raises(NotLeader):
            await ledger.commit()


def _entry(device: str, claim: str) -> LedgerEntry:
    return LedgerEntry(
        device=device,
        device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
        node="node-a",
        host="kind-worker",
        claim_uid=claim,
        state=LedgerState.BOUND,
        operation_id="op-1",
    )
