"""Reading a Redfish resource tree: one memoised GET per URI per pass, collections expanded when the
service can, dangling links tolerated.

Real services and DMTF's own mockups link to resources that do not exist (public-cxl's endpoint T4
links to Connection 14, which its Connections collection does not list; some links point nowhere).
A reader that aborts on the first 404 cannot be trusted with a real fabric, so a missing resource
reads as ``None`` and the caller decides what that means.

A hostile or broken service must not keep a pass going for ever: ``Members@odata.nextLink`` is
resolved on the service (:func:`fabric.redfish.links.resolve`, another origin fails the pass), a
page seen before ends it as a cycle, and a collection of more than :data:`MAX_PAGES` pages or a
pass of more than :data:`MAX_MEMBERS` members fails it, naming the collection — the cause
``/readyz`` and the log then give. A pass keeps what it read until it ends, so it also reads at most
:data:`MAX_PASS_BYTES` of answers and :data:`MAX_PASS_VALUES` JSON values in all: each answer is
bounded by the reader (:mod:`fabric.redfish.reader`), but many answers within their bounds would
still add up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, cast

from fabric.backends.views import JSON, Collection, View, odata_id
from fabric.redfish.client import RedfishClient
from fabric.redfish.links import same_service
from manager_api.errors import FabricError, FabricUnavailable, NotFoundError

__all__ = ["MAX_MEMBERS", "MAX_PAGES", "MAX_PASS_BYTES", "MAX_PASS_VALUES", "Walk", "path_ids"]

V = TypeVar("V", bound=View)

#: pages one collection may have: services page by 50 to 1000 members, so even at 50 a page this
#: is a collection of 12,800 — more endpoints, zones or connections than one fabric has
MAX_PAGES = 256
#: collection members one pass may list, all collections together
MAX_MEMBERS = 100_000
#: bytes of answers one pass may read: a pass keeps every resource it read until it ends, so the
#: transport's bounds per answer and in flight alone would let 16 answers of 60 MB each be kept
#: (a real fabric of thousands of resources reads a few MiB)
MAX_PASS_BYTES = 64 << 20
#: JSON values (:class:`fabric.redfish.reader.Budget`) of the answers one pass may read: bytes
#: alone do not bound what they cost, since 64 MiB of ``[{},{},…]`` would be 22 million objects. A
#: full pass over 8,600 devices and 200 hosts (the emulator, expanded collections) reads 1,561,687
#: values in 41 MB; at most about 100 bytes a value, this keeps at most about 200 MiB
MAX_PASS_VALUES = 2 << 20


def _page_key(uri: str) -> str:
    """A page as a cycle check compares it: its path without a trailing slash, and its query."""
    path, _, query = uri.partition("?")
    return f"{path.rstrip('/') or '/'}?{query}"


def path_ids(uri: str, collection: str) -> str | None:
    """The Id that follows ``collection`` in ``uri``: ``path_ids("/redfish/v1/Systems/H1/…", "Systems")``."""
    parts = [p for p in uri.split("/") if p]
    for index, part in enumerate(parts[:-1]):
        if part == collection:
            return parts[index + 1]
    return None


class Walk:
    """One pass over the tree. GETs are memoised (many resources are linked from several places)
    and run concurrently up to ``concurrency``."""

    def __init__(self, client: RedfishClient, *, concurrency: int = 16, expand: bool = False) -> None:
        self.client = client
        self.expand = expand
        self._cache: dict[str, JSON | None] = {}
        self._inflight: dict[str, asyncio.Future[JSON | None]] = {}
        self._views: dict[tuple[str, type[View]], View] = {}
        self._limit = asyncio.Semaphore(concurrency)
        self.gets = 0
        #: collection members listed in this pass (bounded by :data:`MAX_MEMBERS`)
        self.listed = 0
        #: bytes of the answers read in this pass (bounded by :data:`MAX_PASS_BYTES`)
        self.read_bytes = 0
        #: JSON values of the answers read in this pass (bounded by :data:`MAX_PASS_VALUES`)
        self.read_values = 0

    def seed(self, resource: Mapping[str, Any]) -> None:
        uri = odata_id(resource)
        if uri and uri not in self._cache:
            self._cache[uri] = dict(resource)

    async def get(self, uri: str | None) -> JSON | None:
        """The resource at ``uri``; None when the service says it does not exist."""
        if not uri:
            return None
        uri = uri.rstrip("/") or "/"
        if uri in self._cache:
            return self._cache[uri]
        pending = self._inflight.get(uri)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[JSON | None] = asyncio.get_running_loop().create_future()
        self._inflight[uri] = future
        try:
            async with self._limit:
                self.gets += 1
                try:
                    body: JSON | None = await self._fetch(uri)
                except NotFoundError:
                    body = None
        except BaseException as err:
            future.set_exception(err)
            future.exception()  # consumed here; waiters re-raise it
            raise
        else:
            future.set_result(body)
            self._cache[uri] = body
            return body
        finally:
            del self._inflight[uri]

    async def _fetch(self, uri: str) -> JSON:
        response = await self.client.get(uri)
        self.read_bytes += response.size
        self.read_values += response.values
        if self.read_bytes > MAX_PASS_BYTES:
            raise FabricUnavailable(
                f"the Redfish service's answers in one pass exceed {MAX_PASS_BYTES >> 20} MiB "
                f"(the last: {uri}, {response.size} bytes); not read further"
            )
        if self.read_values > MAX_PASS_VALUES:
            raise FabricUnavailable(
                f"the Redfish service's answers in one pass hold more than {MAX_PASS_VALUES:,} JSON "
                f"values (the last: {uri}, {response.values:,}); not read further"
            )
        return response.body

    async def read(self, uri: str | None, view: type[V]) -> V | None:
        """The resource at ``uri`` read as ``view`` (each resource is read once per view per pass)."""
        body = await self.get(uri)
        if body is None or uri is None:
            return None
        key = (uri.rstrip("/") or "/", view)
        found = self._views.get(key)
        if found is None:
            found = self._views[key] = view.model_validate(body)
        return cast(V, found)

    async def read_all(self, uris: Iterable[str], view: type[V]) -> list[V]:
        found = await asyncio.gather(*(self.read(u, view) for u in dict.fromkeys(uris)))
        return [r for r in found if r is not None]

    async def members(self, collection: str | None, view: type[V]) -> list[V]:
        """Every member of a collection as ``view``, following ``Members@odata.nextLink`` pages.

        With ``expand`` the collection is read with ``$expand=.($levels=1)`` (DSP0266 "Query
        parameters"); members that come back as bare links are read one by one, so a service that
        ignores the query still works.
        """
        return await self.read_all(await self.member_uris(collection), view)

    async def member_uris(self, collection: str | None) -> list[str]:
        """The URIs of every member of a collection, following ``Members@odata.nextLink`` pages
        (members the pages carry in full are kept for :meth:`get`)."""
        if not collection:
            return []
        page_uri: str | None = collection
        member_uris: list[str] = []
        seen: set[str] = set()
        first = True
        while page_uri:
            key = _page_key(page_uri)
            if key in seen:
                raise FabricUnavailable(
                    f"the Redfish collection {collection} pages in a circle (back to {page_uri}); "
                    "the service's Members@odata.nextLink is wrong"
                )
            if len(seen) >= MAX_PAGES:
                raise FabricUnavailable(
                    f"the Redfish collection {collection} has more than {MAX_PAGES} pages "
                    f"(Members@odata.nextLink goes on to {page_uri[:200]}); not read further"
                )
            seen.add(key)
            if first and self.expand:
                page = await self._get_expanded(page_uri)
            else:
                page = await self.get(page_uri)
            first = False
            if page is None:
                return []
            listing = Collection.model_validate(page)
            members = listing.members
            if not isinstance(members, list):
                # Not "no members": an empty reading of Zones or Connections would say nothing is bound.
                raise FabricUnavailable(
                    f"the Redfish collection {page_uri} has Members that is no list "
                    f"({type(members).__name__}); the service's answer cannot be read"
                )
            self.listed += len(members)
            if self.listed > MAX_MEMBERS:
                raise FabricUnavailable(
                    f"the Redfish service lists more than {MAX_MEMBERS} collection members in one pass "
                    f"(at {collection}, {len(seen)} pages); not read further"
                )
            for member in members:
                uri = odata_id(member)
                if not uri:
                    continue
                if isinstance(member, Mapping) and len(member) > 1 and "Id" in member:
                    self.seed(member)
                member_uris.append(uri)
            page_uri = same_service(
                self.client.base_url, listing.next_link, link=f"Members@odata.nextLink of {collection}"
            )
        return member_uris

    async def _get_expanded(self, uri: str) -> JSON | None:
        key = f"{uri}?$expand=.($levels=1)"
        if key in self._cache:
            return self._cache[key]
        async with self._limit:
            self.gets += 1
            try:
                body: JSON | None = await self._fetch(key)
            except NotFoundError:
                body = None
            except FabricUnavailable:
                raise
            except FabricError:
                # Advertised but refused (QueryParameterUnsupported...): read without it from now on.
                self.expand = False
                body = None
        if body is None and not self.expand:
            return await self.get(uri)
        self._cache[key] = body
        return body
