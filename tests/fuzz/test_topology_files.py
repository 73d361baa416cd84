"""Topology files for the emulator, made bad on purpose: every field of the packaged topology
replaced by a value of the wrong type, a hostile or out-of-range one, removed, or joined by an
unknown key; ids duplicated; text that is no YAML, YAML that expands exponentially, nesting too
deep, binary.

``parse_topology``/``load_topology`` answer a valid index or a :class:`TopologyError` whose every
problem names its field; ``fabric-dra emulator topology validate`` and ``emulator serve`` answer
one clear error and exit 1 — never a traceback and never a hang.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from emulator.topology import TopologyError, default_topology_path, load_topology, parse_topology
from plumbing import procs
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.strategies import hostile_text, json_values

pytestmark = pytest.mark.slow(seconds=23)

DEFAULT: dict[str, Any] = yaml.safe_load(default_topology_path().read_text())


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, inner in value.items():
            found.append((*prefix, key))
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found.append((*prefix, index))
            found += _paths(inner, (*prefix, index))
    return found


PATHS = _paths(DEFAULT)

odd_values = st.one_of(
    json_values,
    hostile_text,
    st.sampled_from(
        [
            -1,
            0,
            2**64,
            10**5000,
            1e308,
            float("inf"),
            "0x",
            "0xffffffffff",
            "9" * 5000,
            "80XiB",
            "-5GiB",
            "1e400",
            "kind-worker",
            "gpu0",
            "00000000-0000-0000-0000-000000000000",
            "not-a-uuid",
            "Gen5",
            True,
            [],
            {},
        ]
    ),
)


@st.composite
def bad_topologies(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(DEFAULT)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent: Any = data
        try:
            for step in path[:-1]:
                parent = parent[step]
            action = draw(st.sampled_from(["set", "set", "delete", "unknown-key", "duplicate"]))
            if action == "set":
                parent[path[-1]] = draw(odd_values)
            elif action == "delete":
                del parent[path[-1]]
            elif action == "unknown-key" and isinstance(parent, dict):
                parent[draw(st.text(min_size=1, max_size=12))] = draw(odd_values)
            elif action == "duplicate" and isinstance(parent, list):
                parent.append(copy.deepcopy(parent[path[-1]]))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed what this one would change
    return data


def _check(problem_source: str, err: TopologyError) -> None:
    assert str(err).startswith(f"topology {problem_source}: ")
    assert "\n" not in str(err)
    assert err.problems
    for problem in err.problems:
        text = str(problem)
        assert "Traceback" not in text and len(text) < 2000, text


@given(data=bad_topologies())
@fuzz_settings(300)
def test_a_bad_topology_is_refused_field_by_field(data: dict[str, Any]) -> None:
    try:
        parse_topology(data, "t.yaml")
    except TopologyError as err:
        _check("t.yaml", err)
        # a problem with a part of the file names that part (the whole file has no field)
        if data != DEFAULT and isinstance(data, dict):
            assert any(str(p).split(":", 1)[0].strip() for p in err.problems), err.details()


def _write(tmp: Path, text: str | bytes, name: str = "t.yaml") -> Path:
    path = tmp / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _laughs(levels: int, width: int) -> str:
    lines = ['a0: &a0 ["lol"]']
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    lines.append(f"version: 1\nhosts: *a{levels - 1}")
    return "\n".join(lines)


RAW: dict[str, str | bytes] = {
    "binary": b"\x00\xff\xfe\x01 version: 1",
    "not-utf8": "version: 1\nhosts: [{name: \udcff}]".encode("utf-8", "surrogateescape"),
    "tabs": "version: 1\n\thosts: []",
    "python-tag": "!!python/object/apply:os.system ['true']",
    "billion-laughs": _laughs(9, 10),
    "deep-list": "[" * 5000 + "]" * 5000,
    "deep-map": "{a: " * 3000 + "1" + "}" * 3000,
    "huge-number": "version: 1\nhosts: [{name: a, uuid: " + "9" * 100000 + "}]",
    "a-list": "- 1\n- 2\n",
    "empty": "",
    "json-in-yaml-name": '{"version": 1, "hosts": "kind-worker"}',
}


@pytest.mark.parametrize("name", sorted(RAW))
def test_a_file_that_is_no_topology_is_one_clear_error(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, RAW[name])
    with pytest.raises(TopologyError) as caught:
        load_topology(path)
    _check(str(path), caught.value)


def _writable(data: dict[str, Any]) -> bool:
    """Whether YAML and JSON can write it (not an integer of 5,000 digits: RAW has one as text)."""
    try:
        json.dumps(data, default=str)
        yaml.safe_dump(data)
    except ValueError:
        return False
    return True


@given(data=bad_topologies().filter(_writable), form=st.sampled_from(["yaml", "json"]))
@fuzz_settings(4)
def test_validate_and_serve_refuse_a_bad_topology_without_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, data: dict[str, Any], form: str
) -> None:
    tmp = tmp_path_factory.mktemp("topology")
    try:
        parse_topology(data, "t")
    except TopologyError:
        pass
    else:
        data = {**data, "version": 2}  # every run exercises a refusal
    text = json.dumps(data, default=str) if form == "json" else yaml.safe_dump(data)
    path = _write(tmp, text, f"t.{form}")
    for args in (
        ["emulator", "topology", "validate", str(path)],
        [
            "emulator",
            "serve",
            "--topology",
            str(path),
            "--state-dir",
            str(tmp / "state"),
            "--insecure-no-auth",
        ],
    ):
        done = procs.run(args)
        output = done.stdout + done.stderr
        assert done.returncode == 1, output
        assert "Traceback" not in output, output
        assert str(path) in output, output
    # serve ends with one error line naming the file and the first field (after the full list)
    assert done.stderr.strip().splitlines()[-1].startswith(f"fabric-dra: error: topology {path}: "), (
        done.stderr
    )


@pytest.mark.parametrize("name", ["billion-laughs", "binary", "deep-map"])
def test_serve_refuses_raw_bad_files_with_one_error_line(tmp_path: Path, name: str) -> None:
    path = _write(tmp_path, RAW[name])
    done = procs.run(
        [
            "emulator",
            "serve",
            "--topology",
            str(path),
            "--state-dir",
            str(tmp_path / "state"),
            "--insecure-no-auth",
        ]
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith(f"fabric-dra: error: topology {path}: "), (
        done.stderr
    )
