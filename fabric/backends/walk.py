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
``/readyz`` and the log then give. A pass keeps what it read until it ends, so it also holds at most
:data:`MAX_PASS_BYTES` of answers and :data:`MAX_PASS_VALUES` JSON values in all: each answer is
bounded by the reader (:mod:`fabric.redfish.reader`), but many answers within their bounds would
still add up. (A switch's devices are read by a walk of their own whose answers are dropped once
they are described, :mod:`fabric.backends.stream`: they count while held.)

Where the service serves ``$select`` (``ProtocolFeaturesSupported.SelectQuery``),
:meth:`Walk.prefetch_siblings` may ask for only some properties of each member: DSP0266 "Query
parameters" evaluates ``$select`` after ``$expand``, so ``Metrics/PCIeErrors`` names a property of
the metrics inlined in a port. What comes back is kept for :meth:`Walk.get` as the members' bodies:
the caller asks for what every reader of those members in its walk reads, ``Id`` among them (an
inlined object without one is not taken as a resource). The answer has an ETag of its own and is
revalidated as any other. Refused, the walk reads without ``$select`` from then on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from fabric.backends.views import JSON, Collection, Readable, odata_id
from fabric.redfish.client import RedfishClient, RedfishResponse
from fabric.redfish.links import same_service
from manager_api.errors import FabricError, FabricUnavailable, NotFoundError
from plumbing.logs import get_logger

__all__ = [
    "MAX_MEMBERS",
    "MAX_PAGES",
    "MAX_PASS_BYTES",
    "MAX_PASS_VALUES",
    "Revalidation",
    "Walk",
    "path_ids",
]

V = TypeVar("V", bound=Readable)

log = get_logger(__name__)

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


def _parent(uri: str, segments: int) -> str | None:
    """``uri`` without its last ``segments`` path segments; None above ``/redfish/v1/<collection>``
    (the service root and its own properties are never read as a collection to expand)."""
    parts = uri.split("/")
    if len(parts) - segments < 4:
        return None
    return "/".join(parts[:-segments])


@dataclass(eq=False, slots=True)
class _Kept:
    """A resource as a full pass read it, with the ETag it came with."""

    etag: str
    body: JSON
    size: int
    values: int


class Revalidation:
    """What the last full pass read, by request, with each answer's ETag: the next pass asks with
    ``If-None-Match`` (RFC 9110 §13.1.2) and a 304 gives back what was read — the same objects,
    so the views made of them are not made again (:meth:`Walk.read`). Only what the last pass
    read is kept (:meth:`retain`), so this holds at most one pass's answers, which the pass held
    anyway while it ran. A service that sends no ETags is read in full every pass."""

    def __init__(self) -> None:
        self._kept: dict[str, _Kept] = {}
        #: (URI, view) → (the body it was made of, the view)
        self._views: dict[tuple[str, type[Readable]], tuple[JSON, Readable]] = {}
        #: what the last full pass derived from answers it did not keep (:attr:`Walk.derived`)
        self.derived: dict[Any, Any] = {}
        #: answers of the last pass that were 304 Not Modified, and read in full
        self.not_modified = 0
        self.read = 0

    def etag(self, key: str) -> str | None:
        kept = self._kept.get(key)
        return kept.etag if kept is not None else None

    def kept(self, key: str) -> _Kept | None:
        return self._kept.get(key)

    def view(self, key: tuple[str, type[Readable]], body: JSON) -> Readable | None:
        """The view made last pass of ``body``, if ``body`` is the very object it was made of."""
        held = self._views.get(key)
        return held[1] if held is not None and held[0] is body else None

    def retain(self, walk: Walk) -> None:
        """Keep what ``walk`` (a full pass, ended) read; forget the rest."""
        self._kept = dict(walk.kept)
        self._views = {
            key: (body, view) for key, view in walk.views.items() if (body := walk.cached(key[0])) is not None
        }
        self.derived = dict(walk.derived)
        self.not_modified, self.read = walk.not_modified, walk.gets - walk.not_modified


