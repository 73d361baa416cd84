"""``$expand`` on GET (DSP0266 v1.15 §7.3 "Query parameters", "$expand"): the resources a body
links to come back inline, in place of their ``{"@odata.id": ...}`` references.

- ``*`` expands every hyperlink, ``.`` those outside any ``Links`` property (a collection's
  ``Members``, a fabric's ``Zones``...), ``~`` only those inside ``Links``;
- ``($levels=n)`` says how deep; without it one level. The service root advertises what is
  served (``ProtocolFeaturesSupported.ExpandQuery``: all three forms, ``Levels``, ``MaxLevels`` =
  :data:`MAX_LEVELS`); a deeper request is out of range (400), another form is malformed (400).

A reference that names nothing this service serves stays a reference, as it would without the
query. Clients use ``.($levels=1)`` to read a collection with its members in one request.

``$select`` (DSP0266 "Query parameters", "$select"; advertised as
``ProtocolFeaturesSupported.SelectQuery`` alongside ``$expand``): a comma-separated list of
properties (``Links/Endpoints`` names one inside an object); the answer keeps those and the
``@odata`` annotations (``@odata.id``, ``@odata.type``, ``@odata.etag``...). DSP0266 evaluates
``$expand`` before ``$select``; on a resource collection the selection applies to each member it
inlined, and the collection keeps ``Members`` (with its count and next link) — so
``Zones?$expand=.($levels=1)&$select=Id`` lists every zone with its ETag and not its endpoints.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.resources import ExpandQuery
from emulator.redfish.tree.nodes import Context

__all__ = ["MAX_LEVELS", "Expand", "Select", "expand", "expand_query", "expand_served"]

#: deepest ``$levels`` served (advertised as ``ExpandQuery.MaxLevels``): three reach a collection's
#: members' own collections' members (``Chassis/{switch}/PCIeDevices`` with each device's
#: ``PCIeFunctions`` and their members), which clients read to describe many devices at once
MAX_LEVELS = 3

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


@dataclass(frozen=True)
class Select:
    """One parsed ``$select`` value: property paths, each a tuple of names."""

    paths: tuple[tuple[str, ...], ...]

    @classmethod
    def parse(cls, value: str) -> Select:
        paths = []
        for item in value.split(","):
            parts = tuple(item.strip().split("/"))
            if not all(_NAME.match(p) for p in parts):
                raise RedfishError.of(400, "QueryParameterValueFormatError", value, "$select")
            paths.append(parts)
        return cls(tuple(paths))

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the selected properties and its ``@odata`` annotations; a collection
        keeps its members, each inlined one selected in turn."""
        if isinstance(body.get("Members"), list):
            kept = {k: v for k, v in body.items() if k.startswith(("@odata.", "Members"))}
            kept["Members"] = [self.apply(m) if _inlined(m) else m for m in body["Members"]]
            return kept
        return self._pick(body, self.paths)

    @staticmethod
    def _pick(body: dict[str, Any], paths: tuple[tuple[str, ...], ...]) -> dict[str, Any]:
        kept = {k: v for k, v in body.items() if k.startswith("@odata.")}
        for name in dict.fromkeys(p[0] for p in paths):
            if name not in body:
                continue
            deeper = tuple(p[1:] for p in paths if p[0] == name and len(p) > 1)
            value = body[name]
            whole = any(len(p) == 1 and p[0] == name for p in paths)
            if deeper and not whole and isinstance(value, dict):
                value = Select._pick(value, deeper)
            kept[name] = value
        return kept


_NAME = re.compile(r"^[A-Za-z_@][A-Za-z0-9_.@#]*$")


def _inlined(member: Any) -> bool:
    return isinstance(member, dict) and not _is_reference(member)


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


def expand(
    body: dict[str, Any], query: Expand, render: Callable[[str], dict[str, Any] | None]
) -> dict[str, Any]:
    """``body`` with the references ``query`` selects replaced by the resources they name
    (``render(uri)``: the resource's JSON as an object, or None when there is none)."""

    def inline(uri: str) -> Any:
        found = render(uri)
        return found if found is not None else {"@odata.id": uri}

    def walk(value: Any, in_links: bool, depth: int) -> Any:
        if depth >= query.levels:
            # nothing this deep is expanded: the value as it is (a walk would copy it unchanged;
            # an inlined member is shared with the caller's cache, which nothing here mutates)
            return value
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
