"""The Redfish client's safety rules, against real HTTP(S) servers scripted by each test."""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import logging
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from fabric.redfish import OutcomeUnknown, PreconditionFailed, RedfishClient, RedfishSettings
from fabric.redfish.client import resource_kind
from manager_api.errors import AttachTimeout, BindFailed, DeviceBusy, FabricUnavailable
from plumbing.logs import configure
from tests.support.fabric_http import Reply, Request, ScriptedServer

PASSWORD = "s3cret-Pa55word-for-tests"
ROOT = {
    "@odata.id": "/redfish/v1/",
    "Links": {"Sessions": {"@odata.id": "/redfish/v1/SessionService/Sessions"}},
}


def error(message_id: str, status: int = 400) -> Reply:
    return Reply(
        status,
        {
            "error": {
                "code": message_id,
                "message": "x",
                "@Message.ExtendedInfo": [
                    {
                        "MessageId": message_id,
                        "Message": f"{message_id.rsplit('.', 1)[-1]} happened",
                        "Resolution": "None.",
                    }
                ],
            }
        },
    )


class FakeService:
    """A Redfish service with sessions whose tokens the test can expire."""

    def __init__(self) -> None:
        self.tokens = itertools.count(1)
        self.valid: set[str] = set()
        self.sessions: dict[str, str] = {}
        self.routes: dict[tuple[str, str], list[Reply] | Reply] = {}
        #: how many session DELETEs to lose (the connection closes, the session stays)
        self.lose_deletes = 0
        #: how many logins to lose before the service acts on them (the connection closes)
        self.lose_logins = 0
        #: seconds a login takes to answer after the session exists
        self.login_delay = 0.0
        #: authenticated requests to refuse with 401 although the session is valid
        self.refuse = 0
        #: set once a session exists (before the login's answer is sent)
        self.logged_in = threading.Event()

    def expire_sessions(self) -> None:
        self.valid.clear()

    def __call__(self, request: Request) -> Reply:
        path = request.path.split("?", 1)[0]
        if path.rstrip("/") == "/redfish/v1":
            return Reply(200, ROOT)
        if request.method == "POST" and path == "/redfish/v1/SessionService/Sessions":
            if request.body != {"UserName": "admin", "Password": PASSWORD}:
                return Reply(401, None)
            if self.lose_logins:
                self.lose_logins -= 1
                return Reply(drop=True)
            number = next(self.tokens)
            token = f"token-{number}-{'x' * 16}"
            self.valid.add(token)
            self.sessions[f"/redfish/v1/SessionService/Sessions/{number}"] = token
            self.logged_in.set()
            time.sleep(self.login_delay)
            return Reply(
                201,
                {"@odata.id": f"/redfish/v1/SessionService/Sessions/{number}"},
                {"X-Auth-Token": token, "Location": f"/redfish/v1/SessionService/Sessions/{number}"},
            )
        if request.headers.get("x-auth-token") not in self.valid:
            return error("Base.1.22.1.NoValidSession", 401)
        if self.refuse and request.method == "GET":
            self.refuse -= 1
            return error("Base.1.22.1.NoValidSession", 401)
        if request.method == "DELETE" and path in self.sessions:
            if self.lose_deletes:
                self.lose_deletes -= 1
                return Reply(drop=True)
            self.valid.discard(self.sessions.pop(path))
            return Reply(204)
        route = self.routes.get((request.method, path))
        if isinstance(route, list):
            return route.pop(0) if len(route) > 1 else route[0]
        if route is not None:
            return route
        return error("Base.1.22.1.ResourceMissingAtURI", 404)


@pytest.fixture
def service() -> Iterator[tuple[FakeService, ScriptedServer]]:
    fake = FakeService()
    server = ScriptedServer(fake)
    with server:
        yield fake, server


def settings(url: str, **extra: object) -> RedfishSettings:
    base: dict[str, object] = {
        "base_url": url,
        "username": "admin",
        "password": PASSWORD,
        "read_timeout": 2.0,
        "backoff_initial": 0.01,
        "backoff_max": 0.05,
    }
    base.update(extra)
    return RedfishSettings.model_validate(base)


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure(level="debug", stream=stream)
    yield stream
    logging.getLogger().handlers.clear()


