"""Which backends a Redfish service needs, and one full discovery pass over it.

Per fabric the binding style comes from the configuration, or — ``auto`` — from what the service
offers:

* a fabric with a Connections collection (CXL): memory chunks bind through Connections, and its
  other targets (Type-1/2 devices without chunks) through Zones when it has any;
* a fabric with Zones only (PCIe): Zones;
* the CompositionService: ResourceBlocks — in ``auto`` only those whose device is not already
  reachable through a fabric, so one device never shows up twice (a service may present the same
  GPU as an endpoint *and* as a resource block); each system by the action it offers, or by a
  PATCH of its ``Links.ResourceBlocks`` (:func:`fabric.backends.composition.composed_by`);
* no CompositionService but a root-level ``ResourceBlocks`` collection: those blocks, read into
  the inventory like the CompositionService's.

What a pass finds but cannot offer — blocks no host can be composed with, systems that cannot be
composed — is said in the snapshot's ``notices`` (``/readyz`` detail, ``fabric-dra status``) and
logged once as a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fabric.backends.base import Backend, DiscoveryResult
from fabric.backends.composition import COMPOSITION_FABRIC, CompositionBackend, RootBlocksBackend
from fabric.backends.connections import ConnectionBackend
from fabric.backends.reach import SwitchGraph, narrow_reach
from fabric.backends.views import ComputerSystem, Fabric, ServiceRoot
from fabric.backends.walk import Revalidation, Walk
from fabric.backends.zones import ZoneBackend
from fabric.redfish.client import SERVICE_ROOT, RedfishClient
from fabric.redfish.error_mapping import one_line
from fabric.state.model import DeviceRecord, FabricInfo, FabricSnapshot, HostRecord
from fabric.state.names import assign_names
from manager_api.devices import BindingStyle
from manager_api.errors import FabricError, FabricUnavailable
from plumbing.logs import get_logger

__all__ = ["BindingPlan", "Discovery", "StyleChoice", "gone_notices"]

log = get_logger(__name__)

#: how one fabric is bound: ``auto`` (per fabric, from what the service offers), a style, or
#: ``none`` (leave the fabric alone)
DefaultChoice = Literal["auto"] | BindingStyle
StyleChoice = DefaultChoice | Literal["none"]


class BindingPlan(BaseModel):
    """``--binding-style`` and ``--fabric-binding FABRIC=STYLE``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default: DefaultChoice = "auto"
    #: per Redfish Fabric Id (or "Composition" for the CompositionService)
    fabrics: dict[str, StyleChoice] = Field(default_factory=dict)

    def choice(self, fabric_id: str) -> StyleChoice:
        return self.fabrics.get(fabric_id, self.default)


