"""The HTTP side of DSP0266 on a running emulator: authentication, ETags and preconditions,
methods and ``Allow``, error bodies, query options, OData documents, tasks."""

from __future__ import annotations

import stat
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.fabric.test_wild_services import topology_with
from tests.support.emulator import (
    BLOCKS,
    ENDPOINTS,
    ZONES,
    RunningEmulator,
    block_action,
    run_emulator,
    zone_add,
    zone_remove,
)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    with run_emulator(tmp_path_factory.mktemp("http")) as running:
        yield running


@pytest.fixture
def client(emu: RunningEmulator) -> httpx.Client:
    return emu.client()


def _message_id(response: httpx.Response) -> str:
    body = response.json()
    info = body["error"]["@Message.ExtendedInfo"]
    assert body["error"]["code"] == info[0]["MessageId"]
    return str(info[0]["MessageId"])


# --- authentication -----------------------------------------------------------------------------


def test_credentials_are_generated_once_and_private(emu: RunningEmulator) -> None:
    path = emu.state_dir / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert emu.password and emu.password not in emu.log(), "the password must never be logged"


def test_everything_but_the_entry_points_needs_authentication(emu: RunningEmulator) -> None:
    anonymous = httpx.Client(base_url=emu.url)
    for open_uri in ("/redfish", "/redfish/v1/", "/redfish/v1", "/redfish/v1/odata", "/redfish/v1/$metadata"):
        assert anonymous.get(open_uri).status_code == 200, open_uri
    denied = anonymous.get("/redfish/v1/Systems")
    assert denied.status_code == 401
    assert denied.headers["WWW-Authenticate"].startswith("Basic")
    assert _message_id(denied) == "Base.1.22.NoValidSession"
    assert anonymous.get("/redfish/v1/Systems", headers={"X-Auth-Token": "forged"}).status_code == 401
    assert anonymous.get("/redfish/v1/Systems", auth=(emu.username, "wrong")).status_code == 401
    assert anonymous.get("/redfish/v1/Oem/FabricDRA/Bindings").status_code == 401
    uri, body = zone_add("kind-worker", "gpu0")
    assert anonymous.post(uri, json=body).status_code == 401
    assert emu.bound_hosts() == {}


def test_session_token_authenticates_until_deleted(emu: RunningEmulator) -> None:
    anonymous = httpx.Client(base_url=emu.url)
    login = anonymous.post(
        "/redfish/v1/SessionService/Sessions", json={"UserName": emu.username, "Password": emu.password}
    )
    assert login.status_code == 201
    token, location = login.headers["X-Auth-Token"], login.headers["Location"]
    assert login.json()["@odata.id"] == location
    assert "Password" not in login.json()
    headers = {"X-Auth-Token": token}
    assert anonymous.get("/redfish/v1/Systems", headers=headers).status_code == 200
    assert anonymous.delete(location, headers=headers).status_code == 204
    assert anonymous.get("/redfish/v1/Systems", headers=headers).status_code == 401
    bad = anonymous.post(
        "/redfish/v1/SessionService/Sessions", json={"UserName": emu.username, "Password": "x"}
    )
    assert bad.status_code == 401


# --- resources, ETags, preconditions -------------------------------------------------------------


def test_every_resource_has_an_etag(client: httpx.Client) -> None:
    for uri in (
        "/redfish/v1/",
        "/redfish/v1/Systems",
        "/redfish/v1/Systems/kind-worker",
        f"{ENDPOINTS}/gpu0",
    ):
        response = client.get(uri)
        assert response.status_code == 200
        etag = response.headers["ETag"]
        assert etag.startswith('W/"')
        assert response.json()["@odata.etag"] == etag
        assert "GET" in response.headers["Allow"]
        assert response.headers["OData-Version"] == "4.0"
        assert response.headers["Content-Type"].startswith("application/json")
        assert client.get(uri, headers={"If-None-Match": etag}).status_code == 304
        # RFC 9110 §13.1.2: a list, weak comparison (the tag without W/ matches), "*" any
        unchanged = client.get(uri, headers={"If-None-Match": f'"other", {etag[2:]}'})
        assert unchanged.status_code == 304 and unchanged.headers["ETag"] == etag and not unchanged.content
        assert client.get(uri, headers={"If-None-Match": "*"}).status_code == 304
        assert client.get(uri, headers={"If-None-Match": '"other"'}).status_code == 200


