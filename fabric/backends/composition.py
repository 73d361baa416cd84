"""Binding through the CompositionService: ResourceBlocks added to and removed from a system.

Each ResourceBlock that holds a device (ResourceBlockType Processor, Storage, Network, Expansion,
IndependentResource) is one allocatable device. It is bound to the ComputerSystems in its
``Links.ComputerSystems`` while its ``CompositionStatus.CompositionState`` is Composed,
ComposedAndAvailable or Composing. Binding is the expandable-system use case of the Redfish
Composability white paper (DSP2050): ``#ComputerSystem.AddResourceBlock`` on the host system,
``#ComputerSystem.RemoveResourceBlock`` to undo it, both with ``ResourceBlockETag`` and
``ComputerSystemETag`` (ComputerSystem 1.16) so a concurrent change fails instead of winning.

Services that offer no actions let a client compose by a PATCH of the system's
``Links.ResourceBlocks`` (ReadWrite in the ComputerSystem CSDL) instead: the block is added to (or
left out of) the list the system shows, sent with ``If-Match`` so a concurrent change fails with
412 and is read again. Which of the two each system takes is read from the system itself
(:func:`composed_by`); a system that offers neither cannot be composed and discovery says so.

A service without a CompositionService may list its blocks in the service root's
``ResourceBlocks`` collection (ServiceRoot 1.5, "for implementations that do not contain a
composition service": an expansion enclosure whose hosts another service manages):
:class:`RootBlocksBackend` reads them, and with no system of this service to compose them into,
none is offered.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from fabric.backends.base import Backend, BindContext, DiscoveryResult
from fabric.backends.describe import describe, prefetch_parts
from fabric.backends.views import (
    JSON,
    Chassis,
    CompositionService,
    ComputerSystem,
    DeviceResource,
    NetworkAdapter,
    ResourceBlock,
    odata_id,
)
from fabric.backends.walk import Walk, path_ids
from fabric.state.model import DeviceRecord, HostRecord
from manager_api.devices import BindingStyle
from manager_api.errors import NodeNotFound

__all__ = [
    "COMPOSITION_FABRIC",
    "BlockListing",
    "ComposeBy",
    "CompositionBackend",
    "RootBlocksBackend",
    "block_binding",
    "block_holders",
    "composed_by",
]

#: how a system takes resource blocks: the Add/RemoveResourceBlock actions, or a PATCH of its
#: ``Links.ResourceBlocks``
ComposeBy = Literal["action", "patch"]

#: the fabric name of devices that come from resource blocks linked to no Redfish fabric
COMPOSITION_FABRIC = "Composition"
_DEVICE_BLOCK_TYPES = frozenset({"Processor", "Storage", "Network", "Expansion", "IndependentResource"})
_HOST_BLOCK_TYPES = frozenset({"Compute", "ComputerSystem"})
_BOUND_STATES = frozenset({"Composed", "ComposedAndAvailable", "Composing"})
_BROKEN_STATES = frozenset({"Failed", "Unavailable"})


def _entities(block: ResourceBlock) -> list[tuple[str, str]]:
    """(Endpoint EntityType, URI) of the device resources a block lists."""
    return [
        *(("Processor", u) for u in block.processors),
        *(("Drive", u) for u in block.drives),
        *(("NetworkController", u) for u in (*block.network_interfaces, *block.ethernet_interfaces)),
        *(("StorageSubsystem", u) for u in (*block.storage, *block.simple_storage)),
        *(("PCIeDevice", u) for u in block.pcie_devices),
    ]


#: the properties of a ResourceBlock that :func:`_entities` takes the device's resources from
_ENTITY_PROPERTIES = (
    "Processors",
    "Drives",
    "NetworkInterfaces",
    "EthernetInterfaces",
    "Storage",
    "SimpleStorage",
    "PCIeDevices",
)


def _linked(body: JSON) -> tuple[str, ...]:
    """The device resources a block's JSON links where :func:`_entities` would find them (the
    links read as :class:`fabric.backends.views.ResourceBlock` reads them: a list, or one link).
    A tuple, not a set: one is kept per block between passes (a one-member frozenset is 216 bytes)."""
    found: dict[str, None] = {}
    for name in _ENTITY_PROPERTIES:
        value = body.get(name)
        for link in value if isinstance(value, list) else (value,):
            uri = odata_id(link)
            if uri is not None:
                found[uri] = None
    return tuple(found)


def _offered(linked: tuple[str, ...], offered: frozenset[str]) -> bool:
    return any(uri in offered for uri in linked)


@dataclass(frozen=True, slots=True)
class BlockListing:
    """The blocks collection as a pass derived it from one expanded answer, kept for the next
    pass instead of the answer: its ETag; per member its URI, the device resources it links, and
    its JSON only where no fabric offered its device (a view is made of those). At 10,100 blocks
    that a fabric offers, the answer kept for ``If-None-Match`` was ~30 MiB held between passes."""

    etag: str
    members: tuple[tuple[str, tuple[str, ...], JSON | None], ...]

    @classmethod
    def of(cls, body: JSON, etag: str | None, offered: frozenset[str]) -> BlockListing | None:
        """The listing of an expanded answer; None where it cannot stand for the collection (no
        ETag, paged, a member not inline): the collection is then read as before."""
        members = body.get("Members")
        if not etag or not isinstance(members, list) or "Members@odata.nextLink" in body:
            return None
        kept = []
        for member in members:
            uri = odata_id(member)
            if not uri:
                continue
            if not (isinstance(member, dict) and "Id" in member):
                return None
            linked = _linked(member)
            kept.append((uri, linked, None if _offered(linked, offered) else member))
        return cls(etag, tuple(kept))


async def block_holders(walk: Walk, block: ResourceBlock, also: Iterable[str] = ()) -> tuple[str, ...]:
    """The ComputerSystem Ids ``block`` is composed into now. The systems the block links to
    (and ``also``) are asked: a system's ``Links.ResourceBlocks`` is the composition's record,
    while a block's ``CompositionStatus`` is left stale by some services. A system that does not
    say (no ``Links.ResourceBlocks``) counts as the block says."""
    by_block = block_binding(block)[0]
    uri = block.uri
    candidates = [*block.links.computer_systems, *also]
    holders = set()
    for system in await walk.read_all(candidates, ComputerSystem):
        system_id = system.id or (path_ids(str(system.uri), "Systems") if system.uri else None)
        if not system_id:
            continue
        listed = _listed_blocks(walk, system)
        if listed is None:
            if system_id in by_block:
                holders.add(system_id)
        elif uri in listed:
            holders.add(system_id)
    if not holders and by_block == ("unknown",):
        return by_block  # composed, into a system the service does not name
    return tuple(sorted(holders))


def _listed_blocks(walk: Walk, system: ComputerSystem) -> frozenset[str] | None:
    """A system's ``Links.ResourceBlocks`` as a set, made once per pass: every block asks every
    system (10,100 blocks times 100 systems of 100 blocks each were 10^8 comparisons)."""
    key = ("resource-blocks", id(system))
    if key not in walk.memo:
        listed = system.links.resource_blocks
        walk.memo[key] = (system, None if listed is None else frozenset(listed))
    found: tuple[ComputerSystem, frozenset[str] | None] = walk.memo[key]
    return found[1]


def composed_by(system: ComputerSystem) -> ComposeBy | None:
    """How blocks are composed into ``system``: by ``#ComputerSystem.AddResourceBlock`` when it
    offers the action; else by a PATCH of ``Links.ResourceBlocks`` when it shows that property
    (ReadWrite in the ComputerSystem CSDL; a system that omits it keeps no composition record a
    client could change); else not at all (None)."""
    if system.actions.target("ComputerSystem.AddResourceBlock"):
        return "action"
    if system.links.resource_blocks is not None:
        return "patch"
    return None


def block_binding(block: ResourceBlock) -> tuple[tuple[str, ...], bool]:
    """(ComputerSystem Ids the block is composed into, whether it can be composed at all)."""
    status = block.composition_status
    state = status.composition_state or ""
    hosts = tuple(sorted(h for h in (path_ids(u, "Systems") for u in block.links.computer_systems) if h))
    if state in _BOUND_STATES:
        return (hosts or ("unknown",)), True
    usable = state not in _BROKEN_STATES and not status.reserved
    return (), usable


class CompositionBackend(Backend):
    style = BindingStyle.COMPOSITION
    authority = "systems' Links.ResourceBlocks and resource block"
    #: devices the inventory kept from the last discovery (-1: not told yet, read every block)
    _serving = -1
    #: every known system's URI (from the last discovery): each one's Links.ResourceBlocks is read
    _systems: tuple[str, ...] = ()
    #: resources that make up devices a fabric of this pass offers already (set by discovery
    #: under ``auto``): a block made of one of them is left out of the inventory, so it is not
    #: described either — at 10,100 devices every block's description was made and dropped
    offered: frozenset[str] = frozenset()

    async def blocks_collection(self, walk: Walk) -> str | None:
        """The collection that lists the blocks: the CompositionService's, while it is enabled."""
        service = await walk.read(self.fabric_uri, CompositionService)
        if service is None or service.service_enabled is False:
            return None
        return service.resource_blocks

    async def discover(self, walk: Walk, hosts: Mapping[str, HostRecord]) -> DiscoveryResult:
        collection = await self.blocks_collection(walk)
        if collection is None:
            return DiscoveryResult()
        systems = await walk.read_all((h.uri for h in hosts.values()), ComputerSystem)
        ways = {str(s.id): composed_by(s) for s in systems if str(s.id) in hosts}
        expandable = tuple(sorted(h for h, way in ways.items() if way is not None))
        result = DiscoveryResult(
            hosts=expandable, uncomposable=tuple(sorted(h for h in hosts if ways.get(h) is None))
        )
        self._systems = tuple(h.uri for h in hosts.values())
        blocks = []
        for block in await self._blocks(walk, collection):
            kinds = set(block.resource_block_type or ())
            if not kinds & _DEVICE_BLOCK_TYPES or kinds & _HOST_BLOCK_TYPES:
                continue  # compute, memory and whole-system blocks are not pooled devices
            entities = _entities(block)
            if entities:
                blocks.append((block, entities))
        await prefetch_parts(walk, (entities for _, entities in blocks))
        result.devices.extend(
            await asyncio.gather(*(self._device(walk, b, e, expandable) for b, e in blocks))
        )
        return result

    async def _blocks(self, walk: Walk, collection: str) -> list[ResourceBlock]:
        """The collection's blocks as views, but those made of a resource in :attr:`offered`:
        their links are looked up in the JSON, so no view is made of what is left out."""
        listing = await self._listing(walk, collection) if self.offered else None
        if listing is not None:
            blocks, members = [], []
            for uri, linked, body in listing.members:
                if not _offered(linked, self.offered):
                    if body is not None and not walk.holds(uri):
                        walk.seed_as(uri, body)
                    block = await walk.read(uri, ResourceBlock)  # read now if it was offered then
                    if block is not None:
                        blocks.append(block)
                    body = walk.cached(uri)  # kept from now on: its view is made
                members.append((uri, linked, body))
            walk.derived[("blocks", collection)] = BlockListing(listing.etag, tuple(members))
            return blocks
        uris = list(dict.fromkeys(await walk.member_uris(collection)))
        blocks = []
        for uri, body in zip(uris, await walk.get_all(uris), strict=True):
            if body is not None and not (self.offered and _offered(_linked(body), self.offered)):
                block = await walk.read(uri, ResourceBlock)
                if block is not None:
                    blocks.append(block)
        return blocks

    async def _listing(self, walk: Walk, collection: str) -> BlockListing | None:
        """The collection read expanded into a :class:`BlockListing`, or the last pass's when the
        service answers 304 to its ETag; None where the service cannot give one (no ``$expand``,
        no ETag, pages): the caller reads the collection as before."""
        if not walk.expand or walk.revalidation is None:
            return None
        key = f"{collection}?$expand=.($levels=1)"
        last = walk.revalidation.derived.get(("blocks", collection))
        listing = last if isinstance(last, BlockListing) and await walk.revalidate(key, last.etag) else None
        if listing is None:
            response = await walk.read_apart(key)
            if response is None:
                return None
            listing = BlockListing.of(response.body, response.etag, self.offered)
            if listing is None:
                walk.seed_as(key, response.body)  # read as before from it, not asked again
                return None
            if not any(body is not None for _, _, body in listing.members):
                # dropped: no longer counted against what the pass holds (kept JSON still is)
                walk.release(response)
        walk.count_members(len(listing.members), collection)
        return listing

    async def _device(
        self, walk: Walk, block: ResourceBlock, entities: list[tuple[str, str]], expandable: tuple[str, ...]
    ) -> DeviceRecord:
        attributes = await describe(walk, entities, container=block)
        usable = block_binding(block)[1]
        bound = await block_holders(walk, block, self._systems)
        if not usable or not expandable:  # no system it could be composed into
            attributes = attributes.model_copy(update={"available": False})
        return DeviceRecord(
            key=str(block.uri),
            resource_id=str(block.id or block.uri),
            fabric=await self._fabric_of(walk, block, entities),
            style=self.style,
            attributes=attributes,
            bound_hosts=bound,
            reachable_hosts=expandable,
            block=block.uri,
        )

    async def _fabric_of(self, walk: Walk, block: ResourceBlock, entities: list[tuple[str, str]]) -> str:
        """The Redfish fabric the block's device sits on, so the device keeps its pool whichever
        style binds it: the device's ``Links.Endpoints``, else the switch of the block's chassis
        (Chassis ``Links.Switches``); "Composition" when the service says neither."""
        for _, uri in entities:
            resource = await walk.read(uri, DeviceResource)
            adapter = await walk.read(resource.links.network_adapter if resource else None, NetworkAdapter)
            for holder in (resource, adapter):
                for endpoint in holder.links.endpoints if holder else ():
                    fabric = path_ids(endpoint, "Fabrics")
                    if fabric:
                        return fabric
        for chassis in await walk.read_all(block.links.chassis, Chassis):
            for switch in chassis.links.switches:
                fabric = path_ids(switch, "Fabrics")
                if fabric:
                    return fabric
        return self.fabric_id

    def serving(self, keys: list[str]) -> None:
        self._serving = len(keys)

    async def read_bindings(self, walk: Walk) -> dict[str, tuple[str, ...]]:
        if self._serving == 0:
            # Every block's device is bound through a fabric (zones, connections) and that
            # backend reads its bindings: reading each block here would find nothing to report.
            return {}
        blocks = await walk.members(await self.blocks_collection(walk), ResourceBlock)
        return {str(block.uri): await block_holders(walk, block, self._systems) for block in blocks}

    async def read_binding(self, device: DeviceRecord, hosts: Sequence[HostRecord] = ()) -> tuple[str, ...]:
        walk = Walk(self.client)
        block = await walk.read(device.block, ResourceBlock)
        return await block_holders(walk, block, (h.uri for h in hosts)) if block else ()

    async def _compose(self, device: DeviceRecord, host: HostRecord, adding: bool, ctx: BindContext) -> None:
        """Compose ``device``'s block into ``host`` (``adding``) or take it out, the way the system
        takes blocks (:func:`composed_by`), read now: a service may change it."""
        system = await self.client.get(host.uri)
        view = ComputerSystem.model_validate(system.body)
        way = composed_by(view)
        block = str(device.block)
        if way == "patch":
            allowed = system.headers.get("allow")
            if allowed is not None and "PATCH" not in {m.strip().upper() for m in allowed.split(",")}:
                raise NodeNotFound(
                    f"system {host.id} cannot be composed: it offers no ComputerSystem.AddResourceBlock "
                    f"and its Allow header ({allowed}) does not allow a PATCH of Links.ResourceBlocks"
                )
            current = list(view.links.resource_blocks or ())
            others = [u for u in current if u != block]
            wanted = [*others, block] if adding else others
            ctx.fence()
            # If-Match: another block composed meanwhile changes the list (412, read again)
            response = await self.client.patch(
                host.uri, {"Links": {"ResourceBlocks": self._link_list(wanted)}}, etag=system.etag
            )
            await self._finish(response, ctx)
            return
        action = "AddResourceBlock" if adding else "RemoveResourceBlock"
        target = view.actions.target(f"ComputerSystem.{action}")
        if way is None or not target:
            raise NodeNotFound(
                f"system {host.id} cannot be composed: it offers neither ComputerSystem.{action} nor "
                "Links.ResourceBlocks to PATCH"
            )
        resource_block = await self.client.get(block)
        body: JSON = {"ResourceBlock": {"@odata.id": block}}
        if resource_block.etag:
            body["ResourceBlockETag"] = resource_block.etag
        if system.etag:
            body["ComputerSystemETag"] = system.etag
        ctx.fence()
        response = await self.client.post(target, body)
        await self._finish(response, ctx)

    async def bind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        await self._compose(device, host, True, ctx)

    async def unbind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        await self._compose(device, host, False, ctx)


class RootBlocksBackend(CompositionBackend):
    """Blocks listed only in the service root's ``ResourceBlocks`` (no CompositionService):
    ``fabric_uri`` is that collection. Composition through the systems works as for the
    CompositionService's blocks, for a service that has systems that take them."""

    async def blocks_collection(self, walk: Walk) -> str | None:
        return self.fabric_uri
