from __future__ import annotations

import json
from pathlib import Path

import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.hostdev import HostDevice
from dra_driver.plugin.hostmemory import MemoryRecord
from dra_driver.plugin.partitioner import Partition
from tests.support.cdischema import assert_valid_cdi_spec

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


# -- GPU partitions and memory shares --------------------------------------------------------------

SHARE_A = "3f0e6b9c-6f21-4d3b-8a51-0c8d1e2f3a4b"
SHARE_B = "9a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d"


def partition_device(**changes: object) -> cdi.SpecDevice:
    partition = Partition(
        uuid="MIG-6e2ab5c1-7b3a-4c5d-9e8f-001122334455",
        profile="1g.10gb",
        start=3,
        size=1,
        gpu="0000:41:00.0",
        device_nodes=["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap21"],
        env={"NVIDIA_VISIBLE_DEVICES": "MIG-6e2ab5c1-7b3a-4c5d-9e8f-001122334455"},
        path="/tmp/sys/bus/pci/devices/0000:41:00.0/mig/1g10gb-3",
    )
    fields: dict[str, object] = {
        "device": "gpu0-1g10gb-3",
        "type": "gpu-partition",
        "parent": "gpu0",
        "partition": partition,
    }
    return gpu().model_copy(update=fields | changes)


def share_device(share_id: str, memory: MemoryRecord) -> cdi.SpecDevice:
    return cdi.SpecDevice(
        claim_uid=UID,
        device="cxlpool0",
        pool="fabric-cxl",
        type="cxl-memory",
        request_names=("memory",),
        serial="0xc0ffee000001",
        memory_bytes=4 << 30,
        share_id=share_id,
        host=HostDevice(
            sysfs_path="/tmp/sys/bus/cxl/devices/region0",
            memdev="mem0",
            region="region0",
            dax="dax0.0",
            device_nodes=["/dev/dax0.0"],
        ),
        memory=memory,
    )


def env_of(device: cdi.CdiDevice) -> dict[str, str]:
    return dict(e.split("=", 1) for e in device.container_edits.env)


def test_a_partition_gets_its_own_nodes_and_uuid_never_its_gpus(tmp_path: Path) -> None:
    spec = cdi.build_specs("fabric-dra.io", [partition_device()], real_host=True)["gpu-partition"]
    assert spec.kind == "k8s.fabric-dra.io/gpu-partition"
    (device,) = spec.devices
    assert device.name == f"{UID}-gpu0-1g10gb-3"
    assert [n.path for n in device.container_edits.device_nodes] == [
        "/dev/nvidia0",
        "/dev/nvidiactl",
        "/dev/nvidia-caps/nvidia-cap21",
    ]
    assert "/dev/vfio/12" not in str(spec.to_json())  # the GPU's own nodes stay on the host
    env = env_of(device)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "MIG-6e2ab5c1-7b3a-4c5d-9e8f-001122334455"
    p = "FABRIC_DRA_GPU0_1G10GB_3_"
    assert (env[f"{p}PARTITION_UUID"], env[f"{p}PARTITION_PROFILE"], env[f"{p}PARTITION_START"]) == (
        "MIG-6e2ab5c1-7b3a-4c5d-9e8f-001122334455",
        "1g.10gb",
        "3",
    )
    assert (env[f"{p}DEVICE"], env[f"{p}PARENT"], env[f"{p}TYPE"]) == (
        "gpu0-1g10gb-3",
        "gpu0",
        "gpu-partition",
    )
    (path,) = cdi.write_specs(tmp_path, "fabric-dra.io", UID, {"gpu-partition": spec})
    assert_valid_cdi_spec(path)


def test_an_emulated_partition_shows_its_own_directory(tmp_path: Path) -> None:
    spec = cdi.build_specs("fabric-dra.io", [partition_device()], real_host=False)["gpu-partition"]
    edits = spec.devices[0].container_edits
    assert edits.device_nodes == []
    (mount,) = edits.mounts
    assert mount.container_path == "/run/fabric-dra/devices/gpu0-1g10gb-3"
    assert mount.host_path.endswith("/mig/1g10gb-3")


