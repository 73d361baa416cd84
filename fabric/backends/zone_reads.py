"""The fabric's Zones as last read, read again only where they changed.

With ``$select`` and ``$expand`` (``ProtocolFeaturesSupported``), one GET of the Zones collection
lists each zone's ETag without its endpoints (:data:`_ETAG_LISTING`); a zone whose ETag is the one
last read is taken as read then, and only the others are read again — so the read before a bind
follows the number of zones that changed, not the bindings of the whole fabric. When many of them
changed (under load every host's zone changes between two reads), one GET of the collection with
every zone inline (:data:`_EXPANDED`) replaces a GET per zone; after such a read the next one goes
straight to it, until a read finds few zones changed. A service that cannot list the ETags is read
as before (the collection, expanded, by the caller; zone by zone without ``$expand``).

Every read is shared (:class:`~fabric.backends.shared_read.SharedRead`): callers that ask while one
is under way take the one sent after it, as fresh for each of them as their own would be.
"""

from __future__ import annotations

import asyncio

from fabric.backends.shared_read import SharedRead
from fabric.backends.views import JSON, Zone, odata_id
from fabric.backends.walk import Walk
from fabric.redfish.client import RedfishClient, RedfishResponse
from manager_api.errors import FabricError, FabricUnavailable, NotFoundError

__all__ = ["ZoneReads", "get_or_none"]

#: The Zones collection read for which zones exist and the ETag of each, not their members:
#: DSP0266 "Query parameters" evaluates ``$expand`` before ``$select`` and keeps the ``@odata``
#: annotations of what it selects from, so each inlined zone comes back as its Id, ``@odata.id``
#: and ``@odata.etag`` (the zone's own ETag, DSP0266 "ETags"). The zones whose ETag differs from
#: the one last read are read again; the answer's size follows the number of zones, not the
#: endpoints they hold.
_ETAG_LISTING = "$expand=.($levels=1)&$select=Id"
#: The Zones collection with every zone inline, endpoints and all (DSP0266 v1.20.0 "Query
#: parameters", ``$expand``; served where ``ProtocolFeaturesSupported.ExpandQuery`` says so): one
#: answer whose size follows the zones' members, for one request instead of one per changed zone.
_EXPANDED = "$expand=.($levels=1)"
#: Read every zone inline when at least this many changed since the last read ...
_EXPAND_FROM = 2
#: ... and at least one in this many of all zones: a GET costs both sides a request's fixed work
#: (~0.5 ms of the manager's CPU) besides its body, so one answer of all zones beats a GET of each
#: changed one until the unchanged ones it also carries outweigh the requests it saves.
_EXPAND_SHARE = 8


async def get_or_none(client: RedfishClient, uri: str) -> RedfishResponse | None:
    """The resource at ``uri`` read now; None when the service says it is not there."""
    try:
        return await client.get(uri)
    except NotFoundError:
        return None


