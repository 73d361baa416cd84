"""A bindings pass over the shared zone reads works out again only the zones whose JSON is new
(fabric/backends/zones.py, ``bound_over``), and answers what a walk over every
zone's members answers (``_Roles.bound_by``), through zones bound and unbound, added and gone,
initiators learned, and a new discovery's targets."""

from __future__ import annotations

import random
from typing import Any

from fabric.backends.zones import ZoneBackend, _Zone, bound_over

FABRIC = "/redfish/v1/Fabrics/PCIe"


def _zone(uri: str, endpoints: list[str], zone_type: str | None = "ZoneOfEndpoints") -> dict[str, Any]:
    body: dict[str, Any] = {
        "@odata.id": uri,
        "Id": uri.rsplit("/", 1)[-1],
        "Links": {"Endpoints": [{"@odata.id": e} for e in endpoints]},
    }
    if zone_type is not None:
        body["ZoneType"] = zone_type
    return body


def _expected(backend: ZoneBackend, current: dict[str, dict[str, Any]]) -> dict[str, tuple[str, ...]]:
    zones: dict[str, _Zone] = {}
    for uri, body in current.items():
        backend._add_zone(zones, backend.reads.view(uri, body)[1])
    bound = backend.roles.bound_by(list(zones.values()))
    return {t: tuple(sorted(bound.get(t, ()))) for t in backend._targets}


def test_the_kept_answer_is_the_walk_over_every_zone() -> None:
    rng = random.Random(37)
    backend = ZoneBackend(None, "PCIe", FABRIC)  # (no request is sent)
    hosts = [f"h{i}" for i in range(5)]
    initiators = {f"{FABRIC}/Endpoints/{h}-init": h for h in hosts}
    backend.roles.initiator_hosts = dict(initiators)
    backend._targets = [f"{FABRIC}/Endpoints/gpu{i}" for i in range(40)]
    members: dict[str, set[str]] = {f"{FABRIC}/Zones/{h}": {f"{FABRIC}/Endpoints/{h}-init"} for h in hosts}
    kinds: dict[str, str | None] = dict.fromkeys(members, "ZoneOfEndpoints")
    current = {uri: _zone(uri, sorted(m), kinds[uri]) for uri, m in members.items()}
    for step in range(400):
        changed = rng.choice(sorted(members))
        move = rng.randrange(10)
        if move < 6:  # bind or unbind a device in one zone (a new JSON for that zone only)
            members[changed] ^= {rng.choice(backend._targets)}
        elif move == 6:  # a zone created, or one deleted
            uri = f"{FABRIC}/Zones/extra{rng.randrange(3)}"
            if uri in members:
                del members[uri], current[uri]
                continue
            members[uri] = {rng.choice(list(initiators)), rng.choice(backend._targets)}
            choices: list[str | None] = ["ZoneOfEndpoints", "ZoneOfZones", None]
            kinds[uri] = rng.choice(choices)
            changed = uri
        elif move == 7:  # an initiator learned (a host not discovered, read since)
            uri = f"{FABRIC}/Endpoints/late{step}-init"
            backend.roles.initiator_hosts[uri] = f"late{step}"
            backend.roles.generation += 1
            members[changed].add(uri)
        elif move == 8:  # a new discovery: another list of targets (the kept answer is not its)
            backend._targets = list(backend._targets)
        # else: the same zone read again, a new JSON object of the same version
        current[changed] = _zone(changed, sorted(members[changed]), kinds[changed])
        assert bound_over(backend, current) == _expected(backend, current), step


def test_an_unchanged_read_costs_no_zone() -> None:
    backend = ZoneBackend(None, "PCIe", FABRIC)
    backend.roles.initiator_hosts = {f"{FABRIC}/Endpoints/h0-init": "h0"}
    backend._targets = [f"{FABRIC}/Endpoints/gpu0", f"{FABRIC}/Endpoints/gpu1"]
    uri = f"{FABRIC}/Zones/h0"
    current = {uri: _zone(uri, [f"{FABRIC}/Endpoints/h0-init", f"{FABRIC}/Endpoints/gpu0"])}
    first = bound_over(backend, current)
    assert first == {f"{FABRIC}/Endpoints/gpu0": ("h0",), f"{FABRIC}/Endpoints/gpu1": ()}
    viewed = dict(backend.reads._views)
    assert bound_over(backend, current) == first
    assert backend.reads._views == viewed  # nothing viewed again
    first[f"{FABRIC}/Endpoints/gpu1"] = ("someone",)  # the caller's copy, not the kept answer
    assert bound_over(backend, current)[f"{FABRIC}/Endpoints/gpu1"] == ()
