"""The manager's ledger in a cluster whose API server enforces the real size limits (1 MiB of
ConfigMap data, etcd's 1.5 MiB object, 3 MiB bodies): one ConfigMap per entry holds ledgers far
beyond what one object could, the single ConfigMap of earlier releases is migrated at start
without losing or doubling a binding, and hostile attach requests (huge claim UIDs, one node
taking every device) are refused for that caller only.

The manager, the emulator and the API test server are real processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fabric.state.ledger import (
    LEDGER_LABEL,
    MIGRATED_ANNOTATION,
    ConfigMapLedgerStore,
    Ledger,
    LedgerDocument,
    LedgerEntry,
    LedgerState,
    shard_names,
    shard_of,
)
from manager_api.client import ManagerClient
from manager_api.errors import DeviceBusy, NodeBindingLimit
from manager_api.models import AttachmentState, BindingState
from plumbing.kube import Invalid
from plumbing.kube.client import KubeClient
from plumbing.kube.resources import CONFIGMAPS, NAMESPACES, NODES
from tests.integration.fabric.conftest import NODES as HOSTS
from tests.integration.fabric.conftest import FabricAdmin, allocated_claim, manager_args, plugin_token
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.fabric_manager import running_manager
from tests.support.uids import claim_uid

pytestmark = pytest.mark.slow(seconds=34)  # the migration test starts two managers

NAMESPACE = "fabric-dra"
LEDGER = "fabric-dra-manager-ledger"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    with start_apiserver(tmp_path_factory.mktemp("apiserver")) as server:

        async def populate() -> None:
            async with server.client() as kube:
                await kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
                for host in HOSTS:  # nodes named as their hosts: matched by name
                    await kube.create(NODES, {"metadata": {"name": host}})

        asyncio.run(populate())
        yield server


def _cluster_args(fabric: FabricAdmin, work: Path, cluster: ApiServerProcess, *extra: str) -> list[str]:
    return manager_args(
        fabric,
        work,
        *("--kubeconfig", str(cluster.kubeconfig), "--namespace", NAMESPACE, "--ledger", "configmap"),
        # the claims here are made up: no orphan reconciler to take their devices back
        *("--orphan-grace-seconds", "0"),
        *extra,
    )


async def _shards(kube: KubeClient, ledger: str = LEDGER) -> dict[str, dict[str, Any]]:
    """The ledger's ConfigMaps that exist, by name."""
    items, _ = await kube.list_all(CONFIGMAPS, NAMESPACE, label_selector=f"{LEDGER_LABEL}={ledger}")
    return {item["metadata"]["name"]: item for item in items}


async def _entries(kube: KubeClient) -> dict[str, LedgerEntry]:
    return await ConfigMapLedgerStore(kube, name=LEDGER, namespace=NAMESPACE).load()


def _entry(i: int, node: str = "kind-worker") -> LedgerEntry:
    return LedgerEntry(
        device=f"gpu{i}",
        device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/gpu{i}",
        node=node,
        host=node,
        claim_uid=claim_uid(f"claim-{i}"),
        state=LedgerState.BOUND,
        operation_id=f"op-{i:08d}",
    )


async def test_a_ledger_beyond_one_objects_limit_is_stored_and_read_back(cluster: ApiServerProcess) -> None:
    entries = {f"gpu{i}": _entry(i, node=f"node-{i % 50}") for i in range(6000)}
    async with cluster.client() as kube:
        # The single ConfigMap of earlier releases cannot hold it: the server refuses the write.
        legacy = LedgerDocument(entries=entries).model_dump_json(indent=1)
        assert len(legacy) > 2 << 20
        with pytest.raises(Invalid, match="may not be more than 1048576 bytes"):
            await kube.create(
                CONFIGMAPS,
                {"metadata": {"name": "too-big", "namespace": NAMESPACE}, "data": {"ledger.json": legacy}},
            )
        ledger = Ledger(ConfigMapLedgerStore(kube, name="big-ledger", namespace=NAMESPACE))
        await ledger.load()
        for entry in entries.values():
            ledger.put(entry.model_copy())
        await ledger.commit()
        reread = Ledger(ConfigMapLedgerStore(kube, name="big-ledger", namespace=NAMESPACE))
        await reread.load()
        assert {e.device: e.claim_uid for e in reread.entries()} == {
            d: e.claim_uid for d, e in entries.items()
        }
        shards = await _shards(kube, "big-ledger")
        assert sorted(shards) == list(shard_names("big-ledger"))
        sizes = [len(obj["data"]["ledger.json"]) for obj in shards.values()]
        assert max(sizes) < (1 << 20) // 4  # 6,000 entries fill a quarter of a shard at most
        # one change rewrites one shard
        reread.put(_entry(7, node="node-moved"))
        await reread.commit()
        after = await _shards(kube, "big-ledger")
        changed = [
            n
            for n in after
            if after[n]["metadata"]["resourceVersion"] != shards[n]["metadata"]["resourceVersion"]
        ]
        assert changed == [shard_names("big-ledger")[shard_of("gpu7")]]


