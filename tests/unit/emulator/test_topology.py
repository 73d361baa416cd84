"""Topology files: the packaged default, validation that names the field, and the generator."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from emulator.topology import (
    FABRIC_CXL,
    FABRIC_PCIE,
    TopologyError,
    default_topology_path,
    load_topology,
    parse_topology,
)
from emulator.topology.generate import GenerateSpec, generate_topology, generate_topology_yaml
from manager_api.models import DeviceType
from plumbing import procs


def _base() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(default_topology_path().read_text())
    return loaded


def _inline(**profile: object) -> dict[str, Any]:
    """An inline partition table of one profile (changed by ``profile``) on an 8-slice GPU."""
    return {
        "name": "custom-80gb",
        "memorySlices": 8,
        "multiprocessors": 132,
        "memoryBytes": "79GiB",
        "profiles": [
            {
                "name": "4g.20gb",
                "memorySlices": 4,
                "multiprocessors": 64,
                "memoryBytes": "20GiB",
                "placements": [0, 4],
            }
            | profile
        ],
    }


def _problems(data: dict[str, Any]) -> list[str]:
    with pytest.raises(TopologyError) as info:
        parse_topology(data, "test.yaml")
    return [str(p) for p in info.value.problems]


def test_default_topology_has_what_the_issue_asks_for() -> None:
    index = load_topology(default_topology_path())
    assert list(index.hosts) == ["kind-worker", "kind-worker2", "kind-worker3", "kind-worker4"]
    assert len({h.uuid for h in index.hosts.values()}) == 4
    pcie_switches = list(index.fabric_switches(FABRIC_PCIE))
    assert len(pcie_switches) >= 2
    types = {d.type for d in index.devices.values()}
    assert {DeviceType.GPU, DeviceType.NVME, DeviceType.NIC, DeviceType.FPGA, DeviceType.CXL_MEMORY} <= types
    gpu_models = {d.model.model for d in index.devices.values() if d.type == DeviceType.GPU}
    assert len(gpu_models) == 3
    # partitionable GPUs of both built-in tables (issue 35), beside whole-only ones
    tables = {d.model.partitions.name if d.model.partitions else None for d in index.devices.values()}
    assert tables == {"h100-80gb", "a100-40gb", None}
    cxl = list(index.fabric_devices(FABRIC_CXL))
    premade = [d for d in cxl if d.pool is None]
    assert premade and all(len(d.chunks) > 1 for d in premade)
    assert sum(c.size_bytes for c in premade[0].chunks) == int(premade[0].model.memory or 0)
    # and a pool whose chunks clients create (issue 36), with none made yet
    pools = [d for d in cxl if d.pool is not None]
    assert pools and all(d.chunks == () for d in pools)
    # some serials are 16 hex digits (they get a Device Serial Number capability), some are not
    assert any(len(d.serial) == 16 for d in index.devices.values())
    assert any(len(d.serial) != 16 for d in index.devices.values())


def test_ports_and_reachability() -> None:
    data = _base()
    data["pcie"]["switches"][1]["hosts"] = ["kind-worker3", "kind-worker4"]
    index = parse_topology(data)
    assert index.switches["switch1"].upstream_ports == {"kind-worker3": "UP0", "kind-worker4": "UP1"}
    assert index.devices["gpu4"].port == "DP0"
    assert not index.host_reaches("kind-worker", index.devices["gpu4"])
    assert index.host_reaches("kind-worker", index.devices["gpu0"])


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda d: d["pcie"]["switches"][0]["devices"][2].update(model="h200"),
            "pcie.switches[0].devices[2].model: unknown model 'h200'",
        ),
        (
            lambda d: d["pcie"]["switches"][0]["devices"][1].update(id="gpu0"),
            "pcie.switches[0].devices[1].id: Id 'gpu0' is already used",
        ),
        (
            lambda d: d["pcie"]["switches"][0]["devices"][0].update(serial=1234),
            "pcie.switches[0].devices[0].serial: Value error, write it in quotes",
        ),
        (
            lambda d: d["models"]["h100"].update(vendorId="0x1ffff"),
            "models.h100.vendorId: Value error, 0x1ffff does not fit in 16 bits",
        ),
        (
            lambda d: d["models"]["h100"].update(colour="green"),
            "models.h100.colour: Extra inputs are not permitted",
        ),
        (lambda d: d["hosts"][1].update(name="kind-worker"), "hosts[1].name: duplicate host 'kind-worker'"),
        (lambda d: d["hosts"][0].update(name="Kind_Worker"), "hosts[0].name: String should match pattern"),
        (
            lambda d: d["cxl"]["switches"][0]["devices"][0].update(chunks=3),
            "cxl.switches[0].devices[0].chunks: 68719476736 bytes do not split into 3 chunks",
        ),
        (
            lambda d: d["cxl"]["switches"][0]["devices"][0].update(model="h100"),
            "cxl.switches[0].devices[0].model: model 'h100' is gpu, not cxl-memory",
        ),
        (
            lambda d: d["pcie"]["switches"][0].update(hosts=["kind-worker9"]),
            "pcie.switches[0].hosts[0]: unknown host 'kind-worker9'",
        ),
        (lambda d: d.update(version=2), "version: Input should be 1"),
        # partition tables (issue 35): by built-in name or inline, on gpu models whose memory holds them
        (
            lambda d: d["models"]["h100"].update(partitions="h200-141gb"),
            "models.h100.partitions: Value error, no built-in partition table 'h200-141gb' "
            "(built in: a100-40gb, h100-80gb)",
        ),
        (
            lambda d: d["models"]["h100"].update(memory="40GiB"),
            "models.h100.partitions: table h100-80gb: profile 7g.80gb needs 79.25 GiB of GPU memory; "
            "the GPU has 40 GiB",
        ),
        (
            lambda d: d["models"]["pm1743"].update(partitions="a100-40gb"),
            "models.pm1743.partitions: only a gpu model is partitioned; this one is nvme",
        ),
        (
            lambda d: d["models"]["h100"].update(partitions=_inline(placements=[0, 5])),
            "models.h100.partitions: Value error, profile 4g.20gb: a placement at 5 takes slices 5..8; "
            "the GPU has 0..7",
        ),
        (
            lambda d: d["models"]["h100"].update(partitions=_inline(memorySlices=9)),
            "models.h100.partitions: Value error, profile 4g.20gb takes 9 memory slices; the GPU has 8",
        ),
        # pools (issue 36): chunks are carved, never declared; their Ids are the pool's
        (
            lambda d: d["cxl"]["switches"][0]["devices"][2].update(chunks=4),
            "cxl.switches[0].devices[2].chunks: a pool's chunks are carved by clients; leave chunks out",
        ),
        (
            lambda d: d["cxl"]["switches"][0]["devices"][2]["pool"].update(minChunkMiB=300 * 1024),
            "cxl.switches[0].devices[2].pool.minChunkMiB: a chunk of 307200 MiB does not fit in the "
            "device's 262144 MiB",
        ),
        (
            lambda d: d["cxl"]["switches"][0]["devices"][2]["pool"].update(incrementMiB=0),
            "cxl.switches[0].devices[2].pool.incrementMiB: Input should be greater than or equal to 1",
        ),
        (
            lambda d: d["pcie"]["switches"][0]["devices"][4].update(id="cxlpool0-chunk7"),
            "pcie.switches[0].devices[4].id: Id 'cxlpool0-chunk7' is taken by the chunks clients carve "
            "from cxl.switches[0].devices[2].pool",
        ),
        (
            lambda d: d.update(behaviour={"memoryChunks": "sometimes"}),
            "behaviour.memoryChunks: Input should be 'creatable' or 'fixed'",
        ),
    ],
)
def test_problems_name_the_field(change: Any, expected: str) -> None:
    data = _base()
    change(data)
    problems = _problems(data)
    assert any(p.startswith(expected) for p in problems), problems


def test_error_message_is_one_line_with_the_count(tmp_path: Path) -> None:
    data = _base()
    data["pcie"]["switches"][0]["devices"][0]["model"] = "nope"
    data["pcie"]["switches"][0]["devices"][1]["model"] = "nope"
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(TopologyError) as info:
        load_topology(path)
    text = str(info.value)
    assert "\n" not in text and "(and 1 more problem)" in text and str(path) in text


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read the file"):
        load_topology(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("hosts: [\n")
    with pytest.raises(TopologyError, match=r"not valid YAML/JSON: line \d+"):
        load_topology(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n")
    with pytest.raises(TopologyError, match="must hold a mapping"):
        load_topology(listing)


def test_generator_is_deterministic_and_valid_at_load_test_size() -> None:
    spec = GenerateSpec(hosts=50, gpus=150, nvme=30, nics=10, fpgas=10, cxl_devices=4, chunks=4)
    assert generate_topology_yaml(spec) == generate_topology_yaml(spec)
    index = parse_topology(generate_topology(spec))
    assert len(index.hosts) == 50
    assert len(index.devices) == 204
    assert len(index.targets) == 200 + 16
    assert "kind-worker50" in index.hosts and "kind-worker" in index.hosts
    # every switch gets a mix of device kinds, at most devices_per_switch devices each
    for sw in index.fabric_switches(FABRIC_PCIE):
        assert len(sw.devices) <= spec.devices_per_switch
    assert len({d.type for d in index.devices.values() if d.switch == "switch0"}) == 4
    other_seed = generate_topology(spec.model_copy(update={"seed": "other"}))
    assert other_seed["hosts"][0]["uuid"] != generate_topology(spec)["hosts"][0]["uuid"]


def test_generator_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="at least one device"):
        GenerateSpec(gpus=0, nvme=0, nics=0, fpgas=0, cxl_devices=0)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return procs.run(["emulator", "topology", *args])


def test_topology_cli(tmp_path: Path) -> None:
    out = tmp_path / "big.yaml"
    generated = _cli(
        "generate",
        "--hosts",
        "50",
        "--gpus",
        "150",
        "--nvme",
        "30",
        "--nics",
        "10",
        "--fpgas",
        "10",
        "--output-file",
        str(out),
    )
    assert generated.returncode == 0, generated.stderr
    checked = _cli("validate", str(out))
    assert checked.returncode == 0 and "50 hosts, 202 devices" in checked.stdout
    bad = tmp_path / "bad.yaml"
    data = _base()
    data["models"]["h100"]["pcieWidth"] = 3
    data["hosts"][0]["uuid"] = "not-a-uuid"
    bad.write_text(yaml.safe_dump(data))
    refused = _cli("validate", str(bad))
    assert refused.returncode == 1
    assert "2 problem(s)" in refused.stderr and "hosts[0].uuid" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_an_inline_partition_table_and_the_fixed_chunk_quirk() -> None:
    data = _base()
    data["models"]["h100"]["partitions"] = _inline()
    data["behaviour"] = {"memoryChunks": "fixed"}
    index = parse_topology(data)
    table = index.devices["gpu0"].model.partitions
    assert table is not None and table.name == "custom-80gb" and table.profiles[0].label == "4g20gb"
    # a service without chunk creation: the pool is one pre-made chunk of its whole memory
    pool = index.devices["cxlpool0"]
    assert pool.pool is None and [c.id for c in pool.chunks] == ["cxlpool0-chunk0"]
    assert pool.chunks[0].size_bytes == 256 << 30 and "cxlpool0-chunk0" in index.targets
    creatable = parse_topology(_base())
    assert creatable.devices["cxlpool0"].pool is not None and creatable.devices["cxlpool0"].chunks == ()
    assert not any(t.startswith("cxlpool0") for t in creatable.targets)


def test_generated_topologies_with_partitionable_gpus_and_pools() -> None:
    spec = GenerateSpec(hosts=3, gpus=9, cxl_devices=1, cxl_pools=2, partitionable_gpus=True)
    index = parse_topology(generate_topology(spec))
    tables = sorted(
        (d.id, d.model.partitions.name) for d in index.devices.values() if d.model.partitions is not None
    )
    assert [t for _, t in tables].count("a100-40gb") == 3 and [t for _, t in tables].count("h100-80gb") == 3
    assert sorted(d.id for d in index.devices.values() if d.pool is not None) == ["cxlpool0", "cxlpool1"]
    assert "--cxl-pools 2 --partitionable-gpus" in generate_topology_yaml(spec).splitlines()[0]
    # without them the generated files are what they always were
    plain = generate_topology(GenerateSpec(hosts=3, gpus=9))
    assert "a100" not in plain["models"] and "partitions" not in plain["models"]["h100"]
