"""Every overlay renders, and every object it renders is valid for each supported Kubernetes.

Validation uses the official OpenAPI-derived JSON schemas shipped in ``kubernetes-validate``,
strict (unknown fields are errors), for Kubernetes 1.34 to 1.37.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from packaging.version import Version

from tests.support.deploy import (
    ARTICLE_MANIFESTS,
    COMPOSITIONS,
    KUBERNETES_VERSIONS,
    OVERLAYS_DIR,
    SHARING_MANIFESTS,
    component_names,
    load_yaml_documents,
    overlay_names,
    overlay_params,
    render_target,
)

#: Kinds that a Kubernetes version serves only from some minor on: (apiVersion, kind) → first
#: minor. Objects of such a kind are checked only against versions that serve it, and the test
#: says so. Every other kind fabric-dra renders exists in all supported versions (the
#: ValidatingAdmissionPolicy API is GA since 1.30, resource.k8s.io/v1 since 1.34); a kind that is
#: missing from a version's schemas and not listed here fails the test. The optional warm-affinity
#: component's MutatingAdmissionPolicy is v1 from 1.36 (v1beta1 before: test_warm_affinity_policy).
SERVED_FROM: dict[tuple[str, str], str] = {
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicy"): "1.36",
    ("admissionregistration.k8s.io/v1", "MutatingAdmissionPolicyBinding"): "1.36",
}
#: Custom resources Kubernetes has no schema for: the monitoring component's PrometheusRule, which
#: tests/unit/monitoring checks with promtool instead, and its ServiceMonitor (test_servicemonitor.py).
CUSTOM_RESOURCE_GROUPS = ("monitoring.coreos.com/",)


def test_every_expected_overlay_exists() -> None:
    assert {"kind", "binding-conditions", "production"} <= set(overlay_names())
    assert {
        "emulator",
        "real-hosts",
        "binding-conditions",
        "plugin-scheduling",
        "critical-priority-quota",
        "selinux",
        "warm-affinity",
    } <= set(component_names())


def test_every_component_is_rendered_somewhere() -> None:
    """A component no overlay or composition uses would go unchecked by every test here."""
    used: set[str] = {c for _, components in COMPOSITIONS.values() for c in components}
    for overlay in overlay_names():
        kustomization = yaml.safe_load((OVERLAYS_DIR / overlay / "kustomization.yaml").read_text())
        used |= {Path(c).name for c in kustomization.get("components", [])}
    assert used == set(component_names())


@pytest.mark.parametrize("overlay", overlay_params())
def test_overlay_renders(overlay: str, kustomize: list[str]) -> None:
    objects = render_target(overlay)
    kinds = {o["kind"] for o in objects}
    assert {"DaemonSet", "Deployment", "DeviceClass", "ValidatingAdmissionPolicy"} <= kinds, kinds


def _unique(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drop objects that are byte-for-byte the same as an earlier one (shared by overlays)."""
    seen: set[str] = set()
    unique = []
    for obj in objects:
        key = json.dumps(obj, sort_keys=True)
        if key not in seen:
            seen.add(key)
            unique.append(obj)
    return unique


def _validate_all(objects: list[dict[str, Any]], version: str) -> list[str]:
    problems = []
    for obj in objects:
        name = f"{obj['apiVersion']} {obj['kind']} {obj['metadata'].get('name')}"
        if obj["apiVersion"].startswith(CUSTOM_RESOURCE_GROUPS):
            continue
        first = SERVED_FROM.get((obj["apiVersion"], obj["kind"]))
        if first is not None and Version(version) < Version(first):
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            problems.append(f"{name}: {path}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"{name}: {err.message}")
    return problems


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_objects_validate_strict(
    version: str, rendered_overlays: dict[str, list[dict[str, Any]]]
) -> None:
    objects = _unique([o for objs in rendered_overlays.values() for o in objs])
    assert len(objects) > 20
    assert _validate_all(objects, version) == []


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_article_manifests_validate_strict(version: str) -> None:
    for path in ARTICLE_MANIFESTS.values():
        objects = load_yaml_documents(path.read_text())
        assert [o["kind"] for o in objects] == ["ResourceClaimTemplate", "Deployment"], path
        assert _validate_all(objects, version) == [], path


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_sharing_manifests_validate_strict(version: str) -> None:
    """Their fields exist in every supported release's schema; which releases keep them (1.36's
    gates) is tests/unit/deploy/test_sharing_manifests.py's."""
    for path in SHARING_MANIFESTS.values():
        objects = load_yaml_documents(path.read_text())
        assert {o["kind"] for o in objects} == {"ResourceClaim", "Pod"}, path
        assert _validate_all(objects, version) == [], path


def test_strict_validation_rejects_what_the_api_server_would() -> None:
    """The validator in use really is strict: a misspelt field fails, a right one passes."""
    good: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "x"},
        "spec": {"selectors": [{"cel": {"expression": "true"}}]},
    }
    assert _validate_all([good], KUBERNETES_VERSIONS[0]) == []
    bad = json.loads(json.dumps(good))
    bad["spec"]["selectors"][0]["cell"] = bad["spec"]["selectors"][0].pop("cel")
    assert _validate_all([bad], KUBERNETES_VERSIONS[0]) != []