async def test_session_login_and_relogin_after_expiry(
    service: tuple[FakeService, ScriptedServer], captured_logs: io.StringIO
) -> None:
    fake, server = service
    fake.routes[("GET", "/redfish/v1/Fabrics")] = Reply(200, {"Members": []})
    client = RedfishClient(settings(server.url))
    try:
        assert (await client.get_json("/redfish/v1/Fabrics")) == {"Members": []}
        fake.expire_sessions()
        assert (await client.get_json("/redfish/v1/Fabrics")) == {"Members": []}
    finally:
        await client.aclose()
    assert server.count("POST", "/redfish/v1/SessionService/Sessions") == 2
    # the second session was deleted on close
    assert server.count("DELETE", "/redfish/v1/SessionService/Sessions/2") == 1
    assert fake.valid == set()
    text = captured_logs.getvalue()
    assert "logging in again" in text
    assert PASSWORD not in text and "token-" not in text


async def test_a_session_whose_delete_was_lost_is_deleted_later(
    service: tuple[FakeService, ScriptedServer],
) -> None:
    """A BMC has few session slots: the DELETE of a replaced session that got no answer is sent
    again after the next login, and the one lost at logout is not left behind either."""
    fake, server = service
    fake.routes[("GET", "/redfish/v1/Fabrics")] = Reply(200, {"Members": []})
    client = RedfishClient(settings(server.url))
    try:
        await client.get_json("/redfish/v1/Fabrics")
        fake.lose_deletes = 1
        fake.expire_sessions()  # login 2 replaces session 1, whose DELETE is lost
        await client.get_json("/redfish/v1/Fabrics")
        assert set(fake.sessions) == {f"/redfish/v1/SessionService/Sessions/{n}" for n in (1, 2)}
        fake.expire_sessions()  # login 3 deletes session 2 and, again, session 1
        await client.get_json("/redfish/v1/Fabrics")
        assert set(fake.sessions) == {"/redfish/v1/SessionService/Sessions/3"}
        fake.lose_deletes = 1
        fake.expire_sessions()  # login 4: session 3's DELETE is lost; logout sends it again
        await client.get_json("/redfish/v1/Fabrics")
    finally:
        await client.aclose()
    assert fake.sessions == {}
    assert server.count("DELETE", "/redfish/v1/SessionService/Sessions/1") == 2
    assert server.count("DELETE", "/redfish/v1/SessionService/Sessions/3") == 2


async def test_a_lost_login_keeps_the_session_it_would_replace_deletable(
    service: tuple[FakeService, ScriptedServer],
) -> None:
    """A 401 on a session that is still alive, then a login whose answer is lost: the client keeps
    the old session's token, so its logout still deletes it (without it the DELETE is a 401)."""
    fake, server = service
    fake.routes[("GET", "/redfish/v1/Fabrics")] = Reply(200, {"Members": []})
    client = RedfishClient(settings(server.url, get_attempts=1))
    try:
        await client.get_json("/redfish/v1/Fabrics")
        fake.refuse, fake.lose_logins = 1, 1
        with pytest.raises(FabricUnavailable):
            await client.get_json("/redfish/v1/Fabrics")
    finally:
        await client.aclose()
    assert fake.sessions == {}
    assert server.count("DELETE", "/redfish/v1/SessionService/Sessions/1") == 1


async def test_shutdown_lets_a_login_in_flight_finish_and_deletes_its_session(
    service: tuple[FakeService, ScriptedServer],
) -> None:
    """Shutdown cuts every connection, but not before a login in flight got its answer: cut, the
    session it created would hold one of the BMC's few slots with nobody knowing its token."""
    fake, server = service
    fake.routes[("GET", "/redfish/v1/Fabrics")] = Reply(200, {"Members": []})
    fake.login_delay = 1.0
    client = RedfishClient(settings(server.url))
    request = asyncio.ensure_future(client.get_json("/redfish/v1/Fabrics"))
    assert await asyncio.to_thread(fake.logged_in.wait, 10), "the login never reached the service"
    await client.aclose()
    with contextlib.suppress(Exception):
        await request
    assert fake.sessions == {}
    assert server.count("DELETE", "/redfish/v1/SessionService/Sessions/1") == 1


