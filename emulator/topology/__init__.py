"""Emulated fabric topologies: the file format, its checks, the shipped default and a generator.

>>> index = load_topology(default_topology_path())
>>> sorted(index.hosts)[:2]
['kind-worker', 'kind-worker2']
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from emulator.errors import ConfigError
from emulator.topology.index import (
    FABRIC_CXL,
    FABRIC_PCIE,
    Chunk,
    Device,
    FabricIndex,
    HostInfo,
    Problem,
    SwitchInfo,
    Target,
    check_references,
)
from emulator.topology.model import Topology

__all__ = [
    "FABRIC_CXL",
    "FABRIC_PCIE",
    "PRESETS",
    "Chunk",
    "Device",
    "FabricIndex",
    "HostInfo",
    "Problem",
    "SwitchInfo",
    "Target",
    "Topology",
    "TopologyError",
    "default_topology_path",
    "load_topology",
    "parse_topology",
    "preset_path",
    "resolve_topology",
]

#: topologies shipped with the package, by name: ``--topology NAME`` where no file has that name
PRESETS = ("default", "cascade-2tier", "cascade-3tier")


class TopologyError(ConfigError):
    """A topology file that cannot be used; ``problems`` name each field and what is wrong.

    ``positions`` (parallel to ``problems``, filled by :func:`load_topology`) hold the line and
    column in the file where each problem's field is, when the file says; ``schema_only`` is true
    when the file's shape was wrong, so the checks between sections (references, duplicates) have
    not run yet."""

    def __init__(self, source: str, problems: list[Problem], *, schema_only: bool = False) -> None:
        self.source = source
        self.problems = problems
        self.positions: list[tuple[int, int] | None] = [None] * len(problems)
        self.schema_only = schema_only
        first = problems[0] if problems else Problem("", "invalid")
        more = (
            f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
            if len(problems) > 1
            else ""
        )
        super().__init__(f"topology {source}: {first}{more}")

    def details(self) -> str:
        """One line per problem, ``  FILE:LINE:COLUMN: field: what`` where the file has the field."""
        lines = []
        for problem, position in zip(self.problems, self.positions, strict=True):
            where = f"{self.source}:{position[0]}:{position[1]}: " if position else ""
            lines.append(f"  {where}{problem}")
        if self.schema_only:
            lines.append(
                "  (the references between hosts, models and devices are checked once these are fixed)"
            )
        return "\n".join(lines)


def default_topology_path() -> Path:
    """The topology shipped with the package: 4 kind-style hosts, 2 PCIe switches, a CXL pool."""
    return Path(str(resources.files("emulator.topology").joinpath("default.yaml")))


def preset_path(name: str) -> Path:
    """The packaged topology ``name`` (one of :data:`PRESETS`)."""
    if name not in PRESETS:
        raise ValueError(f"no topology preset {name!r} (presets: {', '.join(PRESETS)})")
    return Path(str(resources.files("emulator.topology").joinpath(f"{name}.yaml")))


def resolve_topology(value: str | Path) -> Path:
    """A topology file's path: ``value`` itself, or the preset of that name where no such file
    exists (a file in the working directory named like a preset wins). A bare name may come here
    made absolute against the working directory, as the command line makes paths."""
    path = Path(value)
    bare = path.parent in (Path("."), Path.cwd())
    if not path.exists() and bare and path.name in PRESETS:
        return preset_path(path.name)
    return path


def _loc(parts: tuple[int | str, ...]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def parse_topology(data: Any, source: str = "<data>") -> FabricIndex:
    """Validate already-decoded YAML/JSON and index it; raises :class:`TopologyError`."""
    if not isinstance(data, dict):
        raise TopologyError(
            source, [Problem("", "the file must hold a mapping (version, service, hosts, ...)")]
        )
    try:
        topology = Topology.model_validate(data)
    except ValidationError as err:
        problems = [Problem(_loc(e["loc"]), e["msg"]) for e in err.errors(include_url=False)]
        raise TopologyError(source, problems, schema_only=True) from None
    problems = check_references(topology)
    if problems:
        raise TopologyError(source, problems)
    return FabricIndex.build(topology)


def load_topology(path: str | Path) -> FabricIndex:
    """Read a topology file (YAML or JSON) and index it; raises :class:`TopologyError`."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise TopologyError(source, [Problem("", f"cannot read the file: {err.strerror or err}")]) from None
    except UnicodeDecodeError as err:
        raise TopologyError(
            source, [Problem("", f"not UTF-8 text: byte {err.object[err.start]:#04x} at offset {err.start}")]
        ) from None
    try:
        data = json.loads(text) if source.endswith(".json") else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as err:
        where = ""
        mark = getattr(err, "problem_mark", None)
        if mark is not None:
            where = f"line {mark.line + 1}, column {mark.column + 1}: "
        elif isinstance(err, json.JSONDecodeError):
            where = f"line {err.lineno}, column {err.colno}: "
        reason = getattr(err, "problem", None) or getattr(err, "msg", None) or str(err)
        raise TopologyError(source, [Problem("", f"not valid YAML/JSON: {where}{reason}")]) from None
    except RecursionError:
        too_deep = Problem("", "not a topology: lists or mappings nested too deeply")
        raise TopologyError(source, [too_deep]) from None
    except ValueError as err:  # e.g. a number of more digits than Python converts
        raise TopologyError(source, [Problem("", f"not a topology: {err}")]) from None
    try:
        return parse_topology(data, source)
    except TopologyError as err:
        err.positions = _positions(text, [p.loc for p in err.problems])
        raise


_LOC_PART = re.compile(r"\[(\d+)\]|([^.\[\]]+)")


def _positions(text: str, locs: list[str]) -> list[tuple[int, int] | None]:
    """Line and column (1-based) of each dotted field path in the YAML/JSON ``text``: the deepest
    node of the path the file has (a missing field: its parent mapping). Walks only each path,
    never the whole tree, so aliases cannot make it expensive."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError, ValueError):
        return [None] * len(locs)
    found: list[tuple[int, int] | None] = []
    for loc in locs:
        node = root
        if node is None or not loc:
            found.append(None)
            continue
        for index, key in _LOC_PART.findall(loc):
            child = None
            if index and isinstance(node, yaml.SequenceNode) and int(index) < len(node.value):
                child = node.value[int(index)]
            elif key and isinstance(node, yaml.MappingNode):
                child = next((v for k, v in node.value if k.value == key), None)
            if child is None:
                break
            node = child
        found.append((node.start_mark.line + 1, node.start_mark.column + 1))
    return found
