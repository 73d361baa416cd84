"""Small pure parts of the manager: names, MessageId mapping, SSE parsing, node mapping, config."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from fabric.api.auth import Identity, Role, StaticTokens, load_static_tokens
from fabric.redfish.error_mapping import PreconditionFailed, error_for_response, error_for_task, message_key
from fabric.redfish.reader import Event, EventReader
from fabric.service.config import load_credentials
from fabric.state.model import DeviceRecord, DiscoveredAttributes, HostRecord
from fabric.state.names import assign_names, dns_label, pool_name
from fabric.state.nodes import NodeResolver, load_node_map
from manager_api.devices import BindingStyle, DeviceType
from manager_api.errors import (
    AttachTimeout,
    BindFailed,
    DeviceBusy,
    DeviceNotFound,
    FabricUnavailable,
    PermissionDenied,
)


def record(resource_id: str, fabric: str = "PCIe") -> DeviceRecord:
    return DeviceRecord(
        key=f"/redfish/v1/Fabrics/{fabric}/Endpoints/{resource_id}",
        resource_id=resource_id,
        fabric=fabric,
        style=BindingStyle.ZONE,
        attributes=DiscoveredAttributes(type=DeviceType.OTHER),
    )


def test_dns_labels() -> None:
    assert dns_label("GPU_0") == "gpu-0"
    assert dns_label("--Weird..Id--") == "weird-id"
    long = dns_label("x" * 100, "/redfish/v1/a")
    assert len(long) == 63 and long.startswith("x" * 54 + "-")
    assert dns_label("x" * 100, "/redfish/v1/a") != dns_label("x" * 100, "/redfish/v1/b")
    assert dns_label("___").startswith("device-")
    assert pool_name("fabric", "PCIe") == "fabric-pcie"


def test_names_are_unique_and_stable() -> None:
    named = {d.key: d.name for d in assign_names([record("gpu0"), record("T1", "CXL"), record("t1", "PCIe")])}
    assert named["/redfish/v1/Fabrics/PCIe/Endpoints/gpu0"] == "gpu0"
    # the same Id on two fabrics: prefixed with the fabric
    assert named["/redfish/v1/Fabrics/CXL/Endpoints/T1"] == "cxl-t1"
    assert named["/redfish/v1/Fabrics/PCIe/Endpoints/t1"] == "pcie-t1"
    again = {d.key: d.name for d in assign_names([record("t1", "PCIe"), record("T1", "CXL"), record("gpu0")])}
    assert again == named


def test_message_ids_map_once_whatever_the_registry_version() -> None:
    assert message_key("Base.1.22.1.ResourceInUse") == ("Base", "ResourceInUse")
    assert message_key("Base.1.8.ResourceInUse") == ("Base", "ResourceInUse")

    def body(mid: str) -> dict[str, object]:
        return {"error": {"code": mid, "@Message.ExtendedInfo": [{"MessageId": mid, "Message": "m"}]}}

    cases = {
        "Base.1.22.1.ResourceInUse": DeviceBusy,
        "Composition.1.1.3.ResourceBlockInUse": DeviceBusy,
        "Base.1.22.1.ResourceNotFound": DeviceNotFound,
        "Base.1.22.1.ServiceTemporarilyUnavailable": FabricUnavailable,
        "Base.1.22.1.OperationTimeout": AttachTimeout,
        "Base.1.22.1.PreconditionFailed": PreconditionFailed,
        "Base.1.22.1.InternalError": BindFailed,
    }
    for mid, cls in cases.items():
        err = error_for_response(500, body(mid), method="POST", uri="/x")
        assert type(err) is cls, mid
        assert err.message_id == mid
    # no MessageId: the status decides
    assert isinstance(error_for_response(409, {}, method="POST", uri="/x"), DeviceBusy)
    assert isinstance(error_for_response(503, {}, method="GET", uri="/x"), FabricUnavailable)
    assert isinstance(error_for_response(400, {}, method="POST", uri="/x"), BindFailed)
    task = {
        "TaskState": "Exception",
        "Messages": [{"MessageId": "Base.1.0.ResourceInUse", "Message": "busy"}],
    }
    assert isinstance(error_for_task(task, uri="/t", action="bind"), DeviceBusy)


def test_sse_parsing() -> None:
    lines = [": keep-alive", "id: 7", 'data: {"a":', "data: 1}", "", "event: x", "data: 2", "", "data: [", ""]
    reader = EventReader(None)
    events = [e for line in lines for e in reader.feed(f"{line}\n".encode())]
    # an event whose data is no JSON still moves the last event ID on, its payload is None
    assert events == [Event("7", {"a": 1}), Event("7", 2), Event("7", None)]


def test_nodes_map_by_file_uuid_then_name(tmp_path: Path) -> None:
    hosts = {
        "H1": HostRecord(id="H1", uri="/s/H1", uuid="aaaa-1"),
        "kind-worker": HostRecord(id="kind-worker", uri="/s/kind-worker", uuid="bbbb-2"),
        "Blade-3": HostRecord(id="Blade-3", uri="/s/Blade-3", host_name="node-c"),
    }
    # without API access, names are trusted
    assert NodeResolver().resolve(hosts) == {"H1": "h1", "kind-worker": "kind-worker", "Blade-3": "blade-3"}
    resolver = NodeResolver({"H1": "node-a"})
    resolver._nodes = {"node-b": "bbbb-2", "node-c": None, "kind-worker": "cccc"}
    # the explicit map wins, then the system UUID, then a name
    assert resolver.resolve(hosts) == {"H1": "node-a", "kind-worker": "node-b", "Blade-3": "node-c"}
    # two hosts on one node: neither is used
    twins = {**hosts, "H9": replace(hosts["kind-worker"], id="H9", uri="/s/H9")}
    assert resolver.resolve(twins) == {"H1": "node-a", "Blade-3": "node-c"}
    path = tmp_path / "map.yaml"
    path.write_text("hosts:\n  H1: Not_A_Node\n")
    with pytest.raises(ValueError, match=r"hosts\.H1: 'Not_A_Node' is not a valid node name"):
        load_node_map(path)


async def test_static_tokens_and_node_scope(tmp_path: Path) -> None:
    path = tmp_path / "tokens.yaml"
    path.write_text(
        "tokens:\n"
        "  - {token: plugin-a-0123456789abcdef, role: plugin, node: node-a}\n"
        "  - {token: operator-0123456789abcdef, role: operator}\n"
    )
    tokens = StaticTokens(load_static_tokens(path))
    plugin = await tokens.authenticate("plugin-a-0123456789abcdef")
    assert plugin == Identity(Role.PLUGIN, "plugin of node-a", "node-a")
    plugin.check_bind("node-a")
    with pytest.raises(PermissionDenied, match="only for it, not for node node-b"):
        plugin.check_bind("node-b")
    operator = await tokens.authenticate("operator-0123456789abcdef")
    assert operator is not None
    with pytest.raises(PermissionDenied, match="read access only"):
        operator.check_bind("node-a")
    assert await tokens.authenticate("nope") is None
    path.write_text("tokens:\n  - {token: short, role: plugin}\n")
    with pytest.raises(ValueError, match=r"tokens\.0\.token"):
        load_static_tokens(path)


def test_credentials_from_file_secret_dir_or_env(tmp_path: Path) -> None:
    file = tmp_path / "credentials.json"
    file.write_text('{"username": "admin", "password": "pw-123"}')
    loaded = load_credentials(file)
    assert loaded is not None and loaded.username == "admin"
    assert loaded.password.get_secret_value() == "pw-123" and "pw-123" not in repr(loaded)
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "username").write_text("fabric\n")
    (secret / "password").write_text("s3cret\n")
    assert load_credentials(secret).password.get_secret_value() == "s3cret"  # type: ignore[union-attr]
    env = {"FABRIC_DRA_REDFISH_USERNAME": "u", "FABRIC_DRA_REDFISH_PASSWORD": "p"}
    assert load_credentials(None, env).username == "u"  # type: ignore[union-attr]
    assert load_credentials(None, {}) is None
    file.write_text('{"username": "admin", "password": ')
    with pytest.raises(ValueError, match="not YAML/JSON") as caught:
        load_credentials(file)
    assert "admin" not in str(caught.value)
