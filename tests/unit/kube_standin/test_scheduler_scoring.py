"""The stand-in scheduler's node scoring and node-affinity Filter, against kube-scheduler's rules
(``pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go``,
``.../podtopologyspread/scoring.go``, ``.../helper/normalize_score.go``, default weights in
``pkg/scheduler/apis/config/v1/default_plugins.go``)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dra_driver.selection import Node
from kube_standin.cluster.scheduler import (
    first_available_score,
    node_scores,
    preferred_affinity_score,
    required_affinity_matches,
)


def node(name: str, **labels: str) -> Node:
    return Node.model_validate({"metadata": {"name": name, "labels": labels}})


def pod(
    *preferred: tuple[int, list[dict[str, Any]]], required: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    affinity: dict[str, Any] = {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": w, "preference": {"matchExpressions": exprs}} for w, exprs in preferred
        ]
    }
    if required is not None:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": required}
    return {"metadata": {"name": "p"}, "spec": {"affinity": {"nodeAffinity": affinity}}}


def req(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def test_the_raw_score_is_the_sum_of_the_matching_terms_weights() -> None:
    p = pod(
        (100, [req("warm/gpu", "Gt", "0")]),
        (30, [req("zone", "In", "a", "b"), req("warm/gpu", "Exists")]),
        (7, [req("warm/gpu", "DoesNotExist")]),
        (5, [req("warm/gpu", "Lt", "2")]),
        (3, [req("zone", "NotIn", "a")]),
        (0, [req("zone", "Exists")]),  # weight 0: skipped, as NewPreferredSchedulingTerms does
        (50, []),  # an empty term matches nothing
    )
    assert preferred_affinity_score(p, node("n", **{"warm/gpu": "2", "zone": "a"})) == 130
    assert preferred_affinity_score(p, node("n", **{"warm/gpu": "1", "zone": "c"})) == 100 + 5 + 3
    assert preferred_affinity_score(p, node("n", zone="b")) == 7 + 3
    # a count that is not a number never satisfies Gt/Lt
    assert preferred_affinity_score(p, node("n", **{"warm/gpu": "x", "zone": "a"})) == 30


def test_node_affinity_is_normalised_to_the_best_node_and_weighted_2() -> None:
    p = pod((30, [req("a", "Exists")]), (40, [req("b", "Exists")]))
    nodes = [node("both", a="1", b="1"), node("a", a="1"), node("b", b="1"), node("none")]
    empty: Counter[str] = Counter()
    scores = node_scores(p, nodes, None, empty)
    least_allocated = 100 * 109 // 110  # every node empty: the pod itself is the only one
    # DefaultNormalizeScore: 100 * raw // max(raw) = 100, 42, 57, 0; times NodeAffinity's weight 2
    assert scores == {
        "both": 200 + least_allocated,
        "a": 2 * (100 * 30 // 70) + least_allocated,
        "b": 2 * (100 * 40 // 70) + least_allocated,
        "none": least_allocated,
    }
    # no node matches: every affinity score stays 0
    assert set(node_scores(p, [node("x"), node("y")], None, empty).values()) == {least_allocated}


def test_spreading_follows_pod_topology_spreads_hostname_score() -> None:
    nodes = [node("a"), node("b"), node("c")]
    siblings = Counter({"b": 1, "c": 2})
    scores = node_scores({"metadata": {}, "spec": {}}, nodes, siblings, siblings)
    # raw = round(siblings * ln(3 + 2) + maxSkew - 1) = 2, 4, 5; normalised 100 * (5 + 2 - raw) // 5
    spread = {"a": 100, "b": 60, "c": 40}
    assert scores == {n: 2 * spread[n] + 100 * (110 - siblings[n] - 1) // 110 for n in spread}


def test_a_preferred_warm_node_beats_the_emptiest_node() -> None:
    """200 points of NodeAffinity outweigh anything least-allocated can give (at most 100)."""
    p = pod((100, [req("warm.fabric-dra.io.node-restriction.kubernetes.io/gpu", "Gt", "0")]))
    nodes = [node("busy", **{"warm.fabric-dra.io.node-restriction.kubernetes.io/gpu": "1"}), node("empty")]
    scores = node_scores(p, nodes, None, Counter({"busy": 109}))
    assert scores["busy"] > scores["empty"]


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 15)), min_size=1, max_size=6),
    st.booleans(),
)
def test_without_affinity_the_order_is_todays_owner_spread_then_fewest_pods(
    counts: list[tuple[int, int]], owned: bool
) -> None:
    """The stand-in's order before node affinity was scored — fewer pods of the same owner, then
    fewer pods, then the name — is what the weighted sum gives for these small counts."""
    nodes = [node(f"n{i}") for i in range(len(counts))]
    siblings = Counter({f"n{i}": s if owned else 0 for i, (s, _) in enumerate(counts)})
    everyone = Counter({f"n{i}": siblings[f"n{i}"] + extra for i, (_, extra) in enumerate(counts)})
    scores = node_scores({"metadata": {}, "spec": {}}, nodes, siblings if owned else None, everyone)

    def weighted(n: Node) -> tuple[int, int, int, str]:
        return -scores[n.name], siblings[n.name], everyone[n.name], n.name

    def today(n: Node) -> tuple[int, int, str]:
        return siblings[n.name], everyone[n.name], n.name

    assert [n.name for n in sorted(nodes, key=weighted)] == [n.name for n in sorted(nodes, key=today)]


def test_required_node_affinity_is_a_filter_of_ored_terms() -> None:
    gpu = node("g", accel="gpu", zone="a")
    assert required_affinity_matches({"spec": {}}, gpu)
    either = [
        {"matchExpressions": [req("accel", "In", "fpga")]},
        {"matchExpressions": [req("zone", "In", "a")]},
    ]
    assert required_affinity_matches(pod(required=either), gpu)
    both = [{"matchExpressions": [req("accel", "In", "fpga"), req("zone", "In", "a")]}]
    assert not required_affinity_matches(pod(required=both), gpu)
    assert required_affinity_matches(pod(required=[{"matchFields": [req("metadata.name", "In", "g")]}]), gpu)
    # no term, or one that does not parse, matches no node
    assert not required_affinity_matches(pod(required=[]), gpu)
    assert not required_affinity_matches(
        pod(required=[{"matchExpressions": [req("zone", "Near", "a")]}]), gpu
    )


def test_the_dra_score_counts_each_first_available_request_by_the_subrequest_used() -> None:
    """``computeScore`` in ``.../plugins/dynamicresources/dynamicresources.go``: 8 - i for
    subrequest i of each ``firstAvailable`` request the allocation used, nothing for ``exactly``;
    a claim allocated before is scored by its own allocation."""
    prioritized = {
        "metadata": {"name": "a"},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "firstAvailable": [{"name": "warm"}, {"name": "any"}]},
                    {"name": "nic", "exactly": {"deviceClassName": "nic"}},
                ]
            }
        },
    }
    done = {
        "metadata": {"name": "b"},
        "spec": {"devices": {"requests": [{"name": "x", "firstAvailable": [{"name": "p"}, {"name": "q"}]}]}},
        "status": {"allocation": {"devices": {"results": [{"request": "x/q"}]}}},
    }

    def found(*requests: str) -> dict[str, Any]:
        return {"devices": {"results": [{"request": r} for r in requests]}}

    assert first_available_score([prioritized], {"a": found("gpu/warm", "nic")}) == 8
    assert first_available_score([prioritized], {"a": found("gpu/any", "nic")}) == 7
    assert first_available_score([prioritized, done], {"a": found("gpu/warm", "nic")}) == 8 + 7
    assert first_available_score([prioritized], {}) == 0
