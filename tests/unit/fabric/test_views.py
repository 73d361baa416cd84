"""The typed read views of Redfish payloads: what they read, and how they tolerate what real
services send (omitted properties, older schemas, values of the wrong shape)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric.backends.views import (
    Connection,
    Drive,
    Endpoint,
    PCIeFunction,
    Processor,
    ResourceBlock,
    ServiceRoot,
    Zone,
    view_of_kind,
)


def test_an_endpoint_reads_its_entities_and_links() -> None:
    endpoint = Endpoint.model_validate(
        {
            "@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/T3/",
            "@odata.type": "#Endpoint.v1_8_2.Endpoint",
            "Id": "T3",
            "ConnectedEntities": [
                {
                    "EntityType": "MemoryChunk",
                    "EntityRole": "Target",
                    "EntityLink": {"@odata.id": "/redfish/v1/Chassis/C/MemoryDomains/1/MemoryChunks/1"},
                    "EntityPciId": {"VendorId": "0x8086"},
                }
            ],
            "Links": {"ConnectedPorts": [{"@odata.id": "/redfish/v1/Fabrics/CXL/Switches/S/Ports/P1"}]},
            "Oem": {"Vendor": {"kept": True}},
        }
    )
    assert (endpoint.uri, endpoint.id, endpoint.kind) == (
        "/redfish/v1/Fabrics/CXL/Endpoints/T3",
        "T3",
        "Endpoint",
    )
    entity = (endpoint.connected_entities or [])[0]
    assert entity.entity_link == "/redfish/v1/Chassis/C/MemoryDomains/1/MemoryChunks/1"
    assert endpoint.entity_pci_id is not None and endpoint.entity_pci_id.vendor_id == "0x8086"
    assert endpoint.links.connected_ports == ("/redfish/v1/Fabrics/CXL/Switches/S/Ports/P1",)
    # Absent is not empty: an endpoint that does not list its zones sends a reader to the fabric's.
    assert endpoint.links.zones is None
    assert Endpoint.model_validate({"Links": {"Zones": []}}).links.zones == ()
    # what no view names is not kept (a 10,100-device fabric's views held more than its answers);
    # an endpoint is a slotted record (kept between passes: no field dict of its own)
    assert not hasattr(endpoint, "Oem") and not hasattr(endpoint, "__dict__")


@pytest.mark.parametrize(
    "junk", ["text", 7, None, True, [], [1, "two"], {"@odata.id": 5}, {"@odata.id": "no-slash"}]
)
def test_a_property_of_the_wrong_shape_reads_as_absent(junk: object) -> None:
    zone = Zone.model_validate(
        {"@odata.id": junk, "Links": junk, "Status": junk, "Actions": junk, "ZoneType": "ZoneOfEndpoints"}
    )
    assert zone.uri is None and zone.links.endpoints == () and zone.status.health is None
    assert zone.actions.target("Zone.AddEndpoint") is None and zone.zone_type == "ZoneOfEndpoints"
    endpoint = Endpoint.model_validate({"ConnectedEntities": [junk, {"EntityType": "Drive"}]})
    kinds = [e.entity_type for e in endpoint.connected_entities or []]
    # A member that is no object is left out; an object without the property is one without it.
    assert kinds == ([None, "Drive"] if isinstance(junk, dict) else ["Drive"])
    assert Endpoint.model_validate({"ConnectedEntities": junk}).connected_entities in (None, [])


def test_links_follow_the_rules_of_a_resource_identifier() -> None:
    connection = Connection.model_validate(
        {
            "MemoryChunkInfo": [{"MemoryChunk": {"@odata.id": "/c/1/"}}, {"MemoryChunk": "/c/2"}, 3],
            "Links": {"InitiatorEndpoints": [{"@odata.id": "/e/I1"}, {"@odata.id": "e/I2"}, "x"]},
        }
    )
    assert connection.chunks == ["/c/1"]
    assert connection.links.initiator_endpoints == ("/e/I1",)
    # A single link sent as an array counts by its first member.
    function = PCIeFunction.model_validate(
        {"Links": {"PCIeDevice": [{"@odata.id": "/d/1"}, {"@odata.id": "/d/2"}]}}
    )
    assert function.links.pcie_device == "/d/1"


def test_numbers_and_flags_must_be_json_numbers_and_booleans() -> None:
    drive = Drive.model_validate({"CapacityBytes": "1000", "Protocol": "NVMe"})
    assert drive.capacity_bytes is None and drive.protocol == "NVMe"
    root = ServiceRoot.model_validate({"ProtocolFeaturesSupported": {"ExpandQuery": {"ExpandAll": "yes"}}})
    assert root.supports_expand is False
    root = ServiceRoot.model_validate({"ProtocolFeaturesSupported": {"ExpandQuery": {"NoLinks": True}}})
    assert root.supports_expand is True


def test_a_device_resource_is_read_as_its_odata_type() -> None:
    gpu = view_of_kind({"@odata.type": "#Processor.v1_22_0.Processor", "ProcessorType": "GPU"})
    assert isinstance(gpu, Processor) and gpu.processor_type == "GPU"
    block = ResourceBlock.model_validate({"ResourceBlockType": ["Processor", 5, None], "Processors": {}})
    assert block.resource_block_type == ["Processor", "5", None] and block.processors == ()


def test_every_dmtf_mockup_resource_reads(redfish_dir: Path) -> None:
    read = 0
    for name in ("public-cxl", "public-composability"):
        for index in (redfish_dir / "mockups" / name).rglob("index.json"):
            payload = json.loads(index.read_text())
            if isinstance(payload, dict):
                view_of_kind(payload)
                read += 1
    assert read > 50


@pytest.mark.parametrize(
    ("allowable", "allowed"),
    [
        (None, True),  # no list: the service takes every value of the parameter's type
        (["ForceRestart", "GracefulRestart"], True),
        (["GracefulRestart", "On"], False),
        ("ForceRestart", True),  # not a list: read as no list
    ],
)
def test_an_action_allows_what_its_allowable_values_list(allowable: object, allowed: bool) -> None:
    action: dict[str, object] = {"target": "/redfish/v1/Systems/1/Processors/GPU0/Actions/Processor.Reset"}
    if allowable is not None:
        action["ResetType@Redfish.AllowableValues"] = allowable
    gpu = Processor.model_validate(
        {"@odata.id": "/redfish/v1/Systems/1/Processors/GPU0", "Actions": {"#Processor.Reset": action}}
    )
    assert gpu.actions.target("Processor.Reset") == action["target"]
    assert gpu.actions.allows("Processor.Reset", "ResetType", "ForceRestart") is allowed
