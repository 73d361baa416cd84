"""One CLI grammar on the emulator's data commands: ``-o table|wide|json|yaml`` on ``emulator
bindings``, ``emulator fault list``, ``emulator topology show`` and ``topology validate``, each run
as a ``fabric-dra`` subprocess against a running emulator."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from plumbing import procs
from tests.support.emulator import RunningEmulator, run_emulator, zone_add

FORMATS = ["table", "wide", "json", "yaml"]


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningEmulator]:
    """One device bound and one fault active, so every command has rows to print."""
    with run_emulator(tmp_path_factory.mktemp("cli-output")) as running:
        client = running.client()
        uri, body = zone_add("kind-worker", "gpu0")
        assert client.post(uri, json=body).status_code == 204
        running.inject({"Kind": "FailOperations", "Target": "nvme0", "Count": 2})
        yield running


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return procs.run(args)


def _client(emu: RunningEmulator) -> list[str]:
    return ["--url", emu.url, "--state-dir", str(emu.state_dir)]


def _document(output: str, text: str) -> Any:
    return json.loads(text) if output == "json" else yaml.safe_load(text)


@pytest.mark.parametrize("output", FORMATS)
def test_bindings_in_every_format(emu: RunningEmulator, output: str) -> None:
    done = _cli("emulator", "bindings", *_client(emu), "-o", output)
    assert done.returncode == 0, done.stderr
    if output in ("json", "yaml"):
        document = _document(output, done.stdout)
        assert [(b["Target"], b["Host"]) for b in document["Bindings"]] == [("gpu0", "kind-worker")]
        return
    header, *rows = done.stdout.splitlines()
    assert header.split()[:3] == ["TARGET", "HOST", "STYLE"]
    assert ("VISIBLE" in header) == (output == "wide")
    assert [row.split()[:2] for row in rows] == [["gpu0", "kind-worker"]]
    if output == "wide":
        assert "PCIe" in rows[0] and "yes" in rows[0].split()


def test_bindings_json_flag_is_kept_as_o_json(emu: RunningEmulator) -> None:
    old, new = (
        _cli("emulator", "bindings", *_client(emu), "--json"),
        _cli("emulator", "bindings", *_client(emu), "-o", "json"),
    )
    assert old.returncode == new.returncode == 0
    assert json.loads(old.stdout)["Bindings"] == json.loads(new.stdout)["Bindings"]


@pytest.mark.parametrize("output", FORMATS)
def test_fault_list_in_every_format(emu: RunningEmulator, output: str) -> None:
    done = _cli("emulator", "fault", "list", *_client(emu), "-o", output)
    assert done.returncode == 0, done.stderr
    if output in ("json", "yaml"):
        (fault,) = _document(output, done.stdout)["faults"]
        assert (fault["Kind"], fault["Target"], fault["Count"]) == ("FailOperations", "nvme0", 2)
        return
    header, row = done.stdout.splitlines()
    if output == "wide":  # a column per field
        assert {"TARGET", "COUNT", "OPERATION"} <= set(header.split())
        assert "nvme0" in row.split()
    else:
        assert header.split() == ["ID", "KIND", "DETAILS"]
        assert "Target=nvme0" in row and "Count=2" in row


@pytest.mark.parametrize("output", FORMATS)
def test_topology_show_in_every_format(output: str) -> None:
    done = _cli("emulator", "topology", "show", "-o", output)
    assert done.returncode == 0, done.stderr
    if output in ("json", "yaml"):
        document = _document(output, done.stdout)
        assert document["hosts"][0] == "kind-worker"
        devices = {d["id"]: d for sw in document["switches"] for d in sw["devices"]}
        assert devices["gpu0"]["pciId"] == "10de:2331" and devices["cxlmem0"]["chunks"] == 4
        return
    lines = done.stdout.splitlines()
    gpu0 = next(line for line in lines if " gpu0 " in line)
    assert "NVIDIA H100 PCIe" in gpu0
    assert ("10de:2331" in gpu0) == (output == "wide")


@pytest.mark.parametrize("output", FORMATS)
def test_topology_validate_in_every_format(tmp_path: Path, output: str) -> None:
    generated = tmp_path / "t.yaml"
    made = _cli("emulator", "topology", "generate", "--hosts", "2", "--output-file", str(generated))
    assert made.returncode == 0, made.stderr
    done = _cli("emulator", "topology", "validate", str(generated), "-o", output)
    assert done.returncode == 0, done.stderr
    if output in ("json", "yaml"):
        document = _document(output, done.stdout)
        assert document["valid"] is True and document["hosts"] == 2 and document["problems"] == []
    else:
        assert "valid: 2 hosts" in done.stdout


def test_topology_generate_writes_yaml_or_json(tmp_path: Path) -> None:
    as_yaml = _cli("emulator", "topology", "generate", "--hosts", "3")
    as_json = _cli("emulator", "topology", "generate", "--hosts", "3", "-o", "json")
    assert as_yaml.returncode == as_json.returncode == 0
    assert yaml.safe_load(as_yaml.stdout) == json.loads(as_json.stdout)
    refused = _cli("emulator", "topology", "generate", "-o", "table")
    assert refused.returncode == 2 and "usage: fabric-dra emulator topology generate" in refused.stderr


def test_a_closed_pipe_is_no_traceback() -> None:
    """``fabric-dra emulator topology show -o json | head -1``: the reader leaves early."""
    shown = subprocess.Popen(
        [sys.executable, "-m", "fabric_dra", "emulator", "topology", "show", "-o", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert shown.stdout is not None and shown.stderr is not None
    shown.stdout.close()  # before it writes a byte
    error = shown.stderr.read().decode()
    assert shown.wait(timeout=60) == 141
    assert "Traceback" not in error and error == ""


def test_bindings_show_a_chunk_being_released(tmp_path: Path) -> None:
    """A carved chunk's release in flight has no host: the table says ``-`` and ``releasing``."""
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        made = client.post(
            "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0/MemoryChunks", json={"MemoryChunkSizeMiB": 1024}
        )
        target = f"cxlpool0-chunk{made.json()['Id']}"
        emu.inject({"Kind": "HangTasks", "Target": target})
        assert client.delete(made.headers["Location"]).status_code == 202
        done = _cli("emulator", "bindings", *_client(emu))
        assert done.returncode == 0, done.stderr
        row = next(line.split() for line in done.stdout.splitlines() if line.startswith(target))
        assert row[1:3] == ["-", "releasing"]
        emu.reset_faults()
