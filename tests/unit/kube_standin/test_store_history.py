"""Property: the change history rebuilds every past state exactly, and replaying the changes
since any resourceVersion onto that state gives the present (what consistent lists and
watch resumption rely on)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from kube_standin.apiserver.store import Store
from tests.unit.kube_standin.objects import resource

CONFIGMAPS = resource("", "v1", "configmaps")

NAMES = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(st.tuples(st.sampled_from(["put", "delete"]), NAMES, st.integers(0, 3)), max_size=40)


def snapshot(store: Store) -> dict[str, Any]:
    return {o["metadata"]["name"]: o for o in store.objects(CONFIGMAPS, "default")}


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_history_rebuilds_every_past_state(ops: list[tuple[str, str, int]]) -> None:
    store = Store(history=1000)
    states: dict[int, dict[str, Any]] = {store.rv: {}}
    for op, name, value in ops:
        current = store.find(CONFIGMAPS, "default", name)
        if op == "put":
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": "default"},
            }
            body["data"] = {"v": str(value)}
            if current is None:
                store.create(CONFIGMAPS, body)
            else:
                updated = copy.deepcopy(current)
                updated["data"] = {"v": str(value)}
                store.update(CONFIGMAPS, updated)
        elif current is not None:
            store.delete(CONFIGMAPS, "default", name)
        states[store.rv] = snapshot(store)
    final = snapshot(store)
    for rv, expected in states.items():
        page = store.list_objects(CONFIGMAPS, "default", match=lambda o: True, at_rv=rv)
        assert {o["metadata"]["name"]: o for o in page.items} == expected
        replayed = dict(expected)
        for change in store.changes_since(CONFIGMAPS.storage_key, rv):
            if change.type == "DELETED":
                replayed.pop(change.key[1])
            else:
                replayed[change.key[1]] = change.obj
        assert replayed == final
    rvs = [c.rv for c in store.history]
    assert rvs == sorted(set(rvs))  # one resourceVersion per change, increasing
