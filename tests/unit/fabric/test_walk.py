"""Reading collections: $expand when the service can, plain reads when it cannot or refuses."""

from __future__ import annotations

from fabric.backends.views import Resource
from fabric.backends.walk import Walk
from fabric.redfish import RedfishClient, RedfishSettings
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