class Discovery:
    """Runs discovery passes and keeps the backends they chose, for binding."""

    def __init__(
        self, client: RedfishClient, plan: BindingPlan | None = None, *, concurrency: int = 16
    ) -> None:
        self.client = client
        self.plan = plan or BindingPlan()
        self.concurrency = concurrency
        self.backends: dict[tuple[str, BindingStyle], Backend] = {}
        self._announced: set[tuple[str, BindingStyle]] = set()
        self._warned: set[tuple[str, str]] = set()
        self._noticed: set[str] = set()
        self._expand = False
        #: what the last full pass read, with ETags: the next full pass asks with If-None-Match
        self.revalidation = Revalidation()
        #: which hosts reach each switch over inter-switch links, recomputed only when they change
        self.switch_graph = SwitchGraph()

    def backend_for(self, device: DeviceRecord) -> Backend:
        return self.backends[(device.fabric, device.style)]

    def _backend(self, cls: type[Backend], fabric_id: str, uri: str | None, **kwargs: Any) -> Backend:
        key = (fabric_id, cls.style)
        backend = self.backends.get(key)
        if backend is None or backend.fabric_uri != uri:
            backend = cls(self.client, fabric_id, uri, **kwargs)
            self.backends[key] = backend
        if key not in self._announced:
            self._announced.add(key)
            log.info("fabric binding style chosen", fabric=fabric_id, style=str(cls.style))
        return backend

    def _plan_fabric(self, fabric: Fabric) -> list[Backend]:
        fabric_id = str(fabric.id)
        uri = fabric.uri
        choice = self.plan.choice(fabric_id)
        has_zones = fabric.zones is not None
        has_connections = fabric.connections is not None
        if choice == "auto":
            if has_connections:
                chosen: list[Backend] = [self._backend(ConnectionBackend, fabric_id, uri)]
                if has_zones:
                    chosen.append(self._backend(ZoneBackend, fabric_id, uri, skip_memory_targets=True))
                return chosen
            return [self._backend(ZoneBackend, fabric_id, uri)] if has_zones else []
        if choice == BindingStyle.ZONE and has_zones:
            return [self._backend(ZoneBackend, fabric_id, uri)]
        if choice == BindingStyle.CONNECTION and has_connections:
            return [self._backend(ConnectionBackend, fabric_id, uri)]
        if choice in (BindingStyle.ZONE, BindingStyle.CONNECTION) and (fabric_id, choice) not in self._warned:
            self._warned.add((fabric_id, choice))
            log.warning("fabric does not offer the configured binding style", fabric=fabric_id, style=choice)
        return []

    async def scan_bindings(self) -> tuple[dict[str, tuple[str, ...]], int, float]:
        """(device key → bound hosts, GETs, monotonic start) from the binding resources only —
        zones, connections, resource blocks; the backends must have run a full :meth:`scan`."""
        with unreadable_payloads("a bindings pass"):
            return await self._scan_bindings()

    async def _scan_bindings(self) -> tuple[dict[str, tuple[str, ...]], int, float]:
        started = time.monotonic()
        walk = Walk(self.client, concurrency=self.concurrency, expand=self._expand)
        found: dict[str, tuple[str, ...]] = {}
        backends = list({id(b): b for b in self.backends.values()}.values())
        for result in await asyncio.gather(*(b.read_bindings(walk) for b in backends)):
            found.update(result)
        return found, walk.gets, started

    async def scan(self) -> FabricSnapshot:
        """One full pass: hosts, every backend's devices and bindings, unique names."""
        with unreadable_payloads("a discovery pass"):
            return await self._scan()

    async def _scan(self) -> FabricSnapshot:
        started = time.monotonic()  # a binding the manager changes after this wins over the pass
        probe = Walk(self.client)
        body = await probe.get(SERVICE_ROOT) or {}
        root = ServiceRoot.model_validate(body)
        self._expand = root.supports_expand
        walk = Walk(
            self.client,
            concurrency=self.concurrency,
            expand=self._expand,
            max_levels=root.expand_levels,
            select=root.supports_select,
            revalidation=self.revalidation,
        )
        walk.seed(body)
        hosts = await _hosts(walk, root)
        planned = await self._plan(walk, root)
        results = await self._discover(walk, planned, hosts)
        found = self._merge(planned, results)
        hosts = _with_initiators(hosts, found.initiators)
        devices = assign_names(await narrow_reach(walk, found.devices, hosts, self.switch_graph))
        self.revalidation.retain(walk)
        return FabricSnapshot(
            devices=devices,
            hosts=hosts,
            fabrics=found.fabrics(planned),
            started_at=started,
            gets=probe.gets + walk.gets,
            not_modified=walk.not_modified,
            notices=[
                *self._notices(planned, results, found.kept, bool(hosts)),
                *gone_notices(walk),
            ],
        )

    async def _discover(
        self, walk: Walk, planned: list[Backend], hosts: dict[str, HostRecord]
    ) -> list[DiscoveryResult]:
        """Each backend's devices: the fabrics' first, then — under ``auto``, where a block that
        a fabric offers too is left out (:meth:`_merge`) — the blocks, told which resources the
        fabrics' devices are made of, so that those blocks are not described only to be dropped."""
        auto = self.plan.choice(COMPOSITION_FABRIC) == "auto"
        later = [b for b in planned if auto and isinstance(b, CompositionBackend)]
        first = [b for b in planned if b not in later]
        results = dict(
            zip(first, await asyncio.gather(*(b.discover(walk, hosts) for b in first)), strict=True)
        )
        offered = frozenset(
            uri
            for result in results.values()
            for d in result.devices
            for uri in (d.key, *d.attributes.identities)
        )
        for backend in later:
            backend.offered = offered
        try:
            found = await asyncio.gather(*(b.discover(walk, hosts) for b in later))
        finally:
            for backend in later:
                backend.offered = frozenset()
        results.update(zip(later, found, strict=True))
        return [results[b] for b in planned]

    async def _plan(self, walk: Walk, root: ServiceRoot) -> list[Backend]:
        """The backends of this pass: each fabric's chosen styles, then the CompositionService's
        (or the root's ResourceBlocks) unless composition is turned off."""
        planned: list[Backend] = []
        for fabric in await walk.members(root.fabrics, Fabric):
            planned.extend(self._plan_fabric(fabric))
        if self.plan.choice(COMPOSITION_FABRIC) in ("auto", BindingStyle.COMPOSITION):
            if root.composition_service:
                planned.append(
                    self._backend(CompositionBackend, COMPOSITION_FABRIC, root.composition_service)
                )
            elif root.resource_blocks:
                planned.append(self._backend(RootBlocksBackend, COMPOSITION_FABRIC, root.resource_blocks))
        return planned

    def _merge(self, planned: list[Backend], results: list[DiscoveryResult]) -> _Found:
        """Every backend's devices (a resource block that a fabric offers too is left out under
        ``auto``), each host's initiators per fabric, and which styles and hosts each fabric has;
        a backend serves every fabric its devices name."""
        found = _Found()
        auto = self.plan.choice(COMPOSITION_FABRIC) == "auto"
        for backend, result in zip(planned, results, strict=True):
            devices = result.devices
            if backend.style is BindingStyle.COMPOSITION and auto:
                devices = _without_duplicates(devices, found.devices)
            found.kept[id(backend)] = devices
            backend.serving([d.key for d in devices])
            found.devices.extend(devices)
            for host, uris in result.initiators.items():
                merged = found.initiators.setdefault(host, {})
                merged[backend.fabric_id] = tuple(sorted(set(merged.get(backend.fabric_id, ())) | set(uris)))
            # Resource blocks name the fabric their device sits on: the backend serves those too.
            for fabric_id in {backend.fabric_id} | {d.fabric for d in devices}:
                self.backends[(fabric_id, backend.style)] = backend
                found.fabric_hosts.setdefault(fabric_id, set()).update(result.hosts)
                if backend.style not in found.styles.setdefault(fabric_id, []):
                    found.styles[fabric_id].append(backend.style)
        return found

    def _notices(
        self,
        planned: list[Backend],
        results: list[DiscoveryResult],
        kept: dict[int, list[DeviceRecord]],
        has_systems: bool,
    ) -> list[str]:
        """What must be said about resource blocks found but not poolable; each logged once."""
        reached = {
            h
            for b, r in zip(planned, results, strict=True)
            if b.style is not BindingStyle.COMPOSITION
            for h in r.hosts
        }
        notices = []
        for backend, result in zip(planned, results, strict=True):
            if isinstance(backend, CompositionBackend):
                notice = _composition_notice(backend, result, kept[id(backend)], reached, has_systems)
                if notice:
                    notices.append(notice)
        for notice in notices:
            if notice not in self._noticed:
                self._noticed.add(notice)
                log.warning("the Redfish service has devices fabric-dra cannot offer", detail=notice)
        return notices


