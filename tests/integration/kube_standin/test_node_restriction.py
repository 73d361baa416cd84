"""NodeRestriction on the API test server, over HTTP with a kubelet's credential: every verb a node
could write its Node with (PUT, the four patch types, the status subresource, dry runs, create,
delete) is refused with the real server's 403 where the plugin refuses it, and nothing is stored."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from kube_standin.apiserver.auth import node_user
from tests.support.apiserver import ApiServerProcess

#: a key under NodeRestriction's namespace, as the controller's pool and warm keys are
RESTRICTED = "pool.example.io.node-restriction.kubernetes.io/fabric-pcie"
MERGE = {"content-type": "application/merge-patch+json"}


@pytest.fixture
def names() -> tuple[str, str]:
    suffix = secrets.token_hex(3)
    return f"nr-self-{suffix}", f"nr-other-{suffix}"


@pytest.fixture
def admin(shared_apiserver: ApiServerProcess) -> Iterator[httpx.Client]:
    with shared_apiserver.http() as client:
        yield client


@pytest.fixture
def kubelet(shared_apiserver: ApiServerProcess, names: tuple[str, str]) -> Iterator[httpx.Client]:
    """The kubelet of node ``names[0]``: ``system:node:<name>`` in ``system:nodes``."""
    with shared_apiserver.http(shared_apiserver.add_token(node_user(names[0]))) as client:
        yield client


def node(name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels or {}}}


def forbidden(answer: httpx.Response, name: str, why: str) -> None:
    assert answer.status_code == 403, answer.text
    body = answer.json()
    assert body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'nodes "{name}" is forbidden: {why}',
        "reason": "Forbidden",
        "details": {"name": name, "kind": "nodes"},
        "code": 403,
    }


def labels_of(admin: httpx.Client, name: str) -> dict[str, str]:
    answer = admin.get(f"/api/v1/nodes/{name}")
    answer.raise_for_status()
    return dict(answer.json()["metadata"].get("labels") or {})


def test_a_kubelet_cannot_set_a_restricted_label_on_its_node_by_any_verb(
    admin: httpx.Client, kubelet: httpx.Client, names: tuple[str, str]
) -> None:
    me, _ = names
    # Registration with the label is refused; without it, allowed.
    forbidden(
        kubelet.post("/api/v1/nodes", json=node(me, {RESTRICTED: "true"})),
        me,
        f'node "{me}" is not allowed to set the following labels: {RESTRICTED}',
    )
    assert kubelet.post("/api/v1/nodes", json=node(me, {"kubernetes.io/os": "linux"})).status_code == 201
    path = f"/api/v1/nodes/{me}"
    why = f"is not allowed to modify labels: {RESTRICTED}"
    attempts: list[tuple[str, str, dict[str, str], Any]] = [
        ("PATCH", path, MERGE, {"metadata": {"labels": {RESTRICTED: "true"}}}),
        ("PATCH", path + "?dryRun=All", MERGE, {"metadata": {"labels": {RESTRICTED: "true"}}}),
        (
            "PATCH",
            path,
            {"content-type": "application/strategic-merge-patch+json"},
            {"metadata": {"labels": {RESTRICTED: "true"}}},
        ),
        (
            "PATCH",
            path,
            {"content-type": "application/json-patch+json"},
            [{"op": "add", "path": "/metadata/labels/" + RESTRICTED.replace("/", "~1"), "value": "true"}],
        ),
        (
            "PATCH",
            path + "?fieldManager=kubelet",
            {"content-type": "application/apply-patch+yaml"},
            node(me, {RESTRICTED: "true"}),
        ),
        # the status subresource: a real server keeps metadata changes made through it
        ("PATCH", path + "/status", MERGE, {"metadata": {"labels": {RESTRICTED: "true"}}}),
    ]
    for method, url, headers, body in attempts:
        forbidden(kubelet.request(method, url, headers=headers, json=body), me, why)
    current = kubelet.get(path).json()
    current["metadata"]["labels"][RESTRICTED] = "true"
    forbidden(kubelet.put(path, json=current), me, why)
    forbidden(kubelet.put(path + "/status", json=current), me, why)
    assert RESTRICTED not in labels_of(admin, me)

    # Its own labels, and the kubelet's, it may still write.
    answer = kubelet.patch(path, headers=MERGE, json={"metadata": {"labels": {"mine": "1"}}})
    assert answer.status_code == 200, answer.text
    assert labels_of(admin, me)["mine"] == "1"


def test_a_kubelet_cannot_change_or_remove_a_restricted_label_an_administrator_set(
    admin: httpx.Client, kubelet: httpx.Client, names: tuple[str, str]
) -> None:
    me, _ = names
    assert admin.post("/api/v1/nodes", json=node(me, {RESTRICTED: "true"})).status_code == 201
    path = f"/api/v1/nodes/{me}"
    why = f"is not allowed to modify labels: {RESTRICTED}"
    forbidden(kubelet.patch(path, headers=MERGE, json={"metadata": {"labels": {RESTRICTED: None}}}), me, why)
    forbidden(kubelet.patch(path, headers=MERGE, json={"metadata": {"labels": {RESTRICTED: "no"}}}), me, why)
    assert labels_of(admin, me)[RESTRICTED] == "true"
    # An update that leaves it as it is passes.
    answer = kubelet.patch(path, headers=MERGE, json={"metadata": {"labels": {"mine": "2"}}})
    assert answer.status_code == 200, answer.text
    assert labels_of(admin, me) == {RESTRICTED: "true", "mine": "2"}


def test_a_kubelet_cannot_touch_another_node(
    admin: httpx.Client, kubelet: httpx.Client, names: tuple[str, str]
) -> None:
    me, other = names
    assert admin.post("/api/v1/nodes", json=node(other)).status_code == 201
    why = f'node "{me}" is not allowed to modify node "{other}"'
    patch = {"metadata": {"labels": {"plain": "x"}}}
    forbidden(kubelet.patch(f"/api/v1/nodes/{other}", headers=MERGE, json=patch), other, why)
    forbidden(kubelet.delete(f"/api/v1/nodes/{other}"), other, why)
    forbidden(kubelet.post("/api/v1/nodes", json=node(other)), other, why)
    forbidden(kubelet.delete("/api/v1/nodes"), "Unknown", f'node "{me}" is not allowed to modify node ""')
    assert labels_of(admin, other) == {}