async def test_a_request_that_stops_waiting_does_not_cut_its_login_short(
    service: tuple[FakeService, ScriptedServer],
) -> None:
    """A request whose deadline passes while it waits for the login (an attach's, say) stops
    waiting; the login goes on, and its session is the one the next request uses and shutdown
    deletes. Cut off with the request, the session would be left on the service with nobody
    knowing its token, and the next request would open a second one."""
    fake, server = service
    fake.routes[("GET", "/redfish/v1/Fabrics")] = Reply(200, {"Members": []})
    fake.login_delay = 0.5
    client = RedfishClient(settings(server.url))
    try:
        request = asyncio.ensure_future(client.get_json("/redfish/v1/Fabrics"))
        assert await asyncio.to_thread(fake.logged_in.wait, 10), "the login never reached the service"
        request.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await request
        assert await client.get_json("/redfish/v1/Fabrics") == {"Members": []}
    finally:
        await client.aclose()
    assert server.count("POST", "/redfish/v1/SessionService/Sessions") == 1
    assert fake.sessions == {}


async def test_bad_credentials_are_one_clear_error(service: tuple[FakeService, ScriptedServer]) -> None:
    _, server = service
    client = RedfishClient(settings(server.url, password="wrong"))
    try:
        with pytest.raises(FabricUnavailable, match=r"login .* was refused .*credentials file") as caught:
            await client.get("/redfish/v1/Fabrics")
    finally:
        await client.aclose()
    assert "wrong" not in str(caught.value) and "admin" not in str(caught.value)


async def test_post_is_never_retried_when_the_answer_is_lost(
    service: tuple[FakeService, ScriptedServer],
) -> None:
    fake, server = service
    fake.routes[("POST", "/redfish/v1/Fabrics/PCIe/Zones")] = Reply(drop=True)
    client = RedfishClient(settings(server.url))
    try:
        with pytest.raises(OutcomeUnknown, match="may or may not have acted"):
            await client.post("/redfish/v1/Fabrics/PCIe/Zones", {"Name": "z"})
    finally:
        await client.aclose()
    assert server.count("POST", "/redfish/v1/Fabrics/PCIe/Zones") == 1


async def test_get_is_retried_with_backoff_and_retry_after(
    service: tuple[FakeService, ScriptedServer],
) -> None:
    fake, server = service
    fake.routes[("GET", "/redfish/v1/Chassis")] = [
        Reply(drop=True),
        error("Base.1.22.1.ServiceTemporarilyUnavailable", 503),
        Reply(503, None, {"Retry-After": "0"}),
        Reply(200, {"Members": []}),
    ]
    client = RedfishClient(settings(server.url, get_attempts=4))
    try:
        assert (await client.get_json("/redfish/v1/Chassis")) == {"Members": []}
    finally:
        await client.aclose()
    assert server.count("GET", "/redfish/v1/Chassis") == 4


async def test_get_gives_up_after_its_attempts(service: tuple[FakeService, ScriptedServer]) -> None:
    fake, server = service
    fake.routes[("GET", "/redfish/v1/Chassis")] = error("Base.1.22.1.ServiceTemporarilyUnavailable", 503)
    client = RedfishClient(settings(server.url, get_attempts=3))
    try:
        with pytest.raises(FabricUnavailable) as caught:
            await client.get("/redfish/v1/Chassis")
    finally:
        await client.aclose()
    assert server.count("GET", "/redfish/v1/Chassis") == 3
    assert caught.value.message_id == "Base.1.22.1.ServiceTemporarilyUnavailable"


async def test_read_timeout_is_always_set() -> None:
    release = threading.Event()

    def hang(request: Request) -> Reply:
        if request.path.startswith("/redfish/v1/Slow"):
            release.wait(10)
        return Reply(200, ROOT)

    with ScriptedServer(hang) as server:
        client = RedfishClient(
            RedfishSettings(base_url=server.url, auth="none", read_timeout=0.3, get_attempts=1)
        )
        try:
            with pytest.raises(FabricUnavailable, match="no answer within the read timeout"):
                await client.get("/redfish/v1/Slow")
            with pytest.raises(OutcomeUnknown):
                await client.post("/redfish/v1/Slow", {})
        finally:
            release.set()
            await client.aclose()