class ZoneReads:
    def __init__(self, client: RedfishClient) -> None:
        self.client = client
        #: the service serves ``$select`` (ProtocolFeaturesSupported.SelectQuery) and, with
        #: ``$expand``, keeps each zone's ``@odata.etag``: :data:`_ETAG_LISTING` is used
        self.select = False
        #: zone URI → (its ETag, its JSON) as last read; the ETag listing says which are current
        self._bodies: dict[str, tuple[str, JSON]] = {}
        #: zone URI → (the JSON of :attr:`_bodies`, read as a view): a bindings pass reads
        #: again only the zones that changed (validating 10,000 endpoint links was its cost)
        self._views: dict[str, tuple[JSON, Zone, frozenset[str]]] = {}
        #: zone URI → the GET of it under way: (its ETag, its JSON), or None when it is gone
        self._fetches: dict[str, asyncio.Future[tuple[str, JSON] | None]] = {}
        #: zone GETs at once, all reads together (a cold cache must not send 100 at once per
        #: bind), on the event loop it was made for
        self._gate_of_loop: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        #: the last read found many zones changed: the next reads every zone inline at once
        self._many_changed = False
        #: the service answers :data:`_EXPANDED` with every member inline and its ETag
        self.inline = True
        #: the read now of every zone, shared by the callers that ask while one is under way
        self.shared: SharedRead[dict[str, JSON] | None] = SharedRead(self._read_now)
        self._collection: str | None = None

    async def remember(self, walk: Walk, uris: list[str]) -> None:
        """The zones at ``uris`` as a discovery pass read them (in ``walk``): the next ETag listing
        reads only those changed since."""
        kept: dict[str, tuple[str, JSON]] = {}
        for uri in uris:
            body = await walk.get(uri)
            tag = body.get("@odata.etag") if body is not None else None
            if body is not None and isinstance(tag, str):
                kept[uri] = (tag, body)
        self._bodies = kept

    def view(self, uri: str, body: JSON) -> tuple[JSON, Zone, frozenset[str]]:
        """The zone's JSON read as a view, and the endpoints it links, once per version read."""
        kept = self._views.get(uri)
        if kept is None or kept[0] is not body:
            view = Zone.model_validate(body)
            kept = self._views[uri] = (body, view, frozenset(view.links.endpoints))
        return kept

    def etag(self, uri: str, body: JSON) -> str | None:
        """The ETag ``body`` (an answer of :meth:`current`) was listed or read with; its own
        ``@odata.etag`` once a later read replaced it (a shared answer outlives the next read)."""
        kept = self._bodies.get(uri)
        if kept is not None and kept[1] is body:
            return kept[0]
        tag = body.get("@odata.etag")
        return tag if isinstance(tag, str) else None

    async def current(self, walk: Walk, collection: str | None) -> dict[str, JSON] | None:
        """Every zone the collection lists, each as it is now, put in ``walk`` (:meth:`Walk.get`
        answers from it); from a read sent after this call began (:attr:`shared`). None when the
        service cannot list the ETags: the caller reads the collection as before.

        As authoritative as the expanded collection: the listing is read now, and each zone it
        lists is taken at the ETag it lists (the JSON last read with that ETag, the same
        representation) or read after it; or the expanded collection itself is read now. The
        answer is shared: callers read it, never change it."""
        if not (collection and self.select and walk.expand):
            return None
        self._collection = collection
        current = await self.shared()
        if current is not None:
            for body in current.values():
                walk.seed(body)
        return current

    async def _read_now(self) -> dict[str, JSON] | None:
        collection = self._collection
        if collection is None or not self.select:
            return None
        if self._many_changed and self.inline:
            inline = await self._inline(collection)
            if inline is not None:
                return inline
        try:
            page = (await self.client.get(f"{collection}?{_ETAG_LISTING}")).body
        except FabricUnavailable:
            raise
        except FabricError:
            self.select = False  # advertised but refused: read the collection as before from now on
            return None
        tags = _member_etags(page)
        if tags is None:
            return None  # paged, or a member without its ETag: the listing cannot say what changed
        current: dict[str, JSON] = {}
        stale = []
        for uri, tag in tags.items():
            kept = self._bodies.get(uri)
            if kept is not None and kept[0] == tag:
                current[uri] = kept[1]
            else:
                stale.append(uri)
        self._many_changed = _many(len(stale), len(tags))
        if self._many_changed and self.inline:
            inline = await self._inline(collection)
            if inline is not None:
                return inline
        for uri, read in zip(
            stale, await asyncio.gather(*(self._at(u, tags[u]) for u in stale)), strict=True
        ):
            if read is not None:  # else deleted since the listing
                current[uri] = read[1]
        self._forget_all_but(tags)
        return {u: current[u] for u in tags if u in current}

    async def _inline(self, collection: str) -> dict[str, JSON] | None:
        """Every zone of the collection as :data:`_EXPANDED` gives it now, a zone whose ETag is the
        one last read kept as that read's JSON (its view stays validated); None when the answer
        cannot serve (refused, paged, a member not inline or without its ETag): the zones are then
        listed and read one by one, from now on."""
        try:
            page = (await self.client.get(f"{collection}?{_EXPANDED}")).body
        except FabricUnavailable:
            raise
        except FabricError:
            page = {}
        tags = _member_etags(page)
        if tags is None or not all("Id" in m for m in page["Members"]):  # not each zone inline
            self.inline = self._many_changed = False
            return None
        current: dict[str, JSON] = {}
        changed = 0
        for member in page["Members"]:
            uri = str(odata_id(member)).rstrip("/")
            tag = tags[uri]
            kept = self._bodies.get(uri)
            if kept is not None and kept[0] == tag:
                current[uri] = kept[1]
            else:
                changed += 1
                current[uri] = member
                self._bodies[uri] = (tag, member)
        self._many_changed = _many(changed, len(tags))
        self._forget_all_but(tags)
        return current

    def _forget_all_but(self, listed: dict[str, str]) -> None:
        for uri in [u for u in self._bodies if u not in listed]:
            del self._bodies[uri]
            self._views.pop(uri, None)

    async def _at(self, uri: str, listed: str) -> tuple[str, JSON] | None:
        """The zone at ``uri`` as the listing that gave it the ETag ``listed`` saw it, or newer:
        a GET of it already under way serves when it answers with that ETag (it then is that
        version, whenever it started); otherwise a GET started now."""
        pending = self._fetches.get(uri)
        if pending is not None:
            try:
                read = await asyncio.shield(pending)
            except Exception:
                read = None  # that read failed: this one tries for itself
            if read is not None and read[0] == listed:
                return read
        return await self._fetch(uri, listed)

    def _gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        if self._gate_of_loop is None or self._gate_of_loop[0] is not loop:
            self._gate_of_loop = (loop, asyncio.Semaphore(8))
        return self._gate_of_loop[1]

    async def _fetch(self, uri: str, listed: str) -> tuple[str, JSON] | None:
        future: asyncio.Future[tuple[str, JSON] | None] = asyncio.get_running_loop().create_future()
        self._fetches[uri] = future
        try:
            async with self._gate():
                response = await get_or_none(self.client, uri)
        except BaseException as err:
            # waiters read for themselves on an error; never hand them this task's cancellation
            future.set_exception(
                err if isinstance(err, Exception) else FabricUnavailable(f"reading {uri} stopped")
            )
            future.exception()  # consumed here
            raise
        finally:
            if self._fetches.get(uri) is future:
                del self._fetches[uri]
        read: tuple[str, JSON] | None = None
        if response is not None:
            annotated = response.body.get("@odata.etag")
            tag = annotated if isinstance(annotated, str) else response.etag or listed
            read = (tag, response.body)
            # a slower read of an older version may land over a newer one: that only costs
            # another read when a listing shows the newer ETag, never a stale answer
            self._bodies[uri] = read
        future.set_result(read)
        return read


def _many(changed: int, zones: int) -> bool:
    """Whether ``changed`` of ``zones`` are read more cheaply all inline (:data:`_EXPAND_SHARE`)."""
    return changed >= _EXPAND_FROM and changed * _EXPAND_SHARE >= zones


def _member_etags(page: JSON) -> dict[str, str] | None:
    """Member URI → ``@odata.etag`` of an :data:`_ETAG_LISTING` answer; None when a member lacks
    either, ``Members`` is no list, or the answer is one page of several (each would need the
    same care; the collection is then read as before)."""
    members = page.get("Members")
    if not isinstance(members, list) or page.get("Members@odata.nextLink"):
        return None
    tags: dict[str, str] = {}
    for member in members:
        uri = odata_id(member)
        tag = member.get("@odata.etag") if isinstance(member, dict) else None
        if not uri or not isinstance(tag, str):
            return None
        tags[uri.rstrip("/")] = tag
    return tags
