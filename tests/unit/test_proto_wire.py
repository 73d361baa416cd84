"""The kubelet talks to the plugin by full gRPC method name and protobuf field number.

The expected values below were taken from Kubernetes' own api.proto files
(staging/src/k8s.io/kubelet/pkg/apis/{pluginregistration/v1,dra/v1,dra/v1beta1,dra-health/v1alpha1});
a renamed package or a renumbered field would silently break the wire, so each one is pinned.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor import FieldDescriptor

from dra_driver.proto import generate
from dra_driver.proto.dra_health_v1alpha1 import api_pb2 as health_pb2
from dra_driver.proto.dra_health_v1alpha1 import api_pb2_grpc as health_grpc
from dra_driver.proto.dra_v1 import api_pb2 as dra_v1_pb2
from dra_driver.proto.dra_v1 import api_pb2_grpc as dra_v1_grpc
from dra_driver.proto.dra_v1beta1 import api_pb2 as dra_v1beta1_pb2
from dra_driver.proto.dra_v1beta1 import api_pb2_grpc as dra_v1beta1_grpc
from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc

REPEATED = "repeated"
SINGULAR = "singular"

# message -> {field: (number, proto type, label)}
REGISTRATION_FIELDS = {
    "PluginInfo": {
        "type": (1, "string", SINGULAR),
        "name": (2, "string", SINGULAR),
        "endpoint": (3, "string", SINGULAR),
        "supported_versions": (4, "string", REPEATED),
    },
    "RegistrationStatus": {"plugin_registered": (1, "bool", SINGULAR), "error": (2, "string", SINGULAR)},
    "RegistrationStatusResponse": {},
    "InfoRequest": {},
}

DRA_FIELDS = {
    "NodePrepareResourcesRequest": {"claims": (1, "message", REPEATED)},
    "NodePrepareResourcesResponse": {"claims": (1, "message", REPEATED)},  # map<string, ...>
    "NodePrepareResourceResponse": {"devices": (1, "message", REPEATED), "error": (2, "string", SINGULAR)},
    "Device": {
        "request_names": (1, "string", REPEATED),
        "pool_name": (2, "string", SINGULAR),
        "device_name": (3, "string", SINGULAR),
        "cdi_device_ids": (4, "string", REPEATED),
    },
    "NodeUnprepareResourcesRequest": {"claims": (1, "message", REPEATED)},
    "NodeUnprepareResourcesResponse": {"claims": (1, "message", REPEATED)},
    "NodeUnprepareResourceResponse": {"error": (1, "string", SINGULAR)},
    "Claim": {
        "namespace": (1, "string", SINGULAR),
        "uid": (2, "string", SINGULAR),
        "name": (3, "string", SINGULAR),
    },
}

HEALTH_FIELDS = {
    "NodeWatchResourcesRequest": {},
    "DeviceIdentifier": {"pool_name": (1, "string", SINGULAR), "device_name": (2, "string", SINGULAR)},
    "DeviceHealth": {
        "device": (1, "message", SINGULAR),
        "health": (2, "enum", SINGULAR),
        "last_updated_time": (3, "int64", SINGULAR),
    },
    "NodeWatchResourcesResponse": {"devices": (1, "message", REPEATED)},
}

_TYPE_NAMES = {
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_MESSAGE: "message",
    FieldDescriptor.TYPE_ENUM: "enum",
}

PACKAGES = [
    (reg_pb2, "pluginregistration", REGISTRATION_FIELDS),
    (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1", DRA_FIELDS),
    (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1", DRA_FIELDS),
    (health_pb2, "v1alpha1", HEALTH_FIELDS),
]


@pytest.mark.parametrize(
    ("module", "package", "expected"), PACKAGES, ids=lambda v: getattr(v, "__name__", "")
)
def test_message_fields_match_kubernetes(
    module: ModuleType, package: str, expected: dict[str, dict[str, tuple[int, str, str]]]
) -> None:
    assert module.DESCRIPTOR.package == package
    assert set(module.DESCRIPTOR.message_types_by_name) == set(expected)
    for message_name, fields in expected.items():
        message = module.DESCRIPTOR.message_types_by_name[message_name]
        actual = {
            f.name: (
                f.number,
                _TYPE_NAMES[f.type],
                REPEATED if f.is_repeated else SINGULAR,
            )
            for f in message.fields
        }
        assert actual == fields, f"{package}.{message_name}"


@pytest.mark.parametrize("module", [dra_v1_pb2, dra_v1beta1_pb2], ids=["v1", "v1beta1"])
def test_claims_maps_are_keyed_by_claim_uid_string(module: ModuleType) -> None:
    for response, value_type in [
        ("NodePrepareResourcesResponse", "NodePrepareResourceResponse"),
        ("NodeUnprepareResourcesResponse", "NodeUnprepareResourceResponse"),
    ]:
        field = module.DESCRIPTOR.message_types_by_name[response].fields_by_name["claims"]
        entry = field.message_type
        assert entry.GetOptions().map_entry
        assert entry.fields_by_name["key"].type == FieldDescriptor.TYPE_STRING
        assert entry.fields_by_name["value"].message_type.name == value_type


def test_health_status_enum_values() -> None:
    enum = health_pb2.DESCRIPTOR.enum_types_by_name["HealthStatus"]
    assert {v.name: v.number for v in enum.values} == {"UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}


def _full_method_names(module: ModuleType) -> set[str]:
    names = set()
    for service in module.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            names.add(f"/{service.full_name}/{method.name}")
    return names


def test_full_method_names() -> None:
    assert _full_method_names(reg_pb2) == {
        "/pluginregistration.Registration/GetInfo",
        "/pluginregistration.Registration/NotifyRegistrationStatus",
    }
    for module, version in [(dra_v1_pb2, "v1"), (dra_v1beta1_pb2, "v1beta1")]:
        assert _full_method_names(module) == {
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodePrepareResources",
            f"/k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin/NodeUnprepareResources",
        }
    assert _full_method_names(health_pb2) == {"/v1alpha1.DRAResourceHealth/NodeWatchResources"}
    stream = health_pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].methods_by_name["NodeWatchResources"]
    assert stream.server_streaming and not stream.client_streaming


def test_generated_grpc_stubs_use_the_same_method_paths() -> None:
    """The *_pb2_grpc modules hard-code the paths they dial; check them against the descriptors."""

    class Recorder:
        def __init__(self) -> None:
            self.paths: set[str] = set()

        def unary_unary(self, path: str, **_: object) -> None:
            self.paths.add(path)

        def unary_stream(self, path: str, **_: object) -> None:
            self.paths.add(path)

    for grpc_module, pb2, stub_name in [
        (reg_grpc, reg_pb2, "RegistrationStub"),
        (dra_v1_grpc, dra_v1_pb2, "DRAPluginStub"),
        (dra_v1beta1_grpc, dra_v1beta1_pb2, "DRAPluginStub"),
        (health_grpc, health_pb2, "DRAResourceHealthStub"),
    ]:
        channel = Recorder()
        getattr(grpc_module, stub_name)(channel)
        assert channel.paths == _full_method_names(pb2)


def test_wire_bytes_of_a_prepare_response() -> None:
    """Encode a response by hand from field numbers and compare with the generated encoder."""
    response = dra_v1_pb2.NodePrepareResourcesResponse()
    entry = response.claims["uid-1"]
    entry.devices.add(request_names=["r"], pool_name="p", device_name="d", cdi_device_ids=["k/c=x"])

    def ld(field: int, payload: bytes) -> bytes:  # length-delimited field
        return bytes([(field << 3) | 2, len(payload)]) + payload

    device = ld(1, b"r") + ld(2, b"p") + ld(3, b"d") + ld(4, b"k/c=x")
    value = ld(1, device)
    map_entry = ld(1, b"uid-1") + ld(2, value)
    assert response.SerializeToString(deterministic=True) == ld(1, map_entry)


def test_committed_bindings_are_not_stale() -> None:
    """Recompile every .proto and compare descriptors with the committed *_pb2 modules."""
    with tempfile.TemporaryDirectory() as tmp:
        written = generate.generate(Path(tmp))
        assert written, "protoc produced nothing"
        fresh: dict[str, bytes] = {}
        for written_path in written:
            if written_path.name == "api_pb2.py":
                source = written_path.read_text()
                start = source.index("AddSerializedFile(") + len("AddSerializedFile(")
                end = source.index(")\n", start)
                fresh[str(written_path.relative_to(tmp))] = eval(source[start:end])  # a bytes literal
    committed = {
        "dra_driver/proto/pluginregistration_v1/api_pb2.py": reg_pb2,
        "dra_driver/proto/dra_v1/api_pb2.py": dra_v1_pb2,
        "dra_driver/proto/dra_v1beta1/api_pb2.py": dra_v1beta1_pb2,
        "dra_driver/proto/dra_health_v1alpha1/api_pb2.py": health_pb2,
    }
    assert set(fresh) == set(committed), "a .proto was added or removed without regenerating"
    for path, module in committed.items():
        want = descriptor_pb2.FileDescriptorProto.FromString(fresh[path])
        have = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        assert have == want, f"{path} is stale: run 'python -m dra_driver.proto.generate'"
