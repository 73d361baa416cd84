from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.hostdev import HostDevice

UID = "0f8c2f6e-1111-4222-8333-944445555666"


def gpu(device: str = "gpu-0", **host: object) -> cdi.SpecDevice:
    return cdi.SpecDevice(
        claim_uid=UID,
        device=device,
        pool="fabric-pcie",
        type="gpu",
        request_names=("gpu",),
        model="H100",
        serial="SN1",
        vendor_id="0x10de",
        device_id="0x2330",
        host=HostDevice(
            sysfs_path="/tmp/sys/bus/pci/devices/0000:41:00.0",
            pci_address="0000:41:00.0",
            iommu_group="12",
            driver="vfio-pci",
            device_nodes=["/dev/vfio/12", "/dev/vfio/vfio"],
            **host,
        ),
    )


def test_real_host_spec_has_device_nodes_and_env() -> None:
    specs = cdi.build_specs("fabric-dra.io", [gpu()], real_host=True)
    spec = specs["gpu"]
    assert spec.kind == "k8s.fabric-dra.io/gpu"
    # The device name starts with a digit (the claim UID): that needs CDI 0.5.0, nothing newer.
    assert spec.cdi_version == "0.5.0"
    device = spec.devices[0]
    assert device.name == f"{UID}-gpu-0"
    assert [n.path for n in device.container_edits.device_nodes] == ["/dev/vfio/12", "/dev/vfio/vfio"]
    env = dict(e.split("=", 1) for e in device.container_edits.env)
    assert env["FABRIC_DRA_GPU_0_PCI_ADDRESS"] == "0000:41:00.0"
    assert env["FABRIC_DRA_GPU_0_MODEL"] == "H100"
    assert env["FABRIC_DRA_GPU_0_SERIAL"] == "SN1"
    assert env["FABRIC_DRA_GPU_0_CLAIM_UID"] == UID
    assert device.container_edits.mounts == []


def test_emulated_host_spec_mounts_sysfs_read_only_without_device_nodes() -> None:
    spec = cdi.build_specs("fabric-dra.io", [gpu()], real_host=False)["gpu"]
    edits = spec.devices[0].container_edits
    assert edits.device_nodes == []
    (mount,) = edits.mounts
    assert mount.container_path == "/run/fabric-dra/devices/gpu-0"
    assert "ro" in mount.options and "bind" in mount.options
    assert mount.type is None  # keeps the spec at 0.5.0
    env = dict(e.split("=", 1) for e in edits.env)
    assert env["FABRIC_DRA_GPU_0_SYSFS"] == "/run/fabric-dra/devices/gpu-0"


def test_mixed_claim_gets_one_spec_per_type(tmp_path: Path) -> None:
    nvme = cdi.SpecDevice(claim_uid=UID, device="nvme-3", pool="fabric-pcie", type="nvme")
    specs = cdi.build_specs("fabric-dra.io", [gpu(), nvme], real_host=True)
    assert set(specs) == {"gpu", "nvme"}
    paths = cdi.write_specs(tmp_path, "fabric-dra.io", UID, specs)
    assert sorted(p.name for p in paths) == [
        f"k8s.fabric-dra.io-gpu_{UID}.json",
        f"k8s.fabric-dra.io-nvme_{UID}.json",
    ]
    assert cdi.spec_files_of_claim(tmp_path, "fabric-dra.io", UID) == sorted(paths)
    doc = json.loads(paths[0].read_text())
    assert doc["cdiVersion"] == "0.5.0" and doc["kind"] == "k8s.fabric-dra.io/gpu"
    # A re-prepare with fewer types leaves no stale file behind.
    cdi.write_specs(tmp_path, "fabric-dra.io", UID, {"gpu": specs["gpu"]})
    assert [p.name for p in cdi.spec_files_of_claim(tmp_path, "fabric-dra.io", UID)] == [
        f"k8s.fabric-dra.io-gpu_{UID}.json"
    ]
    cdi.remove_spec_files(cdi.spec_files_of_claim(tmp_path, "fabric-dra.io", UID))
    assert cdi.spec_files_of_claim(tmp_path, "fabric-dra.io", UID) == []


