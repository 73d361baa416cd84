"""Partitionable GPUs against a real emulator: the partition table on the GPU's PCIeDevice (read back
with the model every layer shares), a table that does not fit refused when the service starts,
and a GPU's partitions leaving the host with the GPU."""

from __future__ import annotations

from pathlib import Path

import yaml

from emulator.topology import default_topology_path
from manager_api.partitions import BUILTIN_TABLES, PartitionTable, partition_devices
from plumbing import procs
from tests.support.emulator import run_emulator, zone_add, zone_remove


def test_the_partition_table_is_on_the_gpus_pcie_device(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        h100 = client.get("/redfish/v1/Chassis/switch0/PCIeDevices/gpu0").json()
        oem = h100["Oem"]["FabricDRA"]
        assert oem["@odata.type"] == "#FabricDRA.v1_0_0.PCIeDevice"
        table = PartitionTable.model_validate(oem["PartitionTable"])
        assert table == BUILTIN_TABLES["h100-80gb"]
        assert [d.name for d in partition_devices("gpu0", table)][-1] == "gpu0-7g80gb-0"
        a100 = client.get("/redfish/v1/Chassis/switch1/PCIeDevices/gpu6").json()
        assert a100["Oem"]["FabricDRA"]["PartitionTable"]["name"] == "a100-40gb"
        # a GPU whose model declares no table says nothing
        assert "Oem" not in client.get("/redfish/v1/Chassis/switch1/PCIeDevices/gpu4").json()
        # the OEM schema it follows is served, and $metadata points at it
        schema = client.get("/redfish/v1/Schemas/FabricDRA_v1.xml")
        assert schema.status_code == 200 and 'ComplexType Name="PartitionTable"' in schema.text
        assert (
            '<edmx:Reference Uri="/redfish/v1/Schemas/FabricDRA_v1.xml">'
            in client.get("/redfish/v1/$metadata").text
        )


def test_a_table_that_does_not_fit_the_model_stops_the_start(tmp_path: Path) -> None:
    data = yaml.safe_load(default_topology_path().read_text())
    data["models"]["a100"]["partitions"] = "h100-80gb"  # 79.25 GiB of profiles on a 40 GiB GPU
    topology = tmp_path / "misfit.yaml"
    topology.write_text(yaml.safe_dump(data))
    result = procs.run(
        ["emulator", "serve", "--state-dir", str(tmp_path / "state"), "--topology", str(topology)]
    )
    assert result.returncode == 1
    assert (
        "models.a100.partitions: table h100-80gb: profile 7g.80gb needs 79.25 GiB of GPU memory; "
        "the GPU has 40 GiB" in result.stderr
    )
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr


def test_partitions_a_plugin_made_vanish_with_the_gpu(tmp_path: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        uri, body = zone_add("kind-worker", "gpu1")
        assert client.post(uri, json=body).status_code == 204
        bdf = emu.bindings()["Bindings"][0]["HostAddress"]["bdf"]
        device = emu.sysfs("kind-worker") / "bus" / "pci" / "devices" / bdf
        # what an emulated partitioner writes (docs/emulator.md, "GPU partitions")
        for start in (0, 4):
            partition = device / "mig" / f"3g40gb-{start}"
            partition.mkdir(parents=True)
            for name, text in {
                "uuid": f"MIG-0000000{start}-1111-2222-3333-444444444444",
                "profile": "3g.40gb",
                "start": str(start),
                "size": "4",
                "minor": str(start + 1),
                "dev": f"/dev/nvidia-caps/nvidia-cap{start + 1}",
            }.items():
                (partition / name).write_text(text + "\n")
        assert sorted(p.name for p in (device / "mig").iterdir()) == ["3g40gb-0", "3g40gb-4"]
        uri, body = zone_remove("kind-worker", "gpu1")
        assert client.post(uri, json=body).status_code == 204
        assert not device.exists()
        # bound again, to another host: the GPU comes up without the last tenant's partitions
        uri, body = zone_add("kind-worker2", "gpu1")
        assert client.post(uri, json=body).status_code == 204
        bdf = emu.bindings()["Bindings"][0]["HostAddress"]["bdf"]
        again = emu.sysfs("kind-worker2") / "bus" / "pci" / "devices" / bdf
        assert (again / "vendor").read_text() == "0x10de\n"
        assert not (again / "mig").exists()
