"""Prepare/unprepare logic against a scripted fabric (the real one runs in tests/integration/plugin)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.checkpoint import CheckpointStore, ClaimState
from dra_driver.plugin.driver import ClaimRef, Driver, base_request_name
from dra_driver.plugin.state import ClaimLocks
from tests.unit.plugin.conftest import DRIVER, FakeClaims, ScriptedBackend, claim_object, make_config


class Harness:
    def __init__(self, root: Path, backend: ScriptedBackend | None = None) -> None:
        self.config = make_config(root)
        self.claims = FakeClaims()
        self.backend = backend or ScriptedBackend()
        self.backend.root = root / "sys"
        self.store = CheckpointStore(self.config.checkpoint_file, driver=DRIVER, node=self.config.node_name)
        self.store.load()
        self.driver = Driver(
            self.config,
            store=self.store,
            locks=ClaimLocks(self.config.lock_file),
            backend=self.backend,
            claims=self.claims,
        )

    def add(self, name: str, devices: list[tuple[str, str]], **kw: object) -> ClaimRef:
        uid, ns, n = self.claims.add(claim_object(name, devices=devices, **kw))  # type: ignore[arg-type]
        return ClaimRef(uid, ns, n)

    async def prepare(self, *refs: ClaimRef, budget: float = 30.0) -> dict[str, object]:
        outcomes = await self.driver.prepare(list(refs), self.driver._clock() + budget)
        return {uid: (o.error or o.devices) for uid, o in outcomes.items()}

    async def unprepare(self, *refs: ClaimRef) -> dict[str, str]:
        return await self.driver.unprepare(list(refs), self.driver._clock() + 30.0)


async def test_prepare_then_unprepare(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ref = h.add("c1", [("gpu", "gpu-0"), ("gpu", "gpu-1")])
    (devices,) = (await h.prepare(ref)).values()
    assert isinstance(devices, list)
    assert sorted((d.device, d.pool, d.request_names) for d in devices) == [
        ("gpu-0", "fabric-pcie", ("gpu",)),
        ("gpu-1", "fabric-pcie", ("gpu",)),
    ]
    assert devices[0].cdi_device_ids == (f"k8s.fabric-dra.io/gpu={ref.uid}-{devices[0].device}",)
    (spec_path,) = cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid)
    spec = cdi.CdiSpec.model_validate_json(spec_path.read_text())
    cdi.validate_spec(spec)
    assert {d.name for d in spec.devices} == {f"{ref.uid}-gpu-0", f"{ref.uid}-gpu-1"}
    entry = h.store.get(ref.uid)
    assert entry is not None and entry.state is ClaimState.PREPARE_COMPLETED
    assert h.backend.attached == {"gpu-0": ref.uid, "gpu-1": ref.uid}

    assert await h.unprepare(ref) == {ref.uid: ""}
    assert h.backend.attached == {}
    assert cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid) == []
    assert h.store.get(ref.uid) is None
    assert json.loads(h.config.checkpoint_file.read_text())["data"]["claims"] == {}


async def test_prepare_is_idempotent_and_answers_from_the_checkpoint(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ref = h.add("c1", [("gpu", "gpu-0")])
    first = await h.prepare(ref)
    reads = h.claims.reads
    assert await h.prepare(ref) == first
    assert h.claims.reads == reads and len(h.backend.attach_calls) == 1
    # A lost spec file (a reboot cleared /var/run) is rewritten on the next prepare.
    cdi.remove_spec_files(cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid))
    assert await h.prepare(ref) == first
    assert len(cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid)) == 1


async def test_claims_of_one_call_are_prepared_concurrently(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    backend.gates = {"gpu-0": asyncio.Event(), "gpu-1": asyncio.Event()}
    h = Harness(tmp_path, backend)
    a, b = h.add("a", [("gpu", "gpu-0")]), h.add("b", [("gpu", "gpu-1")])
    call = asyncio.create_task(h.prepare(a, b))
    # Neither attach can finish while its gate is shut: both must start anyway (a busy machine may
    # take a while to get there, so wait for it rather than for a fixed time).
    for _ in range(500):
        if len(backend.attach_calls) == 2 or call.done():
            break
        await asyncio.sleep(0.01)
    assert {d for _, d in backend.attach_calls} == {"gpu-0", "gpu-1"}  # both started before either finished
    backend.gates["gpu-1"].set()
    backend.gates["gpu-0"].set()
    result = await call
    assert all(isinstance(v, list) for v in result.values())


async def test_other_drivers_results_are_ignored(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ref = h.add("gpu-from-elsewhere", [("gpu", "gpu-0")], driver="gpu.example.com")
    assert await h.prepare(ref) == {ref.uid: []}
    assert h.backend.attach_calls == [] and h.store.get(ref.uid) is None
    assert cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid) == []


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [({"allocated": False}, "not allocated"), ({"reserved": False}, "not reserved")],
)
async def test_unusable_claims_are_reported(tmp_path: Path, kwargs: dict[str, bool], reason: str) -> None:
    h = Harness(tmp_path)
    ref = h.add("c1", [("gpu", "gpu-0")], **kwargs)
    (error,) = (await h.prepare(ref)).values()
    assert isinstance(error, str) and reason in error


async def test_replaced_or_deleted_claim_is_reported(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ref = h.add("c1", [("gpu", "gpu-0")])
    stale = ClaimRef("00000000-0000-0000-0000-000000000000", ref.namespace, ref.name)
    (error,) = (await h.prepare(stale)).values()
    assert isinstance(error, str) and "was replaced" in error
    gone = ClaimRef("11111111-0000-0000-0000-000000000000", "default", "never-created")
    (error,) = (await h.prepare(gone)).values()
    assert isinstance(error, str) and "not found" in error


async def test_slow_fabric_answers_before_the_deadline_and_the_next_call_picks_up(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    backend.gates = {"gpu-0": asyncio.Event()}
    h = Harness(tmp_path, backend)
    ref = h.add("c1", [("gpu", "gpu-0")])
    (error,) = (await h.prepare(ref, budget=0.05)).values()
    assert isinstance(error, str) and "still attaching gpu-0" in error
    entry = h.store.get(ref.uid)
    assert entry is not None and entry.state is ClaimState.PREPARE_STARTED  # recorded before attaching
    backend.gates["gpu-0"].set()
    (devices,) = (await h.prepare(ref)).values()
    assert isinstance(devices, list) and devices[0].device == "gpu-0"
    assert len(backend.attach_calls) == 1  # the retry joined the running attach, no second bind


async def test_two_claims_racing_for_one_device(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    a, b = h.add("a", [("gpu", "gpu-0")]), h.add("b", [("gpu", "gpu-0")])
    results = await h.prepare(a, b)
    winners = [uid for uid, r in results.items() if isinstance(r, list)]
    losers = [r for r in results.values() if isinstance(r, str)]
    assert len(winners) == 1 and len(losers) == 1 and "in use" in losers[0]
    loser = b if winners == [a.uid] else a
    winner = a if loser is b else b
    assert await h.unprepare(winner) == {winner.uid: ""}
    (devices,) = (await h.prepare(loser)).values()
    assert isinstance(devices, list)  # the kubelet's retry succeeds once the device is free


async def test_unprepare_of_unknown_claims_succeeds(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ref = ClaimRef("22222222-0000-0000-0000-000000000000", "default", "never-prepared")
    assert await h.unprepare(ref) == {ref.uid: ""}
    assert h.backend.release_calls == []


async def test_unprepare_works_after_the_claim_was_deleted_and_after_a_restart(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ref = h.add("c1", [("gpu", "gpu-0")])
    await h.prepare(ref)
    h.claims.objects.clear()  # deleted from the API server
    restarted = Harness(tmp_path, h.backend)  # a new process: state comes from the checkpoint
    assert await restarted.unprepare(ref) == {ref.uid: ""}
    assert h.backend.attached == {}
    assert await restarted.unprepare(ref) == {ref.uid: ""}  # again: still fine


async def test_failed_attach_keeps_the_entry_for_cleanup(tmp_path: Path) -> None:
    backend = ScriptedBackend()
    backend.busy = {"gpu-1": "node-b/claim-x"}
    h = Harness(tmp_path, backend)
    ref = h.add("c1", [("gpu", "gpu-0"), ("gpu", "gpu-1")])
    (error,) = (await h.prepare(ref)).values()
    assert isinstance(error, str) and "gpu-1 is in use (held by node-b/claim-x)" in error
    entry = h.store.get(ref.uid)
    assert entry is not None and entry.state is ClaimState.PREPARE_STARTED
    assert {d.device: d.attached for d in entry.devices} == {"gpu-0": True, "gpu-1": False}
    assert await h.unprepare(ref) == {ref.uid: ""}
    assert backend.attached == {}  # gpu-0 was detached although the claim never finished preparing


async def test_the_claims_device_held_on_another_node_is_a_shared_claim_message(tmp_path: Path) -> None:
    """A claim shared by pods the scheduler spread over two nodes (issue 16, defect 1): the
    second node gets the manager's 409 naming the first node and this claim's own UID."""
    backend = ScriptedBackend()
    h = Harness(tmp_path, backend)
    ref = h.add("shared", [("gpu", "gpu-0")])
    backend.busy = {"gpu-0": f"node-b/{ref.uid}"}
    (error,) = (await h.prepare(ref)).values()
    assert isinstance(error, str)
    assert "device gpu-0 of this claim is attached to node node-b" in error
    assert "cannot be attached to node node-a too" in error
    assert "pods sharing a fabric-device claim must run on one node — use pod affinity" in error
    assert "Pods sharing a claim" in error and "in use (held by" not in error
    # Another claim holding it, or this claim on this very node: the ordinary busy message.
    backend.busy = {"gpu-0": "node-b/another-claim"}
    (error,) = (await h.prepare(ref)).values()
    assert isinstance(error, str) and "gpu-0 is in use (held by node-b/another-claim)" in error
    backend.busy = {"gpu-0": f"node-a/{ref.uid}"}
    (error,) = (await h.prepare(ref)).values()
    assert isinstance(error, str) and "pod affinity" not in error


def test_subrequest_names_are_reduced_to_the_request() -> None:
    assert base_request_name("gpus/large") == "gpus"
    assert base_request_name("gpus") == "gpus"


async def test_the_pool_the_claim_names_goes_with_the_attach(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    ref = h.add("c1", [("gpu", "gpu-0")], pool="fabric-pcie")
    assert isinstance((await h.prepare(ref))[ref.uid], list)
    assert h.backend.attach_pools == {"gpu-0": "fabric-pcie"}
    assert await h.unprepare(ref) == {ref.uid: ""}
    # and the claim's namespace, which the manager records as the device's tenant
    assert h.backend.attach_namespaces == {"gpu-0": ref.namespace} and ref.namespace


async def test_one_device_in_two_pools_is_refused_before_any_attach(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    claim = claim_object("c1", devices=[("a", "gpu-0"), ("b", "gpu-0")])
    claim["status"]["allocation"]["devices"]["results"][1]["pool"] = "other-pool"
    uid, namespace, name = h.claims.add(claim)
    ref = ClaimRef(uid, namespace, name)
    (error,) = (await h.prepare(ref)).values()
    assert isinstance(error, str) and "two pools (fabric-pcie, other-pool)" in error
    assert h.backend.attach_calls == []
    assert await h.unprepare(ref) == {ref.uid: ""}
