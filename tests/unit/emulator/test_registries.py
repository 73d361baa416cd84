"""Every message the emulator sends exists in DMTF's registries, with the registry's argument count;
every schema ``$metadata`` references exists in DMTF's CSDL with the namespaces it includes."""

from __future__ import annotations

import ast
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import emulator.redfish
from emulator.redfish.model.oem import OEM_SCHEMA_URI, oem_schema
from emulator.redfish.model.registries import REGISTRIES, all_message_defs, message
from emulator.redfish.model.resources import ALL_TYPES
from emulator.redfish.views.services import COLLECTION_TYPES, metadata_document
from manager_api.partitions import PartitionProfile, PartitionTable

PACKAGE = Path(emulator.redfish.__file__).parent


def _registry(redfish_dir: Path, prefix: str) -> dict[str, dict[str, object]]:
    path = redfish_dir / "registries" / f"{prefix}.{REGISTRIES[prefix]}.json"
    data = json.loads(path.read_text())
    assert data["RegistryPrefix"] == prefix and data["RegistryVersion"] == REGISTRIES[prefix]
    messages: dict[str, dict[str, object]] = data["Messages"]
    return messages


def test_message_ids_exist_in_the_dmtf_registries(redfish_dir: Path) -> None:
    for definition in all_message_defs():
        registry = _registry(redfish_dir, definition.prefix)
        assert definition.key in registry, definition.message_id
        entry = registry[definition.key]
        assert entry.get("NumberOfArgs", 0) == definition.nargs, definition.message_id
        assert entry["MessageSeverity"] == definition.severity, definition.message_id


def _literal_calls(func_names: set[str]) -> list[tuple[str, str, int, bool, str]]:
    """(key, prefix, positional args after the key, whether that count is exact, where) of every call."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name not in func_names:
                continue
            args = node.args[1:] if name == "of" else node.args
            if not args or not isinstance(args[0], ast.Constant) or not isinstance(args[0].value, str):
                continue
            prefix = "Base"
            for keyword in node.keywords:
                if keyword.arg == "prefix" and isinstance(keyword.value, ast.Constant):
                    prefix = str(keyword.value.value)
            exact = not any(isinstance(a, ast.Starred) for a in args[1:])
            found.append((args[0].value, prefix, len(args) - 1, exact, f"{path.name}:{node.lineno}"))
    return found


def test_every_message_the_code_sends_is_defined_with_its_arguments() -> None:
    calls = _literal_calls({"of", "message", "make"})
    assert len(calls) > 40, "the scan must see the code's messages"
    defined = {(d.prefix, d.key): d for d in all_message_defs()}
    for key, prefix, nargs, exact, where in calls:
        if (prefix, key) not in defined:
            # events.make("ZoneCreated", ..., prefix="Fabric") etc. name their registry explicitly
            pytest.fail(f"{where}: {prefix}.{key} is not defined in emulator.redfish.model.registries")
        if exact:
            assert nargs == defined[(prefix, key)].nargs, (
                f"{where}: {prefix}.{key} takes {defined[(prefix, key)].nargs}"
            )


def test_message_formatting() -> None:
    body = message("ResourceNotFound", "Endpoint", "gpu9")
    assert body["MessageId"] == "Base.1.22.ResourceNotFound"
    assert body["MessageArgs"] == ["Endpoint", "gpu9"]
    assert "gpu9" in body["Message"]
    with pytest.raises(ValueError, match="takes 2 arguments"):
        message("ResourceNotFound", "Endpoint")


def test_metadata_references_real_schemas(redfish_dir: Path) -> None:
    root = ET.fromstring(metadata_document())
    edmx = "{http://docs.oasis-open.org/odata/ns/edmx}"
    included: set[str] = set()
    for reference in root.findall(f"{edmx}Reference"):
        if reference.attrib["Uri"] == OEM_SCHEMA_URI:
            text = oem_schema()  # the service's own, which it serves (emulator.redfish.model.oem)
        else:
            schema_file = redfish_dir / "csdl" / reference.attrib["Uri"].rsplit("/", 1)[-1]
            assert schema_file.exists(), schema_file.name
            text = schema_file.read_text()
        for include in reference.findall(f"{edmx}Include"):
            namespace = include.attrib["Namespace"]
            assert f'Namespace="{namespace}"' in text, (reference.attrib["Uri"], namespace)
            included.add(namespace)
    for model in ALL_TYPES:
        assert model.ODATA_TYPE.rsplit(".", 1)[0] in included, model.ODATA_TYPE
    for collection in COLLECTION_TYPES:
        assert collection in included
    assert {"FabricDRA", "FabricDRA.v1_0_0"} <= included


def test_the_oem_schema_declares_what_the_partition_table_model_has() -> None:
    """``FabricDRA_v1.xml`` is derived from manager_api.partitions: every field, by its JSON name."""
    root = ET.fromstring(oem_schema())
    edm = "{http://docs.oasis-open.org/odata/ns/edm}"
    types = {t.attrib["Name"]: t for s in root.iter(f"{edm}Schema") for t in s.findall(f"{edm}ComplexType")}
    for model in (PartitionTable, PartitionProfile):
        declared = {
            p.attrib["Name"]: p.attrib["Type"] for p in types[model.__name__].findall(f"{edm}Property")
        }
        assert set(declared) == set(model.model_json_schema(by_alias=True)["properties"])
    placements = types["PartitionProfile"].find(f"{edm}Property[@Name='placements']")
    assert placements is not None and placements.attrib["Type"] == "Collection(Edm.Int64)"
    assert types["PCIeDevice"].attrib["BaseType"] in ("Resource.OemObject", "FabricDRA.PCIeDevice")
