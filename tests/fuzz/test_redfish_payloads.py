"""Whole discovery passes over DMTF's own mockups (public-cxl, public-composability) served by a
real HTTP server, with hostile edits: a property of any resource replaced by a value of the wrong
type, a hostile string or a deeply nested one, removed (``@odata.id``, ``Members``, ``Links``,
``Id``...), collections whose ``Members@odata.nextLink`` points back at themselves, members that
are no links, whole resources replaced by bytes that are no JSON object.

A pass ends in a snapshot or a :class:`FabricError` — never another exception (which would stop
the manager's inventory loop for good) and never a hang. The mockups are read from the DMTF
bundle (``FABRIC_DRA_REDFISH_DIR``), never copied here.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fabric.backends.discovery import Discovery
from fabric.redfish.client import RedfishClient, RedfishSettings
from manager_api.errors import FabricError
from tests.fuzz.budget import fuzz_settings
from tests.fuzz.strategies import hostile_text, json_values
from tests.support.fabric_http import Reply, Request, ScriptedServer

# Deeply nested bodies make Hypothesis warn that their repr is large; that is the point.
pytestmark = [
    pytest.mark.slow(seconds=62),
    pytest.mark.filterwarnings("ignore::hypothesis.errors.HypothesisWarning"),
]

HANG = 30.0


def _load(root: Path) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for index in root.rglob("index.json"):
        relative = index.parent.relative_to(root).as_posix()
        uri = "/redfish/v1" + ("" if relative == "." else f"/{relative}")
        tree[uri] = json.loads(index.read_text())
    return tree


class Mutated:
    """A mockup tree with edits, served read-only; each example sets new edits."""

    def __init__(self, trees: dict[str, dict[str, Any]]) -> None:
        self.trees = trees
        self.tree: dict[str, Any] = {}
        self.raw: dict[str, bytes] = {}

    def __call__(self, request: Request) -> Reply:
        path = request.path.split("?", 1)[0].rstrip("/")
        if request.method != "GET":
            return Reply(405, {}, {"Allow": "GET"})
        if path == "/redfish":
            return Reply(200, {"v1": "/redfish/v1/"})
        if path in self.raw:
            return Reply(200, self.raw[path])
        if path in self.tree:
            return Reply(200, self.tree[path])
        return Reply(404, {"error": {"code": "Base.1.22.0.ResourceNotFound", "message": path}})


@pytest.fixture(scope="module")
def mockups(redfish_dir: Path) -> dict[str, dict[str, Any]]:
    return {name: _load(redfish_dir / "mockups" / name) for name in ("public-cxl", "public-composability")}


@pytest.fixture(scope="module")
def served(mockups: dict[str, dict[str, Any]]) -> Iterator[tuple[Mutated, ScriptedServer]]:
    mutated = Mutated(mockups)
    with ScriptedServer(mutated) as server:
        yield mutated, server


@pytest.fixture(scope="module")
def read_by_a_pass(
    served: tuple[Mutated, ScriptedServer], mockups: dict[str, dict[str, Any]]
) -> dict[str, list[str]]:
    """The resources a clean pass over each mockup reads: where edits matter."""
    mutated, server = served
    read: dict[str, list[str]] = {}
    for name, tree in mockups.items():
        mutated.tree, mutated.raw = tree, {}
        before = len(server.requests)
        _scan(server.url)
        read[name] = sorted({r.path.split("?", 1)[0].rstrip("/") for r in server.requests[before:]})
    return read


def _paths(value: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    """Every key path into a JSON value, up to a depth."""
    found: list[tuple[Any, ...]] = []
    if depth > 5:
        return found
    if isinstance(value, dict):
        for key, inner in value.items():
            found.append((*prefix, key))
            found += _paths(inner, (*prefix, key), depth + 1)
    elif isinstance(value, list):
        for index, inner in enumerate(value[:4]):
            found.append((*prefix, index))
            found += _paths(inner, (*prefix, index), depth + 1)
    return found


def _edit(resource: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    """A copy of ``resource`` with the value at ``path`` replaced (or deleted); only the
    containers along the path are copied."""
    copy: Any = dict(resource) if isinstance(resource, dict) else list(resource)
    target = copy
    for step in path[:-1]:
        inner = target[step]
        target[step] = dict(inner) if isinstance(inner, dict) else list(inner)
        target = target[step]
    if delete and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = new
    return copy


new_values = st.one_of(
    json_values,
    hostile_text,
    st.just({"@odata.id": "/redfish/v1"}),
    st.just({"@odata.id": 42}),
    st.just([{"@odata.id": None}, "x", 3]),
    st.integers(100, 900).map(lambda n: json.loads("[" * n + "]" * n)),  # deeper: test_redfish_client
)


#: properties discovery follows or reads: an edit hits one of these most of the time
STRUCTURAL = {
    "@odata.id",
    "Id",
    "Members",
    "Members@odata.nextLink",
    "Links",
    "Systems",
    "Fabrics",
    "CompositionService",
    "Endpoints",
    "Zones",
    "Connections",
    "ConnectedEntities",
    "EntityLink",
    "EntityRole",
    "EntityType",
    "EntityPciId",
    "Identifiers",
    "DurableName",
    "MemoryChunkInfo",
    "MemoryChunk",
    "InitiatorEndpoints",
    "TargetEndpoints",
    "ResourceBlocks",
    "ComputerSystems",
    "CompositionStatus",
    "CompositionState",
    "Status",
    "Health",
    "PCIeDevice",
    "PCIeFunctions",
    "ConnectedPorts",
    "UUID",
    "SerialNumber",
    "ProcessorType",
    "MemoryChunkSizeMiB",
    "CapacityBytes",
    "ProtocolFeaturesSupported",
}


@st.composite
def edits(
    draw: st.DrawFn, tree: dict[str, Any], read: list[str]
) -> tuple[dict[str, Any], dict[str, bytes], list[str]]:
    """Up to four edits of resources a clean pass reads; returns (tree, raw bodies, what was done)."""
    uris = [u for u in read if u in tree] or sorted(tree)
    changed = dict(tree)
    raw: dict[str, bytes] = {}
    done: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        uri = draw(st.sampled_from(uris))
        resource = changed[uri]
        kind = draw(st.sampled_from(["set", "set", "set", "delete", "self-next", "raw"]))
        if kind == "raw":
            raw[uri] = draw(st.sampled_from([b"", b"[]", b"null", b'{"Members": [', b"\xff\xfe"]))
            done.append(f"{uri}: body {raw[uri]!r}")
            continue
        if kind == "self-next" and "Members" in resource:
            changed[uri] = {**resource, "Members@odata.nextLink": uri}
            done.append(f"{uri}: nextLink to itself")
            continue
        paths = _paths(resource)
        if not paths:
            continue
        structural = [p for p in paths if any(step in STRUCTURAL for step in p)]
        path = draw(st.sampled_from(structural if structural and draw(st.integers(0, 9)) < 8 else paths))
        value = draw(new_values)
        changed[uri] = _edit(resource, path, value, delete=kind == "delete")
        done.append(f"{uri}: {kind} {'/'.join(map(str, path))}")
    return changed, raw, done


def _scan(url: str) -> Any:
    async def scenario() -> Any:
        client = RedfishClient(
            RedfishSettings(
                base_url=url,
                auth="none",
                read_timeout=2.0,
                get_attempts=1,
                backoff_initial=0.01,
                max_workers=8,
            )
        )
        try:
            discovery = Discovery(client)
            snapshot = await asyncio.wait_for(discovery.scan(), HANG)
            await asyncio.wait_for(discovery.scan_bindings(), HANG)
            return snapshot
        finally:
            await client.aclose()

    try:
        return asyncio.run(scenario())
    except FabricError as err:
        assert "\n" not in err.message
        return err


@pytest.mark.parametrize("mockup", ["public-cxl", "public-composability"])
def test_the_unedited_mockups_are_discovered(
    served: tuple[Mutated, ScriptedServer], mockups: dict[str, dict[str, Any]], mockup: str
) -> None:
    mutated, server = served
    mutated.tree, mutated.raw = mockups[mockup], {}
    snapshot = _scan(server.url)
    assert not isinstance(snapshot, FabricError), snapshot
    assert snapshot.devices


@pytest.mark.parametrize("mockup", ["public-cxl", "public-composability"])
@given(data=st.data())
@fuzz_settings(60)
def test_a_discovery_pass_over_an_edited_mockup_ends_in_a_snapshot_or_a_fabric_error(
    served: tuple[Mutated, ScriptedServer],
    mockups: dict[str, dict[str, Any]],
    read_by_a_pass: dict[str, list[str]],
    mockup: str,
    data: st.DataObject,
) -> None:
    mutated, server = served
    tree, raw, done = data.draw(edits(mockups[mockup], read_by_a_pass[mockup]), label="edits")
    mutated.tree, mutated.raw = tree, raw
    try:
        _scan(server.url)
    except TimeoutError:  # pragma: no cover - a failure
        pytest.fail(f"discovery hung after {done}")