async def test_the_single_configmap_of_earlier_releases_is_migrated_at_start(
    cluster: ApiServerProcess, fabric: FabricAdmin, tmp_path: Path
) -> None:
    args = _cluster_args(fabric, tmp_path, cluster)
    bindings = {
        "gpu0": ("kind-worker", await allocated_claim(cluster, "old-a", "gpu0", "kind-worker")),
        "nvme0": ("kind-worker2", await allocated_claim(cluster, "old-b", "nvme0", "kind-worker2")),
    }
    with running_manager(tmp_path, fabric.url, args=args, name="before") as manager:
        for device, (node, claim) in bindings.items():
            async with ManagerClient(manager.address, token=plugin_token(node)) as plugin:
                assert (
                    await plugin.attach(device, node, claim, wait_seconds=20)
                ).state == AttachmentState.ATTACHED
    assert fabric.bound_hosts() == {"gpu0": "kind-worker", "nvme0": "kind-worker2"}

    # Put the ledger back as an earlier release kept it: one ConfigMap holding every entry. The
    # shard of nvme0 stays, as after a crash half-way through a migration.
    async with cluster.client() as kube:
        entries = await _entries(kube)
        assert sorted(entries) == ["gpu0", "nvme0"]
        for name in await _shards(kube):
            if name != shard_names(LEDGER)[shard_of("nvme0")]:
                await kube.delete(CONFIGMAPS, name, NAMESPACE)
        assert sorted(await _entries(kube)) == ["nvme0"]
        legacy = LedgerDocument(entries=entries).model_dump_json(indent=1)
        await kube.create(
            CONFIGMAPS,
            {"metadata": {"name": LEDGER, "namespace": NAMESPACE}, "data": {"ledger.json": legacy}},
        )

    with running_manager(tmp_path, fabric.url, args=args, name="after") as manager:
        async with cluster.client() as kube:
            assert sorted(await _entries(kube)) == ["gpu0", "nvme0"]
            old = await kube.get(CONFIGMAPS, LEDGER, NAMESPACE)  # emptied, saying where its entries went
            assert LedgerDocument.model_validate_json(old["data"]["ledger.json"]).entries == {}
            assert old["metadata"]["annotations"][MIGRATED_ANNOTATION].startswith(f"configmaps {NAMESPACE}/")
        for device, (node, claim) in bindings.items():
            other = next(h for h in HOSTS if h != node)
            async with ManagerClient(manager.address, token=plugin_token(node)) as plugin:
                shown = await plugin.device(device)
                assert (shown.state, shown.node, shown.claim_uid) == (BindingState.BOUND, node, claim)
                again = await plugin.attach(device, node, claim, wait_seconds=20)  # idempotent
                assert again.state == AttachmentState.ATTACHED
            async with ManagerClient(manager.address, token=plugin_token(other)) as intruder:
                with pytest.raises(DeviceBusy, match=claim):
                    intruding = await allocated_claim(cluster, f"someone-else-{device}", device, other)
                    await intruder.attach(device, other, intruding, wait_seconds=5)
        assert fabric.bound_hosts() == {"gpu0": "kind-worker", "nvme0": "kind-worker2"}  # never twice
        for device, (node, claim) in bindings.items():
            async with ManagerClient(manager.address, token=plugin_token(node)) as plugin:
                await plugin.detach(device, node, claim, wait_seconds=20)
    assert "ledger migrated to its shards" in manager.log_file.read_text()
    assert fabric.bound_hosts() == {}