def test_etag_changes_only_with_the_resource(client: httpx.Client) -> None:
    zone_before = client.get(f"{ZONES}/kind-worker2").headers["ETag"]
    other_before = client.get(f"{ZONES}/kind-worker3").headers["ETag"]
    uri, body = zone_add("kind-worker2", "gpu2")
    assert client.post(uri, json=body).status_code == 204
    assert client.get(f"{ZONES}/kind-worker2").headers["ETag"] != zone_before
    assert client.get(f"{ZONES}/kind-worker3").headers["ETag"] == other_before
    uri, body = zone_remove("kind-worker2", "gpu2")
    assert client.post(uri, json=body).status_code == 204
    assert client.get(f"{ZONES}/kind-worker2").headers["ETag"] == zone_before


def test_if_match_and_action_etags(client: httpx.Client, emu: RunningEmulator) -> None:
    zone = client.post(
        ZONES,
        json={
            "Links": {
                "Endpoints": [{"@odata.id": f"{ENDPOINTS}/kind-worker4"}, {"@odata.id": f"{ENDPOINTS}/gpu3"}]
            }
        },
    )
    assert zone.status_code == 201
    location = zone.headers["Location"]
    etag = client.get(location).headers["ETag"]
    stale = client.delete(location, headers={"If-Match": 'W/"0000000000000000"'})
    assert stale.status_code == 412
    assert _message_id(stale) == "Base.1.22.PreconditionFailed"
    assert emu.bound_hosts().get("gpu3") == "kind-worker4"
    assert client.delete(location, headers={"If-Match": etag}).status_code == 204
    assert "gpu3" not in emu.bound_hosts()

    # action ETag parameters: a mismatch is 428 (Zone v1_5 / ComputerSystem v1_16 CSDL)
    uri, body = zone_add("kind-worker", "nic0")
    stale_zone = client.post(uri, json={**body, "ZoneETag": 'W/"0000000000000000"'})
    assert stale_zone.status_code == 428
    assert _message_id(stale_zone) == "Base.1.22.PreconditionFailed"
    endpoint_etag = client.get(f"{ENDPOINTS}/nic0").headers["ETag"]
    zone_etag = client.get(f"{ZONES}/kind-worker").headers["ETag"]
    fresh = client.post(uri, json={**body, "ZoneETag": zone_etag, "EndpointETag": endpoint_etag})
    assert fresh.status_code == 204
    uri, body = block_action("kind-worker", "nic0", "RemoveResourceBlock")
    stale_block = client.post(uri, json={**body, "ResourceBlockETag": 'W/"1"'})
    assert stale_block.status_code == 428
    block_etag = client.get(f"{BLOCKS}/nic0").headers["ETag"]
    assert client.post(uri, json={**body, "ResourceBlockETag": block_etag}).status_code == 204


# --- methods, errors, queries ----------------------------------------------------------------------


def test_wrong_methods_get_405_with_allow(client: httpx.Client) -> None:
    cases = {
        ("PUT", "/redfish/v1/Systems/kind-worker"): "GET, HEAD",
        ("DELETE", f"{ZONES}/kind-worker"): "GET, HEAD",
        ("PATCH", f"{ENDPOINTS}/gpu0"): "GET, HEAD",
        ("GET", f"{ZONES}/kind-worker/Actions/Zone.AddEndpoint"): "POST",
        ("POST", "/redfish/v1/Systems"): "GET, HEAD",
    }
    for (method, uri), allow in cases.items():
        response = client.request(method, uri, json={})
        assert response.status_code == 405, (method, uri)
        assert response.headers["Allow"] == allow, (method, uri)
        assert _message_id(response) == "Base.1.22.OperationNotAllowed"
    assert "POST" in client.get(ZONES).headers["Allow"]