async def test_message_ids_map_to_error_classes(service: tuple[FakeService, ScriptedServer]) -> None:
    fake, server = service
    fake.routes[("POST", "/a")] = error("Base.1.8.ResourceInUse", 409)
    fake.routes[("POST", "/b")] = error("Base.1.22.1.PropertyValueNotInList", 400)
    fake.routes[("DELETE", "/c")] = Reply(412, None)
    client = RedfishClient(settings(server.url))
    try:
        with pytest.raises(DeviceBusy) as busy:
            await client.post("/a", {})
        assert busy.value.message_id == "Base.1.8.ResourceInUse"
        assert "ResourceInUse happened" in busy.value.message
        with pytest.raises(BindFailed):
            await client.post("/b", {})
        with pytest.raises(PreconditionFailed):
            await client.delete("/c", etag='W/"7"')
    finally:
        await client.aclose()
    deletes = [r for r in server.requests if r.method == "DELETE" and r.path == "/c"]
    assert deletes[0].headers["if-match"] == 'W/"7"'


async def test_task_monitor_is_followed_to_the_result(service: tuple[FakeService, ScriptedServer]) -> None:
    fake, server = service
    fake.routes[("POST", "/redfish/v1/Fabrics/CXL/Connections")] = Reply(
        202,
        {"@odata.id": "/redfish/v1/TaskService/Tasks/1", "TaskState": "New"},
        {"Location": "/redfish/v1/TaskService/TaskMonitors/1", "Retry-After": "0"},
    )
    fake.routes[("GET", "/redfish/v1/TaskService/TaskMonitors/1")] = [
        Reply(202, {"TaskState": "Running"}, {"Retry-After": "0"}),
        Reply(202, {"TaskState": "Running"}),
        Reply(
            201,
            {"@odata.id": "/redfish/v1/Fabrics/CXL/Connections/9"},
            {"Location": "/redfish/v1/Fabrics/CXL/Connections/9"},
        ),
    ]
    seen: list[str] = []
    client = RedfishClient(settings(server.url))
    try:
        accepted = await client.post("/redfish/v1/Fabrics/CXL/Connections", {})
        done = await client.follow(
            accepted, action="bind", deadline=time.monotonic() + 10, on_task=seen.append
        )
    finally:
        await client.aclose()
    assert done.status == 201 and done.location == "/redfish/v1/Fabrics/CXL/Connections/9"
    assert seen == ["/redfish/v1/TaskService/TaskMonitors/1"]
    assert server.count("POST", "/redfish/v1/Fabrics/CXL/Connections") == 1


async def test_failed_task_maps_its_messages(service: tuple[FakeService, ScriptedServer]) -> None:
    fake, server = service
    fake.routes[("POST", "/x")] = Reply(202, None, {"Location": "/tasks/2"})
    fake.routes[("GET", "/tasks/2")] = Reply(
        200,
        {
            "@odata.type": "#Task.v1_7_0.Task",
            "TaskState": "Exception",
            "TaskStatus": "Critical",
            "Messages": [{"MessageId": "Base.1.22.1.ResourceInUse", "Message": "in use"}],
        },
    )
    client = RedfishClient(settings(server.url))
    try:
        accepted = await client.post("/x", {})
        with pytest.raises(DeviceBusy, match="ended Exception"):
            await client.follow(accepted, action="bind", deadline=time.monotonic() + 10)
    finally:
        await client.aclose()


async def test_hung_task_times_out_and_says_it_goes_on(service: tuple[FakeService, ScriptedServer]) -> None:
    fake, server = service
    fake.routes[("POST", "/x")] = Reply(202, None, {"Location": "/tasks/3", "Retry-After": "0"})
    fake.routes[("GET", "/tasks/3")] = Reply(202, {"TaskState": "Running"}, {"Retry-After": "0"})
    client = RedfishClient(settings(server.url))
    try:
        accepted = await client.post("/x", {})
        with pytest.raises(AttachTimeout, match="still running"):
            await client.follow(accepted, action="bind", deadline=time.monotonic() + 0.5)
    finally:
        await client.aclose()


