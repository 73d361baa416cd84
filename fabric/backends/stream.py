"""Describing a fabric's devices a switch at a time, and keeping what was described instead of
what was read.

A device's resources (its Processor or Drive, PCIeFunction, PCIeDevice, the switch port and its
metrics) are read per switch, in collections (:func:`fabric.backends.describe.prefetch_parts`).
Read for the whole fabric at once they were most of what a pass held: at 10,100 devices several
hundred MiB of answers and their views, kept to the end of the pass and then, for the next pass's
``If-None-Match``, until the next one ended. Here each switch's devices are read by a walk of
their own (:class:`_SwitchWalk`), described, and the answers and views dropped; what is kept is
what was derived — the devices' attributes — with the ETag of each answer it was derived from.

The next full pass asks for each of those answers with ``If-None-Match``; when every one is 304
Not Modified, and what the devices were described from besides (their endpoints, anything the
switch's walk took from the pass) is unchanged, the attributes are taken as they were, without a
view made. Otherwise the switch is read and described again. A switch whose reads gave anything
without an ETag (a service that sends none, a resource that is not there) is described again on
every pass, as before revalidation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from fabric.backends.describe import describe, prefetch_parts
from fabric.backends.views import JSON, Endpoint, Readable
from fabric.backends.walk import Revalidation, Walk
from fabric.state.model import DiscoveredAttributes
from manager_api.errors import FabricUnavailable, NotFoundError

__all__ = ["SWITCHES_AT_ONCE", "SwitchRecord", "describe_by_switch"]

V = TypeVar("V", bound=Readable)

#: switches read and described at once: each holds its answers and views until its devices are
#: described, so this (not the fabric's size) bounds what a pass holds of devices' resources
SWITCHES_AT_ONCE = 8

#: what a pass that has not read a URI holds for it (None is a resource that is not there)
_UNREAD: Any = object()

#: a device as the backends hand it over: its entities ((EntityType, URI) pairs) and its endpoint
Target = tuple[Sequence[tuple[str, str]], Endpoint | None]


@dataclass(frozen=True, slots=True)
class SwitchRecord:
    """What one switch's devices were described from, and what they were described as."""

    #: the answers the switch's walk read itself: (request, ETag)
    etags: tuple[tuple[str, str], ...]
    #: what it took from the pass's walk, as it was then (the same objects while unchanged)
    borrowed: tuple[tuple[str, JSON | None], ...]
    #: per device, what its description read from its endpoint and entities (:func:`_inputs`)
    inputs: tuple[Any, ...]
    described: tuple[DiscoveredAttributes, ...]


class _SwitchWalk(Walk):
    """The reads of one switch's devices: its own answers, dropped with it; what the pass holds
    already (its endpoints, say) is borrowed, not read again. Requests and answers count
    against the pass's bounds as if the pass had made them."""

    def __init__(self, walk: Walk) -> None:
        super().__init__(
            walk.client,
            expand=walk.expand,
            max_levels=walk.max_levels,
            select=walk.select,
            revalidation=Revalidation(),
        )
        self.share_limit(walk)
        self.pass_walk = walk
        self.borrowed: dict[str, JSON | None] = {}
        #: members listed count from the pass's (what it holds, and this switch's while held)
        self.listed = walk.listed
        #: answers that cannot be revalidated (no ETag, not there)
        self.unkept = 0

    async def get(self, uri: str | None) -> JSON | None:
        key = (uri.rstrip("/") or "/") if uri else None
        if key is not None and not self.holds(key) and self.pass_walk.holds(key):
            body = self.borrowed[key] = self.pass_walk.cached(key)
            self.seed_as(key, body)
            return body
        return await super().get(uri)

    def _view(self, uri: str, body: JSON, view: type[V]) -> V:
        # what the pass holds is borrowed with its view: its JSON may be a stub (Walk.slim)
        if self.borrowed.get(uri, _UNREAD) is body:
            held = self.pass_walk.views.get((uri, view))
            if held is not None:
                return cast(V, held)
        return super()._view(uri, body, view)

    async def _fetch(self, uri: str) -> JSON:
        try:
            body = await super()._fetch(uri)
        except NotFoundError:
            self.unkept += 1
            raise
        if uri not in self.kept:
            self.unkept += 1
        return body

    def _count(self, uri: str, size: int, values: int) -> None:
        super()._count(uri, size, values)
        self.pass_walk._count(uri, size, values)

    def close(self) -> None:
        """Hand the pass what it must count: requests, ``$expand`` refused. The answers are
        dropped: the pass's bounds on what it holds (bytes, JSON values, members listed) no
        longer count them. Counted to the end of the pass, 10,100 devices' switches were more
        than a pass may hold (2,097,152 values; over 100,000 members with each switch's ports)
        and the pass failed before it ended."""
        walk = self.pass_walk
        walk.read_bytes -= self.read_bytes
        walk.read_values -= self.read_values
        walk.gets += self.gets
        walk.prefetched += self.prefetched
        if not self.expand:
            walk.expand = False
        if not self.select:
            walk.select = False

    def record(
        self, inputs: tuple[Any, ...], described: tuple[DiscoveredAttributes, ...]
    ) -> SwitchRecord | None:
        """What the next pass needs to take ``described`` as it is; None when a read cannot be
        revalidated."""
        if self.unkept:
            return None
        etags = tuple((key, kept.etag) for key, kept in self.kept.items())
        return SwitchRecord(etags, tuple(self.borrowed.items()), inputs, described)