@dataclass(slots=True)
class _Found:
    """What the backends of one pass found, merged."""

    devices: list[DeviceRecord] = field(default_factory=list)
    #: ComputerSystem Id → Fabric Id → its initiator endpoint URIs there
    initiators: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    fabric_hosts: dict[str, set[str]] = field(default_factory=dict)
    styles: dict[str, list[BindingStyle]] = field(default_factory=dict)
    #: backend (by id) → the devices kept of what it found
    kept: dict[int, list[DeviceRecord]] = field(default_factory=dict)

    def fabrics(self, planned: list[Backend]) -> dict[str, FabricInfo]:
        """The fabrics with a device, or a binding style of their own (composition names none)."""
        used = {d.fabric for d in self.devices} | {
            b.fabric_id for b in planned if b.style is not BindingStyle.COMPOSITION
        }
        return {
            fabric_id: FabricInfo(
                id=fabric_id,
                uri=next((b.fabric_uri for b in planned if b.fabric_id == fabric_id), None),
                styles=tuple(styles),
                hosts=tuple(sorted(self.fabric_hosts[fabric_id])),
            )
            for fabric_id, styles in self.styles.items()
            if fabric_id in used
        }


async def _hosts(walk: Walk, root: ServiceRoot) -> dict[str, HostRecord]:
    """The service's ComputerSystems, by Id."""
    hosts: dict[str, HostRecord] = {}
    for system in await walk.members(root.systems, ComputerSystem):
        system_id = system.id or ""
        uri = system.uri
        if system_id and uri:
            hosts[system_id] = HostRecord(
                id=system_id,
                uri=uri,
                uuid=system.uuid.lower() if system.uuid else None,
                name=system.name,
                host_name=system.host_name,
            )
    return hosts


