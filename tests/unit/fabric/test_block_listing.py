"""Resource blocks a fabric offers too: what a pass keeps of the blocks collection is a derived
listing with the answer's ETag, not the answer (fabric/backends/composition.py, BlockListing)."""

from __future__ import annotations

from typing import Any

from fabric.backends.composition import BlockListing, CompositionBackend
from fabric.backends.walk import Revalidation, Walk
from fabric.redfish import RedfishClient, RedfishSettings
from tests.support.fabric_http import Reply, Request, ScriptedServer

COLLECTION = "/redfish/v1/CompositionService/ResourceBlocks"
KEY = f"{COLLECTION}?$expand=.($levels=1)"


def _processor(device: str) -> str:
    return f"/redfish/v1/Chassis/S1/Processors/{device}"


class Service:
    """The blocks collection, expanded, with an ETag (304 to a match); each block alone too."""

    def __init__(self) -> None:
        self.models = {"gpu1": "H100", "gpu2": "H100", "gpu3": "A100"}

    def block(self, device: str) -> dict[str, Any]:
        return {
            "@odata.id": f"{COLLECTION}/{device}",
            "Id": device,
            "ResourceBlockType": ["Processor"],
            "Description": self.models[device],
            "Processors": [{"@odata.id": _processor(device)}],
        }

    def answer(self, request: Request) -> Reply:
        if request.path == KEY:
            body = {"Members": [self.block(d) for d in sorted(self.models)]}
            tag = f'"{abs(hash(repr(body)))}"'
            if request.headers.get("if-none-match") == tag:
                return Reply(304, None, {"ETag": tag})
            return Reply(200, body, {"ETag": tag})
        device = request.path.rsplit("/", 1)[-1]
        return Reply(200, self.block(device)) if device in self.models else Reply(404, None)


async def _pass(
    client: RedfishClient, backend: CompositionBackend, revalidation: Revalidation, offered: set[str]
) -> tuple[list[str], Walk]:
    walk = Walk(client, expand=True, revalidation=revalidation)
    backend.offered = frozenset(_processor(d) for d in offered)
    blocks = await backend._blocks(walk, COLLECTION)
    revalidation.retain(walk)
    return [str(b.id) for b in blocks], walk


async def test_offered_blocks_leave_no_answer_behind_and_a_304_reads_nothing_again() -> None:
    service = Service()
    with ScriptedServer(service.answer) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        backend = CompositionBackend(client, "Composition", "/redfish/v1/CompositionService")
        revalidation = Revalidation()
        try:
            ids, walk = await _pass(client, backend, revalidation, {"gpu1", "gpu2", "gpu3"})
            assert ids == []
            # the answer is not kept for If-None-Match, nor held against the pass's bounds
            assert revalidation.kept(KEY) is None
            assert walk.read_values == 0, walk.read_values
            listing = revalidation.derived[("blocks", COLLECTION)]
            assert isinstance(listing, BlockListing)
            assert [body for _, _, body in listing.members] == [None, None, None]

            # unchanged: one conditional GET
            before = server.count("GET")
            ids, walk = await _pass(client, backend, revalidation, {"gpu1", "gpu2", "gpu3"})
            assert ids == []
            assert (server.count("GET") - before, walk.not_modified) == (1, 1)

            # a fabric no longer offers gpu3: its block, whose JSON was not kept, is read again,
            # once; the next pass takes it and its view as they were
            before = server.count("GET")
            ids, walk = await _pass(client, backend, revalidation, {"gpu1", "gpu2"})
            assert ids == ["gpu3"]
            assert server.count("GET") - before == 2
            first = dict(walk.views)
            before = server.count("GET")
            ids, walk = await _pass(client, backend, revalidation, {"gpu1", "gpu2"})
            assert ids == ["gpu3"]
            assert server.count("GET") - before == 1
            assert [walk.views[k] is v for k, v in first.items()] == [True]

            # the collection changed: read again in full, the change seen
            service.models["gpu3"] = "B200"
            ids, walk = await _pass(client, backend, revalidation, {"gpu1"})
            assert ids == ["gpu2", "gpu3"]
            assert walk.cached(f"{COLLECTION}/gpu3") == service.block("gpu3")
        finally:
            await client.aclose()


async def test_a_service_without_etags_is_read_as_before() -> None:
    def answer(request: Request) -> Reply:
        reply = Service().answer(request)
        reply.headers.pop("ETag", None)
        return reply

    with ScriptedServer(answer) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        backend = CompositionBackend(client, "Composition", "/redfish/v1/CompositionService")
        revalidation = Revalidation()
        try:
            for _ in range(2):
                before = server.count("GET")
                ids, _ = await _pass(client, backend, revalidation, {"gpu1"})
                assert ids == ["gpu2", "gpu3"]
                assert server.count("GET") - before == 1  # the collection, expanded, once
                assert ("blocks", COLLECTION) not in revalidation.derived
        finally:
            await client.aclose()
