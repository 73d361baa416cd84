"""``$expand`` on GET (DSP0266 v1.15 §7.3 "Query parameters", "$expand"): the resources a body
links to come back inline, in place of their ``{"@odata.id": ...}`` references.

- ``*`` expands every hyperlink, ``.`` those outside any ``Links`` property (a collection's
  ``Members``, a fabric's ``Zones``...), ``~`` only those inside ``Links``;
- ``($levels=n)`` says how deep; without it one level. The service root advertises what is
  served (``ProtocolFeaturesSupported.ExpandQuery``: all three forms, ``Levels``, ``MaxLevels`` =
  :data:`MAX_LEVELS`); a deeper request is out of range (400), another form is malformed (400).

A reference that names nothing this service serves stays a reference, as it would without the
query. Clients use ``.($levels=1)`` to read a collection with its members in one request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulator.redfish.models import ExpandQuery
from emulator.redfish.nodes import Context
from emulator.redfish.registries import RedfishError

__all__ = ["MAX_LEVELS", "Expand", "expand", "expand_query", "expand_served"]

#: deepest ``$levels`` served (advertised as ``ExpandQuery.MaxLevels``)
MAX_LEVELS = 1

_FORM = re.compile(r"^(?P<kind>[*.~])(?:\(\$levels=(?P<levels>[0-9]+)\))?$")


@dataclass(frozen=True)
class Expand:
    """One parsed ``$expand`` value: which hyperlinks (``*``, ``.``, ``~``) and how deep."""

    kind: str
    levels: int

    @classmethod
    def parse(cls, value: str) -> Expand:
        found = _FORM.match(value.strip())
        if found is None:
            raise RedfishError.of(400, "QueryParameterValueFormatError", value, "$expand")
        levels = int(found["levels"]) if found["levels"] is not None else 1
        if not 1 <= levels <= MAX_LEVELS:
            raise RedfishError.of(400, "QueryParameterOutOfRange", str(levels), "$levels", f"1-{MAX_LEVELS}")
        return cls(found["kind"], levels)


def expand_served(ctx: Context) -> bool:
    """Whether this service serves ``$expand`` (topology ``behaviour.expand``)."""
    return ctx.index.topology.behaviour.expand == "served"


def expand_query(ctx: Context) -> ExpandQuery:
    """What the service root advertises in ``ProtocolFeaturesSupported.ExpandQuery``."""
    if not expand_served(ctx):
        return ExpandQuery()
    return ExpandQuery(ExpandAll=True, Levels=True, Links=True, NoLinks=True, MaxLevels=MAX_LEVELS)


def _is_reference(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("@odata.id"), str)


def expand(body: dict[str, Any], query: Expand, render: Callable[[str], bytes | None]) -> dict[str, Any]:
    """``body`` with the references ``query`` selects replaced by the resources they name
    (``render(uri)``: the resource's JSON, or None when there is none)."""

    def inline(uri: str) -> Any:
        raw = render(uri)
        return json.loads(raw) if raw is not None else {"@odata.id": uri}

    def walk(value: Any, in_links: bool, depth: int) -> Any:
        if _is_reference(value):
            wanted = query.kind == "*" or (query.kind == "~") == in_links
            if wanted and depth < query.levels:
                return walk(inline(value["@odata.id"]), False, depth + 1)
            return value
        if isinstance(value, dict):
            return {k: walk(v, in_links or k == "Links", depth) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, in_links, depth) for v in value]
        return value

    result = walk(body, False, 0)
    if not isinstance(result, dict):  # walk maps an object to an object: this cannot happen
        raise TypeError(f"$expand turned a resource into {type(result).__name__}")
    return result