def test_bad_requests_name_the_property(client: httpx.Client) -> None:
    uri, _ = zone_add("kind-worker", "gpu0")
    malformed = client.post(uri, content=b"{not json", headers={"Content-Type": "application/json"})
    assert malformed.status_code == 400 and _message_id(malformed) == "Base.1.22.MalformedJSON"
    missing = client.post(uri, json={})
    assert missing.status_code == 400 and _message_id(missing) == "Base.1.22.ActionParameterMissing"
    assert missing.json()["error"]["@Message.ExtendedInfo"][0]["MessageArgs"] == [
        "Zone.AddEndpoint",
        "Endpoint",
    ]
    unknown = client.post(uri, json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/gpu0"}, "Force": True})
    assert unknown.status_code == 400 and _message_id(unknown) == "Base.1.22.ActionParameterUnknown"
    nowhere = client.post(uri, json={"Endpoint": {"@odata.id": f"{ENDPOINTS}/gpu99"}})
    assert nowhere.status_code == 400 and _message_id(nowhere) == "Base.1.22.ResourceNotFound"
    bad_zone = client.post(
        ZONES, json={"Links": {"Endpoints": [{"@odata.id": f"{ENDPOINTS}/gpu0"}]}, "Color": "red"}
    )
    assert bad_zone.status_code == 400
    ids = {m["MessageId"] for m in bad_zone.json()["error"]["@Message.ExtendedInfo"]}
    assert ids == {"Base.1.22.PropertyUnknown"}
    no_host = client.post(ZONES, json={"Links": {"Endpoints": [{"@odata.id": f"{ENDPOINTS}/gpu0"}]}})
    assert no_host.status_code == 400 and "exactly one host" in no_host.json()["error"]["message"]
    missing_resource = client.get("/redfish/v1/Systems/kind-worker99")
    assert (
        missing_resource.status_code == 404 and _message_id(missing_resource) == "Base.1.22.ResourceNotFound"
    )
    # $expand and $select are served (test_expand_inlines_a_collections_members,
    # test_select_keeps_the_named_properties_and_the_annotations); other query options are not
    assert client.get("/redfish/v1/Systems?$filter=Id eq 'kind-worker'").status_code == 501


def test_odata_documents(client: httpx.Client, redfish_dir: Path) -> None:
    service = client.get("/redfish/v1/odata").json()
    urls = {v["url"] for v in service["value"]}
    assert {"/redfish/v1/", "/redfish/v1/Fabrics", "/redfish/v1/CompositionService"} <= urls
    metadata = client.get("/redfish/v1/$metadata")
    assert metadata.headers["Content-Type"].startswith("application/xml")
    root = ET.fromstring(metadata.content)
    edmx = "{http://docs.oasis-open.org/odata/ns/edmx}"
    references = root.findall(f"{edmx}Reference")
    assert len(references) > 30
    for reference in references:
        uri = reference.attrib["Uri"]
        schema_file = uri.rsplit("/", 1)[-1]
        if uri.startswith("/redfish/v1/"):  # the service's own schema: it serves it, open to all
            served = httpx.get(f"{client.base_url}{uri}")
            assert served.status_code == 200 and served.headers["Content-Type"].startswith("application/xml")
            text = served.text
        else:
            text = (redfish_dir / "csdl" / schema_file).read_text()
        for include in reference.findall(f"{edmx}Include"):
            assert f'Namespace="{include.attrib["Namespace"]}"' in text, (schema_file, include.attrib)
    assert client.get("/redfish").json() == {"v1": "/redfish/v1/"}


def test_session_timeout_is_patchable_within_range(client: httpx.Client) -> None:
    ok = client.patch("/redfish/v1/SessionService", json={"SessionTimeout": 600})
    assert ok.status_code == 200 and ok.json()["SessionTimeout"] == 600
    low = client.patch("/redfish/v1/SessionService", json={"SessionTimeout": 5})
    assert low.status_code == 400 and _message_id(low) == "Base.1.22.PropertyValueOutOfRange"
    unknown = client.patch("/redfish/v1/SessionService", json={"ServiceEnabled": False})
    assert unknown.status_code == 400


# --- tasks -----------------------------------------------------------------------------------------


def test_prefer_respond_async_runs_a_task(client: httpx.Client, emu: RunningEmulator) -> None:
    uri, body = block_action("kind-worker3", "gpu5")
    accepted = client.post(uri, json=body, headers={"Prefer": "respond-async"})
    assert accepted.status_code == 202
    monitor = accepted.headers["Location"]
    assert monitor.startswith("/redfish/v1/TaskService/TaskMonitors/")
    assert accepted.json()["TaskMonitor"] == monitor
    final = client.get(monitor)
    while final.status_code == 202:
        final = client.get(monitor)
    assert final.status_code == 204
    task = client.get(accepted.json()["@odata.id"]).json()
    assert task["TaskState"] == "Completed" and task["PercentComplete"] == 100
    assert task["Payload"]["TargetUri"] == uri and task["Payload"]["HttpOperation"] == "POST"
    assert {m["MessageId"] for m in task["Messages"]} >= {
        "TaskEvent.1.0.TaskStarted",
        "TaskEvent.1.0.TaskCompletedOK",
    }
    assert emu.bound_hosts()["gpu5"] == "kind-worker3"
    assert client.delete(monitor).status_code == 409, "a finished task cannot be cancelled"
    uri, body = block_action("kind-worker3", "gpu5", "RemoveResourceBlock")
    assert client.post(uri, json=body).status_code == 204


def test_cancelling_a_hung_task_releases_the_device(client: httpx.Client, emu: RunningEmulator) -> None:
    emu.inject({"Kind": "HangTasks", "Target": "fpga0"})
    uri, body = block_action("kind-worker2", "fpga0")
    accepted = client.post(uri, json=body)
    assert accepted.status_code == 202
    monitor = accepted.headers["Location"]
    assert client.get(monitor).status_code == 202
    assert client.post(*block_action("kind-worker4", "fpga0")[:1], json=body).status_code == 409
    assert client.delete(monitor).status_code == 204
    cancelled = client.get(monitor)
    assert cancelled.status_code == 409
    assert _message_id(cancelled) == "TaskEvent.1.0.TaskCancelled"
    assert client.get(accepted.json()["@odata.id"]).json()["TaskState"] == "Cancelled"
    assert emu.bindings()["InFlight"] == [] and "fpga0" not in emu.bound_hosts()
    emu.reset_faults()


def test_unsupported_odata_version_is_412(client: httpx.Client) -> None:
    assert client.get("/redfish/v1/Systems", headers={"OData-Version": "4.0"}).status_code == 200
    refused = client.get("/redfish/v1/Systems", headers={"OData-Version": "4.1"})
    assert refused.status_code == 412 and _message_id(refused) == "Base.1.22.PreconditionFailed"


def test_post_to_the_sessions_members_uri_logs_in(emu: RunningEmulator) -> None:
    with httpx.Client(base_url=emu.url, verify=False) as anonymous:
        body = {"UserName": emu.username, "Password": emu.password}
        created = anonymous.post("/redfish/v1/SessionService/Sessions/Members", json=body)
        assert created.status_code == 201 and created.headers["X-Auth-Token"]
        token = {"X-Auth-Token": created.headers["X-Auth-Token"]}
        assert anonymous.get("/redfish/v1/Systems", headers=token).status_code == 200
        assert anonymous.delete(created.headers["Location"], headers=token).status_code in (200, 204)


def test_expand_inlines_a_collections_members(client: httpx.Client) -> None:
    """DSP0266 §7.3 "$expand": ``.`` inlines hyperlinks outside Links (a collection's Members),
    ``~`` only those inside Links; one level unless ``$levels`` says more, up to ``MaxLevels``
    as the service root advertises."""
    features = client.get("/redfish/v1/").json()["ProtocolFeaturesSupported"]["ExpandQuery"]
    assert features == {"ExpandAll": True, "Levels": True, "Links": True, "NoLinks": True, "MaxLevels": 3}
    zones = "/redfish/v1/Fabrics/PCIe/Zones"
    plain = client.get(zones).json()
    expanded = client.get(zones, params={"$expand": ".($levels=1)"})
    assert expanded.status_code == 200
    members = expanded.json()["Members"]
    assert [m["@odata.id"] for m in members] == [m["@odata.id"] for m in plain["Members"]]
    for member in members:
        alone = client.get(member["@odata.id"]).json()
        assert member == alone  # the member as its own GET gives it, @odata.etag included
        assert all(len(e) == 1 for e in member["Links"]["Endpoints"])  # one level only
    assert expanded.headers["ETag"] == expanded.json()["@odata.etag"] != plain["@odata.etag"]
    # "~": Links only; the collection has none, so its members stay references
    assert client.get(zones, params={"$expand": "~"}).json()["Members"] == plain["Members"]
    zone = members[0]["@odata.id"]
    linked = client.get(zone, params={"$expand": "~"}).json()["Links"]["Endpoints"]
    assert linked and all("Id" in e for e in linked)
    too_deep = client.get(zones, params={"$expand": ".($levels=4)"})
    assert too_deep.status_code == 400 and _message_id(too_deep).endswith("QueryParameterOutOfRange")
    # three levels: a switch's PCIe devices, each one's PCIeFunctions collection, its members
    devices = "/redfish/v1/Chassis/switch0/PCIeDevices"
    deep = client.get(devices, params={"$expand": ".($levels=3)"})
    assert deep.status_code == 200 and deep.headers["ETag"] == deep.json()["@odata.etag"]
    device = deep.json()["Members"][0]
    functions = device["PCIeFunctions"]["Members"]
    assert functions and functions[0] == client.get(functions[0]["@odata.id"]).json()
    assert all(len(link) == 1 for link in functions[0]["Links"].values() if isinstance(link, dict))
    again = client.get(
        devices, params={"$expand": ".($levels=3)"}, headers={"If-None-Match": deep.headers["ETag"]}
    )
    assert again.status_code == 304
    # a query a read takes, sent with a change: Base.QueryNotSupportedOnOperation
    uri, body = zone_add("kind-worker2", "gpu3")
    refused = client.post(uri, json=body, params={"$expand": "."})
    assert refused.status_code == 400 and _message_id(refused).endswith("QueryNotSupportedOnOperation")
    malformed = client.get(zones, params={"$expand": "Members"})
    assert malformed.status_code == 400 and _message_id(malformed).endswith("QueryParameterValueFormatError")


def test_select_keeps_the_named_properties_and_the_annotations(client: httpx.Client) -> None:
    """DSP0266 "$select", evaluated after "$expand": on a collection it applies to each member
    inlined, which keeps its ``@odata`` annotations — each zone with its own ETag, not its
    endpoints."""
    assert client.get("/redfish/v1/").json()["ProtocolFeaturesSupported"]["SelectQuery"] is True
    zones = "/redfish/v1/Fabrics/PCIe/Zones"
    listing = client.get(zones, params={"$expand": ".($levels=1)", "$select": "Id"})
    assert listing.status_code == 200
    body = listing.json()
    assert body["Members@odata.count"] == len(body["Members"]) > 0
    for member in body["Members"]:
        alone = client.get(member["@odata.id"])
        assert member == {
            "@odata.id": member["@odata.id"],
            "@odata.type": alone.json()["@odata.type"],
            "@odata.etag": alone.headers["ETag"],
            "Id": alone.json()["Id"],
        }
    assert listing.headers["ETag"] == body["@odata.etag"]
    zone = f"{zones}/kind-worker"
    picked = client.get(zone, params={"$select": "Name,Links/Endpoints"}).json()
    whole = client.get(zone).json()
    assert set(picked) == {"@odata.id", "@odata.type", "@odata.etag", "Name", "Links"}
    assert picked["Links"] == {"Endpoints": whole["Links"]["Endpoints"]}
    # without $expand a collection's members stay references
    assert (
        client.get(zones, params={"$select": "Id"}).json()["Members"] == client.get(zones).json()["Members"]
    )
    malformed = client.get(zone, params={"$select": "Name;Id"})
    assert malformed.status_code == 400 and _message_id(malformed).endswith("QueryParameterValueFormatError")


def test_a_zones_etag_follows_its_own_endpoints_only(client: httpx.Client) -> None:
    """A zone's rendering is kept while its targets are the same (the emulator does not render
    every zone again when one changes): its ETag changes with its own members, not another's."""
    zones = "/redfish/v1/Fabrics/PCIe/Zones"
    mine, other = f"{zones}/kind-worker2", f"{zones}/kind-worker3"
    before = {u: client.get(u).headers["ETag"] for u in (mine, other)}
    uri, body = zone_add("kind-worker3", "gpu5")
    assert client.post(uri, json=body).status_code == 204
    try:
        assert client.get(mine).headers["ETag"] == before[mine]
        changed = client.get(other)
        assert changed.headers["ETag"] != before[other]
        assert {"@odata.id": f"{ENDPOINTS}/gpu5"} in changed.json()["Links"]["Endpoints"]
    finally:
        uri, body = zone_remove("kind-worker3", "gpu5")
        assert client.post(uri, json=body).status_code == 204
    assert client.get(other).headers["ETag"] == before[other]


def test_a_service_without_etags(tmp_path: Path) -> None:
    """``behaviour.etags: omitted``: no ETag header, no ``@odata.etag``, every read 200 in full
    (If-None-Match never matches), If-Match and action ETag parameters not compared."""
    topology = topology_with(tmp_path, etags="omitted", expand="unsupported")
    with run_emulator(tmp_path, topology=topology) as emu, emu.client() as client:
        root = client.get("/redfish/v1/")
        assert "ETag" not in root.headers and "@odata.etag" not in root.json()
        assert not any(root.json()["ProtocolFeaturesSupported"]["ExpandQuery"].values())
        zone = f"{ZONES}/kind-worker2"
        read = client.get(zone)
        assert "ETag" not in read.headers and "@odata.etag" not in read.json()
        assert client.get(zone, headers={"If-None-Match": "*"}).status_code == 200
        uri, body = zone_add("kind-worker2", "gpu2")
        stale = {**body, "ZoneETag": 'W/"0000000000000000"'}
        assert client.post(uri, json=stale, headers={"If-Match": 'W/"stale"'}).status_code == 204
        assert client.get(zone).json()["Links"]["Endpoints"]
        unsupported = client.get(zone, params={"$expand": "."})
        assert unsupported.status_code == 501 and _message_id(unsupported).endswith(
            "QueryParameterUnsupported"
        )
