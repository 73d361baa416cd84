"""Name what differs between a stored slice and the one the controller is about to write.

A write over a stored slice is either a change of the inventory (expected) or a field the API
server stores differently from how the controller renders it (a bug: every restart would write
again). The log line of each in-place rewrite carries the first few differing paths of the two
normal forms, so a rewrite on a real cluster names its field without a debugger: ``spec.devices
[gpu-3].attributes[fabric-dra.io/health]: stored {'string': 'Healthy'}, rendered {'string':
'Critical'}``.

Normal forms (:func:`dra_driver.controller.slices._normal_spec`) are JSON values whose device
lists are keyed by device name; lists elsewhere are compared by position.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["differences"]

#: longest rendering of one side of a difference in a log line
_VALUE_CHARS = 80
_MISSING = object()


def _show(value: Any) -> str:
    if value is _MISSING:
        return "absent"
    text = repr(value)
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _key_path(path: str, key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key}]"


def _walk(path: str, stored: Any, rendered: Any) -> Iterator[str]:
    if stored == rendered:
        return
    if isinstance(stored, Mapping) and isinstance(rendered, Mapping):
        for key in sorted(set(stored) | set(rendered), key=str):
            yield from _walk(_key_path(path, key), stored.get(key, _MISSING), rendered.get(key, _MISSING))
        return
    if isinstance(stored, list) and isinstance(rendered, list) and len(stored) == len(rendered):
        for index, (a, b) in enumerate(zip(stored, rendered, strict=True)):
            yield from _walk(f"{path}[{index}]", a, b)
        return
    yield f"{path or '.'}: stored {_show(stored)}, rendered {_show(rendered)}"


def differences(stored: Any, rendered: Any, *, limit: int = 5) -> list[str]:
    """At most ``limit`` paths where ``stored`` and ``rendered`` differ, each with both values
    (shortened), in a stable order; ``[]`` when they are equal."""
    found: list[str] = []
    for line in _walk("", stored, rendered):
        found.append(line)
        if len(found) >= limit:
            break
    return found
