"""A fabric's endpoints are slotted records read by hand (:class:`fabric.backends.views.Endpoint`),
no longer pydantic views: they must read every payload exactly as the views they replace did.
The reference here is that view, as it was declared; every endpoint of DMTF's mockups and a set of
payloads of the wrong shape read the same through both (the emulator's fabrics, in each of its
quirk profiles: tests/integration/fabric/test_endpoint_record.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import PlainValidator

from fabric.backends.views import (
    Each,
    Endpoint,
    Link,
    Part,
    Refs,
    Resource,
    Text,
    Tolerant,
    View,
    _all_uris,
    part,
    prop,
    refs,
)

MOCKUPS = Path(__file__).resolve().parents[3] / "../shared/redfish/mockups"


class _PciId(View):
    vendor_id: Text = prop("VendorId")
    device_id: Text = prop("DeviceId")
    class_code: Text = prop("ClassCode")


class _ConnectedEntity(View):
    entity_type: Text = prop("EntityType")
    entity_role: Text = prop("EntityRole")
    entity_link: Link = prop("EntityLink")
    entity_pci_id: Tolerant[_PciId] = prop("EntityPciId")


class _EndpointLinks(View):
    ports: Refs = refs("Ports")
    connected_ports: Refs = refs("ConnectedPorts")
    local_ports: Refs = refs("LocalPorts")
    zones: Annotated[tuple[str, ...] | None, PlainValidator(_all_uris)] = prop("Zones")
    connections: Annotated[tuple[str, ...] | None, PlainValidator(_all_uris)] = prop("Connections")


class ReferenceEndpoint(Resource):
    """The pydantic view of an Endpoint as declared before the record replaced it."""

    connected_entities: Tolerant[Each[_ConnectedEntity]] = prop("ConnectedEntities")
    links: Part[_EndpointLinks] = part("Links", _EndpointLinks)

    @property
    def entity_pci_id(self) -> _PciId | None:
        return next((e.entity_pci_id for e in self.connected_entities or () if e.entity_pci_id), None)


def read_alike(payload: dict[str, Any]) -> None:
    """``payload`` reads the same as a record and as the reference view."""
    record, view = Endpoint.model_validate(payload), ReferenceEndpoint.model_validate(payload)
    assert (record.uri, record.odata_type, record.id, record.name, record.kind) == (
        view.uri,
        view.odata_type,
        view.id,
        view.name,
        view.kind,
    )
    assert record.status == view.status
    assert record.actions.model_extra == view.actions.model_extra
    entities = [
        (e.entity_type, e.entity_role, e.entity_link, e.entity_pci_id and e.entity_pci_id.model_dump())
        for e in view.connected_entities or ()
    ]
    assert (record.connected_entities is None) is (view.connected_entities is None)
    assert [
        (e.entity_type, e.entity_role, e.entity_link, e.entity_pci_id and _as_dict(e.entity_pci_id))
        for e in record.connected_entities or ()
    ] == entities
    links, reference = record.links, view.links
    assert (links.ports, links.connected_ports, links.local_ports, links.zones, links.connections) == (
        reference.ports,
        reference.connected_ports,
        reference.local_ports,
        reference.zones,
        reference.connections,
    )
    assert record.entity_pci_id == (
        None
        if view.entity_pci_id is None
        else Endpoint.model_validate(
            {"ConnectedEntities": [{"EntityPciId": view.entity_pci_id.model_dump(by_alias=True)}]}
        ).entity_pci_id
    )


def _as_dict(pci_id: Any) -> dict[str, Any]:
    return {"vendor_id": pci_id.vendor_id, "device_id": pci_id.device_id, "class_code": pci_id.class_code}


def _mockup_endpoints() -> list[Path]:
    return sorted(p for p in MOCKUPS.glob("**/Endpoints/*/index.json"))


def test_every_endpoint_of_dmtf_mockups_reads_the_same() -> None:
    paths = _mockup_endpoints()
    assert paths, f"no endpoint in {MOCKUPS}"
    for path in paths:
        read_alike(json.loads(path.read_text()))


JUNK: list[object] = ["text", 7, 7.5, None, True, [], [1, "two"], {}, {"@odata.id": 5}, {"@odata.id": "x"}]


@pytest.mark.parametrize("junk", JUNK)
def test_a_property_of_the_wrong_shape_reads_as_the_view_read_it(junk: object) -> None:
    uri = {"@odata.id": "/redfish/v1/Fabrics/F/Endpoints/E/"}
    for payload in (
        dict.fromkeys(("@odata.id", "@odata.type", "Id", "Name", "Status", "Actions", "Links"), junk),
        {"ConnectedEntities": junk, "Links": {"Zones": junk, "Ports": junk, "ConnectedPorts": [junk, uri]}},
        {"ConnectedEntities": [junk, {"EntityType": junk, "EntityLink": junk, "EntityPciId": junk}]},
        {"Status": {"Health": junk, "State": junk}, "Links": {"Connections": junk, "LocalPorts": junk}},
        {"Links": {"Zones": [uri, junk], "ConnectedPorts": uri}, "Actions": {"#Endpoint.Reset": junk}},
    ):
        read_alike(payload)


def test_a_payload_that_is_no_object_is_refused_as_the_view_refused_it() -> None:
    junks: list[object] = ["text", [], None]
    for junk in junks:
        with pytest.raises(ValueError):
            ReferenceEndpoint.model_validate(junk)
        with pytest.raises(ValueError):
            Endpoint.model_validate(junk)
