"""What every binding backend offers, and the fabric-endpoint reading that two of them share."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from fabric.backends.describe import DEVICE_ENTITY_TYPES, RESET_TYPE
from fabric.backends.views import Endpoint, Fabric
from fabric.backends.walk import Walk, path_ids
from fabric.redfish.client import RedfishClient, RedfishResponse
from fabric.state.model import DeviceRecord, HostRecord
from manager_api.devices import BindingStyle
from manager_api.errors import BindRefused, NodeNotFound

__all__ = [
    "Backend",
    "BindContext",
    "DiscoveryResult",
    "EndpointView",
    "authoritative_members",
    "host_initiators",
    "linked_initiators",
    "read_endpoints",
]


@dataclass(slots=True)
class BindContext:
    """What a bind or unbind needs from the operation that runs it."""

    #: ``time.monotonic()`` after which a running Redfish task is left to run (AttachTimeout)
    deadline: float
    #: called right before every request that changes the fabric; raises NotLeader when this
    #: replica lost its Lease, so a deposed leader never touches the fabric
    fence: Callable[[], None]
    #: called with the task monitor URI when the fabric answers 202, before waiting for it
    on_task: Callable[[str], Awaitable[None]] | None = None
    #: called with the task's PercentComplete each time a read of the task carries one
    on_progress: Callable[[int], None] | None = None
    #: a short human description for errors and logs, e.g. "bind gpu0 to kind-worker"
    action: str = ""


@dataclass(slots=True)
class DiscoveryResult:
    devices: list[DeviceRecord] = field(default_factory=list)
    #: ComputerSystem Id → initiator endpoint URIs on this backend's fabric
    initiators: dict[str, tuple[str, ...]] = field(default_factory=dict)
    #: ComputerSystem Ids this backend can bind devices to
    hosts: tuple[str, ...] = ()
    #: ComputerSystem Ids it cannot bind to, that discovery must not leave unsaid (composition:
    #: systems that offer neither AddResourceBlock nor Links.ResourceBlocks to PATCH)
    uncomposable: tuple[str, ...] = ()


@dataclass(slots=True)
class EndpointView:
    """A fabric Endpoint classified: an initiator of a host, a device target, or neither."""

    uri: str
    id: str
    endpoint: Endpoint
    host: str | None = None  # ComputerSystem Id, for initiators
    entities: list[tuple[str, str]] = field(default_factory=list)  # device targets: (EntityType, URI)
    chunks: list[str] = field(default_factory=list)  # MemoryChunk URIs among the entities

    @property
    def is_initiator(self) -> bool:
        return self.host is not None

    @property
    def is_target(self) -> bool:
        return bool(self.entities)


def classify_endpoint(endpoint: Endpoint | None) -> EndpointView | None:
    uri = endpoint.uri if endpoint else None
    if endpoint is None or not uri:
        return None
    view = EndpointView(uri=uri, id=endpoint.id or uri.rsplit("/", 1)[-1], endpoint=endpoint)
    for entity in endpoint.connected_entities or ():
        role = entity.entity_role or ""
        kind = entity.entity_type or ""
        target = entity.entity_link
        if role in ("Initiator", "Both") and target:
            host = path_ids(target, "Systems")
            if host and view.host is None:
                view.host = host
        if role in ("Target", "Both") and kind in DEVICE_ENTITY_TYPES and target:
            if path_ids(target, "Systems") and role == "Both":
                continue  # a host's own resource, not a pooled device
            view.entities.append((kind, target))
            if kind == "MemoryChunk":
                view.chunks.append(target)
    return view


async def read_endpoints(walk: Walk, fabric: Fabric) -> list[EndpointView]:
    """The fabric's endpoints, classified. Their JSON is dropped once read (:meth:`Walk.slim`):
    the pass and the next one read them through their views only."""
    endpoints = await walk.members(fabric.endpoints, Endpoint)
    views = [classify_endpoint(e) for e in endpoints]
    walk.slim(endpoints)
    return [v for v in views if v is not None]


async def authoritative_members(
    walk: Walk, collection: str | None, linked: Iterable[str] = ()
) -> tuple[list[str], frozenset[str]]:
    """The URIs to read to learn what binds an endpoint now: every member of the fabric's
    collection (``Zones``, ``Connections``), plus the ones the endpoint's links name that the
    collection does not list (public-cxl's Connection 14); and the set of those link-only ones.

    The collection is the authority: an endpoint's ``Links.Zones`` / ``Links.Connections`` are
    left stale or omitted by some services, so they only ever add to what is read, never limit it
    — a binding read from them alone would let a detach answer "detached" without unbinding."""
    members = await walk.member_uris(collection)
    listed = set(members)
    extra = [u for u in dict.fromkeys(linked) if u not in listed]
    return [*members, *extra], frozenset(extra)


async def linked_initiators(
    walk: Walk, endpoints: list[EndpointView], linked: Iterable[str]
) -> list[EndpointView]:
    """Initiator endpoints that only links name (a zone's ``Links.Endpoints``, a connection's
    ``Links.InitiatorEndpoints``), absent from the fabric's Endpoints collection: read and
    classified, so such a host still has its ports on the fabric."""
    known = {v.uri for v in endpoints}
    extra = [u for u in dict.fromkeys(linked) if u not in known]
    views = [classify_endpoint(e) for e in await walk.read_all(extra, Endpoint)]
    return [v for v in views if v is not None and v.is_initiator]


def host_initiators(endpoints: list[EndpointView], hosts: Mapping[str, HostRecord]) -> DiscoveryResult:
    """A discovery result naming, for each known host, its initiator endpoints on the fabric
    (initiators of hosts this manager does not know are left out); no devices yet."""
    initiators: dict[str, list[str]] = {}
    for view in endpoints:
        if view.is_initiator and view.host in hosts:
            initiators.setdefault(str(view.host), []).append(view.uri)
    return DiscoveryResult(
        initiators={h: tuple(sorted(u)) for h, u in initiators.items()},
        hosts=tuple(sorted(initiators)),
    )


class Backend(ABC):
    """One binding style on one fabric."""

    style: ClassVar[BindingStyle]
    #: what the fabric keeps that says who is bound (read to confirm every change), for messages
    authority: ClassVar[str]

    def __init__(self, client: RedfishClient, fabric_id: str, fabric_uri: str | None) -> None:
        self.client = client
        #: the service serves ``$expand`` (learnt by discovery): a collection and its members are
        #: then one GET (DSP0266 v1.15 §7.3 "Query parameters"), else one per member
        self.expand = False
        self.fabric_id = fabric_id
        self.fabric_uri = fabric_uri

    @abstractmethod
    async def discover(self, walk: Walk, hosts: Mapping[str, HostRecord]) -> DiscoveryResult:
        """Devices this backend can bind, with their current bindings."""

    def serving(self, keys: list[str]) -> None:  # noqa: B027 - optional, most backends need nothing
        """The devices of the last :meth:`discover` that the inventory kept (duplicates of devices
        another backend offers are dropped); a backend may read less for the others."""

    async def prepare_bind(self, device: DeviceRecord, host: HostRecord) -> None:  # noqa: B027
        """Read what a bind of ``device`` to ``host`` will need, while the binding itself is read
        (:meth:`read_binding`): one round trip instead of two. Optional; nothing is changed."""

    def fresh_walk(self) -> Walk:
        """A new pass over the fabric, reading collections expanded when the service can."""
        return Walk(self.client, expand=self.expand)

    @abstractmethod
    async def read_binding(self, device: DeviceRecord, hosts: Sequence[HostRecord] = ()) -> tuple[str, ...]:
        """The ComputerSystem Ids ``device`` is bound to now, read fresh from the fabric; ``hosts``
        are asked too where a style keeps the binding on the host's side (composition)."""

    async def confirmed(self, device: DeviceRecord, host: HostRecord, *, bound: bool) -> bool:
        """Whether the fabric's authoritative record of bindings, read now, shows ``device`` bound
        to ``host`` (``bound``) or not bound to it: what confirms a change (issue 15's rule). A
        bind is first looked for in the one resource it changed (:meth:`witnessed`): one found
        proves it; only the absence of a binding needs :meth:`read_binding`'s full read."""
        if bound and await self.witnessed(device, host):
            return True
        return (host.id in await self.read_binding(device, (host,))) is bound

    async def witnessed(self, device: DeviceRecord, host: HostRecord) -> bool:
        """Whether the resource the last bind of ``device`` changed or created, listed in the
        fabric's collection and read now, binds ``device`` to ``host``. False: no proof here, the
        full read decides."""
        return False

    @abstractmethod
    async def read_bindings(self, walk: Walk) -> dict[str, tuple[str, ...]]:
        """Device key → bound ComputerSystem Ids for every device of the last :meth:`discover`,
        reading only the resources that say who is bound (zones, connections, resource blocks):
        the cheap pass that follows binding events."""

    @abstractmethod
    async def bind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        """Bind ``device`` to ``host``; returns once the fabric reports it done."""

    @abstractmethod
    async def unbind(self, device: DeviceRecord, host: HostRecord, ctx: BindContext) -> None:
        """Undo the binding of ``device`` to ``host``; returns once the fabric reports it done."""

    async def reset(self, device: DeviceRecord, ctx: BindContext) -> None:
        """Reset ``device`` through its resource's ``Reset`` action (``#Processor.Reset``,
        ``#Drive.Reset``: :attr:`DiscoveredAttributes.reset_target`), following the task when the
        service runs one; raises the fabric's error when it refuses or the task fails
        (:data:`~fabric.backends.describe.RESET_TYPE`)."""
        target = device.attributes.reset_target
        if target is None:
            raise BindRefused(f"device {device.name} offers no Reset action", device=device.name)
        ctx.fence()
        response = await self.client.post(target, {"ResetType": RESET_TYPE})
        await self._finish(response, ctx)

    def initiators_of(self, host: HostRecord) -> tuple[str, ...]:
        found = host.initiators.get(self.fabric_id, ())
        if not found:
            raise NodeNotFound(f"host {host.id} has no initiator endpoint on fabric {self.fabric_id}")
        return found

    async def _finish(self, response: RedfishResponse, ctx: BindContext) -> RedfishResponse:
        return await self.client.follow(
            response,
            action=ctx.action,
            deadline=ctx.deadline,
            on_task=ctx.on_task,
            on_progress=ctx.on_progress,
        )

    @staticmethod
    def _link_list(uris: list[str]) -> list[dict[str, str]]:
        return [{"@odata.id": u} for u in uris]
