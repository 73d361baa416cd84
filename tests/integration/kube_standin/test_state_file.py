"""--state-file: a restarted server keeps its objects and resourceVersions; old watches get 410."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from plumbing.kube import Gone, Invalid
from plumbing.kube.resources import CONFIGMAPS, RESOURCE_SLICES, Resource
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


def _budget_crd() -> dict[str, object]:
    path = Path(__file__).resolve().parents[3] / "deploy" / "base" / "devicebudget-crd.yaml"
    crd: dict[str, object] = yaml.safe_load(path.read_text())
    return crd


async def test_crds_and_their_objects_survive_a_restart(tmp_path: Path) -> None:
    crds = Resource(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
    )
    budgets = Resource("fabric-dra.io", "v1alpha1", "devicebudgets", "DeviceBudget", True)
    crd = _budget_crd()
    budget = {
        "metadata": {"name": "kept", "namespace": "default"},
        "spec": {"tree": {"label": {"key": "t"}}, "limits": {"gpuMemory": "80Gi"}},
    }
    state = tmp_path / "state.json"
    with start_apiserver(tmp_path / "first", state_file=state) as first:
        async with first.client() as kube:
            await kube.create(crds, crd)
            kept = await kube.create(budgets, budget)
    with start_apiserver(tmp_path / "second", state_file=state) as second:
        async with second.client() as kube:
            assert await kube.get(budgets, "kept", "default") == kept
            with pytest.raises(Invalid, match="must be a positive quantity"):
                await kube.patch(budgets, "kept", {"spec": {"limits": {"gpuMemory": "0"}}}, "default")
