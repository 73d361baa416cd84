"""The pure parts of the binding-condition controller: which node, which devices, which conditions."""

from __future__ import annotations

from typing import Any, cast

import pytest

from dra_driver.controller.binding_conditions import ClaimBinder
from dra_driver.controller.claimstatus import Target, merge_conditions
from manager_api.errors import DeviceBusy
from manager_api.models import Inventory
from manager_api.partitions import BUILTIN_TABLES
from plumbing.kube.dra import allocated_node
from tests.support.controller import make_device, make_inventory, make_pool


def selector(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"nodeSelectorTerms": list(terms)}


def by_name(*names: str) -> dict[str, Any]:
    return {"matchFields": [{"key": "metadata.name", "operator": "In", "values": list(names)}]}


def test_the_scheduler_s_single_node_selector_names_the_node() -> None:
    assert allocated_node(selector(by_name("node-a"))) == "node-a"


@pytest.mark.parametrize(
    "value",
    [
        None,
        selector(),
        selector(by_name("a", "b")),
        selector(by_name("a"), by_name("b")),
        selector(
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a"]}]}
        ),
        selector({"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["a"]}]}),
        selector(
            {
                **by_name("a"),
                "matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}],
            }
        ),
    ],
)
def test_anything_but_exactly_one_node_is_no_node(value: dict[str, Any] | None) -> None:
    assert allocated_node(value) is None


def test_conditions_keep_their_transition_time_while_the_status_holds() -> None:
    old = [
        {
            "type": "d/Attached",
            "status": "False",
            "reason": "Attaching",
            "message": "m",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]
    same_status = merge_conditions(old, {"d/Attached": ("False", "Attaching", "still")}, 3)
    assert same_status[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same_status[0]["message"] == "still" and same_status[0]["observedGeneration"] == 3
    flipped = merge_conditions(
        old, {"d/Attached": ("True", "Attached", "ok"), "d/AttachFailed": ("False", "Attached", "")}, 3
    )
    assert flipped[0]["status"] == "True" and flipped[0]["lastTransitionTime"] != "2026-01-01T00:00:00Z"
    assert [c["type"] for c in flipped] == ["d/Attached", "d/AttachFailed"]


def test_an_unchanged_condition_is_left_exactly_as_stored() -> None:
    stored = [
        {
            "type": "d/Attached",
            "status": "True",
            "reason": "Attached",
            "message": "ok",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": 1,
        }
    ]
    assert merge_conditions(stored, {"d/Attached": ("True", "Attached", "ok")}, 1) == stored


# -- partitions and memory shares -------------------------------------------------------------


class _Feed:
    """The one thing the binder reads of its inventory feed: the latest inventory."""

    def __init__(self, inventory: Inventory) -> None:
        self.latest = inventory


def _binder() -> ClaimBinder:
    inventory = make_inventory(
        [make_device("gpu0", partition_table=BUILTIN_TABLES["h100-80gb"]), make_pool("cxlpool0", 8 * 2**30)]
    )
    return ClaimBinder(cast(Any, None), cast(Any, None), cast(Any, _Feed(inventory)), driver="fabric-dra.io")


def _claim(*results: dict[str, Any]) -> dict[str, Any]:
    conditions = {
        "bindingConditions": ["fabric-dra.io/Attached"],
        "bindingFailureConditions": ["fabric-dra.io/AttachFailed"],
    }
    return {
        "metadata": {"name": "c", "namespace": "default", "uid": "u-1"},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": "fabric-dra.io", **conditions, **r} for r in results
                    ]
                },
                "nodeSelector": selector(by_name("node-a")),
            }
        },
    }


async def test_each_share_of_a_pool_is_a_target_of_its_own_with_its_size_in_bytes() -> None:
    share = "4c0c5d0e-9a3b-4b8e-8a52-0a2f9d1c7e11"
    other = "7d1f6a2b-1c4e-4f7a-9b3d-2e5c8a9f0b12"
    claim = _claim(
        {
            "pool": "fabric-cxl",
            "device": "cxlpool0",
            "shareID": share,
            "consumedCapacity": {"fabric-dra.io/memory": "3Gi"},
        },
        {
            "pool": "fabric-cxl",
            "device": "cxlpool0",
            "shareID": other,
            "consumedCapacity": {"fabric-dra.io/memory": "1.5"},
        },
        {"pool": "fabric-pcie", "device": "gpu0-1g10gb-3"},
    )
    targets = _binder().targets(claim)
    assert [(t.device, t.share_id, t.memory_bytes, t.label) for t in targets] == [
        ("cxlpool0", share, 3 * 2**30, f"cxlpool0/{share}"),
        ("cxlpool0", other, None, f"cxlpool0/{other}"),  # no whole number of bytes: refused, not rounded
        ("gpu0-1g10gb-3", None, None, "gpu0-1g10gb-3"),
    ]


async def test_a_partition_refused_for_a_gpu_held_on_another_node_fails_at_once() -> None:
    binder = _binder()
    partition = Target("fabric-pcie", "gpu0-1g10gb-3", "node-a")
    elsewhere = DeviceBusy("serves node-b", held_by="node-b/u-2, node-b/u-3")
    here = DeviceBusy("slice in use", held_by="node-a/u-2")
    assert binder.elsewhere(partition, elsewhere)
    assert not binder.elsewhere(partition, here)  # the same node: a holder may be leaving, asked again
    assert not binder.elsewhere(Target("fabric-pcie", "gpu0", "node-a"), elsewhere)  # a whole GPU waits
    assert not binder.elsewhere(partition, DeviceBusy("busy"))
