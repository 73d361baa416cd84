"""Reading a Redfish resource tree: one memoised GET per URI per pass, collections expanded when the
service can, dangling links tolerated.

Real services and DMTF's own mockups link to resources that do not exist (public-cxl's endpoint T4
links to Connection 14, which its Connections collection does not list; some links point nowhere).
A reader that aborts on the first 404 cannot be trusted with a real fabric, so a missing resource
reads as ``None`` and the caller decides what that means.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any

from fabric.redfish.client import RedfishClient
from manager_api.errors import FabricError, FabricUnavailable, NotFoundError

__all__ = ["Walk", "link", "links", "odata_id", "path_ids"]

JSON = dict[str, Any]


def odata_id(value: object) -> str | None:
    """The ``@odata.id`` of a navigation link object, or None — also when it is no URI path
    (DSP0266: a resource identifier is the path of its URI)."""
    if isinstance(value, Mapping):
        target = value.get("@odata.id")
        if isinstance(target, str) and target.startswith("/") and target.isprintable():
            return target.rstrip("/") or "/"
    return None


def link(resource: Mapping[str, Any] | None, *path: str) -> str | None:
    """``link(r, "Links", "PCIeDevice")`` → the URI that property points to (single link)."""
    value: object = resource
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    if isinstance(value, list):
        return odata_id(value[0]) if value else None
    return odata_id(value)


def links(resource: Mapping[str, Any] | None, *path: str) -> list[str]:
    """All URIs of a link array (or a single link) at ``path``."""
    value: object = resource
    for key in path:
        if not isinstance(value, Mapping):
            return []
        value = value.get(key)
    if isinstance(value, list):
        return [u for u in (odata_id(v) for v in value) if u]
    single = odata_id(value)
    return [single] if single else []


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
        self._limit = asyncio.Semaphore(concurrency)
        self.gets = 0

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
                    body: JSON | None = await self.client.get_json(uri)
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

    async def get_all(self, uris: Iterable[str]) -> list[JSON]:
        found = await asyncio.gather(*(self.get(u) for u in dict.fromkeys(uris)))
        return [r for r in found if r is not None]

    async def members(self, collection: str | None) -> list[JSON]:
        """Every member of a collection, following ``Members@odata.nextLink`` pages.

        With ``expand`` the collection is read with ``$expand=.($levels=1)`` (DSP0266 "Query
        parameters"); members that come back as bare links are read one by one, so a service that
        ignores the query still works.
        """
        return await self.get_all(await self.member_uris(collection))

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
            if page_uri in seen:
                raise FabricUnavailable(
                    f"the Redfish collection {collection} pages in a circle (back to {page_uri}); "
                    "the service's Members@odata.nextLink is wrong"
                )
            seen.add(page_uri)
            if first and self.expand:
                page = await self._get_expanded(page_uri)
            else:
                page = await self.get(page_uri)
            first = False
            if page is None:
                return []
            members = page.get("Members", [])
            if not isinstance(members, list):
                # Not "no members": an empty reading of Zones or Connections would say nothing is bound.
                raise FabricUnavailable(
                    f"the Redfish collection {page_uri} has Members that is no list "
                    f"({type(members).__name__}); the service's answer cannot be read"
                )
            for member in members:
                uri = odata_id(member)
                if not uri:
                    continue
                if isinstance(member, Mapping) and len(member) > 1 and "Id" in member:
                    self.seed(member)
                member_uris.append(uri)
            next_link = page.get("Members@odata.nextLink")
            page_uri = next_link if isinstance(next_link, str) and next_link.startswith("/") else None
        return member_uris

    async def _get_expanded(self, uri: str) -> JSON | None:
        key = f"{uri}?$expand=.($levels=1)"
        if key in self._cache:
            return self._cache[key]
        async with self._limit:
            self.gets += 1
            try:
                body: JSON | None = await self.client.get_json(key)
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
