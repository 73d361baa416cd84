"""GPU partitions and CXL memory shares through the real manager and the emulator (its default
topology, over TLS): what the fabric shows is checked against the emulator's own tables.

* partitions: the first binds the GPU (one operation), the second on the same node is one ledger
  write (no operation, no fabric write), another node is refused naming the holders, the GPU is
  unbound only with its last partition; holders survive a restart;
* shares: a chunk of the rounded size carved and connected to the node's host, released
  Connection first and the chunk gone from the domain; concurrent shares never over-commit the
  pool; a share survives a restart; a chunk fabric-dra made that no share holds is removed after
  the orphan grace;
* crash points between the steps converge: no chunk made twice, none left behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from manager_api.client import ManagerClient
from manager_api.errors import DeviceBusy, DeviceNotFound
from manager_api.models import AttachmentState, BindingState, UsageGrouping
from plumbing.kube.resources import NODES, RESOURCE_CLAIMS
from tests.integration.fabric.conftest import (
    CONTROLLER_TOKEN,
    OPERATOR_TOKEN,
    FabricAdmin,
    Tls,
    allocated_claim,
    manager_args,
    tls_emulator,
)
from tests.integration.fabric.test_wild_services import topology_with
from tests.support.apiserver import start_apiserver
from tests.support.fabric_manager import running_manager, start_manager
from tests.support.uids import claim_uid
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow(seconds=22)

NODE, OTHER = "kind-worker", "kind-worker2"
POOL = "cxlpool0-pool"
DOMAIN = "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0"
GIB = 1 << 30


def share_id(name: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"fabric-dra-test-share:{name}"))


def chunks(fabric: FabricAdmin) -> list[dict[str, Any]]:
    """The pool domain's chunks as the emulator has them."""
    return [fabric.get(m["@odata.id"]) for m in fabric.get(f"{DOMAIN}/MemoryChunks")["Members"]]


def connections(fabric: FabricAdmin) -> list[dict[str, Any]]:
    return [fabric.get(m["@odata.id"]) for m in fabric.get("/redfish/v1/Fabrics/CXL/Connections")["Members"]]


async def test_partitions_share_one_gpu_on_one_node(fabric: FabricAdmin, tmp_path: Path) -> None:
    args = manager_args(fabric, tmp_path)
    a, b, c = claim_uid("part-a"), claim_uid("part-b"), claim_uid("part-c")
    with running_manager(tmp_path, fabric.url, args=args) as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            first = await client.attach("gpu1-1g10gb-0", NODE, a, wait_seconds=20)
            assert (first.state, first.partition, first.claim_uid) == (
                AttachmentState.ATTACHED,
                "gpu1-1g10gb-0",
                a,
            )
            assert fabric.bound_hosts().get("gpu1") == NODE
            ops_before = [o for o in await client.operations() if o.device == "gpu1"]
            second = await client.attach("gpu1-1g10gb-1", NODE, b, wait_seconds=20)
            assert second.state is AttachmentState.ATTACHED
            # no fabric write: no operation of the GPU's, the fabric's one binding unchanged
            assert [o for o in await client.operations() if o.device == "gpu1"] == ops_before
            with pytest.raises(DeviceBusy) as busy:
                await client.attach("gpu1-1g10gb-2", OTHER, c, wait_seconds=20)
            assert a in (busy.value.held_by or "") and b in (busy.value.held_by or "")
            with pytest.raises(DeviceBusy):  # overlapping placement (slices 0-1 of 2g.20gb)
                await client.attach("gpu1-2g20gb-0", NODE, c, wait_seconds=20)
            with pytest.raises(DeviceBusy):  # the whole GPU while it serves partitions
                await client.attach("gpu1", NODE, c, wait_seconds=20)
            again = await client.attach("gpu1-1g10gb-0", NODE, a, wait_seconds=20)  # idempotent
            assert again.state is AttachmentState.ATTACHED
    # the holders survive a restart of the manager
    with running_manager(tmp_path, fabric.url, args=args, name="manager-restarted") as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            gpu = await client.device("gpu1")
            assert {(h.partition, h.claim_uid, h.node) for h in gpu.partitions} == {
                ("gpu1-1g10gb-0", a, NODE),
                ("gpu1-1g10gb-1", b, NODE),
            }
            assert gpu.claim_uid is None and gpu.state is BindingState.BOUND
            await client.detach("gpu1-1g10gb-0", NODE, a, wait_seconds=20)
            assert fabric.bound_hosts().get("gpu1") == NODE  # one holder left: still bound
            await client.detach("gpu1-1g10gb-0", NODE, a, wait_seconds=20)  # unknown: no-op
            done = await client.detach("gpu1-1g10gb-1", NODE, b, wait_seconds=20)
            assert done.state is AttachmentState.DETACHED
            assert "gpu1" not in fabric.bound_hosts()
            assert (await client.device("gpu1")).state is BindingState.FREE


