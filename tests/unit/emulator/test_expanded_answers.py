"""Kept expanded answers against a full rebuild: after random binds, unbinds, and client zones
created and deleted, every ``$expand``/``$select`` answer (and ETag) the service serves from what
it kept is the one a service with empty caches builds for the same state."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from emulator.redfish.model.latency import INSTANT
from emulator.redfish.service.expanded import ExpandedAnswers
from emulator.redfish.service.server import ServeConfig, build_service
from emulator.redfish.tree.auth import Credentials
from emulator.redfish.tree.expand import Expand, Select
from emulator.redfish.tree.nodes import CollectionNode
from emulator.redfish.tree.render import Renderer
from emulator.redfish.views import resolve, resolve_under
from emulator.topology import parse_topology
from emulator.topology.generate import GenerateSpec, generate_topology_yaml
from tests.support.emulator import ENDPOINTS, ZONES

_HOSTS = ["kind-worker", "kind-worker2", "kind-worker3"]
_READS = [
    (ZONES, ".($levels=1)", "Id"),
    (ZONES, ".($levels=1)", None),
    (ZONES, None, "Members"),
    (ENDPOINTS, ".($levels=1)", None),
    (ENDPOINTS, ".($levels=1)", "Id,Links/ConnectedEntities"),
    ("/redfish/v1/Fabrics/PCIe", ".($levels=2)", None),
    ("/redfish/v1/Fabrics/PCIe", "*($levels=3)", None),
    ("/redfish/v1/Systems", "*($levels=1)", None),
    ("/redfish/v1/CompositionService/ResourceBlocks", ".($levels=1)", "Id,CompositionStatus"),
]


def test_kept_answers_are_what_a_full_rebuild_gives(tmp_path: Path) -> None:
    index = parse_topology(yaml.safe_load(generate_topology_yaml(GenerateSpec(hosts=3, gpus=6))))
    service = build_service(
        ServeConfig(
            index=index,
            state_dir=tmp_path / "state",
            latency=INSTANT,
            credentials=Credentials(username="admin", password="secret-password"),
        )
    )
    app = service.app
    rng = random.Random(11)
    bound: dict[str, str] = {}  # gpu → zone it is in
    client_zones: list[str] = []

    def fresh_answer(uri: str, query: str | None, chosen: str | None) -> tuple[bytes, str]:
        ctx = app.ctx
        kept = ctx.renderer
        ctx.renderer = Renderer(ctx.revision, etags=kept.etags)
        try:
            answers = ExpandedAnswers(
                ctx, lambda base, u, made: resolve_under(app.root, base, u, made), app.expanded.served
            )
            node = resolve(app.root, uri)
            assert node is not None
            return answers.answer(
                node, Expand.parse(query) if query else None, Select.parse(chosen) if chosen else None
            )
        finally:
            ctx.renderer = kept

    async def step(client: httpx.AsyncClient) -> None:
        roll = rng.random()
        if roll < 0.15 and len(client_zones) < 3:
            host = rng.choice(_HOSTS)
            made = await client.post(
                ZONES, json={"Links": {"Endpoints": [{"@odata.id": f"{ENDPOINTS}/{host}"}]}}
            )
            assert made.status_code == 201, made.text
            client_zones.append(made.headers["Location"].rsplit("/", 1)[1])
            return
        if roll < 0.25 and client_zones:
            zone = client_zones.pop(rng.randrange(len(client_zones)))
            for gpu in [g for g, z in bound.items() if z == zone]:
                del bound[gpu]
            gone = await client.delete(f"{ZONES}/{zone}")
            assert gone.status_code in (200, 204), gone.text
            return
        gpu = f"gpu{rng.randrange(6)}"
        if gpu in bound:
            zone = bound.pop(gpu)
            action = "RemoveEndpoint"
        else:
            zone = rng.choice(_HOSTS + client_zones)
            bound[gpu] = zone
            action = "AddEndpoint"
        done = await client.post(
            f"{ZONES}/{zone}/Actions/Zone.{action}", json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/{gpu}"}}
        )
        assert done.status_code == 204, done.text

    async def main() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://emulator", auth=("admin", "secret-password")
        ) as client:
            for turn in range(60):
                await step(client)
                for uri, query, chosen in rng.sample(_READS, 4):
                    params = {k: v for k, v in (("$expand", query), ("$select", chosen)) if v}
                    served = await client.get(uri, params=params)
                    assert served.status_code == 200, served.text
                    body, etag = fresh_answer(uri, query, chosen)
                    assert served.headers["ETag"] == etag, (turn, uri, query, chosen)
                    assert served.content == body, (turn, uri, query, chosen)
        service.engine.close()

    asyncio.run(main())


def test_a_collection_is_rendered_again_when_its_members_change_only() -> None:
    """The fingerprint of a plain collection is its members: a subclass that renders more has none."""

    class Wider(CollectionNode):
        def render(self):  # type: ignore[no-untyped-def]
            return super().render()

    members = ["a", "b"]
    plain = CollectionNode(None, "/c", "XCollection", "X", lambda: members, lambda _i: None)  # type: ignore[arg-type]
    before = plain.fingerprint()
    members.append("c")
    assert plain.fingerprint() != before
    assert Wider(None, "/c", "XCollection", "X", lambda: members, lambda _i: None).fingerprint() is None  # type: ignore[arg-type]


def test_unchanged_zones_are_not_rendered_again_when_other_reads_fill_the_kept_renderings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renderer keeps renderings by fingerprint up to a limit. Used ones must stay: with the
    first kept evicted first, reads of other resources pushed the zones out one by one, and each
    change's expanded Zones listing rendered a zone again — at 10,000 bindings, a hundred endpoints
    each. With the kept renderings full, only the changed zone is rendered per change."""
    from emulator.redfish.tree import render
    from emulator.redfish.views import fabrics

    monkeypatch.setattr(render, "_KEPT_LIMIT", 40)
    index = parse_topology(yaml.safe_load(generate_topology_yaml(GenerateSpec(hosts=12, gpus=120))))
    service = build_service(
        ServeConfig(index=index, state_dir=tmp_path / "state", latency=INSTANT, credentials=None)
    )
    rendered: list[str] = []
    real = fabrics.ZoneNode.render

    def counted(node: fabrics.ZoneNode) -> Any:
        rendered.append(node.zone_id)
        return real(node)

    monkeypatch.setattr(fabrics.ZoneNode, "render", counted)
    listing = {"$expand": ".($levels=1)", "$select": "Id"}
    changed: list[str] = []

    async def main() -> None:
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as client:
            zones = [m["@odata.id"] for m in (await client.get(ZONES)).json()["Members"]]
            changed.append(zones[0].rsplit("/", 1)[1])
            gpus = sorted(t for t in index.targets if t.startswith("gpu"))
            assert (await client.get(ZONES, params=listing)).status_code == 200
            rendered.clear()
            for turn in range(30):
                action = "AddEndpoint" if turn % 2 == 0 else "RemoveEndpoint"
                done = await client.post(
                    f"{zones[0]}/Actions/Zone.{action}", json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/gpu1"}}
                )
                assert done.status_code == 204, done.text
                assert (await client.get(ZONES, params=listing)).status_code == 200
                for k in range(4):  # endpoints read between changes: new renderings to keep
                    await client.get(f"{ENDPOINTS}/{gpus[(turn * 4 + k) % len(gpus)]}")

    asyncio.run(main())
    assert rendered == changed * 30


