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
from pathlib import Path
from typing import Any

import httpx
import pytest

from manager_api.client import ManagerClient
from manager_api.errors import DeviceBusy, DeviceNotFound
from manager_api.models import AttachmentState, BindingState
from tests.integration.fabric.conftest import CONTROLLER_TOKEN, FabricAdmin, manager_args
from tests.support.fabric_manager import running_manager, start_manager
from tests.support.uids import claim_uid
from tests.support.waiting import wait_until

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