def _switch(target: Target) -> str:
    """The chassis (a switch's, in a PCIe enclosure) of the device's first entity
    (``/redfish/v1/Chassis/{switch}/Processors/{device}``), else the entity itself."""
    uri = next((u for _, u in target[0]), "")
    parts = uri.split("/")
    return "/".join(parts[:-2]) if len(parts) > 5 else uri


def _inputs(target: Target) -> tuple[Any, ...]:
    """What :func:`describe` reads of a device besides the walk: its entities and its endpoint's
    status, ports and connected entities (not its zones: a bind changes those, not the device)."""
    entities, endpoint = target
    if endpoint is None:
        return (tuple(entities), None)
    links = endpoint.links
    return (
        tuple(entities),
        endpoint.uri,
        endpoint.status,
        (links.connected_ports, links.ports, links.local_ports),
        endpoint.connected_entities,
    )


async def _unchanged(walk: Walk, record: SwitchRecord | None, inputs: tuple[Any, ...]) -> bool:
    if record is None or record.inputs != inputs:
        return False
    for uri, body in record.borrowed:
        now = walk.cached(uri) if walk.holds(uri) else _UNREAD
        if now is not body and now != body:
            return False
    answers = await asyncio.gather(*(walk.revalidate(key, tag) for key, tag in record.etags))
    return all(answers)


async def _describe_switch(walk: Walk, key: str, targets: list[Target]) -> list[DiscoveredAttributes]:
    inputs = tuple(_inputs(t) for t in targets)
    last = walk.revalidation.derived.get(("switch", key)) if walk.revalidation is not None else None
    if last is not None and await _unchanged(walk, last, inputs):
        walk.derived[("switch", key)] = last
        return list(last.described)
    switch_walk = _SwitchWalk(walk)
    try:
        await prefetch_parts(switch_walk, (entities for entities, _ in targets))
        described = await asyncio.gather(
            *(describe(switch_walk, entities, endpoint=endpoint) for entities, endpoint in targets)
        )
    finally:
        switch_walk.close()
    record = switch_walk.record(inputs, tuple(described))
    if record is not None and walk.revalidation is not None:
        walk.derived[("switch", key)] = record
    return described


async def describe_by_switch(walk: Walk, targets: Sequence[Target]) -> list[DiscoveredAttributes]:
    """The attributes of each of ``targets``, in order: a switch's devices at a time, at most
    :data:`SWITCHES_AT_ONCE` switches at once, each switch's answers dropped once its devices
    are described (module doc)."""
    groups: dict[str, list[int]] = {}
    for index, target in enumerate(targets):
        groups.setdefault(_switch(target), []).append(index)
    gate = asyncio.Semaphore(SWITCHES_AT_ONCE)
    out: list[DiscoveredAttributes | None] = [None] * len(targets)

    async def one(key: str, indexes: list[int]) -> None:
        async with gate:
            described = await _describe_switch(walk, key, [targets[i] for i in indexes])
        for index, attributes in zip(indexes, described, strict=True):
            out[index] = attributes

    await asyncio.gather(*(one(key, indexes) for key, indexes in groups.items()))
    described = [a for a in out if a is not None]
    if len(described) != len(targets):  # gather returns only when every switch was described
        raise FabricUnavailable(f"{len(targets) - len(described)} device(s) were not described in this pass")
    return described