def test_spec_devices_round_trip_through_the_file(tmp_path: Path) -> None:
    specs = cdi.build_specs("fabric-dra.io", [gpu("gpu-7")], real_host=False)
    (path,) = cdi.write_specs(tmp_path, "fabric-dra.io", UID, specs)
    (back,) = cdi.read_spec_devices(path)
    assert (back.claim_uid, back.device, back.pool, back.type, back.request_names) == (
        UID,
        "gpu-7",
        "fabric-pcie",
        "gpu",
        ("gpu",),
    )
    assert (back.serial, back.vendor_id, back.device_id) == ("SN1", "0x10de", "0x2330")


def spec(**fields: object) -> cdi.CdiSpec:
    base: dict[str, object] = {
        "cdiVersion": "0.3.0",
        "kind": "vendor.com/gpu",
        "devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}],
    }
    base.update(fields)
    return cdi.CdiSpec.model_validate(base)


@pytest.mark.parametrize(
    ("fields", "version"),
    [
        ({}, "0.3.0"),
        (
            {
                "devices": [
                    {
                        "name": "a",
                        "containerEdits": {
                            "mounts": [{"hostPath": "/a", "containerPath": "/b", "type": "bind"}]
                        },
                    }
                ]
            },
            "0.4.0",
        ),
        ({"devices": [{"name": "1a"}]}, "0.5.0"),
        (
            {
                "devices": [
                    {
                        "name": "a",
                        "containerEdits": {"deviceNodes": [{"path": "/dev/x", "hostPath": "/dev/y"}]},
                    }
                ]
            },
            "0.5.0",
        ),
        ({"annotations": {"k": "v"}}, "0.6.0"),
        ({"kind": "vendor.com/g.pu"}, "0.6.0"),
    ],
)
def test_minimum_version_follows_the_cdi_rules(fields: dict[str, object], version: str) -> None:
    assert cdi.minimum_version(spec(**fields)) == version


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"cdiVersion": "0.2.9"}, "not a released"),
        ({"cdiVersion": "0.4.0", "devices": [{"name": "1a"}]}, "too old"),
        ({"kind": "gpu"}, "<vendor>/<class>"),
        ({"kind": "Vendor_com/gpu"}, "DNS subdomain"),
        ({"kind": "vendor.com/-gpu"}, "class"),
        ({"devices": []}, "at least one"),
        ({"devices": [{"name": "a"}, {"name": "a"}]}, "twice"),
        ({"devices": [{"name": "a-"}]}, "device name"),
        ({"devices": [{"name": "a", "containerEdits": {"env": ["NOVALUE"]}}]}, "NAME=VALUE"),
        ({"devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": "dev/x"}]}}]}, "absolute"),
        (
            {
                "devices": [
                    {
                        "name": "a",
                        "containerEdits": {"deviceNodes": [{"path": "/dev/x", "permissions": "rx"}]},
                    }
                ]
            },
            "permissions",
        ),
        (
            {
                "devices": [
                    {"name": "a", "containerEdits": {"mounts": [{"hostPath": "a", "containerPath": "/b"}]}}
                ]
            },
            "absolute",
        ),
    ],
)
def test_validate_rejects_what_a_runtime_would(fields: dict[str, object], reason: str) -> None:
    with pytest.raises(cdi.CdiSpecError, match=reason):
        cdi.validate_spec(spec(**fields))


def test_read_rejects_a_foreign_file(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"cdiVersion": "0.3.0", "kind": "x.com/y", "devices": [{"name": "a"}]}')
    with pytest.raises(cdi.CdiSpecError, match="FABRIC_DRA"):
        cdi.read_spec_devices(path)
    path.write_text("{not json")
    with pytest.raises(cdi.CdiSpecError, match="not a readable CDI spec"):
        cdi.read_spec_devices(path)
