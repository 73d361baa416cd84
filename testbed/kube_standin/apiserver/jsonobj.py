"""Copying JSON documents: the store shares stored objects with history and watchers and never
mutates them, so writers copy only what they change (or :func:`clone` a whole document)."""

from __future__ import annotations

from typing import Any

__all__ = ["Obj", "clone"]

#: a Kubernetes object (or any JSON object) as decoded from the wire.
Obj = dict[str, Any]


def clone(value: Any) -> Any:
    """A deep copy of a JSON document (dicts, lists, scalars); several times faster than
    :func:`copy.deepcopy`, which has to handle arbitrary objects and shared references."""
    kind = type(value)
    if kind is dict:
        return {key: clone(item) for key, item in value.items()}
    if kind is list:
        return [clone(item) for item in value]
    return value
