"""PATCH bodies as the API server applies them: JSON merge patch (RFC 7386), JSON patch
(RFC 6902) and strategic merge patch (the subset described in docs/testing.md).

Strategic merge takes each list's patch strategy and merge key from the official schemas
(``x-kubernetes-patch-strategy`` / ``x-kubernetes-patch-merge-key``), the same tags the
real server reads from the Go types. Supported directives: ``$patch: replace|delete|merge``
on maps and list items, ``$retainKeys``, ``$deleteFromPrimitiveList/<field>`` and
``$setElementOrder/<field>`` (accepted, order is kept as merged).

:func:`apply_patch` applies a PATCH request's body in its format (``patch_type`` of
:mod:`kube_standin.apiserver.negotiation`), strategic merge with :func:`patch_schema`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from kube_standin.apiserver.schemas import SchemaCatalog
from kube_standin.errors import RequestError

__all__ = [
    "PatchError",
    "SchemaNode",
    "apply_json_patch",
    "apply_merge_patch",
    "apply_patch",
    "apply_strategic_merge_patch",
    "patch_schema",
]


class PatchError(RequestError, ValueError):
    """The patch cannot be applied to the object (answered 422)."""


# The schema view strategic merge needs: the node for a child field and for list items.
class SchemaNode:
    def __init__(
        self, node: Mapping[str, Any] | None, resolve: Callable[[Mapping[str, Any]], Mapping[str, Any]]
    ):
        self._resolve = resolve
        self.node: Mapping[str, Any] = resolve(node) if node else {}

    def child(self, key: str) -> SchemaNode:
        props = self.node.get("properties") or {}
        if key in props:
            return SchemaNode(props[key], self._resolve)
        extra = self.node.get("additionalProperties")
        return SchemaNode(extra if isinstance(extra, Mapping) else None, self._resolve)

    def items(self) -> SchemaNode:
        items = self.node.get("items")
        return SchemaNode(items if isinstance(items, Mapping) else None, self._resolve)

    @property
    def strategy(self) -> set[str]:
        raw = self.node.get("x-kubernetes-patch-strategy") or ""
        return {part for part in str(raw).split(",") if part}

    @property
    def merge_key(self) -> str | None:
        key = self.node.get("x-kubernetes-patch-merge-key")
        return str(key) if key else None


_EMPTY = SchemaNode(None, lambda n: n)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result


# -- JSON patch -----------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _index(container: list[Any], token: str, *, allow_end: bool) -> int:
    if token == "-" and allow_end:  # noqa: S105 - RFC 6901's "past the end" index, not a secret
        return len(container)
    if not token.isdigit() or (len(token) > 1 and token.startswith("0")):
        raise PatchError(f"invalid array index {token!r}")
    index = int(token)
    if index > len(container) or (index == len(container) and not allow_end):
        raise PatchError(f"array index {index} out of range")
    return index


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for token in parts[:-1]:
        if isinstance(node, dict):
            if token not in node:
                raise PatchError(f"path {path!r} does not exist")
            node = node[token]
        elif isinstance(node, list):
            node = node[_index(node, token, allow_end=False)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node


def _member(doc: Any, parts: list[str], path: str) -> tuple[Any, Any]:
    """(container, key or index) of the existing member ``parts`` points to."""
    parent = _parent(doc, parts, path)
    token = parts[-1]
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"path {path!r} does not exist")
        return parent, token
    if isinstance(parent, list):
        return parent, _index(parent, token, allow_end=False)
    raise PatchError(f"path {path!r} does not exist")


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent, key = _member(doc, parts, path)
    return parent[key]


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        raise PatchError("cannot remove the whole document")
    parent, key = _member(doc, parts, path)
    return parent.pop(key)


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    token = parts[-1]
    if isinstance(parent, dict):
        parent[token] = value
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, allow_end=True), value)
    else:
        raise PatchError(f"path {path!r} does not exist")
    return doc


def apply_json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902, all six operations; the first failing one aborts the whole patch."""
    if not isinstance(operations, list):
        raise PatchError("a JSON patch must be an array of operations")
    doc = copy.deepcopy(target)
    for number, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchError(f"operation {number} needs 'op' and 'path'")
        kind, path = op["op"], str(op["path"])
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchError(f"operation {number} ({kind}) needs a 'value'")
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            if not _pointer(path):
                doc = copy.deepcopy(op["value"])
            else:
                _remove(doc, path)
                doc = _add(doc, path, copy.deepcopy(op["value"]))
        elif kind in ("move", "copy"):
            source = str(op.get("from", ""))
            if kind == "move" and (path + "/").startswith(source + "/") and path != source:
                raise PatchError(f"operation {number}: cannot move {source!r} into its own child {path!r}")
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise PatchError(f"test operation {number} failed: {path!r} does not hold the given value")
        else:
            raise PatchError(f"operation {number}: unknown op {kind!r}")
    return doc


