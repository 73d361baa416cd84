"""Reading collections: $expand when the service can, plain reads when it cannot or refuses."""

from __future__ import annotations

import pytest

from fabric.backends.discovery import gone_notices
from fabric.backends.views import Resource
from fabric.backends.walk import MAX_MEMBERS, Revalidation, Walk
from fabric.redfish import RedfishClient, RedfishSettings
from manager_api.errors import FabricUnavailable
from tests.support.fabric_http import Reply, Request, ScriptedServer

MEMBERS = [{"@odata.id": f"/redfish/v1/Things/{i}"} for i in range(3)]


def thing(i: int) -> dict[str, object]:
    return {"@odata.id": f"/redfish/v1/Things/{i}", "Id": str(i), "Name": f"thing {i}"}


def service(expand: str) -> ScriptedServer:
    def answer(request: Request) -> Reply:
        if request.path == "/redfish/v1/Things?$expand=.($levels=1)":
            if expand == "refused":
                return Reply(
                    400,
                    {
                        "error": {
                            "code": "Base.1.22.QueryParameterUnsupported",
                            "@Message.ExtendedInfo": [
                                {"MessageId": "Base.1.22.QueryParameterUnsupported", "Message": "no"}
                            ],
                        }
                    },
                )
            return Reply(200, {"Members": [thing(i) for i in range(3)]})
        if request.path == "/redfish/v1/Things":
            return Reply(200, {"Members": MEMBERS, "Members@odata.nextLink": "/redfish/v1/Things?page=2"})
        if request.path == "/redfish/v1/Things?page=2":
            return Reply(200, {"Members": [{"@odata.id": "/redfish/v1/Things/9"}]})
        if request.path == "/redfish/v1/Things/9":
            return Reply(404, None)
        index = int(request.path.rsplit("/", 1)[1])
        return Reply(200, thing(index))

    return ScriptedServer(answer)


async def test_expanded_collection_needs_one_read() -> None:
    with service("ok") as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        try:
            walk = Walk(client, expand=True)
            assert [m.id for m in await walk.members("/redfish/v1/Things", Resource)] == ["0", "1", "2"]
        finally:
            await client.aclose()
        assert server.count("GET") == 1


async def test_refused_expand_falls_back_to_pages_and_members() -> None:
    with service("refused") as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        try:
            walk = Walk(client, expand=True)
            # pages are followed; a member that does not exist is skipped, not fatal
            assert [m.id for m in await walk.members("/redfish/v1/Things", Resource)] == ["0", "1", "2"]
            assert walk.expand is False
        finally:
            await client.aclose()
        assert server.count("GET", "/redfish/v1/Things/") == 4


async def test_member_uris_follow_the_pages_without_reading_the_members() -> None:
    with service("ok") as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        try:
            uris = await Walk(client).member_uris("/redfish/v1/Things")
        finally:
            await client.aclose()
        assert uris == [*(m["@odata.id"] for m in MEMBERS), "/redfish/v1/Things/9"]
        assert server.count("GET", "/redfish/v1/Things/") == 0


# -- a service that lists too much, or changes while it is read (issue 37, "Bad input") -----------


async def test_a_collection_past_the_members_bound_fails_the_read_naming_it_and_reads_no_further() -> None:
    """120 pages of 1,000 members each: the walk stops at the page that passes MAX_MEMBERS (not at
    the page bound, far later), names the collection, and never reads a member."""
    per_page = 1_000

    def answer(request: Request) -> Reply:
        page = int(request.path.split("page=", 1)[1]) if "page=" in request.path else 0
        members = [{"@odata.id": f"/redfish/v1/Things/{page}-{i}"} for i in range(per_page)]
        body: dict[str, object] = {"Members": members}
        if page < 119:
            body["Members@odata.nextLink"] = f"/redfish/v1/Things?page={page + 1}"
        return Reply(200, body)

    with ScriptedServer(answer) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        walk = Walk(client)
        try:
            with pytest.raises(FabricUnavailable, match="more than 100000 collection members") as raised:
                await walk.members("/redfish/v1/Things", Resource)
        finally:
            await client.aclose()
        assert "/redfish/v1/Things" in raised.value.message
        assert server.count("GET") == MAX_MEMBERS // per_page + 1  # the pages, no member
        assert walk.listed <= MAX_MEMBERS + per_page


async def test_a_collection_that_changes_while_it_is_read_ends_and_says_what_it_skipped() -> None:
    """Each read of a page lists members of a newer generation, and members go away between the
    listing and their read: the walk reads each page and member once, ends, keeps what was there,
    and counts what it skipped (the pass says so in its notices)."""
    reads = {"pages": 0}

    def answer(request: Request) -> Reply:
        if request.path.startswith("/redfish/v1/Things?") or request.path == "/redfish/v1/Things":
            reads["pages"] += 1
            generation = reads["pages"]
            page = int(request.path.split("page=", 1)[1]) if "page=" in request.path else 0
            body: dict[str, object] = {
                "Members": [{"@odata.id": f"/redfish/v1/Things/{generation}{i}"} for i in range(3)]
            }
            if page < 2:
                body["Members@odata.nextLink"] = f"/redfish/v1/Things?page={page + 1}"
            return Reply(200, body)
        index = int(request.path.rsplit("/", 1)[1])
        return Reply(404, None) if index % 10 == 0 else Reply(200, thing(index))

    with ScriptedServer(answer) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        walk = Walk(client)
        try:
            found = await walk.members("/redfish/v1/Things", Resource)
        finally:
            await client.aclose()
        assert [m.id for m in found] == ["11", "12", "21", "22", "31", "32"]
        assert server.count("GET") == 3 + 9  # each page once, each member once
        assert walk.gone == {"/redfish/v1/Things": (3, "/redfish/v1/Things/10")}
        (notice,) = gone_notices(walk)
        assert "3 member(s) of /redfish/v1/Things" in notice and "/redfish/v1/Things/10" in notice


async def test_slimmed_answers_keep_their_views_in_the_pass_and_after_a_304() -> None:
    """What is read through its views only (a fabric's endpoints) keeps no JSON past them: the
    answers become stubs, the views are still found for them, and a 304 next pass gives them back."""

    def answer(request: Request) -> Reply:
        tag = '"v1"'
        if request.headers.get("if-none-match") == tag:
            return Reply(304, None, {"ETag": tag})
        return Reply(200, {"Members": [thing(i) for i in range(3)]}, {"ETag": tag})

    with ScriptedServer(answer) as server:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        revalidation = Revalidation()
        try:
            walk = Walk(client, expand=True, revalidation=revalidation)
            views = await walk.members("/redfish/v1/Things", Resource)
            walk.slim(views)
            assert walk.cached("/redfish/v1/Things/1") == {"@odata.id": "/redfish/v1/Things/1", "Id": "1"}
            assert await walk.read("/redfish/v1/Things/1", Resource) is views[1]
            revalidation.retain(walk)

            again = Walk(client, expand=True, revalidation=revalidation)
            found = await again.members("/redfish/v1/Things", Resource)
            assert [a is b for a, b in zip(found, views, strict=True)] == [True, True, True]
            assert [m.name for m in found] == ["thing 0", "thing 1", "thing 2"]
            assert again.not_modified == 1
        finally:
            await client.aclose()
        assert server.count("GET") == 2
