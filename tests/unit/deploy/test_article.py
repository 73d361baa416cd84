"""The composable-DRA article's manifest, as e2e.sh applies it, differs from what the article
wrote only where a resource.k8s.io version requires it.

The article itself (seeds/composable-dra-article.txt beside the repository, like the DMTF files;
set FABRIC_DRA_SEEDS_DIR elsewhere) is read when present; without it the comparison is skipped and
the checks against the names the article uses still run.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.support.deploy import ARTICLE_MANIFESTS, DEPLOY_DIR, REPO_ROOT, load_yaml_documents, render

Obj = dict[str, Any]


def _seeds_dir() -> Path:
    return Path(os.environ.get("FABRIC_DRA_SEEDS_DIR", REPO_ROOT.parent / "shared" / "seeds"))


@pytest.fixture(scope="module")
def article_objects() -> list[Obj]:
    path = _seeds_dir() / "composable-dra-article.txt"
    if not path.is_file():
        pytest.skip(f"the article is not at {path} (set FABRIC_DRA_SEEDS_DIR)")
    text = path.read_text()
    # The manifest runs from its first apiVersion line to the line before the next heading.
    match = re.search(r"^apiVersion: resource\.k8s\.io/.*?(?=^How to Verify)", text, re.MULTILINE | re.DOTALL)
    assert match, "the article's manifest was not found in the article"
    objects = load_yaml_documents(match.group(0))
    assert [o["kind"] for o in objects] == ["ResourceClaimTemplate", "Deployment"]
    return objects


def _ours(version: str) -> list[Obj]:
    return load_yaml_documents(ARTICLE_MANIFESTS[version].read_text())


def test_v1beta1_variant_changes_only_the_api_version(article_objects: list[Obj]) -> None:
    expected = copy.deepcopy(article_objects)
    expected[0]["apiVersion"] = "resource.k8s.io/v1beta1"
    assert _ours("v1beta1") == expected


def test_v1_variant_changes_the_api_version_and_moves_the_class_under_exactly(
    article_objects: list[Obj],
) -> None:
    expected = copy.deepcopy(article_objects)
    expected[0]["apiVersion"] = "resource.k8s.io/v1"
    for request in expected[0]["spec"]["spec"]["devices"]["requests"]:
        request["exactly"] = {"deviceClassName": request.pop("deviceClassName")}
    assert _ours("v1") == expected


@pytest.mark.parametrize("version", sorted(ARTICLE_MANIFESTS))
def test_article_names_are_kept(version: str) -> None:
    template, deployment = _ours(version)
    assert template["metadata"] == {"name": "cohdi-accelerator-template", "namespace": "agent-platform"}
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["name"] == "dedicated-accelerator"
    assert deployment["metadata"] == {"name": "agent-inference-worker", "namespace": "agent-platform"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["resourceClaims"] == [
        {"name": "accelerator-claim", "resourceClaimTemplateName": "cohdi-accelerator-template"}
    ]
    (container,) = pod["containers"]
    assert container["image"] == "agent-runner:latest"
    assert container["resources"] == {"claims": [{"name": "accelerator-claim"}]}


def test_the_article_class_is_deployed(kustomize: list[str]) -> None:
    template = _ours("v1")[0]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    class_name = request["exactly"]["deviceClassName"]
    objects = render(DEPLOY_DIR / "overlays" / "kind")
    assert any(o["kind"] == "DeviceClass" and o["metadata"]["name"] == class_name for o in objects)
