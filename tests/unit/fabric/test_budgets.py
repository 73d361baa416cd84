"""DeviceBudgets at the manager's attach (docs/budgets.md, "Enforcement"): what a device takes from
a budget (class, model, memory), the check against what a tree holds with attaches in flight, Warn,
and the status — over the in-memory fabric of the attach tests."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest

from fabric.bindings.attribution import Attribution, claim_labels
from fabric.bindings.budget_status import status_of
from fabric.bindings.budget_use import Holding, TreeUse, device_class_of, holding_of, model_slug
from fabric.bindings.budgets import BudgetGate
from fabric.bindings.trees import OwnerChains
from fabric.bindings.usage import UsageBook, UsageKey, UsageMeter
from fabric.state.budgets import BudgetView, DeviceLimit, read_budget
from fabric.state.claims import ClaimView
from fabric.state.ledger import ShareRecord
from fabric.state.model import DeviceRecord, DiscoveredAttributes
from manager_api import models as api
from manager_api.devices import BindingStyle, DeviceType
from manager_api.errors import BudgetExceeded, FabricUnavailable
from manager_api.partitions import BUILTIN_TABLES, partition_devices
from plumbing.kube.client import KubeClient
from plumbing.kube.dra import ResourceClaim
from plumbing.kube.informer import Change
from tests.unit.fabric.fakes import Harness, make_harness

TREE_KEY = "agents.example.com/tree"
NS = "team-a"


def claim_object(
    uid: str, device: str, *, tree: str | None = "task-847", request: str = "gpu", spec: Any = None
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"claim-{uid}",
            "namespace": NS,
            "uid": uid,
            "labels": {TREE_KEY: tree} if tree else {},
        },
        "spec": spec
        or {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}}]}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": request, "driver": "fabric-dra.io", "pool": "p", "device": device}
                    ]
                }
            }
        },
    }


def budget_object(
    limits: dict[str, Any], *, enforcement: str = "Enforce", value: str | None = None
) -> dict[str, Any]:
    label = {"key": TREE_KEY} | ({"value": value} if value else {})
    return {
        "metadata": {"name": "research", "namespace": NS, "generation": 3},
        "spec": {"tree": {"label": label}, "limits": limits, "enforcement": enforcement},
    }


def gate_for(h: Harness, budget: dict[str, Any], claims: list[dict[str, Any]]) -> BudgetGate:
    view = ClaimView(cast(KubeClient, None))
    view._apply([Change("ADDED", c) for c in claims], "list")
    view.synced.set()
    budgets = BudgetView(cast(KubeClient, None))
    budgets.put(budget)
    gate = BudgetGate(budgets, view, h.ledger, h.inventory, partition=h.attachments.sharing.partition)
    h.attachments.use_budgets(gate)
    return gate


def attach_request(device: str, node: str, claim: str) -> api.AttachRequest:
    return api.AttachRequest.model_construct(device=device, node=node, claim_uid=claim)


# -- what a device takes ------------------------------------------------------------------------


def test_the_class_is_the_claims_request_or_the_first_available_subrequest_chosen() -> None:
    spec = {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "fabric-gpu"}},
                {
                    "name": "any",
                    "firstAvailable": [
                        {"name": "big", "deviceClassName": "fabric-gpu"},
                        {"name": "slice", "deviceClassName": "fabric-gpu-partition"},
                    ],
                },
            ]
        }
    }
    claim = ResourceClaim.read(claim_object("c1", "gpu0", spec=spec))
    assert claim is not None
    assert device_class_of(claim, "gpu") == "fabric-gpu"
    assert device_class_of(claim, "any/slice") == "fabric-gpu-partition"
    assert device_class_of(claim, "any/none") is None
    assert device_class_of(claim, "other") is None


def _record(kind: DeviceType, memory: int | None, model: str = "NVIDIA H100 PCIe") -> DeviceRecord:
    return DeviceRecord(
        key="/k",
        resource_id="d",
        fabric="PCIe",
        style=BindingStyle.ZONE,
        attributes=DiscoveredAttributes(type=kind, model=model, memory_bytes=memory),
        name="gpu0",
    )


def test_gpu_memory_is_the_devices_or_the_partitions_own_and_cxl_memory_the_shares() -> None:
    claim = ResourceClaim.read(claim_object("c1", "gpu0"))
    gpu = _record(DeviceType.GPU, 80 << 30)
    assert holding_of(claim, "gpu0", gpu) == Holding("fabric-gpu", "NVIDIA H100 PCIe", gpu_memory=80 << 30)
    table = BUILTIN_TABLES["h100-80gb"]
    partition = next(p for p in partition_devices("gpu0", table) if p.profile.name == "1g.10gb")
    held = holding_of(None, partition.name, gpu, partition=partition)
    assert held.gpu_memory == int(partition.profile.memory_bytes) < 80 << 30
    assert held.device_class is None  # a claim gone: its class is not known, its memory is
    pool = _record(DeviceType.CXL_MEMORY, 256 << 30, model="CXL pool")
    share = ShareRecord(pool="pool0", share_id="s1", memory_bytes=3 << 30, chunk_mib=3072)
    assert holding_of(None, "pool0", pool, share_bytes=share.memory_bytes).cxl_memory == 3 << 30
    use = TreeUse([holding_of(claim, "gpu0", gpu), held])
    assert use.gpu_memory == (80 << 30) + int(partition.profile.memory_bytes)
    by_model = DeviceLimit.model_validate({"model": model_slug("NVIDIA H100 PCIe"), "max": 1})
    assert use.devices(by_model) == 2


def test_a_budget_that_does_not_read_is_refused_as_it_is_read() -> None:
    with pytest.raises(ValueError, match="exactly one of label and owner"):
        read_budget({"metadata": {"name": "b", "namespace": NS}, "spec": {"tree": {}, "limits": {}}})
    with pytest.raises(ValueError, match="not a quantity"):
        read_budget(budget_object({"gpuMemory": "lots"}))
    with pytest.raises(ValueError, match="no duration"):
        read_budget(budget_object({"deviceHours": {"max": 2, "window": "a day"}}))
    assert read_budget(budget_object({"gpuMemory": "160Gi"})).spec.limits.gpu_memory == 160 << 30


# -- the check ----------------------------------------------------------------------------------


async def test_attaches_of_one_tree_at_once_never_pass_its_cap(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=6)
    h.fabric.delay = 0.05  # every attach is still in flight when the next one is checked
    claims = [claim_object(f"c{i}", f"gpu{i}") for i in range(6)]
    gate_for(h, budget_object({"devices": [{"deviceClassName": "fabric-gpu", "max": 2}]}), claims)
    answers = await asyncio.gather(
        *(h.attachments.attach(attach_request(f"gpu{i}", "node-0", f"c{i}"), wait=5) for i in range(6)),
        return_exceptions=True,
    )
    refused = [a for a in answers if isinstance(a, BudgetExceeded)]
    assert len(refused) == 4 and len(h.fabric.bound) == 2, answers
    assert "DeviceBudget team-a/research: tree task-847 holds 2 of 2 fabric-gpu devices" in refused[0].message
    assert refused[0].http_status == 409 and not refused[0].retriable
    # A retry of a binding the claim holds is no new hold: answered, never refused.
    holder = next(d for d in h.fabric.bound)
    uid = f"c{holder.removeprefix('gpu')}"
    assert (await h.attachments.attach(attach_request(holder, "node-0", uid), wait=5))[1] == 200
    # One released: the next claim of the tree is admitted.
    await h.attachments.detach(holder, uid, "node-0", wait=5)
    waiting = next(f"gpu{i}" for i in range(6) if f"gpu{i}" not in h.fabric.bound and f"gpu{i}" != holder)
    _, status = await h.attachments.attach(
        attach_request(waiting, "node-0", f"c{waiting.removeprefix('gpu')}"), wait=5
    )
    assert status == 200 and len(h.fabric.bound) == 2


async def test_another_tree_and_a_claim_in_no_tree_are_not_counted(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=4)
    claims = [
        claim_object("c0", "gpu0"),
        claim_object("c1", "gpu1", tree="task-9"),
        claim_object("c2", "gpu2", tree=None),
        claim_object("c3", "gpu3"),
    ]
    gate_for(h, budget_object({"devices": [{"deviceClassName": "fabric-gpu", "max": 1}]}), claims)
    for i in range(3):
        assert (await h.attachments.attach(attach_request(f"gpu{i}", "node-0", f"c{i}"), wait=5))[1] == 200
    with pytest.raises(BudgetExceeded, match="tree task-847 holds 1 of 1"):
        await h.attachments.attach(attach_request("gpu3", "node-0", "c3"), wait=5)


async def test_gpu_memory_counts_against_its_limit(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=2)
    claims = [claim_object("c0", "gpu0"), claim_object("c1", "gpu1")]
    gate = gate_for(h, budget_object({"gpuMemory": "100Gi"}), claims)
    # The fake fabric's GPUs say nothing of memory: give them 80 GiB each.
    for name in ("gpu0", "gpu1"):
        record = h.inventory.device(name)
        assert record is not None
        attributes = record.attributes.model_copy(update={"memory_bytes": 80 << 30})
        h.inventory._records[name] = dataclasses.replace(record, attributes=attributes)
    assert (await h.attachments.attach(attach_request("gpu0", "node-0", "c0"), wait=5))[1] == 200
    with pytest.raises(
        BudgetExceeded, match="holds 80 GiB of 100 GiB of GPU memory; this device needs 80 GiB"
    ):
        await h.attachments.attach(attach_request("gpu1", "node-0", "c1"), wait=5)
    (budget,) = gate.view.all()
    (tree,) = await gate.report(budget)
    assert [(u.limit, u.used, u.max) for u in tree.limits] == [("gpuMemoryBytes", 80 << 30, 100 << 30)]


async def test_warn_refuses_nothing_and_remembers_what_it_would_have(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=3)
    claims = [claim_object(f"c{i}", f"gpu{i}") for i in range(3)]
    budget = budget_object({"devices": [{"deviceClassName": "fabric-gpu", "max": 1}]}, enforcement="Warn")
    gate = gate_for(h, budget, claims)
    for i in range(3):
        assert (await h.attachments.attach(attach_request(f"gpu{i}", "node-0", f"c{i}"), wait=5))[1] == 200
    refusal = gate.refusals[(f"{NS}/research", "task-847")]
    assert (refusal.claim, refusal.limit) == (f"{NS}/claim-c2", "devices:fabric-gpu")


async def test_the_status_shows_each_tree_against_each_limit_and_the_limit_reached(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=3)
    claims = [claim_object(f"c{i}", f"gpu{i}") for i in range(3)]
    gate = gate_for(h, budget_object({"devices": [{"deviceClassName": "fabric-gpu", "max": 2}]}), claims)
    for i in range(2):
        await h.attachments.attach(attach_request(f"gpu{i}", "node-0", f"c{i}"), wait=5)
    with pytest.raises(BudgetExceeded):
        await h.attachments.attach(attach_request("gpu2", "node-0", "c2"), wait=5)
    (budget,) = gate.view.all()
    status = status_of(budget, await gate.report(budget), datetime(2026, 12, 6, tzinfo=UTC))
    assert status["observedGeneration"] == 3
    (tree,) = status["trees"]
    assert tree["tree"] == "task-847"
    assert tree["used"]["devices"] == [{"deviceClassName": "fabric-gpu", "used": 2, "max": 2}]
    assert tree["lastRefused"]["claim"] == f"{NS}/claim-c2"
    (condition,) = status["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == (
        "LimitReached",
        "True",
        "LimitReached",
    )
    assert condition["message"] == "tree task-847 holds 2 of 2 (devices:fabric-gpu)"


async def test_until_the_budgets_are_read_a_new_hold_waits(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=1)
    gate = gate_for(h, budget_object({"devices": [{"deviceClassName": "fabric-gpu", "max": 1}]}), [])
    gate.view.synced.clear()  # a leader's first seconds: the informer has not listed them yet
    gate.sync_wait = 0.1
    with pytest.raises(FabricUnavailable, match="has not read the DeviceBudgets"):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c0"), wait=5)
    assert h.fabric.bound == {} and h.ledger.get("gpu0") is None


# -- owner trees and device-hours ---------------------------------------------------------------


def owner_budget(name: str | None) -> dict[str, Any]:
    owner = {"apiVersion": "batch/v1", "kind": "Job"} | ({"name": name} if name else {})
    return {
        "metadata": {"name": "jobs", "namespace": NS, "generation": 1},
        "spec": {
            "tree": {"owner": owner},
            "limits": {"devices": [{"deviceClassName": "fabric-gpu", "max": 1}]},
        },
    }


def owned_claim(uid: str, device: str, pod: str) -> dict[str, Any]:
    claim = claim_object(uid, device, tree=None)
    claim["metadata"]["ownerReferences"] = [
        {"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": f"u-{pod}", "controller": True}
    ]
    return claim


async def test_an_owner_tree_is_the_root_of_the_claims_chain(tmp_path: Path) -> None:
    objects: dict[tuple[str, str], dict[str, Any]] = {
        ("Job", "orchestrator-1"): {"metadata": {"name": "orchestrator-1", "uid": "u-job"}},
        ("Pod", "a"): {"metadata": {"uid": "u-a", "ownerReferences": [_job_ref("orchestrator-1")]}},
        ("Pod", "b"): {"metadata": {"uid": "u-b", "ownerReferences": [_job_ref("orchestrator-1")]}},
        ("Pod", "c"): {"metadata": {"uid": "u-c", "ownerReferences": [_job_ref("gone")]}},
    }

    async def fetch(api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return objects.get((kind, name))

    h = await make_harness(tmp_path, devices=3)
    claims = [owned_claim("c0", "gpu0", "a"), owned_claim("c1", "gpu1", "b"), owned_claim("c2", "gpu2", "c")]
    gate = gate_for(h, owner_budget("orchestrator-1"), claims)
    gate.roots = OwnerChains(fetch)
    assert (await h.attachments.attach(attach_request("gpu0", "node-0", "c0"), wait=5))[1] == 200
    with pytest.raises(BudgetExceeded, match="tree Job/orchestrator-1 holds 1 of 1 fabric-gpu devices"):
        await h.attachments.attach(attach_request("gpu1", "node-0", "c1"), wait=5)
    # A chain whose root is gone is in no tree: never guessed into one, never refused by it, and
    # looked at again at the claim's next use rather than remembered as in no tree.
    assert (await h.attachments.attach(attach_request("gpu2", "node-0", "c2"), wait=5))[1] == 200
    assert (f"{NS}/jobs", "c2") not in gate._trees and gate._trees[
        (f"{NS}/jobs", "c0")
    ] == "Job/orchestrator-1"


def _job_ref(name: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": "u-job", "controller": True}


@dataclasses.dataclass
class _Usage:
    """What the gate reads of the usage accounting: whether it counts, its keys, its book."""

    book_: UsageBook
    attribution: Attribution
    counting: bool = True

    def book(self) -> UsageBook:
        return self.book_


async def test_device_hours_come_from_the_trees_attribution_label(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, devices=1)
    now = datetime.now(UTC)
    book = UsageBook()
    labels = claim_labels(cast(ResourceClaim, ResourceClaim.read(claim_object("old", "gpu9"))), (TREE_KEY,))
    book.add(UsageKey(NS, "H100", "Pod/a", "bound", labels), now - timedelta(hours=2, minutes=30), now)
    budget = budget_object({"deviceHours": {"max": 2, "window": "24h"}}, value="task-847")
    gate = gate_for(h, budget, [claim_object("c0", "gpu0")])
    gate.usage = cast(UsageMeter, _Usage(book, Attribution(keys=())))
    # The label is no attribution key: not counted, shown unknown, never refused.
    (tree,) = await gate.report(gate.view.all()[0])
    assert [(u.limit, u.known) for u in tree.limits] == [("deviceHours", False)]
    gate.usage = cast(UsageMeter, _Usage(book, Attribution(keys=(TREE_KEY,))))
    with pytest.raises(BudgetExceeded, match=r"used 2\.50 of 2 device-hours in the last 24h"):
        await h.attachments.attach(attach_request("gpu0", "node-0", "c0"), wait=5)


async def test_what_a_gone_claim_held_is_forgotten_and_nothing_is_walked_before_a_check(
    tmp_path: Path,
) -> None:
    """The gate remembers each hold's tree and what it takes; once a claim holds nothing and is
    deleted, both go. While nothing is remembered (no budget checked yet), the ledger is not walked
    at every status refresh: at 10,000 bindings that walk held the manager's loop every 3 s."""
    h = await make_harness(tmp_path, devices=2)
    claims = [claim_object("c0", "gpu0"), claim_object("c1", "gpu1")]
    gate = gate_for(h, budget_object({"devices": [{"deviceClassName": "fabric-gpu", "max": 2}]}), claims)
    walked: list[int] = []
    entries = h.ledger.entries

    def counted() -> list[Any]:
        walked.append(1)
        return entries()

    h.ledger.entries = counted  # type: ignore[method-assign]
    gate.forget_gone()
    assert walked == []
    for i in range(2):
        assert (await h.attachments.attach(attach_request(f"gpu{i}", "node-0", f"c{i}"), wait=5))[1] == 200
    assert {uid for _, uid in gate._trees} == {"c0", "c1"}
    assert "c0" in {uid for uid, _, _ in gate._holdings}  # (c1's was counted at no check yet)
    await h.attachments.detach("gpu0", "c0", "node-0", wait=5)
    gate.forget_gone()  # c0 holds nothing but still exists: its tree is kept
    assert {uid for _, uid in gate._trees} == {"c0", "c1"}
    gate.claims._apply([Change("DELETED", claims[0])], "watch")
    gate.forget_gone()
    assert {uid for _, uid in gate._trees} == {"c1"}
    assert "c0" not in {uid for uid, _, _ in gate._holdings}
    assert walked