def _grouped(uris: Iterable[str], segments: int) -> dict[str, list[str]]:
    """``uris`` by their :func:`_parent` ``segments`` up (those without one are left out)."""
    groups: dict[str, list[str]] = {}
    for uri in uris:
        parent = _parent(uri, segments)
        if parent is not None and "?" not in uri:
            groups.setdefault(parent, []).append(uri)
    return groups


def path_ids(uri: str, collection: str) -> str | None:
    """The Id that follows ``collection`` in ``uri``: ``path_ids("/redfish/v1/Systems/H1/…", "Systems")``."""
    parts = [p for p in uri.split("/") if p]
    for index, part in enumerate(parts[:-1]):
        if part == collection:
            return parts[index + 1]
    return None


def _slim(
    cache: dict[str, JSON | None],
    made: Mapping[tuple[str, type[Readable]], Readable],
    views: Iterable[Readable],
) -> None:
    """Drop the JSON of resources a pass read into ``views``: each answer becomes a stub of its
    ``@odata.id`` and ``Id``, the same object, so what holds it (the pass, an expanded page's
    members, :class:`Revalidation` for a 304) holds only the stub, and the view made of it is still
    found for it — this pass and, after a 304, the next. For what is read through its views only (a
    fabric's endpoints: 54 MiB of JSON beside their views at 10,100 devices); a reader of the JSON
    would find the stub."""
    for view in views:
        uri = getattr(view, "uri", None)
        body = cache.get(uri) if isinstance(uri, str) else None
        if body is None or made.get((str(uri), type(view))) is not view:
            continue
        stub: JSON = {k: body[k] for k in ("@odata.id", "Id") if k in body}
        body.clear()
        body.update(stub)


def _inline_resources(value: Any, under: str, cache: dict[str, JSON | None]) -> None:
    """Keep in ``cache`` every resource given inline in ``value`` (an object with its ``@odata.id``
    and an ``Id`` or ``Members``) whose URI lies under ``under``: an answer speaks for what it
    holds, not for resources elsewhere in the tree. The bodies are kept as they came (not copied)."""
    pending = [value]
    # decoded JSON holds only dict and list containers (exact types: compared, not
    # isinstance-checked, as every value of every expanded answer passes here)
    while pending:
        item = pending.pop()
        if type(item) is list:
            pending.extend(v for v in item if type(v) is dict or type(v) is list)
            continue
        if type(item) is not dict:
            continue
        if ("Id" in item or "Members" in item) and (uri := odata_id(item)) and uri.startswith(under):
            cache.setdefault(uri, item)
        # ``$expand=.`` inlines subordinate resources only, never what ``Links`` names
        # (DSP0266 "Query parameters"): a port's or an initiator's links are not walked
        for key, inner in item.items():
            if (type(inner) is dict or type(inner) is list) and key != "Links":
                pending.append(inner)