def _with_initiators(
    hosts: dict[str, HostRecord], initiators: dict[str, dict[str, tuple[str, ...]]]
) -> dict[str, HostRecord]:
    """``hosts`` with the initiator endpoints each has on each fabric."""
    for host_id, by_fabric in initiators.items():
        hosts[host_id] = dataclasses.replace(hosts[host_id], initiators=by_fabric)
    return hosts


def gone_notices(walk: Walk) -> list[str]:
    """What a pass skipped because the service changed while it read: members a collection
    listed that were gone when read (each logged as a warning, and said in ``/readyz`` detail
    until a pass reads the collection whole)."""
    notices = [
        f"{count} member(s) of {collection} were listed but not there when read (the first: "
        f"{first}): the service changed while it was read; the next pass reads them again"
        for collection, (count, first) in sorted(walk.gone.items())
    ]
    for notice in notices:
        log.warning("the Redfish service changed while discovery read it", detail=notice)
    return notices


@contextlib.contextmanager
def unreadable_payloads(what: str) -> Iterator[None]:
    """A payload of the wrong shape (a string where an object belongs, a value pydantic refuses,
    JSON nested too deeply) ends the pass as a FabricError: the view stays as it was and the
    next pass tries again — nothing is concluded from an answer that cannot be read."""
    try:
        yield
    except FabricError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError) as err:
        detail = one_line(f"{type(err).__name__}: {err}", 300)
        log.warning("the Redfish service sent a payload fabric-dra cannot read", during=what, error=detail)
        raise FabricUnavailable(
            f"{what} stopped: the Redfish service sent a payload fabric-dra cannot read ({detail}); "
            "check the service's answers (fabric-dra logs what it was) or report it"
        ) from err


def _composition_notice(
    backend: CompositionBackend,
    result: DiscoveryResult,
    found: list[DeviceRecord],
    reached: set[str],
    has_systems: bool,
) -> str | None:
    """What must be said about resource blocks that are found but not (all) poolable, if anything."""
    if not found:
        return None
    kinds = Counter(str(d.attributes.type) for d in found)
    blocks = f"{len(found)} resource block(s) ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})"
    if isinstance(backend, RootBlocksBackend) and not has_systems:
        return (
            f"the Redfish service lists {blocks} only in its root ResourceBlocks collection "
            f"({backend.fabric_uri}), with no CompositionService and no ComputerSystem: they are in "
            "the inventory as unavailable and none is poolable, because no host of this service "
            "reaches them (an expansion enclosure whose hosts another service manages); fabric-dra "
            "has no setting that joins hosts of another Redfish service to these blocks — point "
            "--redfish-url at the service that manages the hosts and composes these blocks"
        )
    if not result.hosts:
        return (
            f"{blocks} found at {backend.fabric_uri}, none poolable: no ComputerSystem of the "
            "service can be composed (none offers ComputerSystem.AddResourceBlock or "
            "Links.ResourceBlocks to PATCH); they are in the inventory as unavailable"
        )
    left_out = [h for h in result.uncomposable if h not in reached]
    if left_out:
        return (
            f"system(s) {', '.join(left_out)} cannot be composed (no ComputerSystem.AddResourceBlock, "
            f"no Links.ResourceBlocks to PATCH): the {blocks} at {backend.fabric_uri} are not offered "
            "to them"
        )
    return None


def _without_duplicates(candidates: list[DeviceRecord], known: list[DeviceRecord]) -> list[DeviceRecord]:
    identities = {uri for d in known for uri in d.attributes.identities} | {d.key for d in known}
    serials = {d.attributes.serial for d in known if d.attributes.serial}
    kept = []
    for device in candidates:
        if device.attributes.identities & identities or (
            device.attributes.serial and device.attributes.serial in serials
        ):
            log.debug("resource block already reachable through a fabric", block=device.key)
            continue
        kept.append(device)
    return kept
