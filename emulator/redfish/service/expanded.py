"""Answers to reads with ``$expand`` or ``$select``, kept between requests with what they were made of.

An expanded answer is the resource's body with the resources it links to inline
(:mod:`emulator.redfish.tree.expand`): one switch's ``Ports?$expand=.($levels=2)`` is 116 ports
and their metrics, re-parsed, walked and serialised again. Its ETag is a digest of those bytes.
A client that revalidates (``If-None-Match``, DSP0266 v1.20.0 §6.5 "ETags": "services shall
return 304 Not Modified" when the ETag matches, RFC 9110 §13.1.2) should not make the service
build the answer to learn that nothing changed, so each answer is kept with its *parts*: the URI
of every resource it was made of (the resource itself first, then each one inlined or left a
reference because it was not served) and a validator of that resource:

- its :meth:`~emulator.redfish.tree.nodes.Node.fingerprint` where it has one (what its rendering
  depends on: a port's link state, a zone's targets), which costs no rendering;
- else its own ETag (a digest of its rendering, kept per state revision by the renderer).

At the state revision it was made (or last found current) an answer is current as it is: every
change visible over Redfish bumps the revision, and a node whose payload changes without one
(``cached = False``) makes its answers *volatile* — built again on every read. At a later
revision it is current when every part's validator is what it was: the answer is a function of
its parts' renderings and the query alone. Else it is built again. So the ETag still changes
whenever the body would, and a 304 is answered from the kept ETag without rendering.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from emulator.redfish.tree.expand import Expand, Select, expand
from emulator.redfish.tree.nodes import Context, Node
from emulator.redfish.tree.render import tagged

__all__ = ["ExpandedAnswers", "Resolver"]

#: resolves a URI while an answer of ``base`` is made: (base, uri, nodes met so far) → node or None
Resolver = Callable[[Node, str, dict[str, Node | None]], Node | None]

#: answers kept, and their bytes in all (the oldest go first past either)
_ANSWERS_LIMIT = 4096
_BYTES_LIMIT = 128 << 20
#: inlined members parsed (and selected), by URI, ETag and ``$select``
_INLINED_LIMIT = 16384

_Key = tuple[str, Expand | None, Select | None]
#: (uri, validator); validator None: no resource served there (it stays a reference)
_Part = tuple[str, Hashable | None]


@dataclass(eq=False, slots=True)
class _Answer:
    revision: int
    volatile: bool
    parts: tuple[_Part, ...]
    body: bytes
    etag: str


class ExpandedAnswers:
    """The expanded answers of one service (``served(node)``: whether a node is inlined at all —
    a resource, not a document)."""

    def __init__(self, ctx: Context, resolve: Resolver, served: Callable[[Node], bool]) -> None:
        self.ctx = ctx
        self.resolve = resolve
        self.served = served
        self._answers: dict[_Key, _Answer] = {}
        self._bytes = 0
        #: (uri, ETag, $select) → the member as inlined: an ETag names one rendering
        self._inlined: dict[tuple[str, str, Select | None], dict[str, Any]] = {}
        #: answers served as kept without a look at their parts, checked part by part, built
        self.counts = {"kept": 0, "checked": 0, "built": 0}

    def answer(self, node: Node, query: Expand | None, chosen: Select | None) -> tuple[bytes, str]:
        """(body with ``@odata.etag`` unless the service sends none, ETag) of ``node`` read with
        ``query`` and ``chosen``."""
        key: _Key = (node.uri, query, chosen)
        revision = self.ctx.revision.value
        kept = self._answers.get(key)
        if kept is not None and not kept.volatile:
            self._answers[key] = self._answers.pop(key)  # most recently used last
            if kept.revision == revision:
                self.counts["kept"] += 1
                return kept.body, kept.etag
            if self._current(node, kept.parts):
                self.counts["checked"] += 1
                kept.revision = revision
                return kept.body, kept.etag
        self.counts["built"] += 1
        made = self._build(node, query, chosen)
        self._keep(key, made)
        return made.body, made.etag

    def _validator(self, node: Node, etag: str | None = None) -> Hashable:
        fingerprint = node.fingerprint()
        if fingerprint is not None:
            return ("fingerprint", fingerprint)
        return etag if etag is not None else self.ctx.renderer.render(node)[1]

    def _current(self, node: Node, parts: tuple[_Part, ...]) -> bool:
        made: dict[str, Node | None] = {node.uri: node}
        for uri, validator in parts:
            linked = self.resolve(node, uri, made)
            now = self._validator(linked) if linked is not None and self.served(linked) else None
            if now != validator:
                return False
        return True

    def _build(self, node: Node, query: Expand | None, chosen: Select | None) -> _Answer:
        renderer = self.ctx.renderer
        raw, tag = renderer.render(node)
        parts: list[_Part] = [(node.uri, self._validator(node, tag))]
        volatile = not node.cached
        made: dict[str, Node | None] = {node.uri: node}

        def render(uri: str) -> dict[str, Any] | None:
            nonlocal volatile
            linked = self.resolve(node, uri, made)
            if linked is None or not self.served(linked):
                parts.append((uri, None))
                return None
            raw, tag = renderer.render(linked)
            parts.append((uri, self._validator(linked, tag)))
            volatile = volatile or not linked.cached
            return self._inline(uri, raw, tag, early)

        body: dict[str, Any] = json.loads(raw)
        # A collection's members read one level deep are selected as they are inlined (and kept so,
        # for the next answer); anything deeper is selected once the whole answer is made: the
        # paths name properties of the members (``Metrics/PCIeErrors``), not of what the members
        # link to, which ``$expand`` inlined first (DSP0266 "Query parameters", "$select").
        direct = query is not None and query.levels == 1 and isinstance(body.get("Members"), list)
        early = chosen if direct else None
        if query is not None:
            body = expand(body, query, render)
        if chosen is not None:
            body = chosen.apply(body)
        body.pop("@odata.etag", None)
        text, etag = tagged(body, etags=renderer.etags)
        return _Answer(self.ctx.revision.value, volatile, tuple(parts), text, etag)

    def _inline(self, uri: str, raw: bytes, tag: str, chosen: Select | None) -> dict[str, Any]:
        key = (uri, tag, chosen)
        member = self._inlined.pop(key, None)
        if member is not None:
            self._inlined[key] = member  # the most recently used last (the oldest go past the limit)
        else:
            member = json.loads(raw)
            if chosen is not None:
                member = chosen.apply(member)
            if len(self._inlined) >= _INLINED_LIMIT:
                del self._inlined[next(iter(self._inlined))]
            self._inlined[key] = member
        return member

    def _keep(self, key: _Key, answer: _Answer) -> None:
        old = self._answers.pop(key, None)
        if old is not None:
            self._bytes -= len(old.body)
        if answer.volatile:
            return
        size = len(answer.body)
        while self._answers and (len(self._answers) >= _ANSWERS_LIMIT or self._bytes + size > _BYTES_LIMIT):
            gone = self._answers.pop(next(iter(self._answers)))
            self._bytes -= len(gone.body)
        self._answers[key] = answer
        self._bytes += len(answer.body)
