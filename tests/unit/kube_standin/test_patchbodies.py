"""Merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge from the schemas' patch tags."""

from __future__ import annotations

from typing import Any

import pytest

from kube_standin.apiserver.patchbodies import (
    PatchError,
    SchemaNode,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from kube_standin.apiserver.schemas import SchemaCatalog


def test_merge_patch_rfc7386_examples() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    assert apply_merge_patch(target, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
    assert apply_merge_patch({"a": ["b"]}, {"a": ["c"]}) == {"a": ["c"]}
    assert apply_merge_patch({"a": "b"}, ["c"]) == ["c"]
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}  # the target is not modified


def test_json_patch_operations() -> None:
    doc: dict[str, Any] = {"metadata": {"labels": {"a/b": "1"}}, "list": [1, 2, 3]}
    ops = [
        {"op": "add", "path": "/list/-", "value": 4},
        {"op": "remove", "path": "/list/0"},
        {"op": "replace", "path": "/metadata/labels/a~1b", "value": "2"},
        {"op": "copy", "from": "/list/0", "path": "/first"},
        {"op": "move", "from": "/first", "path": "/moved"},
        {"op": "test", "path": "/moved", "value": 2},
    ]
    assert apply_json_patch(doc, ops) == {"metadata": {"labels": {"a/b": "2"}}, "list": [2, 3, 4], "moved": 2}
    with pytest.raises(PatchError, match="test operation 0 failed"):
        apply_json_patch(doc, [{"op": "test", "path": "/list/0", "value": 9}])
    with pytest.raises(PatchError, match="does not exist"):
        apply_json_patch(doc, [{"op": "remove", "path": "/nope"}])
    with pytest.raises(PatchError, match="out of range"):
        apply_json_patch(doc, [{"op": "add", "path": "/list/9", "value": 0}])


@pytest.fixture(scope="module")
def pod_schema() -> SchemaNode:
    catalog = SchemaCatalog(["1.34"])
    schema_set = catalog.sets[0]
    kind = schema_set.kind("v1", "Pod")
    assert kind is not None
    return SchemaNode(kind.top, schema_set.resolve)


def test_strategic_merge_merges_lists_by_their_merge_key(pod_schema: SchemaNode) -> None:
    pod = {
        "metadata": {"finalizers": ["a"]},
        "spec": {"containers": [{"name": "app", "image": "v1"}, {"name": "side", "image": "s1"}]},
    }
    patch = {
        "metadata": {"finalizers": ["b"]},
        "spec": {"containers": [{"name": "app", "image": "v2"}, {"name": "new", "image": "n1"}]},
    }
    merged = apply_strategic_merge_patch(pod, patch, pod_schema)
    assert merged["metadata"]["finalizers"] == ["a", "b"]  # patchStrategy merge, no key: a set union
    assert merged["spec"]["containers"] == [
        {"name": "app", "image": "v2"},
        {"name": "side", "image": "s1"},
        {"name": "new", "image": "n1"},
    ]
    deleted = apply_strategic_merge_patch(
        merged, {"spec": {"containers": [{"name": "side", "$patch": "delete"}]}}, pod_schema
    )
    assert [c["name"] for c in deleted["spec"]["containers"]] == ["app", "new"]
    replaced = apply_strategic_merge_patch(
        merged, {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "o"}]}}, pod_schema
    )
    assert replaced["spec"]["containers"] == [{"name": "only", "image": "o"}]
    trimmed = apply_strategic_merge_patch(merged, {"$deleteFromPrimitiveList/x": []}, pod_schema)
    assert trimmed == merged
    unfinalized = apply_strategic_merge_patch(
        merged, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}, pod_schema
    )
    assert unfinalized["metadata"]["finalizers"] == ["b"]


def test_strategic_merge_without_tags_replaces_lists() -> None:
    assert apply_strategic_merge_patch({"l": [1, 2], "m": {"a": 1}}, {"l": [3], "m": {"b": 2}}) == {
        "l": [3],
        "m": {"a": 1, "b": 2},
    }
    assert apply_strategic_merge_patch({"m": {"a": 1}}, {"m": {"$patch": "replace", "b": 2}}) == {
        "m": {"b": 2}
    }
    with pytest.raises(PatchError, match="unknown \\$patch directive"):
        apply_strategic_merge_patch({}, {"$patch": "explode"})