def test_links_named_after_the_kept_ones_filled_up_are_kept_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """One frozen link per URI, the least recently used dropped past the limit: a discovery of a
    large fabric names more links than the limit, and a zone's endpoints named after that must
    still be kept (they were made and validated anew at every rendering of the zone)."""
    from emulator.redfish.model import resources

    monkeypatch.setattr(resources, "_REFS", {})
    monkeypatch.setattr(resources, "_REFS_LIMIT", 4)
    hot = resources.ref("/redfish/v1/Fabrics/PCIe/Endpoints/gpu0")
    for i in range(10):  # a pass over many other resources
        resources.ref(f"/redfish/v1/Chassis/c{i}")
        assert resources.ref("/redfish/v1/Fabrics/PCIe/Endpoints/gpu0") is hot  # in use: stays
    late = resources.ref("/redfish/v1/Fabrics/PCIe/Endpoints/gpu99")
    assert resources.ref("/redfish/v1/Fabrics/PCIe/Endpoints/gpu99") is late
    assert len(resources._REFS) == 4
    assert "/redfish/v1/Chassis/c0" not in resources._REFS  # the least recently used went
    assert late.model_dump(by_alias=True) == {"@odata.id": "/redfish/v1/Fabrics/PCIe/Endpoints/gpu99"}
