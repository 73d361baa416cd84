"""Everything the controller writes, and the DeviceClasses it ships, against the official
Kubernetes JSON schemas (``kubernetes-validate``, strict) of every supported release."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from celpy.adapter import json_to_cel

from dra_driver.controller.devices import PublishPolicy
from dra_driver.controller.slices import check_slice, desired_pools, plan_pool
from manager_api.models import DeviceType, Health
from manager_api.partitions import BUILTIN_TABLES
from tests.conftest import REPO_ROOT
from tests.support.controller import make_device, make_inventory, make_pool

VERSIONS = ["1.34", "1.35", "1.36", "1.37"]
DEVICECLASS_FILES = [
    REPO_ROOT / "deploy/base/deviceclasses.yaml",
    REPO_ROOT / "deploy/base/deviceclasses-v1beta1.yaml",
]


def all_kinds_inventory() -> Any:
    devices = [
        make_device(f"gpu-{i}", switch=f"Switch{i % 2}", health=Health.CRITICAL if i == 3 else Health.OK)
        for i in range(70)
    ]
    devices += [
        make_device("nvme-0", type=DeviceType.NVME),
        make_device("nic-0", type=DeviceType.NIC, memory_bytes=None),
        make_device("fpga-0", type=DeviceType.FPGA, model="F" * 90),
        make_device("cxl-0", type=DeviceType.CXL_MEMORY, pool="fabric-cxl", fabric="CXL", switch=None),
        make_device("odd-0", type=DeviceType.OTHER, health=Health.WARNING, memory_bytes=1536 * 2**20 + 7),
        make_device("h100-0", partition_table=BUILTIN_TABLES["h100-80gb"]),
        make_device("a100-0", partition_table=BUILTIN_TABLES["a100-40gb"], memory_bytes=40 * 2**30),
        make_pool("cxlpool-0", 256 * 2**30, min_chunk_bytes=64 << 20, increment_bytes=64 << 20),
    ]
    return make_inventory(devices, pools={"fabric-pcie": ["a", "b"], "fabric-cxl": ["b"], "fabric-empty": []})


def written_slices(policy: PublishPolicy) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, pool in desired_pools(all_kinds_inventory(), policy).items():
        plan = plan_pool(name, pool, {}, driver=policy.driver)
        assert plan is not None
        out.extend(w.obj for w in plan.writes)
    return out


POLICIES = [
    PublishPolicy(driver="fabric-dra.io", device_taints=True, binding_conditions=False),
    PublishPolicy(driver="fabric-dra.io", device_taints=False, binding_conditions=True),
    PublishPolicy(driver="fabric-dra.io", device_taints=True, binding_conditions=True),
]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("policy", POLICIES, ids=["taints", "bindings", "taints+bindings"])
def test_every_slice_validates_strictly(version: str, policy: PublishPolicy) -> None:
    slices = written_slices(policy)
    assert len(slices) >= 3  # PCIe (two slices when one is tainted: ≤ 64), CXL, an empty pool
    for obj in slices:
        check_slice(obj)
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_misspelt_field_is_rejected_by_the_same_validation(version: str) -> None:
    obj = written_slices(POLICIES[0])[0]
    obj["spec"]["devices"][0]["bindToNode"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, version, strict=True)


def load_classes(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", DEVICECLASS_FILES, ids=lambda p: p.name)
def test_deviceclasses_validate_strictly(path: Path, version: str) -> None:
    docs = load_classes(path)
    assert {d["kind"] for d in docs} == {"DeviceClass"}
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def test_both_deviceclass_files_hold_the_same_classes() -> None:
    v1, v1beta1 = (load_classes(p) for p in DEVICECLASS_FILES)
    assert {d["apiVersion"] for d in v1} == {"resource.k8s.io/v1"}
    assert {d["apiVersion"] for d in v1beta1} == {"resource.k8s.io/v1beta1"}
    assert [(d["metadata"], d["spec"]) for d in v1] == [(d["metadata"], d["spec"]) for d in v1beta1]


CLASS_MEMBERS = {
    "cohdi-pcie-device": {"gpu", "nvme", "nic", "fpga"},
    "fabric-gpu": {"gpu"},
    "fabric-nvme": {"nvme"},
    "fabric-nic": {"nic"},
    "fabric-fpga": {"fpga"},
    "fabric-cxl-memory": {"cxl-0"},
    "fabric-cxl-memory-pool": {"cxlpool-0"},
    "fabric-gpu-partition": {"h100-0-*", "a100-0-*"},
    "fabric-h100-80gb-partition": {"h100-0-*"},
    "fabric-a100-40gb-partition": {"a100-0-*"},
}


def _member(device: dict[str, Any], attrs: dict[str, Any]) -> str:
    """What CLASS_MEMBERS names a selected device by: its type, a partition as ``<gpu>-*``, a CXL
    device by name (chunks and pools share a type)."""
    kind = attrs.get("type") or "foreign"
    if kind == "gpu-partition":
        return str(device["name"]).split("-", 2)[0] + "-0-*"
    return str(device["name"]) if kind == "cxl-memory" else str(kind)


def test_deviceclass_selectors_select_exactly_their_types() -> None:
    """Evaluate each class's CEL against the devices the controller publishes."""
    env = celpy.Environment()
    classes = {d["metadata"]["name"]: d for d in load_classes(DEVICECLASS_FILES[0])}
    assert set(classes) == set(CLASS_MEMBERS)
    # with binding conditions: free GPUs offer their partitions too
    devices = [d for obj in written_slices(POLICIES[2]) for d in obj["spec"].get("devices", [])]
    foreign = {"driver": "gpu.example.com", "attributes": {"gpu.example.com": {"type": {"string": "gpu"}}}}
    for name, doc in classes.items():
        programs = [env.program(env.compile(s["cel"]["expression"])) for s in doc["spec"]["selectors"]]
        selected = set()
        for device in [*devices, foreign]:
            # CEL sees attribute values unwrapped, grouped by domain, as Kubernetes presents them.
            attrs: dict[str, dict[str, Any]] = {}
            for qualified, value in device.get("attributes", {}).items():
                domain, _, ident = qualified.rpartition("/")
                attrs.setdefault(domain, {})[ident] = next(iter(value.values()))
            context = {
                "device": json_to_cel({"driver": device.get("driver", "fabric-dra.io"), "attributes": attrs})
            }
            if all(bool(p.evaluate(context)) for p in programs):
                selected.add(_member(device, attrs.get("fabric-dra.io", {})))
        assert selected == CLASS_MEMBERS[name], name