def test_a_devdax_share_is_its_dax_device(tmp_path: Path) -> None:
    record = MemoryRecord(mode=MemoryMode.DEVDAX, dax="dax0.0", node=2)
    spec = cdi.build_specs("fabric-dra.io", [share_device(SHARE_A, record)], real_host=True)["cxl-memory"]
    (device,) = spec.devices
    assert device.name == f"{UID}-cxlpool0-{SHARE_A}"
    assert [n.path for n in device.container_edits.device_nodes] == ["/dev/dax0.0"]
    assert device.container_edits.hooks is None
    env = env_of(device)
    p = cdi.env_prefix(f"cxlpool0-{SHARE_A}")
    assert (env[f"{p}SHARE_ID"], env[f"{p}MEMORY_MODE"], env[f"{p}MEMORY_BYTES"], env[f"{p}DAX"]) == (
        SHARE_A,
        "devdax",
        str(4 << 30),
        "dax0.0",
    )
    (path,) = cdi.write_specs(tmp_path, "fabric-dra.io", UID, {"cxl-memory": spec})
    assert_valid_cdi_spec(path)


def test_a_kmem_share_has_no_node_and_a_hook_binding_the_container_to_its_numa_node(tmp_path: Path) -> None:
    record = MemoryRecord(mode=MemoryMode.KMEM, dax="dax0.0", node=2, blocks=[1024, 1025, 1026, 1027])
    spec = cdi.build_specs(
        "fabric-dra.io",
        [share_device(SHARE_A, record)],
        real_host=True,
        hook_path="/usr/local/bin/fabric-dra",
    )["cxl-memory"]
    (device,) = spec.devices
    assert device.container_edits.device_nodes == []
    (hook,) = device.container_edits.hooks or []
    assert (hook.hook_name, hook.path, hook.args, hook.timeout) == (
        "createRuntime",
        "/usr/local/bin/fabric-dra",
        ["fabric-dra", "cdi-hook", "set-mems", "--node", "2"],
        10,
    )
    env = env_of(device)
    p = cdi.env_prefix(f"cxlpool0-{SHARE_A}")
    assert (env[f"{p}NUMA_NODE"], env[f"{p}MEMORY_MODE"]) == ("2", "kmem")
    assert f"{p}DEVICE_NODES" not in env
    (path,) = cdi.write_specs(tmp_path, "fabric-dra.io", UID, {"cxl-memory": spec})
    document = assert_valid_cdi_spec(path)
    assert document["devices"][0]["containerEdits"]["hooks"][0]["hookName"] == "createRuntime"


def test_two_shares_of_one_pool_in_one_claim_are_two_devices_and_read_back_apart(tmp_path: Path) -> None:
    devdax = MemoryRecord(mode=MemoryMode.DEVDAX, dax="dax0.0")
    specs = cdi.build_specs(
        "fabric-dra.io", [share_device(SHARE_A, devdax), share_device(SHARE_B, devdax)], real_host=False
    )
    names = [d.name for d in specs["cxl-memory"].devices]
    assert names == [f"{UID}-cxlpool0-{SHARE_A}", f"{UID}-cxlpool0-{SHARE_B}"]
    (path,) = cdi.write_specs(tmp_path, "fabric-dra.io", UID, specs)
    assert_valid_cdi_spec(path)
    back = cdi.read_spec_devices(path)
    assert [(d.device, d.share_id, d.key) for d in back] == [
        ("cxlpool0", SHARE_A, f"cxlpool0-{SHARE_A}"),
        ("cxlpool0", SHARE_B, f"cxlpool0-{SHARE_B}"),
    ]


@pytest.mark.parametrize(
    ("hook", "reason"),
    [
        ({"hook_name": "beforeEverything", "path": "/bin/x"}, "hook name 'beforeEverything' is none of"),
        ({"hook_name": "createRuntime", "path": "bin/x"}, "must be an absolute path"),
        ({"hook_name": "createRuntime", "path": "/bin/x", "timeout": 0}, "positive number of seconds"),
    ],
)
def test_validate_rejects_hooks_a_runtime_would(hook: dict[str, object], reason: str) -> None:
    edits = cdi.ContainerEdits(hooks=[cdi.Hook(**hook)])
    bad = cdi.CdiSpec(
        cdi_version="0.5.0",
        kind="k8s.fabric-dra.io/x",
        devices=[cdi.CdiDevice(name="d", container_edits=edits)],
    )
    with pytest.raises(cdi.CdiSpecError, match=reason):
        cdi.validate_spec(bad)
