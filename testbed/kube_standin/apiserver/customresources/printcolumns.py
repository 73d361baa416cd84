"""A CRD's ``additionalPrinterColumns`` as Table columns (``kubectl get``), as
``k8s.io/apiextensions-apiserver/pkg/registry/customresource/tableconvertor/tableconvertor.go`` builds
them: ``Name``, then each column in order; a ``date`` column shows the time since the value (as
``Age``); a path that finds nothing leaves the cell empty.

The JSONPath is the subset CRDs use (``k8s.io/client-go/util/jsonpath``): ``.field`` steps, ``[n]``
indexes and ``[?(@.key=="value")]`` filters; a filter's first match is shown.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Column", "printer_columns", "read_path"]

#: (name, type, cell of an object), as :mod:`kube_standin.apiserver.tables` renders columns.
Column = tuple[str, str, Callable[[Mapping[str, Any]], Any]]

_STEP = re.compile(r"""\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*["']([^"']*)["']\)\]""")


def read_path(obj: Any, path: str) -> Any:
    """The value at ``path`` in ``obj`` (None when the path finds nothing or is not understood)."""
    position = 0
    values: list[Any] = [obj]
    while position < len(path):
        step = _STEP.match(path, position)
        if step is None:
            return None
        field, index, filter_key, filter_value = step.groups()
        if field is not None:
            values = [v[field] for v in values if isinstance(v, Mapping) and field in v]
        elif index is not None:
            values = [v[int(index)] for v in values if isinstance(v, list) and int(index) < len(v)]
        else:
            values = [
                item
                for v in values
                if isinstance(v, list)
                for item in v
                if isinstance(item, Mapping) and str(_dig(item, filter_key)) == filter_value
            ]
        position = step.end()
    return values[0] if values else None


def _dig(item: Mapping[str, Any], dotted: str) -> Any:
    node: Any = item
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def printer_columns(definitions: Sequence[Mapping[str, Any]], age: Callable[[Any], str]) -> list[Column]:
    """The columns after ``Name`` (``age`` renders a ``date`` column's timestamp); with no
    definitions, ``Age`` alone, as a CRD without columns prints."""
    if not definitions:
        return [("Age", "date", lambda o: age(read_path(o, ".metadata.creationTimestamp")))]
    columns: list[Column] = []
    for definition in definitions:
        kind = str(definition.get("type") or "string")
        columns.append(
            (str(definition["name"]), kind, _cell(str(definition.get("jsonPath") or ""), kind, age))
        )
    return columns


def _cell(path: str, kind: str, age: Callable[[Any], str]) -> Callable[[Mapping[str, Any]], Any]:
    def cell(obj: Mapping[str, Any]) -> Any:
        value = read_path(obj, path)
        return age(value) if kind == "date" else value

    return cell
