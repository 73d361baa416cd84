"""A ledger write rides out a slow or conflicting API server within its deadline (issue 37).

Under load an attach once answered ``FabricUnavailable: cannot write the ledger configmap …``:
one shard write that met a timeout or a 5xx failed the attach at once. Now a shard write is tried
again within :attr:`ConfigMapLedgerStore.write_deadline`, and a conflict with its own timed-out
attempt (stored after all) is told apart from another replica's write, as client-go's
``RetryOnConflict`` re-reads and retries.

Real processes: the API test server with its injected faults (``/testing/v1/faults``: an error
code, or a delay after which the request is served); the ledger and its store in this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from fabric.state.ledger import (
    ConfigMapLedgerStore,
    Ledger,
    LedgerEntry,
    LedgerError,
    LedgerState,
    shard_names,
    shard_of,
)
from manager_api.errors import NotLeader
from plumbing.kube.client import KubeClient
from plumbing.kube.resources import CONFIGMAPS, NAMESPACES
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.support.uids import claim_uid

pytestmark = pytest.mark.slow(seconds=46)

NAMESPACE = "fabric-dra"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    with start_apiserver(tmp_path_factory.mktemp("apiserver")) as server:

        async def populate() -> None:
            async with server.client() as kube:
                await kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})

        asyncio.run(populate())
        yield server
        server.hooks.clear_faults()


@pytest.fixture(autouse=True)
def _no_faults_left(cluster: ApiServerProcess) -> Iterator[None]:
    """A test that fails half-way leaves none of its faults armed for the next one."""
    yield
    cluster.hooks.clear_faults()


def _entry(device: str, claim: str) -> LedgerEntry:
    return LedgerEntry(
        device=device,
        device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
        node="kind-worker",
        host="kind-worker",
        claim_uid=claim_uid(claim),
        state=LedgerState.BOUND,
        operation_id=f"op-{claim}",
    )


async def _ledger(kube: KubeClient, name: str, **timing: float) -> tuple[Ledger, ConfigMapLedgerStore]:
    store = ConfigMapLedgerStore(kube, name=name, namespace=NAMESPACE, **timing)
    ledger = Ledger(store)
    await ledger.load()
    ledger.put(_entry("gpu1", "first"))
    await ledger.commit()  # the shard exists: the next writes are updates
    return ledger, store


async def _stored_claim(kube: KubeClient, name: str, device: str) -> str:
    reread = Ledger(ConfigMapLedgerStore(kube, name=name, namespace=NAMESPACE))
    await reread.load()
    entry = reread.get(device)
    assert entry is not None
    return entry.claim_uid


def _shard(name: str, device: str) -> str:
    return shard_names(name)[shard_of(device)]


async def test_a_conflict_is_read_again_and_written_and_two_step_back(cluster: ApiServerProcess) -> None:
    async with cluster.client() as kube:
        ledger, store = await _ledger(kube, "conflict")
        await asyncio.to_thread(
            cluster.hooks.fail, "configmaps", verbs=["update"], name=_shard("conflict", "gpu1"), code=409
        )
        ledger.put(_entry("gpu1", "second"))
        await ledger.commit()
        assert await _stored_claim(kube, "conflict", "gpu1") == claim_uid("second")
        assert store.retried_writes == 1
        # two in a row: another replica writes this shard now; this one steps back
        await asyncio.to_thread(
            cluster.hooks.fail,
            "configmaps",
            verbs=["update"],
            name=_shard("conflict", "gpu1"),
            code=409,
            count=2,
        )
        ledger.put(_entry("gpu1", "third"))
        with pytest.raises(NotLeader, match="another manager replica"):
            await ledger.commit()
        assert await _stored_claim(kube, "conflict", "gpu1") == claim_uid("second")


async def test_a_conflict_after_a_timeout_is_not_taken_for_another_writer(cluster: ApiServerProcess) -> None:
    """A PUT the client gave up on may be stored all the same; the next PUT then conflicts with
    it. Here the server holds the first PUT past the client's timeout, then answers the second
    with 409, as it would had the first been stored: the write is read again and made, where two
    conflicts without a timeout between them step back (above)."""
    async with cluster.client() as kube:
        ledger, store = await _ledger(kube, "slow", request_timeout=0.3, write_deadline=10.0)
        hooks, shard = cluster.hooks, _shard("slow", "gpu1")
        await asyncio.to_thread(
            hooks.fail, "configmaps", verbs=["update"], name=shard, code=200, delay_seconds=1.0
        )
        await asyncio.to_thread(hooks.fail, "configmaps", verbs=["update"], name=shard, code=409)
        ledger.put(_entry("gpu1", "second"))
        await ledger.commit()
        assert await _stored_claim(kube, "slow", "gpu1") == claim_uid("second")
        assert (store.retried_writes, store.failed_attempts) == (1, 2)
        assert not await asyncio.to_thread(hooks.faults)


async def test_an_unavailable_server_is_ridden_out_within_the_deadline(cluster: ApiServerProcess) -> None:
    async with cluster.client() as kube:
        ledger, store = await _ledger(kube, "flaky", write_deadline=10.0)
        shard = _shard("flaky", "gpu1")
        await asyncio.to_thread(
            cluster.hooks.fail, "configmaps", verbs=["update"], name=shard, code=503, count=3
        )
        ledger.put(_entry("gpu1", "second"))
        await ledger.commit()
        assert await _stored_claim(kube, "flaky", "gpu1") == claim_uid("second")
        assert (store.retried_writes, store.failed_attempts) == (1, 3)
        # a server that stays down: one clear error once the deadline is up, the change kept
        # for the next write
        store.write_deadline = 0.5
        await asyncio.to_thread(
            cluster.hooks.fail, "configmaps", verbs=["update"], name=shard, code=503, count=10_000
        )
        ledger.put(_entry("gpu1", "third"))
        with pytest.raises(LedgerError, match=r"within 0.5 s \(\d+ attempts\): 503"):
            await ledger.commit()
        await asyncio.to_thread(cluster.hooks.clear_faults)
        await ledger.commit()
        assert await _stored_claim(kube, "flaky", "gpu1") == claim_uid("third")


async def test_a_slow_unavailable_server_is_reported_by_its_answer(cluster: ApiServerProcess) -> None:
    """Each 503 comes after 0.25 s: the deadline ends during a wait or cuts the last attempt
    short, and either way the error says what the server answered, not the timeout the
    deadline imposed on that last attempt."""
    async with cluster.client() as kube:
        ledger, _ = await _ledger(kube, "slowdown", write_deadline=0.7)
        await asyncio.to_thread(
            cluster.hooks.fail,
            "configmaps",
            verbs=["update"],
            name=_shard("slowdown", "gpu1"),
            code=503,
            delay_seconds=0.25,
            count=10_000,
        )
        ledger.put(_entry("gpu1", "second"))
        with pytest.raises(LedgerError, match=r"within 0.7 s \(\d+ attempts\): 503"):
            await ledger.commit()


async def test_a_load_rides_out_failed_reads(cluster: ApiServerProcess) -> None:
    async with cluster.client() as kube:
        await _ledger(kube, "reads")
        await asyncio.to_thread(cluster.hooks.fail, "configmaps", verbs=["get"], code=503, count=20)
        assert await _stored_claim(kube, "reads", "gpu1") == claim_uid("first")
        assert not await asyncio.to_thread(cluster.hooks.faults)  # every failure met, and ridden out
        objects = await kube.list(CONFIGMAPS, NAMESPACE)
        assert any(o["metadata"]["name"] == _shard("reads", "gpu1") for o in objects["items"])