async def test_hostile_claim_uids_and_names_are_refused_in_one_line(
    cluster: ApiServerProcess, fabric: FabricAdmin, tmp_path: Path
) -> None:
    args = _cluster_args(fabric, tmp_path, cluster)
    with running_manager(tmp_path, fabric.url, args=args) as manager:
        headers = {"Authorization": f"Bearer {plugin_token('kind-worker')}"}
        async with httpx.AsyncClient(base_url=manager.address, headers=headers, timeout=60) as http:
            # A dozen 250 KB claim UIDs: refused before anything reaches the ledger.
            for i in range(12):
                huge = f"{i:02d}" + "x" * 250_000
                body = {"device": "gpu1", "node": "kind-worker", "claimUid": huge}
                refused = await http.post("/api/v1/attachments", json=body)
                # 422 from the UID check, or 413 from a body limit in front of it: refused either way
                assert refused.status_code in (413, 422), refused.text
                assert len(refused.content) < 1000
            for field, body in (
                ("body.claimUid", {"device": "gpu1", "node": "kind-worker", "claimUid": "u" * 37}),
                ("body.claimUid", {"device": "gpu1", "node": "kind-worker", "claimUid": "claim-1"}),
                ("body.node", {"device": "gpu1", "node": "N" * 300, "claimUid": claim_uid("a")}),
                ("body.device", {"device": "GPU_1", "node": "kind-worker", "claimUid": claim_uid("a")}),
            ):
                refused = await http.post("/api/v1/attachments", json=body)
                assert refused.status_code == 422, refused.text
                error = refused.json()
                assert error["code"] == "InvalidRequest" and field in error["message"]
                assert "\n" not in error["message"] and len(error["message"]) < 300
            detach = await http.delete(
                "/api/v1/attachments/gpu1", params={"claimUid": "x" * 1000, "node": "kind-worker"}
            )
            assert detach.status_code == 422 and "query.claimUid" in detach.json()["message"]
        async with cluster.client() as kube:
            assert await _entries(kube) == {}
        # every node still attaches
        async with ManagerClient(manager.address, token=plugin_token("kind-worker2")) as other:
            uid = await allocated_claim(cluster, "after-the-attack", "gpu1", "kind-worker2")
            assert (
                await other.attach("gpu1", "kind-worker2", uid, wait_seconds=20)
            ).state == AttachmentState.ATTACHED
            await other.detach("gpu1", "kind-worker2", uid, wait_seconds=20)


async def test_a_node_at_its_bound_is_refused_and_the_others_keep_attaching(
    cluster: ApiServerProcess, fabric: FabricAdmin, tmp_path: Path
) -> None:
    args = _cluster_args(fabric, tmp_path, cluster, "--max-bindings-per-node", "2")
    with running_manager(tmp_path, fabric.url, args=args) as manager:
        async with (
            ManagerClient(manager.address, token=plugin_token("kind-worker")) as greedy,
            ManagerClient(manager.address, token=plugin_token("kind-worker2")) as other,
        ):
            held = [
                (device, await allocated_claim(cluster, f"greedy-{i}", device, "kind-worker"))
                for i, device in enumerate(("gpu0", "gpu1", "gpu2", "gpu3"))
            ]
            for device, uid in held[:2]:
                assert (
                    await greedy.attach(device, "kind-worker", uid, wait_seconds=20)
                ).state == AttachmentState.ATTACHED
            with pytest.raises(NodeBindingLimit, match=r"node kind-worker holds 2 devices") as refused:
                await greedy.attach("gpu2", "kind-worker", held[2][1], wait_seconds=20)
            assert "\n" not in str(refused.value)
            mine = await allocated_claim(cluster, "other-0", "gpu2", "kind-worker2")
            assert (
                await other.attach("gpu2", "kind-worker2", mine, wait_seconds=20)
            ).state == AttachmentState.ATTACHED
            # a detach frees a place for that node again
            await greedy.detach("gpu1", "kind-worker", held[1][1], wait_seconds=20)
            assert (await greedy.attach("gpu3", "kind-worker", held[3][1], wait_seconds=20)).state == (
                AttachmentState.ATTACHED
            )
            for client, node, device, uid in (
                (greedy, "kind-worker", "gpu0", held[0][1]),
                (greedy, "kind-worker", "gpu3", held[3][1]),
                (other, "kind-worker2", "gpu2", mine),
            ):
                await client.detach(device, node, uid, wait_seconds=20)
    assert fabric.bound_hosts() == {}