async def test_while_task_events_arrive_the_monitor_is_read_on_the_event(
    service: tuple[FakeService, ScriptedServer],
) -> None:
    """Retry-After 0 would mean a read after every answer; once the service is known to send task
    events, the follower reads only when the event comes (or every EVENTED_POLL_SECONDS)."""
    fake, server = service
    fake.routes[("POST", "/y")] = Reply(202, None, {"Location": "/tasks/5", "Retry-After": "0"})
    fake.routes[("GET", "/tasks/5")] = Reply(202, {"TaskState": "Running"}, {"Retry-After": "0"})
    client = RedfishClient(settings(server.url))
    try:
        accepted = await client.post("/y", {})
        follower = asyncio.create_task(client.follow(accepted, action="bind", deadline=time.monotonic() + 60))
        for _ in range(500):
            if server.count("GET", "/tasks/5") >= 3:
                break
            await asyncio.sleep(0.01)
        assert server.count("GET", "/tasks/5") >= 3  # no events known yet: Retry-After rules
        client.tasks.changed("/tasks/5", final=False)  # TaskProgressChanged for the followed task
        assert client.tasks.evented
        reads = -1
        while reads != server.count("GET", "/tasks/5"):  # a read in flight ends, then it waits
            reads = server.count("GET", "/tasks/5")
            await asyncio.sleep(0.3)
        await asyncio.sleep(1.0)
        assert server.count("GET", "/tasks/5") == reads
        fake.routes[("GET", "/tasks/5")] = Reply(200, {"Id": "done"})
        client.tasks.changed("/tasks/5")  # TaskCompletedOK
        done = await asyncio.wait_for(follower, 4)
        assert done.status == 200 and done.body["Id"] == "done"
        assert server.count("GET", "/tasks/5") == reads + 1
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def test_ca() -> trustme.CA:
    return trustme.CA()


def tls_server(ca: trustme.CA) -> ScriptedServer:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(context)
    return ScriptedServer(lambda request: Reply(200, ROOT), ssl_context=context)


async def test_tls_is_verified_by_default(
    test_ca: trustme.CA, tmp_path: Path, captured_logs: io.StringIO
) -> None:
    ca_file = tmp_path / "ca.pem"
    test_ca.cert_pem.write_to_path(str(ca_file))
    with tls_server(test_ca) as server:
        unverified = RedfishClient(RedfishSettings(base_url=server.url, auth="none", get_attempts=1))
        trusted = RedfishClient(RedfishSettings(base_url=server.url, auth="none", ca_file=str(ca_file)))
        insecure = RedfishClient(RedfishSettings(base_url=server.url, auth="none", insecure=True))
        try:
            with pytest.raises(FabricUnavailable, match="TLS handshake failed"):
                await unverified.get("/redfish/v1/")
            assert (await trusted.get("/redfish/v1/")).status == 200
            assert (await insecure.get("/redfish/v1/")).status == 200
        finally:
            for client in (unverified, trusted, insecure):
                await client.aclose()
    assert "TLS verification of the Redfish service is OFF" in captured_logs.getvalue()


def test_settings_refuse_credentials_in_the_url() -> None:
    with pytest.raises(ValueError, match="credentials file"):
        RedfishSettings(base_url="https://admin:pw@fabric.example:443")
    assert (
        RedfishSettings(base_url="https://fabric.example:8443/redfish/v1/").base_url
        == "https://fabric.example:8443"
    )


@pytest.mark.parametrize(
    ("uri", "kind"),
    [
        ("/redfish/v1/", "ServiceRoot"),
        ("/redfish/v1/Systems", "Systems"),
        ("/redfish/v1/Systems/kind-worker", "Systems"),
        ("/redfish/v1/Chassis/sw0/NetworkAdapters/nic0", "NetworkAdapters"),
        ("/redfish/v1/Chassis/sw0/PCIeDevices/gpu0/PCIeFunctions/0", "PCIeFunctions"),
        ("https://bmc:8443/redfish/v1/Fabrics/PCIe/Zones/3?$expand=.", "Zones"),
        ("/redfish/v1/Fabrics/PCIe/Zones/3/Actions/Zone.AddEndpoint", "Zone.AddEndpoint"),
        ("/redfish/v1/CompositionService", "CompositionService"),
        ("/redfish/v1/CompositionService/ResourceBlocks", "ResourceBlocks"),
        ("/redfish/v1/CompositionService/ResourceBlocks/gpu0", "ResourceBlocks"),
        ("/redfish/v1/TaskService/Tasks/17", "Tasks"),
        ("/redfish/v1/SessionService/Sessions/abc", "Sessions"),
        ("/redfish/v1/Oem/FabricDRA/Bindings", "Bindings"),
        ("/redfish/v1/Oem/FabricDRA", "Oem"),
    ],
)
def test_request_metric_labels_never_carry_a_member_id(uri: str, kind: str) -> None:
    assert resource_kind(uri) == kind
