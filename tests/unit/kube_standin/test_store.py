"""The store's etcd-like semantics: resourceVersions, status, generation, finalizers, history."""

from __future__ import annotations

import copy

import pytest

from kube_standin.apiserver.status import StatusError
from kube_standin.apiserver.store import Store
from tests.unit.kube_standin.objects import allocation, resource, resource_claim

CLAIMS = resource("resource.k8s.io", "v1", "resourceclaims")
CONFIGMAPS = resource("", "v1", "configmaps")
NAMESPACES = resource("", "v1", "namespaces")


def configmap(name: str, namespace: str = "default", **data: str) -> dict[str, object]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": namespace},
        "data": data,
    }


def test_every_change_gets_the_next_resource_version_and_no_ops_get_none() -> None:
    store = Store()
    start = store.rv
    created = store.create(CONFIGMAPS, configmap("a", x="1"))
    assert created["metadata"]["resourceVersion"] == str(start + 1)
    same = store.update(CONFIGMAPS, copy.deepcopy(created))
    assert same is created and store.rv == start + 1  # a no-op: nothing changes, no event
    changed = copy.deepcopy(created)
    changed["data"]["x"] = "2"
    updated = store.update(CONFIGMAPS, changed)
    assert updated["metadata"]["resourceVersion"] == str(start + 2)
    with pytest.raises(StatusError) as stale:
        store.update(CONFIGMAPS, changed)  # still carries the old resourceVersion
    assert stale.value.code == 409 and stale.value.reason == "Conflict"
    deleted, now = store.delete(CONFIGMAPS, "default", "a")
    assert now and deleted["metadata"]["resourceVersion"] == str(start + 3)
    assert [c.type for c in store.changes_since(CONFIGMAPS.storage_key, start)] == [
        "ADDED",
        "MODIFIED",
        "DELETED",
    ]


def test_status_subresource_and_generation() -> None:
    store = Store()
    claim = resource_claim()
    claim["status"] = {"allocation": allocation()}
    created = store.create(CLAIMS, claim)
    assert "status" not in created and created["metadata"]["generation"] == 1
    with_status = copy.deepcopy(created)
    with_status["status"] = {"allocation": allocation()}
    ignored = store.update(CLAIMS, with_status)
    assert ignored is created  # the main resource ignores status
    allocated = store.update(CLAIMS, with_status, subresource="status")
    assert allocated["status"]["allocation"] == allocation()
    assert allocated["metadata"]["generation"] == 1  # status never bumps generation
    relabel = copy.deepcopy(allocated)
    relabel["metadata"]["labels"] = {"a": "b"}
    relabel["status"] = {}
    after = store.update(CLAIMS, relabel, subresource="status")
    assert "labels" not in after["metadata"]  # the status subresource ignores metadata


def test_finalizers_hold_deletion_until_removed() -> None:
    store = Store()
    held = configmap("held")
    held["metadata"]["finalizers"] = ["fabric-dra.io/detach"]  # type: ignore[index]
    store.create(CONFIGMAPS, held)
    marked, now = store.delete(CONFIGMAPS, "default", "held")
    assert not now and marked["metadata"]["deletionTimestamp"]
    adding = copy.deepcopy(marked)
    adding["metadata"]["finalizers"].append("other.io/x")
    with pytest.raises(StatusError, match="no new finalizers can be added"):
        store.update(CONFIGMAPS, adding)
    released = copy.deepcopy(marked)
    released["metadata"]["finalizers"] = []
    store.update(CONFIGMAPS, released)
    assert store.find(CONFIGMAPS, "default", "held") is None
    assert store.history[-1].type == "DELETED"


def test_delete_preconditions() -> None:
    store = Store()
    created = store.create(CONFIGMAPS, configmap("p"))
    with pytest.raises(StatusError, match="Precondition failed: UID in precondition: nope"):
        store.delete(CONFIGMAPS, "default", "p", uid="nope")
    with pytest.raises(StatusError, match="Precondition failed: ResourceVersion in precondition: 1,"):
        store.delete(CONFIGMAPS, "default", "p", resource_version="1")
    store.delete(CONFIGMAPS, "default", "p", uid=created["metadata"]["uid"])


def test_namespaces_must_exist_and_their_deletion_takes_their_contents() -> None:
    store = Store()
    with pytest.raises(StatusError, match='namespaces "team" not found'):
        store.create(CONFIGMAPS, configmap("a", "team"))
    store.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}})
    store.create(CONFIGMAPS, configmap("a", "team"))
    held = configmap("held", "team")
    held["metadata"]["finalizers"] = ["x.io/y"]  # type: ignore[index]
    store.create(CONFIGMAPS, held)
    ns, now = store.delete(NAMESPACES, None, "team")
    assert not now and ns["status"]["phase"] == "Terminating"
    assert store.find(CONFIGMAPS, "team", "a") is None
    with pytest.raises(StatusError, match="because it is being terminated"):
        store.create(CONFIGMAPS, configmap("b", "team"))
    last = copy.deepcopy(store.get(CONFIGMAPS, "team", "held"))
    last["metadata"]["finalizers"] = []
    store.update(CONFIGMAPS, last)
    assert store.find(NAMESPACES, None, "team") is None


def test_history_rebuilds_past_states_until_compacted() -> None:
    store = Store(history=100)
    store.create(CONFIGMAPS, configmap("a", v="1"))
    rv_before = store.rv
    current = copy.deepcopy(store.get(CONFIGMAPS, "default", "a"))
    current["data"]["v"] = "2"
    store.update(CONFIGMAPS, current)
    store.create(CONFIGMAPS, configmap("b"))
    page = store.list_objects(CONFIGMAPS, "default", match=lambda o: True, at_rv=rv_before)
    assert [(o["metadata"]["name"], o["data"]["v"]) for o in page.items] == [("a", "1")]
    store.compact()
    with pytest.raises(StatusError) as expired:
        store.changes_since(CONFIGMAPS.storage_key, rv_before)
    assert expired.value.code == 410
    for i in range(150):  # the bounded history compacts by itself
        store.create(CONFIGMAPS, configmap(f"n{i}"))
    assert len(store.history) == 100 and store.compacted_rv == store.rv - 100


def test_generate_name_and_server_fields() -> None:
    store = Store()
    obj = configmap("")
    obj["metadata"] = {"generateName": "slice-", "namespace": "default", "uid": "client-chosen"}
    created = store.create(CONFIGMAPS, obj)
    name = created["metadata"]["name"]
    assert name.startswith("slice-") and len(name) == len("slice-") + 5
    assert created["metadata"]["uid"] != "client-chosen"
    with pytest.raises(StatusError, match="resourceVersion should not be set"):
        store.create(
            CONFIGMAPS,
            {**configmap("x"), "metadata": {"name": "x", "namespace": "default", "resourceVersion": "5"}},
        )


def test_a_shutdown_ends_every_watch_and_each_one_opened_after_it() -> None:
    """Once the server shuts down, open watches end, and so does a watch a client opens again
    (an informer re-watches at once, on a keep-alive connection still served)."""
    store = Store()
    before = store.subscribe(CONFIGMAPS, None)
    assert store.shut_down_watches() == 1
    assert before.queue.get_nowait() is None  # the stream's end
    again = store.subscribe(CONFIGMAPS, None)
    assert again.queue.get_nowait() is None
    store.create(CONFIGMAPS, configmap("after"))
    assert again.queue.empty()  # no longer offered changes
    assert store.close_watchers() == 0
