"""Rendered payloads, their ETags, and the checks of ``If-Match`` and action ETag parameters.

A payload is serialised once per state revision and cached with its ETag, a weak validator
derived from the bytes (so an unrelated change elsewhere does not change it). The body also
carries it as ``@odata.etag``. A resource with a :meth:`Renderable.fingerprint` keeps its
serialisation across revisions while the fingerprint is the same: a zone is not serialised
again because another zone changed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Hashable
from typing import Any, Protocol

from emulator.redfish.engine.bindings import Revision
from emulator.redfish.model.errors import RedfishError

__all__ = ["Renderable", "Renderer", "etag_matches", "none_match", "tagged"]

_CACHE_LIMIT = 8192
#: renderings kept across revisions by fingerprint: more than a fabric of 10,100 devices has
#: endpoints, so rebuilding the expanded Endpoints after one bind does not render them all again
_KEPT_LIMIT = 32768


class Renderable(Protocol):
    """What the renderer needs of a resource (a :class:`~emulator.redfish.tree.nodes.Node`)."""

    uri: str
    #: rendered once per state revision; False for a payload that also reads what changes without one
    cached: bool

    def fingerprint(self) -> Hashable | None:
        """What the payload depends on, when that is cheaper to get than the payload; None: always render."""
        ...

    def payload(self) -> dict[str, Any]: ...


class Renderer:
    """``etags=False`` (topology ``behaviour.etags: omitted``): bodies without ``@odata.etag`` and
    no ``If-Match`` or ETag parameter checked; :meth:`render` still gives each rendering's tag
    (the application keys its caches by it) and the application sends it nowhere."""

    def __init__(self, revision: Revision, *, etags: bool = True) -> None:
        self.revision = revision
        self.etags = etags
        self._revision = -1
        self._cache: dict[str, tuple[bytes, str]] = {}
        #: uri → (fingerprint, body, ETag) of nodes that have one, kept across revisions
        self._kept: dict[str, tuple[Hashable, bytes, str]] = {}

    def render(self, node: Renderable) -> tuple[bytes, str]:
        """(JSON body with ``@odata.etag``, ETag header value) of a resource node."""
        revision = self.revision.value
        if revision != self._revision:
            self._cache.clear()
            self._revision = revision
        hit = self._cache.get(node.uri)
        if hit is not None:
            return hit
        fingerprint = node.fingerprint()
        if fingerprint is not None:
            kept = self._kept.get(node.uri)
            if kept is not None and kept[0] == fingerprint:
                # the most recently used goes last: past the limit the least recently used goes,
                # not the first kept (the zones an expanded answer uses at every change were
                # evicted one by one by other reads, and rendered again each time: at 10,000
                # bindings a zone of a hundred endpoints a change)
                del self._kept[node.uri]
                self._kept[node.uri] = kept
                return kept[1], kept[2]
        body, etag = tagged(node.payload(), etags=self.etags)
        # past the limit the oldest goes (a dict keeps insertion order): a pass over a fabric of
        # more resources than the limit keeps what it read last, not nothing
        if node.cached:
            if len(self._cache) >= _CACHE_LIMIT:
                del self._cache[next(iter(self._cache))]
            self._cache[node.uri] = (body, etag)
        if fingerprint is not None:
            self._kept.pop(node.uri, None)
            if len(self._kept) >= _KEPT_LIMIT:
                del self._kept[next(iter(self._kept))]
            self._kept[node.uri] = (fingerprint, body, etag)
        return body, etag

    def check_if_match(self, node: Renderable, header: str | None) -> None:
        """``If-Match`` on a change: 412 PreconditionFailed unless it names the current ETag or ``*``."""
        if header is None or header.strip() == "*" or not self.etags:
            return
        _, current = self.render(node)
        if not any(etag_matches(tag, current) for tag in header.split(",")):
            raise RedfishError.of(
                412,
                "PreconditionFailed",
                detail=f"If-Match {header} does not match the current ETag {current} of {node.uri}.",
            )

    def check_action_etag(self, node: Renderable, given: str | None, parameter: str) -> None:
        """An action's ETag parameter; the CSDL (Zone 1.5, ComputerSystem 1.16) asks for 428 on mismatch."""
        if given is None or not self.etags:
            return
        _, current = self.render(node)
        if not etag_matches(given, current):
            raise RedfishError.of(
                428,
                "PreconditionFailed",
                related=[f"/{parameter}"],
                detail=f"{parameter} {given} does not match the current ETag {current} of {node.uri}.",
            )


def tagged(payload: dict[str, Any], *, etags: bool) -> tuple[bytes, str]:
    """(JSON of ``payload`` with ``@odata.etag`` unless ``etags`` is False, its ETag): a weak
    validator digested from the bytes without the annotation."""
    raw = json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()
    etag = 'W/"' + hashlib.blake2b(raw, digest_size=8).hexdigest() + '"'
    if not etags:
        return raw, etag
    # splice the annotation in rather than serialising twice: raw is a JSON object "{...}"
    annotation = b'"@odata.etag":' + json.dumps(etag).encode() + b"}"
    return raw[:-1] + (b"," if len(raw) > 2 else b"") + annotation, etag


def _opaque(tag: str) -> str:
    tag = tag.strip()
    if tag.startswith("W/"):
        tag = tag[2:]
    return tag.strip('"')


def etag_matches(given: str, current: str) -> bool:
    """Weak comparison (RFC 9110 §8.8.3.2), also accepting the tag without quotes."""
    return bool(current) and _opaque(given) == _opaque(current)


def none_match(header: str | None, current: str) -> bool:
    """Whether ``If-None-Match: header`` fails for a resource whose ETag is ``current`` (a GET then
    answers 304, RFC 9110 §13.1.2): ``*`` matches any current representation, a list of tags by
    weak comparison. A service without ETags has nothing to match."""
    if not header or not current:
        return False
    if header.strip() == "*":
        return True
    return any(etag_matches(tag, current) for tag in header.split(","))