async def test_a_share_is_carved_connected_and_released(fabric: FabricAdmin, tmp_path: Path) -> None:
    args = manager_args(fabric, tmp_path)
    claim, share = claim_uid("share-a"), share_id("share-a")
    with running_manager(tmp_path, fabric.url, args=args) as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            started = time.monotonic()
            made = await client.attach(
                POOL, NODE, claim, wait_seconds=20, share_id=share, memory_bytes=3 * GIB - 5
            )
            attach_seconds = time.monotonic() - started
            assert made.state is AttachmentState.ATTACHED and made.share is not None
            assert (made.share.share_id, made.share.node, made.share.memory_bytes) == (
                share,
                NODE,
                3 * GIB - 5,
            )
            chunk = fabric.get(str(made.share.chunk))
            assert chunk["MemoryChunkSizeMiB"] == 3 * 1024  # rounded up per the domain's 1 GiB steps
            connection = fabric.get(str(made.share.connection))
            assert connection["ConnectionType"] == "Memory"
            assert [i["MemoryChunk"]["@odata.id"] for i in connection["MemoryChunkInfo"]] == [
                chunk["@odata.id"]
            ]
            assert fabric.get(connection["Links"]["InitiatorEndpoints"][0]["@odata.id"])["Id"] == NODE
            with pytest.raises(DeviceBusy):  # the same share ID is another allocation's
                await client.attach(POOL, OTHER, claim_uid("share-b"), share_id=share, memory_bytes=GIB)
    with running_manager(tmp_path, fabric.url, args=args, name="manager-restarted") as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            pool = (await client.device(POOL)).memory_pool
            assert pool is not None and [s.share_id for s in pool.shares] == [share]
            started = time.monotonic()
            gone = await client.detach(POOL, NODE, claim, wait_seconds=20, share_id=share)
            release_seconds = time.monotonic() - started
            assert gone.state is AttachmentState.DETACHED
            assert chunks(fabric) == [] and connections(fabric) == []
            pool = (await client.device(POOL)).memory_pool
            assert pool is not None and pool.shares == []
    print(f"share attach {attach_seconds * 1000:.1f} ms, release {release_seconds * 1000:.1f} ms")


async def test_a_share_of_a_whole_device_or_a_pool_taken_whole_is_no_such_device(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    """The OpenAPI document cannot say which devices are pools: asking for the wrong kind is 404
    (as for a device of another pool), a share naming only one of its two fields 422, and the
    fabric is left as it was."""
    with running_manager(tmp_path, fabric.url, args=manager_args(fabric, tmp_path)) as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            claim, share = claim_uid("wrong-kind"), share_id("wrong-kind")
            with pytest.raises(DeviceNotFound, match="no memory pool"):
                await client.attach("gpu0", NODE, claim, share_id=share, memory_bytes=GIB)
            with pytest.raises(DeviceNotFound, match="no memory pool"):
                await client.attach("gpu1-1g10gb-0", NODE, claim, share_id=share, memory_bytes=GIB)
            with pytest.raises(DeviceNotFound, match="never bound whole"):
                await client.attach(POOL, NODE, claim)
        half = {"device": POOL, "node": NODE, "claimUid": claim, "shareId": share}
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"}) as http:
            answer = await http.post(f"{manager.address}/api/v1/attachments", json=half, timeout=30)
        assert answer.status_code == 422 and "both shareId and memoryBytes" in answer.text, answer.text
        assert not {"gpu0", "gpu1"} & set(fabric.bound_hosts()) and chunks(fabric) == []


async def test_concurrent_shares_never_over_commit_the_pool(fabric: FabricAdmin, tmp_path: Path) -> None:
    with running_manager(tmp_path, fabric.url, args=manager_args(fabric, tmp_path)) as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=60) as client:
            size = (await client.device(POOL)).memory_pool
            assert size is not None
            each = size.size_bytes // 4  # five asks of a quarter each: one is refused
            asks = [
                client.attach(
                    POOL,
                    (NODE, OTHER)[i % 2],
                    claim_uid(f"many-{i}"),
                    wait_seconds=30,
                    share_id=share_id(f"many-{i}"),
                    memory_bytes=each,
                )
                for i in range(5)
            ]
            results = await asyncio.gather(*asks, return_exceptions=True)
            refused = [r for r in results if isinstance(r, DeviceBusy)]
            made = [r for r in results if not isinstance(r, BaseException)]
            assert len(refused) == 1 and len(made) == 4, results
            assert "in use" in refused[0].message
            assert sum(c["MemoryChunkSizeMiB"] for c in chunks(fabric)) * (1 << 20) == 4 * each
            for i, r in enumerate(results):
                if not isinstance(r, BaseException):
                    await client.detach(
                        POOL,
                        (NODE, OTHER)[i % 2],
                        claim_uid(f"many-{i}"),
                        wait_seconds=30,
                        share_id=share_id(f"many-{i}"),
                    )
            assert chunks(fabric) == []