class Walk:
    """One pass over the tree. GETs are memoised (many resources are linked from several places)
    and run concurrently up to ``concurrency``.

    ``expand``: the service serves ``$expand`` (``max_levels`` deep, ServiceRoot
    ``ProtocolFeaturesSupported.ExpandQuery``): collections are read with their members inline
    (:meth:`member_uris`), and :meth:`prefetch` reads in one request the members a caller is
    about to read one by one. ``select``: it serves ``$select`` too (``SelectQuery``).
    ``revalidation``: what the last full pass read, asked again with ``If-None-Match``."""

    def __init__(
        self,
        client: RedfishClient,
        *,
        concurrency: int = 16,
        expand: bool = False,
        max_levels: int = 1,
        select: bool = False,
        revalidation: Revalidation | None = None,
    ) -> None:
        self.client = client
        self.expand = expand
        self.select = select and expand
        self.max_levels = max_levels if expand else 0
        self.revalidation = revalidation
        self._cache: dict[str, JSON | None] = {}
        self._inflight: dict[str, asyncio.Future[JSON | None]] = {}
        self._views: dict[tuple[str, type[Readable]], Readable] = {}
        #: what callers derive from this pass's resources, once per pass (keys are theirs)
        self.memo: dict[Any, Any] = {}
        #: what callers derived from answers this pass did not keep, with what the next pass
        #: needs to know it still holds (kept by :class:`Revalidation`; keys are theirs)
        self.derived: dict[Any, Any] = {}
        self._limit = asyncio.Semaphore(concurrency)
        #: what this pass read with an ETag, by request (for the next pass's :class:`Revalidation`)
        self.kept: dict[str, _Kept] = {}
        self.gets = 0
        #: answers that were 304 Not Modified (what the last pass read still holds)
        self.not_modified = 0
        #: collections read with their members inline by :meth:`prefetch`
        self.prefetched = 0
        self._reading: dict[str, asyncio.Future[bool]] = {}
        #: collection members listed in this pass (bounded by :data:`MAX_MEMBERS`)
        self.listed = 0
        #: bytes of the answers read in this pass (bounded by :data:`MAX_PASS_BYTES`)
        self.read_bytes = 0
        #: JSON values of the answers read in this pass (bounded by :data:`MAX_PASS_VALUES`)
        self.read_values = 0
        #: collection → (members it listed that were not there when read, the first of them)
        self.gone: dict[str, tuple[int, str]] = {}

    def seed(self, resource: Mapping[str, Any]) -> None:
        uri = odata_id(resource)
        if uri and uri not in self._cache:
            self._cache[uri] = dict(resource)

    def seed_as(self, key: str, body: JSON | None) -> None:
        """Hold ``body`` for ``key`` as it is (the same object: a view made of it last pass holds)."""
        self._cache[key] = body

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

    @property
    def views(self) -> Mapping[tuple[str, type[Readable]], Readable]:
        return self._views

    def cached(self, uri: str) -> JSON | None:
        """The resource at ``uri`` if this pass has it already; never reads."""
        return self._cache.get(uri.rstrip("/") or "/")

    def holds(self, uri: str) -> bool:
        """Whether this pass has read ``uri`` already (a resource that is not there included)."""
        return (uri.rstrip("/") or "/") in self._cache

    def slim(self, views: Iterable[Readable]) -> None:
        """Drop the JSON of resources this pass read into ``views`` (:func:`_slim`)."""
        _slim(self._cache, self._views, views)

    def share_limit(self, walk: Walk) -> None:
        """Take ``walk``'s bound on requests in flight: a walk within a pass counts with it."""
        self._limit = walk._limit

    async def revalidate(self, key: str, etag: str) -> bool:
        """Whether the answer to ``key`` (a URI, with its query) still has ``etag``: 304 Not
        Modified to ``If-None-Match``. Another answer is dropped (not held, so not counted
        against the pass's bounds); the caller reads again what it needs. A refusal or 404 is
        no 304."""
        async with self._limit:
            self.gets += 1
            try:
                response = await self.client.get(key, if_none_match=etag)
            except FabricUnavailable:
                raise
            except FabricError:
                return False
        if response.status == 304:
            self.not_modified += 1
            return True
        return False

    async def read_apart(self, key: str) -> RedfishResponse | None:
        """``key`` (a URI, with its query) read now for a caller that derives what it needs from
        the answer and drops it: not held by the pass, not kept for the next one. It counts
        against the pass's bounds (bytes, JSON values) until the caller :meth:`release`s it.
        None when the service refuses or says it is not there: the caller reads as before."""
        async with self._limit:
            self.gets += 1
            try:
                response = await self.client.get(key)
            except FabricUnavailable:
                raise
            except FabricError:
                return None
        self._count(key, response.size, response.values)
        return response

    def release(self, response: RedfishResponse) -> None:
        """``response`` (:meth:`read_apart`) is dropped: the pass no longer holds it."""
        self.read_bytes -= response.size
        self.read_values -= response.values

    def count_members(self, listed: int, collection: str, where: str = "") -> None:
        """``listed`` more collection members in this pass; past :data:`MAX_MEMBERS` the pass fails."""
        self.listed += listed
        if self.listed > MAX_MEMBERS:
            raise FabricUnavailable(
                f"the Redfish service lists more than {MAX_MEMBERS} collection members in one pass "
                f"(at {collection}{where}); not read further"
            )

    async def _fetch(self, uri: str) -> JSON:
        etag = self.revalidation.etag(uri) if self.revalidation is not None else None
        response = await self.client.get(uri, if_none_match=etag)
        if response.status == 304 and self.revalidation is not None:
            kept = self.revalidation.kept(uri)
            if kept is None:  # not asked with If-None-Match: cannot be
                raise FabricUnavailable(f"the Redfish service answered 304 to GET {uri}, unasked")
            self.not_modified += 1
            self.kept[uri] = kept
            self._count(uri, kept.size, kept.values)
            return kept.body
        self._count(uri, response.size, response.values)
        tag = response.etag
        if self.revalidation is not None and tag:
            self.kept[uri] = _Kept(tag, response.body, response.size, response.values)
        return response.body

    def _count(self, uri: str, size: int, values: int) -> None:
        self.read_bytes += size
        self.read_values += values
        if self.read_bytes > MAX_PASS_BYTES:
            raise FabricUnavailable(
                f"the Redfish service's answers in one pass exceed {MAX_PASS_BYTES >> 20} MiB "
                f"(the last: {uri}, {size} bytes); not read further"
            )
        if self.read_values > MAX_PASS_VALUES:
            raise FabricUnavailable(
                f"the Redfish service's answers in one pass hold more than {MAX_PASS_VALUES:,} JSON "
                f"values (the last: {uri}, {values:,}); not read further"
            )

    async def read(self, uri: str | None, view: type[V]) -> V | None:
        """The resource at ``uri`` read as ``view`` (each resource is read once per view per pass)."""
        body = await self.get(uri)
        if body is None or uri is None:
            return None
        return self._view(uri.rstrip("/") or "/", body, view)

    def _view(self, uri: str, body: JSON, view: type[V]) -> V:
        key = (uri, view)
        found = self._views.get(key)
        if found is None:
            # the same object as last pass: a 304 gave it back, unchanged, so its view holds too
            held = self.revalidation.view(key, body) if self.revalidation is not None else None
            found = self._views[key] = held if held is not None else view.model_validate(body)
        return cast(V, found)

    async def get_all(self, uris: Iterable[str]) -> list[JSON | None]:
        """Each of ``uris`` as :meth:`get` gives it, in order; what this pass holds is taken as it is."""
        wanted = [u.rstrip("/") or "/" for u in uris]
        missing = [u for u in dict.fromkeys(wanted) if u not in self._cache]
        if len(missing) == 1:
            await self.get(missing[0])
        elif missing:
            await asyncio.gather(*(self.get(u) for u in missing))
        return [self._cache.get(u) for u in wanted]

    async def read_all(self, uris: Iterable[str], view: type[V]) -> list[V]:
        """Each of ``uris`` as ``view``, in order (those that do not exist left out). What this
        pass holds already is taken as it is: a task per resource, for every block times every
        system of a 10,100-device fabric, was most of a pass."""
        wanted = list(dict.fromkeys(u.rstrip("/") or "/" for u in uris if u))
        bodies = await self.get_all(wanted)
        return [
            self._view(uri, body, view) for uri, body in zip(wanted, bodies, strict=True) if body is not None
        ]

    async def members(self, collection: str | None, view: type[V]) -> list[V]:
        """Every member of a collection as ``view``, following ``Members@odata.nextLink`` pages.

        With ``expand`` the collection is read with ``$expand=.($levels=1)`` (DSP0266 "Query
        parameters"); members that come back as bare links are read one by one, so a service that
        ignores the query still works.
        """
        uris = await self.member_uris(collection)
        found = await self.read_all(uris, view)
        if collection and len(found) < len(set(uris)):
            # listed, then not there when read: changed while this pass read it (the next reads
            # it again); said, not concluded from (:attr:`gone`)
            gone = [u for u in dict.fromkeys(uris) if self.holds(u) and self.cached(u) is None]
            if gone:
                count, first = self.gone.get(collection, (0, gone[0]))
                self.gone[collection] = (count + len(gone), first)
        return found

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
            self.count_members(len(members), collection, f", {len(seen)} pages")
            for member in members:
                uri = odata_id(member)
                if not uri:
                    continue
                if isinstance(member, dict) and len(member) > 1 and "Id" in member:
                    # kept as it came: a page answered 304 gives back the same members, whose
                    # views are then not made again (Revalidation)
                    self._cache.setdefault(uri, member)
                member_uris.append(uri)
            page_uri = same_service(
                self.client.base_url, listing.next_link, link=f"Members@odata.nextLink of {collection}"
            )
        return member_uris

    async def prefetch(self, uris: Iterable[str]) -> None:
        """Read in a few requests what the caller is about to read one by one: where two or more
        of ``uris`` are members of one collection (their parent path), that collection with
        ``$expand=.($levels=1)``; where they are members of collections of members of one
        collection (``…/PCIeDevices/{device}/PCIeFunctions/{n}``), that one with ``$levels=3``
        if the service goes that deep. What comes back inline is kept for :meth:`get`; what does
        not is read one by one as before, so a service that ignores or refuses the query costs a
        request per collection, no more. Within the pass's bounds like any other read."""
        if not self.expand:
            return
        wanted = [
            uri
            for uri in dict.fromkeys(u.rstrip("/") for u in uris if u)
            if uri and uri not in self._cache and uri not in self._inflight
        ]
        reads: list[tuple[str, int]] = []
        lone: list[str] = []
        for collection, members in _grouped(wanted, 1).items():
            if len(members) >= 2:
                reads.append((collection, 1))
            else:
                lone.extend(members)
        if self.max_levels >= 3:
            deep = {c for c, members in _grouped(lone, 3).items() if len(members) >= 2}
            # three levels of a collection hold its one level too: read once
            reads = [(c, levels) for c, levels in reads if c not in deep] + [(c, 3) for c in sorted(deep)]
        await asyncio.gather(*(self._read_inline(collection, levels) for collection, levels in reads))

    async def prefetch_siblings(self, uri: str, levels: int, select: str = "") -> None:
        """Read the collection ``uri`` is a member of with ``$expand=.($levels=levels)`` (no deeper
        than the service goes), once a pass: a port's ``Metrics`` for every port of a switch in one
        request instead of two a device. Only a speed-up, as :meth:`prefetch`. With ``select``,
        where the service serves it, only those properties of each member (module docstring)."""
        collection = uri.rstrip("/").rpartition("/")[0]
        if not self.expand or not collection or uri in self._cache:
            return
        levels = max(1, min(levels, self.max_levels))
        if not (select and self.select and await self._read_inline(collection, levels, select)):
            await self._read_inline(collection, levels)

    async def _read_inline(self, collection: str, levels: int, select: str = "") -> bool:
        """Whether the service answered (did not refuse) the read of ``collection``'s members inline."""
        key = f"{collection}?$expand=.($levels={levels})" + (f"&$select={select}" if select else "")
        if not self.expand:
            return False
        # two backends of a pass may ask for the same collection: the second waits for the first
        pending = self._reading.get(key)
        if pending is None:
            pending = self._reading[key] = asyncio.ensure_future(self._read_inline_once(collection, key))
        return await asyncio.shield(pending)

    async def _read_inline_once(self, collection: str, key: str) -> bool:
        async with self._limit:
            self.gets += 1
            try:
                body = await self._fetch(key)
            except NotFoundError:
                return True
            except FabricUnavailable:
                raise
            except FabricError as err:
                # Advertised but refused (QueryParameterUnsupported, out of range...): from now on
                # read without $select, or (refused $expand) one member at a time.
                log.info("query refused; read without it from now on", uri=key, error=err.message)
                self.expand = self.expand and "&$select=" in key
                self.select = False
                return False
        members = body.get("Members")
        if not isinstance(members, list):
            return True
        self.prefetched += 1
        self.count_members(len(members), collection)
        self._seed_inline(members, collection + "/")
        return True

    def _seed_inline(self, value: Any, under: str) -> None:
        """Keep every resource given inline in ``value`` (:func:`_inline_resources`)."""
        _inline_resources(value, under, self._cache)

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
                self.expand = self.select = False
                body = None
        if body is None and not self.expand:
            return await self.get(uri)
        self._cache[key] = body
        return body