# -- strategic merge ------------------------------------------------------------------------


def apply_strategic_merge_patch(target: Any, patch: Any, schema: SchemaNode | None = None) -> Any:
    return _merge_map(target if isinstance(target, dict) else {}, patch, schema or _EMPTY)


def _merge_map(original: dict[str, Any], patch: Any, schema: SchemaNode) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise PatchError(f"unknown $patch directive {directive!r}")
    result = dict(original)
    retain = patch.get("$retainKeys")
    if retain is not None:
        if not isinstance(retain, list):
            raise PatchError("$retainKeys must be a list of field names")
        result = {k: v for k, v in result.items() if k in retain}
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.split("/", 1)[1]
            if not isinstance(value, list):
                raise PatchError(f"{key} must be a list")
            current = result.get(field)
            if isinstance(current, list):
                result[field] = [item for item in current if item not in value]
            continue
        sub = schema.child(key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            current = result.get(key)
            merged = _merge_map(current if isinstance(current, dict) else {}, value, sub)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(result.get(key), value, sub)
        else:
            result[key] = value
    return result


def _merge_list(original: Any, patch: list[Any], schema: SchemaNode) -> list[Any]:
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    if "merge" not in schema.strategy or not isinstance(original, list):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "delete")]
    key = schema.merge_key
    items = schema.items()
    if key is None:
        # A primitive list with the merge strategy is a set union, original order first.
        merged = list(original)
        merged.extend(item for item in patch if item not in original)
        return merged
    merged = [copy.deepcopy(i) for i in original]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise PatchError(f"each item of a list merged by {key!r} needs that key")
        position = next(
            (n for n, have in enumerate(merged) if isinstance(have, dict) and have.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                merged.pop(position)
            continue
        if position is None:
            merged.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            result = _merge_map(merged[position], item, items)
            if result is None:
                merged.pop(position)
            else:
                merged[position] = result
    return merged


def patch_schema(catalog: SchemaCatalog, obj: Mapping[str, Any]) -> SchemaNode | None:
    """Where strategic merge reads ``obj``'s list merge keys: the newest configured release's schema."""
    if not catalog.sets:
        return None
    schema_set = catalog.sets[-1]
    kind = schema_set.kind(str(obj.get("apiVersion")), str(obj.get("kind")))
    if kind is None:
        return None
    return SchemaNode(kind.top, schema_set.resolve)


def apply_patch(kind: str, base: Any, patch: Any, catalog: SchemaCatalog) -> Any:
    """``patch`` of the format ``kind`` (``merge``, ``json``, ``strategic``, ``apply``: merged as a
    strategic merge patch, without field ownership) applied to ``base``."""
    if kind == "merge":
        return apply_merge_patch(base, patch)
    if kind == "json":
        return apply_json_patch(base, patch)
    if not isinstance(patch, dict):
        raise PatchError("a strategic merge patch must be a JSON object")
    return apply_strategic_merge_patch(base, patch, patch_schema(catalog, base))