@pytest.mark.parametrize(
    "point",
    [
        "manager.share.after-chunk-created",
        "manager.share.chunk-recorded",
        "manager.share.after-connection",
        "manager.share.after-connection-deleted",
    ],
)
async def test_a_crash_between_share_steps_converges(fabric: FabricAdmin, tmp_path: Path, point: str) -> None:
    args = manager_args(fabric, tmp_path)
    claim, share = claim_uid(f"crash-{point}"), share_id(f"crash-{point}")
    releasing = point.endswith("connection-deleted")
    crashing = start_manager(tmp_path, fabric.url, args=args)
    try:
        crashing.stop()
        crashing.start([point])  # the same manager, its crash point armed
        deadline = time.monotonic() + 30
        while crashing.alive() and time.monotonic() < deadline:  # asked until it is up, then it dies
            async with ManagerClient(crashing.address, token=CONTROLLER_TOKEN, timeout=30) as client:
                with contextlib.suppress(Exception):
                    await client.attach(POOL, NODE, claim, wait_seconds=20, share_id=share, memory_bytes=GIB)
                    if releasing:
                        await client.detach(POOL, NODE, claim, wait_seconds=20, share_id=share)
            await asyncio.sleep(0.2)
        crashing.wait_crashed(point)
    finally:
        crashing.stop()
    with running_manager(tmp_path, fabric.url, args=args, name="manager-restarted") as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            if not releasing:
                made = await client.attach(
                    POOL, NODE, claim, wait_seconds=20, share_id=share, memory_bytes=GIB
                )
                assert made.state is AttachmentState.ATTACHED
                assert len(chunks(fabric)) == 1 and len(connections(fabric)) == 1  # never made twice
            await client.detach(POOL, NODE, claim, wait_seconds=20, share_id=share)
            wait_until(lambda: not chunks(fabric) and not connections(fabric), timeout=20, what="released")


@pytest.mark.parametrize("holder", ["first", "second"])
async def test_a_crash_after_a_partition_holder_is_recorded_converges(
    fabric: FabricAdmin, tmp_path: Path, holder: str
) -> None:
    """``manager.partition.after-holder-recorded``: the first holder's crash comes after its intent
    to bind the GPU is durable and before the bind starts; the second's after its one ledger write.
    After a restart the holders are as recorded, the GPU is bound once to the node, and both go."""
    args = manager_args(fabric, tmp_path)
    point = "manager.partition.after-holder-recorded"
    a, b = claim_uid(f"crash-part-a-{holder}"), claim_uid(f"crash-part-b-{holder}")
    crashing = start_manager(tmp_path, fabric.url, args=args)
    try:
        if holder == "second":
            async with ManagerClient(crashing.address, token=CONTROLLER_TOKEN, timeout=30) as client:
                await client.attach("gpu1-1g10gb-0", NODE, a, wait_seconds=20)
        crashing.stop()
        crashing.start([point])
        asked, claim = ("gpu1-1g10gb-0", a) if holder == "first" else ("gpu1-1g10gb-1", b)
        deadline = time.monotonic() + 30
        while crashing.alive() and time.monotonic() < deadline:
            async with ManagerClient(crashing.address, token=CONTROLLER_TOKEN, timeout=30) as client:
                with contextlib.suppress(Exception):
                    await client.attach(asked, NODE, claim, wait_seconds=20)
            await asyncio.sleep(0.2)
        crashing.wait_crashed(point)
    finally:
        crashing.stop()
    with running_manager(tmp_path, fabric.url, args=args, name="manager-restarted") as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            recorded = {(h.partition, h.claim_uid) for h in (await client.device("gpu1")).partitions}
            expected = {("gpu1-1g10gb-0", a)} | ({("gpu1-1g10gb-1", b)} if holder == "second" else set())
            assert recorded == expected  # durable before the crash: none lost, none added
            again = await client.attach(asked, NODE, claim, wait_seconds=20)  # the plugin's retry
            assert again.state is AttachmentState.ATTACHED
            assert fabric.bound_hosts().get("gpu1") == NODE
            for partition, uid in sorted(expected):
                await client.detach(partition, NODE, uid, wait_seconds=20)
            assert "gpu1" not in fabric.bound_hosts()
            assert (await client.device("gpu1")).partitions == []


