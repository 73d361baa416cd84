"""--state-file: a restarted server keeps its objects and resourceVersions; old watches get 410."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing.kube import Gone
from plumbing.kube.resources import CONFIGMAPS, RESOURCE_SLICES
from tests.support.apiserver import start_apiserver
from tests.unit.kube_standin.objects import resource_slice


async def test_objects_survive_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    with start_apiserver(tmp_path / "first", state_file=state) as first:
        async with first.client() as kube:
            piece = await kube.create(RESOURCE_SLICES, resource_slice("kept", devices=3))
            await kube.create(CONFIGMAPS, {"metadata": {"name": "kept", "namespace": "default"}})
            listed = await kube.list(CONFIGMAPS, "default")
    assert first.process.proc is not None and first.process.proc.returncode == 0
    with start_apiserver(tmp_path / "second", state_file=state) as second:
        async with second.client() as kube:
            again = await kube.get(RESOURCE_SLICES, "kept")
            assert again == piece
            after = await kube.create(CONFIGMAPS, {"metadata": {"name": "new", "namespace": "default"}})
            assert int(after["metadata"]["resourceVersion"]) > int(listed["metadata"]["resourceVersion"])
            with pytest.raises(Gone):
                async for _ in kube.watch(
                    CONFIGMAPS, "default", resource_version=piece["metadata"]["resourceVersion"]
                ):
                    pass
