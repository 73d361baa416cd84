"""fabric-dra's OEM schema (DSP0266 "OEM extensions"): what the emulator adds to DMTF resources under
``Oem.FabricDRA``, declared in CSDL as DMTF declares its own, so DMTF's service validator checks it
(the tests put it beside DMTF's schema files) and a client can look it up. The service serves it at
:data:`OEM_SCHEMA_URI` and references it from ``$metadata``.

``FabricDRA.v1_0_0.PCIeDevice`` carries ``PartitionTable``: a partitionable GPU's table, with the
camelCase names of :class:`manager_api.partitions.PartitionTable`, so a client reads it with that
model as it is. The CSDL of the table is derived from that model's fields (names, types,
descriptions): one declaration.
"""

from __future__ import annotations

from typing import Any, get_args, get_origin
from xml.sax.saxutils import quoteattr

from pydantic import BaseModel

from manager_api.partitions import PartitionProfile, PartitionTable

__all__ = [
    "OEM_NAMESPACE",
    "OEM_NAMESPACES",
    "OEM_SCHEMA_FILE",
    "OEM_SCHEMA_URI",
    "PCIE_DEVICE_OEM_TYPE",
    "oem_schema",
]

OEM_NAMESPACE = "FabricDRA"
_VERSIONED = f"{OEM_NAMESPACE}.v1_0_0"
#: the namespaces the schema file declares (``$metadata`` includes each)
OEM_NAMESPACES = (OEM_NAMESPACE, _VERSIONED)
OEM_SCHEMA_FILE = f"{OEM_NAMESPACE}_v1.xml"
OEM_SCHEMA_URI = f"/redfish/v1/Schemas/{OEM_SCHEMA_FILE}"
#: ``@odata.type`` of ``Oem.FabricDRA`` on a PCIeDevice
PCIE_DEVICE_OEM_TYPE = f"#{_VERSIONED}.PCIeDevice"

_ODATA = "http://docs.oasis-open.org/odata/odata/v4.0/errata03/csd01/complete/vocabularies"
_REFERENCES = (
    (f"{_ODATA}/Org.OData.Core.V1.xml", "Org.OData.Core.V1", "OData"),
    (f"{_ODATA}/Org.OData.Measures.V1.xml", "Org.OData.Measures.V1", "Measures"),
    ("http://redfish.dmtf.org/schemas/v1/RedfishExtensions_v1.xml", "RedfishExtensions.v1_0_0", "Redfish"),
    ("http://redfish.dmtf.org/schemas/v1/Resource_v1.xml", "Resource", None),
)
_READ = '<Annotation Term="OData.Permissions" EnumMember="OData.Permission/Read"/>'


def _annotations(description: str, long_description: str) -> list[str]:
    return [
        f'<Annotation Term="OData.Description" String={quoteattr(description)}/>',
        f'<Annotation Term="OData.LongDescription" String={quoteattr(long_description)}/>',
    ]


def _edm(annotation: Any) -> tuple[str, bool]:
    """The CSDL type of a field's annotation, and whether it is a collection."""
    if get_origin(annotation) is list:
        return _edm(get_args(annotation)[0])[0], True
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return f"{_VERSIONED}.{annotation.__name__}", False
    if isinstance(annotation, type) and issubclass(annotation, int) and not issubclass(annotation, bool):
        return "Edm.Int64", False
    if annotation is str:
        return "Edm.String", False
    raise TypeError(f"no CSDL type for {annotation}")


def _complex_type(model: type[BaseModel], what: str) -> list[str]:
    lines = [
        f'<ComplexType Name="{model.__name__}">',
        '<Annotation Term="OData.AdditionalProperties" Bool="false"/>',
    ]
    lines += _annotations(what, f"This type shall describe {what[0].lower()}{what[1:].rstrip('.')}.")
    for name, info in model.model_fields.items():
        edm, many = _edm(info.annotation)
        description = (info.description or name).rstrip(".")
        kind = f"Collection({edm})" if many else edm
        lines.append(f'<Property Name="{info.alias or name}" Type="{kind}" Nullable="false">')
        if not edm.startswith(_VERSIONED):
            lines.append(_READ)
        lines += _annotations(
            description[0].upper() + description[1:] + ".", f"This property shall contain the {description}."
        )
        if name.endswith("_bytes"):
            lines.append('<Annotation Term="Measures.Unit" String="By"/>')
        lines.append("</Property>")
    lines.append("</ComplexType>")
    return lines


def oem_schema() -> str:
    """The CSDL document of ``FabricDRA_v1.xml``."""
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">',
    ]
    for uri, namespace, alias in _REFERENCES:
        include = f'<edmx:Include Namespace="{namespace}"' + (f' Alias="{alias}"/>' if alias else "/>")
        out += [f'  <edmx:Reference Uri="{uri}">', f"    {include}", "  </edmx:Reference>"]
    owner = '<Annotation Term="Redfish.OwningEntity" String="fabric-dra"/>'
    extension = _annotations(
        "fabric-dra's extension of a PCIe device.",
        "This type shall contain fabric-dra's OEM properties of a PCIeDevice.",
    )
    body = [
        f'<Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="{OEM_NAMESPACE}">',
        owner,
        '<ComplexType Name="PCIeDevice" BaseType="Resource.OemObject" Abstract="true">',
        *extension,
        "</ComplexType>",
        "</Schema>",
        f'<Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="{_VERSIONED}">',
        owner,
        '<Annotation Term="Redfish.Release" String="1.0"/>',
        f'<ComplexType Name="PCIeDevice" BaseType="{OEM_NAMESPACE}.PCIeDevice">',
        '<Annotation Term="OData.AdditionalProperties" Bool="false"/>',
        *extension,
        f'<Property Name="PartitionTable" Type="{_VERSIONED}.PartitionTable" Nullable="false">',
        *_annotations(
            "How this GPU splits into partitions (MIG-style profiles).",
            "This property shall contain the partition profile table of a partitionable GPU.",
        ),
        "</Property>",
        "</ComplexType>",
        *_complex_type(PartitionTable, "A GPU model's partition profile table."),
        *_complex_type(PartitionProfile, "One way to carve a partition out of the GPU."),
        "</Schema>",
    ]
    out += [
        "  <edmx:DataServices>",
        *(f"    {line}" for line in body),
        "  </edmx:DataServices>",
        "</edmx:Edmx>",
    ]
    return "\n".join(out) + "\n"