async def test_an_orphan_chunk_is_removed_after_its_grace(fabric: FabricAdmin, tmp_path: Path) -> None:
    args = manager_args(fabric, tmp_path, "--orphan-grace-seconds", "1")
    with fabric._http() as http:
        made = http.post(
            f"{DOMAIN}/MemoryChunks",
            json={"Name": "fabric-dra share " + share_id("orphan"), "MemoryChunkSizeMiB": 1024},
        )
        made.raise_for_status()
        outside = http.post(
            f"{DOMAIN}/MemoryChunks", json={"Name": "made by hand", "MemoryChunkSizeMiB": 1024}
        )
        outside.raise_for_status()
    with running_manager(tmp_path, fabric.url, args=args) as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            pool = (await client.device(POOL)).memory_pool
            assert pool is not None and pool.outside_bytes == GIB  # the hand-made chunk: not ours
            wait_until(lambda: len(chunks(fabric)) == 1, timeout=30, what="the orphan chunk removed")
            assert [c["Name"] for c in chunks(fabric)] == ["made by hand"]
    with fabric._http() as http:
        http.delete(outside.headers["Location"]).raise_for_status()


async def test_usage_counts_partitions_at_their_share_and_shares_in_gib_seconds(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    """A partition and a share held across a graceful restart of the manager: the partition's
    seconds at its memory slices' share of the GPU, the share's GiB-seconds, each within the
    time the test saw it held; the GPU's own seconds have no namespace (no one claim holds it)."""
    args = manager_args(fabric, tmp_path)
    part, mem, share = claim_uid("usage-part"), claim_uid("usage-mem"), share_id("usage-mem")
    since = datetime.now(UTC)
    with running_manager(tmp_path, fabric.url, args=args) as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            table = (await client.device("gpu1")).partition_table
            assert table is not None
            profile = next(p for p in table.profiles if p.label == "1g10gb")
            weight = profile.memory_slices / table.memory_slices
            t0 = time.monotonic()
            await client.attach("gpu1-1g10gb-0", NODE, part, wait_seconds=20, namespace="team-p")
            await client.attach(
                POOL, NODE, mem, wait_seconds=20, share_id=share, memory_bytes=2 * GIB, namespace="team-m"
            )
            t1 = time.monotonic()
            await asyncio.sleep(1.5)
    # SIGTERM: the record written; the time down is charged to what the ledger says
    with running_manager(tmp_path, fabric.url, args=args, name="manager-restarted") as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            await asyncio.sleep(1.5)
            t2 = time.monotonic()
            await client.detach("gpu1-1g10gb-0", NODE, part, wait_seconds=20)
            await client.detach(POOL, NODE, mem, wait_seconds=20, share_id=share)
            t3 = time.monotonic()
        async with ManagerClient(manager.address, token=OPERATOR_TOKEN, timeout=30) as operator:
            report = await operator.usage(since, UsageGrouping.NAMESPACE)
    groups = {g.name: g for g in report.groups}
    held_at_least, held_at_most = t2 - t1, t3 - t0
    assert held_at_least * weight - 0.01 <= groups["team-p"].partition_seconds <= held_at_most * weight + 0.01
    assert 2 * held_at_least - 0.01 <= groups["team-m"].memory_gib_seconds <= 2 * held_at_most + 0.01
    # a partition's and a share's claims hold no device: their namespaces have no device-seconds
    assert (groups["team-p"].total, groups["team-m"].total) == (0.0, 0.0)
    assert groups[""].bound >= held_at_least and groups[""].partition_seconds == 0.0
    print(
        f"partition {groups['team-p'].partition_seconds:.2f} GPU-s at {weight:.3f} of the GPU, "
        f"share {groups['team-m'].memory_gib_seconds:.2f} GiB-s, "
        f"held {held_at_least:.2f}..{held_at_most:.2f} s"
    )


async def test_an_abandoned_partition_holder_is_released_and_the_gpu_with_the_last(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    """Two partitions of one GPU for two allocated, reserved claims; one claim is deleted: its
    holder alone is released after the grace (the GPU stays bound for the other), then the other's
    claim goes too and the GPU is unbound with its last holder."""
    with start_apiserver(tmp_path / "apiserver") as cluster:
        async with cluster.client() as kube:
            await kube.create(NODES, {"metadata": {"name": NODE}})
        kept = await allocated_claim(cluster, "part-kept", "gpu1-1g10gb-0", NODE, reserved=True)
        gone = await allocated_claim(cluster, "part-gone", "gpu1-1g10gb-1", NODE, reserved=True)
        args = manager_args(
            fabric,
            tmp_path,
            *("--kubeconfig", str(cluster.kubeconfig), "--namespace", "default"),
            *("--orphan-grace-seconds", "1", "--orphan-interval-seconds", "0.3"),
            *("--plugin-report-ttl-seconds", "1"),
        )
        with running_manager(tmp_path, fabric.url, args=args) as manager:
            async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
                await client.attach("gpu1-1g10gb-0", NODE, kept, wait_seconds=20)
                await client.attach("gpu1-1g10gb-1", NODE, gone, wait_seconds=20)
                async with cluster.client() as kube:
                    await kube.delete(RESOURCE_CLAIMS, "part-gone", "default")

                async def holders() -> set[str]:
                    return {h.claim_uid for h in (await client.device("gpu1")).partitions}

                for _ in range(100):
                    if await holders() == {kept}:
                        break
                    await asyncio.sleep(0.2)
                assert await holders() == {kept}
                assert fabric.bound_hosts().get("gpu1") == NODE  # still serving the kept claim
                async with cluster.client() as kube:
                    await kube.delete(RESOURCE_CLAIMS, "part-kept", "default")
                # The fabric unbinds first; the manager marks the GPU free once it has confirmed
                # that from the fabric: wait for both.
                for _ in range(100):
                    unbound = "gpu1" not in fabric.bound_hosts()
                    if unbound and (await client.device("gpu1")).state is BindingState.FREE:
                        break
                    await asyncio.sleep(0.2)
                assert "gpu1" not in fabric.bound_hosts()
                assert (await client.device("gpu1")).state is BindingState.FREE


async def test_a_share_on_the_realistic_profile_follows_the_sanitize_task(tmp_path: Path, tls: Tls) -> None:
    """The realistic latency profile: the chunk's DELETE is a task (the sanitize delay) that the
    release follows until the chunk is gone; the share is made and given back once each."""
    claim, share = claim_uid("realistic-share"), share_id("realistic-share")
    with tls_emulator(tmp_path / "fabric", tls, latency="realistic") as fabric:
        args = manager_args(fabric, tmp_path)
        with running_manager(tmp_path, fabric.url, args=args) as manager:
            async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=60) as client:
                started = time.monotonic()
                made = await client.attach(
                    POOL, NODE, claim, wait_seconds=40, share_id=share, memory_bytes=2 * GIB
                )
                attach_seconds = time.monotonic() - started
                assert made.state is AttachmentState.ATTACHED and made.share is not None
                assert len(chunks(fabric)) == 1 and len(connections(fabric)) == 1
                started = time.monotonic()
                gone = await client.detach(POOL, NODE, claim, wait_seconds=40, share_id=share)
                release_seconds = time.monotonic() - started
                assert gone.state is AttachmentState.DETACHED
                assert chunks(fabric) == [] and connections(fabric) == []
                # the delete was a task the manager followed, not an answer at once
                tasks = fabric.get("/redfish/v1/TaskService/Tasks")["Members"]
                assert tasks, "the realistic profile's chunk delete ran as a task"
    print(f"realistic: share attach {attach_seconds:.2f} s, release (sanitize task) {release_seconds:.2f} s")


async def test_a_domain_without_chunk_creation_keeps_whole_chunks(tmp_path: Path, tls: Tls) -> None:
    """The quirk profile ``memoryChunks: fixed``: no domain allows chunk creation, so there is no
    pool device and no share; the pre-made chunk is a whole device, bound and unbound as before."""
    claim = claim_uid("fixed-chunk")
    topology = topology_with(tmp_path, memoryChunks="fixed")
    with (
        tls_emulator(tmp_path / "fabric", tls, topology=topology) as fabric,
        running_manager(tmp_path, fabric.url, args=manager_args(fabric, tmp_path)) as manager,
    ):
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            devices = {d.name: d for d in await client.devices()}
            assert not [d for d in devices.values() if d.memory_pool is not None]
            # one chunk of the endpoint: the device is named after the endpoint (its target in the
            # emulator's table is the chunk, cxlpool0-chunk0)
            whole = devices.get("cxlpool0")
            assert whole is not None and POOL not in devices, " ".join(sorted(devices))
            assert whole.memory_pool is None and whole.redfish_uri.endswith("/MemoryChunks/0")
            with pytest.raises(DeviceNotFound):
                await client.attach(POOL, NODE, claim, share_id=share_id("fixed"), memory_bytes=GIB)
            with pytest.raises(DeviceNotFound, match="no memory pool"):
                await client.attach("cxlpool0", NODE, claim, share_id=share_id("fixed"), memory_bytes=GIB)
            bound = await client.attach("cxlpool0", NODE, claim, wait_seconds=20)
            assert bound.state is AttachmentState.ATTACHED and bound.share is None
            assert fabric.bound_hosts().get("cxlpool0-chunk0") == NODE
            await client.detach("cxlpool0", NODE, claim, wait_seconds=20)
            assert "cxlpool0-chunk0" not in fabric.bound_hosts()


async def test_a_share_released_on_the_realistic_profile_never_blocks_the_next(
    tmp_path: Path, tls: Tls
) -> None:
    """A pool is allocated many times: right after one share's release (its chunk sanitized by a
    task, shown ``Disabled`` meanwhile) the next share of the same pool is made at its first ask,
    each time; the pool's own state never follows one of its chunks."""
    with tls_emulator(tmp_path / "fabric", tls, latency="realistic") as fabric:
        args = manager_args(fabric, tmp_path)
        with running_manager(tmp_path, fabric.url, args=args) as manager:
            async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=60) as client:
                for i in range(4):  # each attach sent at once after the previous share's release
                    claim, share = claim_uid(f"next-share-{i}"), share_id(f"next-share-{i}")
                    made = await client.attach(
                        POOL, NODE, claim, wait_seconds=40, share_id=share, memory_bytes=GIB
                    )
                    assert made.state is AttachmentState.ATTACHED, made
                    gone = await client.detach(POOL, NODE, claim, wait_seconds=40, share_id=share)
                    assert gone.state is AttachmentState.DETACHED
                pool = await client.device(POOL)
                assert pool.state is BindingState.FREE, pool.state
                assert chunks(fabric) == [] and connections(fabric) == []


