"""The pure parts of the binding-condition controller: which node, which devices, which conditions."""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.controller.claimstatus import merge_conditions
from plumbing.kube.dra import allocated_node


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
