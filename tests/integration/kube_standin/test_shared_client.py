"""The roles' own Kubernetes code (plumbing.kube) against the server: Lease leader election,
server-side apply as supported here, and collection deletes."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from plumbing.kube import ApiError, KubeClient
from plumbing.kube.leader import LeaderElector
from plumbing.kube.resources import CONFIGMAPS, LEASES, RESOURCE_SLICES
from tests.support.waiting import eventually
from tests.unit.kube_standin.objects import resource_slice


async def test_leader_election_hands_over_on_release(mkube: KubeClient, ns: str) -> None:
    def elector(identity: str) -> LeaderElector:
        return LeaderElector(
            mkube,
            name="fabric-dra-controller",
            namespace=ns,
            identity=identity,
            lease_duration=3.0,
            renew_deadline=2.0,
            retry_period=0.2,
        )

    first, second = elector("replica-a"), elector("replica-b")
    first_task = asyncio.create_task(first.run())
    await eventually(lambda: first.is_leader, what="replica-a to lead")
    second_task = asyncio.create_task(second.run())
    await asyncio.sleep(0.6)
    assert first.is_leader and not second.is_leader  # the Lease's compare-and-swap keeps one leader
    first_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first_task
    await eventually(lambda: second.is_leader, what="replica-b to take over")
    lease = await mkube.get(LEASES, "fabric-dra-controller", ns)
    assert lease["spec"]["holderIdentity"] == "replica-b"
    second_task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await second_task


async def test_apply_creates_then_merges(mkube: KubeClient, ns: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "applied", "namespace": ns},
        "data": {"a": "1"},
    }
    created = await mkube.patch(CONFIGMAPS, "applied", config, ns, patch_type="apply", field_manager="test")
    assert created["data"] == {"a": "1"}
    again = await mkube.patch(
        CONFIGMAPS, "applied", {**config, "data": {"b": "2"}}, ns, patch_type="apply", field_manager="test"
    )
    assert again["data"] == {"a": "1", "b": "2"}  # no field ownership here: see docs/testing.md
    with pytest.raises(ApiError) as missing_manager:
        await mkube.patch(CONFIGMAPS, "applied", config, ns, patch_type="apply")
    assert missing_manager.value.status == 400


async def test_delete_collection_by_selector(mkube: KubeClient, ns: str) -> None:
    for index in range(3):
        piece = resource_slice(f"{ns}-dc-{index}", devices=1)
        piece["metadata"]["labels"] = {"batch": ns, "keep": "yes" if index == 0 else "no"}
        await mkube.create(RESOURCE_SLICES, piece)
    gone = await mkube.request(
        "DELETE", RESOURCE_SLICES.path(), params={"labelSelector": f"batch={ns},keep=no"}
    )
    assert sorted(i["metadata"]["name"] for i in gone["items"]) == [f"{ns}-dc-1", f"{ns}-dc-2"]
    left = await mkube.list(RESOURCE_SLICES, label_selector=f"batch={ns}")
    assert [i["metadata"]["name"] for i in left["items"]] == [f"{ns}-dc-0"]


async def test_renewals_go_on_while_becoming_leader_takes_longer_than_the_renew_deadline(
    mkube: KubeClient, ns: str
) -> None:
    """What a new leader does first (the manager loads its ledger) may outlast the renew deadline;
    the renewals go on beside it, so the replica is still leader after it. When the loop waited
    for the callback, it renewed nothing and stepped down 2 s after it became leader."""
    started, release = asyncio.Event(), asyncio.Event()
    calls: list[bool] = []

    async def on_change(leading: bool) -> None:
        calls.append(leading)
        if leading:
            started.set()
            await release.wait()

    elector = LeaderElector(
        mkube,
        name="slow-start",
        namespace=ns,
        identity="replica-a",
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.2,
        on_change=on_change,
    )
    task = asyncio.create_task(elector.run())
    await eventually(started.is_set, what="the callback of becoming leader")
    await asyncio.sleep(3.0)  # past the renew deadline, the callback still running
    assert elector.is_leader
    release.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert calls == [True, False]
    assert not elector.is_leader