async def test_a_release_of_the_last_partition_answers_its_own_unbind(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    """The last partition of a GPU is released while the node asks for a new partition of it over
    and over: the new one binds the GPU again once the unbind is done, and the release answers the
    unbind it asked for (detached), never that new bind (no BindFailed); each turn ends with the
    GPU bound once, to the node, for the new holder alone, and nothing is left after the last."""
    args = manager_args(fabric, tmp_path)
    with running_manager(tmp_path, fabric.url, args=args) as manager:
        async with ManagerClient(manager.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            held, placement = claim_uid("turn-0"), "gpu1-1g10gb-0"
            await client.attach(placement, NODE, held, wait_seconds=20)
            for turn in range(1, 31):
                claim, asked = claim_uid(f"turn-{turn}"), f"gpu1-1g10gb-{turn % 2}"
                asks = 0

                async def ask_next(claim: str = claim, asked: str = asked) -> None:
                    nonlocal asks
                    while True:  # as a plugin asks again, at once: the tightest race there is
                        asks += 1
                        with contextlib.suppress(DeviceBusy):
                            made = await client.attach(asked, NODE, claim, wait_seconds=20)
                            assert made.state is AttachmentState.ATTACHED, made
                            return
                        assert asks < 2000, "the next partition was never made"

                release = asyncio.create_task(client.detach(placement, NODE, held, wait_seconds=20))
                await asyncio.sleep(0.002)  # the release is sent first
                released, _ = await asyncio.gather(release, ask_next())
                assert released.state is AttachmentState.DETACHED, released
                gpu = await client.device("gpu1")
                assert [(h.partition, h.claim_uid) for h in gpu.partitions] == [(asked, claim)]
                assert fabric.bound_hosts().get("gpu1") == NODE
                held, placement = claim, asked
            await client.detach(placement, NODE, held, wait_seconds=20)
            assert "gpu1" not in fabric.bound_hosts()
            assert (await client.device("gpu1")).state is BindingState.FREE
            assert not [o for o in await client.operations() if o.finished_at is None]
