"""Shares of a CXL memory pool on the fabric: a chunk carved from a MemoryDomain that allows chunk
creation, connected to one host by a memory Connection, and given back in the reverse order.

* **Create**: POST to the domain's ``MemoryChunks`` (MemoryChunks v1_6: nothing is
  ``RequiredOnCreate``; the body says what the domain's limits imply — ``MemoryChunkSizeMiB``
  rounded up per ``MinMemoryChunkSizeMiB``/``MemoryChunkIncrementMiB``, ``AddressRangeType``
  ``Volatile`` — and carries fabric-dra's marker in ``Name``), then the chunk read back from the
  ``Location`` header to confirm what the service made.
* **Connect**: POST a Connection (``ConnectionType`` ``Memory``, ``MemoryChunkInfo`` naming the chunk,
  ``Links.InitiatorEndpoints`` the host's port, ``Links.TargetEndpoints`` the pool's endpoint).
* **Release**: DELETE the Connection, then the chunk; a service that sanitizes on release answers
  the DELETE with a task, followed to its end like every long fabric operation.

The marker (:func:`chunk_marker`) is how a chunk fabric-dra made is told from one made outside it:
discovery leaves marked chunks out of the whole devices, the manager finds the chunk of a share
whose creation's outcome it did not learn (a crash, a lost answer), and the orphan reconciler
removes marked chunks no ledger entry knows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fabric.backends.base import BindContext
from fabric.backends.views import Connection, Fabric, MemoryChunks, odata_id
from fabric.backends.walk import Walk
from fabric.redfish.client import RedfishClient
from fabric.redfish.links import resolve
from fabric.state.model import DeviceRecord, HostRecord, MemoryDomainRecord
from manager_api.errors import DeviceNotFound, NotFoundError

if TYPE_CHECKING:
    from fabric.backends.connections import ConnectionBackend

__all__ = ["MARKER_PREFIX", "MadeChunk", "MemoryCarver", "chunk_marker", "share_of_marker"]

#: every chunk fabric-dra makes is named ``fabric-dra share <shareID>``
MARKER_PREFIX = "fabric-dra share "


def chunk_marker(share_id: str) -> str:
    """The ``Name`` of the chunk of share ``share_id``."""
    return MARKER_PREFIX + share_id


def share_of_marker(name: str | None) -> str | None:
    """The share ID a chunk's ``Name`` marks it for, or None for a chunk fabric-dra did not make."""
    if name and name.startswith(MARKER_PREFIX):
        return name[len(MARKER_PREFIX) :] or None
    return None


@dataclass(frozen=True, slots=True)
class MadeChunk:
    """A chunk as the fabric shows it now."""

    uri: str
    size_mib: int | None
    share_id: str | None


class MemoryCarver:
    """Chunks and memory Connections of one fabric's pools (the connection backend's)."""

    def __init__(self, backend: ConnectionBackend) -> None:
        self.backend = backend

    @property
    def client(self) -> RedfishClient:
        return self.backend.client

    async def chunks(self, domain: MemoryDomainRecord) -> list[MadeChunk]:
        """Every chunk of ``domain``, read now."""
        walk = Walk(self.client)
        return [
            MadeChunk(
                uri=str(c.uri),
                size_mib=int(c.memory_chunk_size_mib) if c.memory_chunk_size_mib is not None else None,
                share_id=share_of_marker(c.name),
            )
            for c in await walk.members(domain.chunks, MemoryChunks)
            if c.uri
        ]

    async def find_chunk(self, domain: MemoryDomainRecord, share_id: str) -> MadeChunk | None:
        """The chunk fabric-dra made for ``share_id`` in ``domain``, if the fabric has one."""
        return next((c for c in await self.chunks(domain) if c.share_id == share_id), None)

    async def chunk(self, uri: str) -> MadeChunk | None:
        """The chunk at ``uri`` read now; None when it is gone."""
        try:
            response = await self.client.get(uri)
        except (NotFoundError, DeviceNotFound):
            return None
        chunk = MemoryChunks.model_validate(response.body)
        size = chunk.memory_chunk_size_mib
        return MadeChunk(uri, int(size) if size is not None else None, share_of_marker(chunk.name))

    async def create_chunk(
        self, domain: MemoryDomainRecord, size_mib: int, share_id: str, ctx: BindContext
    ) -> str | None:
        """POST the chunk; its URI (``Location``, else the body's ``@odata.id``), or None when the
        service did not say (the caller reads the domain to find it by its marker)."""
        ctx.fence()
        response = await self.client.post(
            domain.chunks,
            {
                "Name": chunk_marker(share_id),
                "MemoryChunkSizeMiB": size_mib,
                "AddressRangeType": "Volatile",
            },
        )
        location = response.location
        created = resolve(self.client.base_url, location, link="Location") if location else None
        created = created or odata_id(response.body)
        await self.backend.follow_change(response, ctx)
        return created

    async def connections_of(self, chunk_uri: str) -> list[tuple[str, set[str]]]:
        """The Connections that carry ``chunk_uri`` now, each with the hosts it gives it to."""
        walk = Walk(self.client)
        fabric = await walk.read(self.backend.fabric_uri, Fabric)
        connections = await walk.members(fabric.connections if fabric else None, Connection)
        await self.backend.learn_initiators(walk, connections)
        return [
            (str(c.uri), self.backend.hosts_of(c)) for c in connections if c.uri and chunk_uri in c.chunks
        ]

    async def connect(
        self, pool: DeviceRecord, chunk_uri: str, host: HostRecord, share_id: str, ctx: BindContext
    ) -> str | None:
        """POST the memory Connection of ``chunk_uri`` to ``host``; its URI when the service says."""
        return await self.backend.post_connection(
            pool, chunk_uri, host, ctx, name=f"{chunk_marker(share_id)} on {host.id}"
        )

    async def delete(self, uri: str, ctx: BindContext) -> None:
        """DELETE ``uri`` (a Connection or a chunk), following the service's task (a chunk's
        sanitize on release); one already gone is done."""
        try:
            fresh = await self.client.get(uri)
        except (NotFoundError, DeviceNotFound):
            return
        ctx.fence()
        try:
            response = await self.client.delete(uri, etag=fresh.etag)
        except (NotFoundError, DeviceNotFound):
            return
        await self.backend.follow_change(response, ctx)

    async def gone(self, uri: str) -> bool:
        """Whether ``uri`` is gone from the fabric (read now)."""
        try:
            await self.client.get(uri)
        except (NotFoundError, DeviceNotFound):
            return True
        return False
