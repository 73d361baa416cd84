"""``fabric-dra emulator topology validate`` lists every problem of a file at once, each with where
it is: ``FILE:LINE:COLUMN: field: what``, the line and column of that field in the file."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml

from emulator.topology import default_topology_path
from plumbing import procs


def _validate(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return procs.run(["emulator", "topology", "validate", str(path), *extra])


def _line_of(text: str, needle: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if needle in line)


def _problem_lines(path: Path, stderr: str) -> dict[str, int]:
    """field → line, from ``  FILE:LINE:COLUMN: field: what`` lines."""
    found = {}
    for line in stderr.splitlines()[1:]:
        rest = line.strip().removeprefix(f"{path}:")
        if rest == line.strip():
            continue
        number, _column, field, _ = rest.split(":", 3)
        found[field.strip()] = int(number)
    return found


def test_every_reference_problem_with_its_line(tmp_path: Path) -> None:
    text = default_topology_path().read_text()
    data = yaml.safe_load(text)
    data["hosts"][1]["name"] = data["hosts"][0]["name"]  # a duplicate host
    data["pcie"]["switches"][0]["devices"][1]["model"] = "h200"  # an unknown model
    data["pcie"]["switches"][0]["devices"][2]["serial"] = data["pcie"]["switches"][0]["devices"][0]["serial"]
    path = tmp_path / "bad.yaml"
    written = yaml.safe_dump(data, sort_keys=False, width=200)
    path.write_text(written)
    done = _validate(path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[0] == f"{path}: {len(done.stderr.splitlines()) - 1} problem(s):"
    lines = _problem_lines(path, done.stderr)
    assert {
        "hosts[1].name",
        "pcie.switches[0].devices[1].model",
        "pcie.switches[0].devices[2].serial",
    } <= set(lines), done.stderr
    assert lines["pcie.switches[0].devices[1].model"] == _line_of(written, "model: h200")
    second_host = written.splitlines()[lines["hosts[1].name"] - 1]
    assert f"name: {data['hosts'][0]['name']}" in second_host


def test_every_schema_problem_with_its_line_and_what_comes_after(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "version: 1\n"
        "service: {uuid: ac3f10ab-c9da-41a5-80a9-960b43c531c4}\n"
        "hosts:\n"
        "  - {name: a, uuid: not-a-uuid}\n"
        "  - {name: b, uuid: 256ebd99-678f-4f37-b1b6-3b826ce5e7a8, numaNode: x}\n"
        "models:\n"
        "  m: {type: gpu, manufacturer: M, model: M, vendorId: 0x10de, deviceId: 0x1,\n"
        "      classCode: 0x030200, pcieWidth: 3}\n"
        "pcie: {switches: [{id: s0, devices: [{id: d0, model: m, serial: '1'}]}]}\n"
    )
    done = _validate(path)
    assert done.returncode == 1
    lines = _problem_lines(path, done.stderr)
    assert lines == {"hosts[0].uuid": 4, "hosts[1].numaNode": 5, "models.m.pcieWidth": 8}, done.stderr
    assert "checked once these are fixed" in done.stderr


def test_json_output_carries_line_column_and_field(tmp_path: Path) -> None:
    data = json.loads(json.dumps(yaml.safe_load(default_topology_path().read_text())))
    data["hosts"][0]["uuid"] = "nope"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data, indent=2))
    done = _validate(path, "-o", "json")
    assert done.returncode == 1
    document = json.loads(done.stdout)
    assert document["valid"] is False
    (problem,) = document["problems"]
    assert problem["field"] == "hosts[0].uuid"
    assert path.read_text().splitlines()[problem["line"] - 1].strip().startswith('"uuid": "nope"')
