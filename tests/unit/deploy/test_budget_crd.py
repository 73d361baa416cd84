"""The DeviceBudget CRD (deploy/base/devicebudget-crd.yaml) against the files it must agree with:
its DeviceClass enum is the classes deploy/base ships, and the API test server's CRD rules (those
of apiextensions-apiserver) accept it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kube_standin.apiserver.convert import apply_defaults
from kube_standin.apiserver.customresources.definitions import validate_crd
from kube_standin.apiserver.customresources.served import CRDS, resource_of
from plumbing import DEFAULT_DRIVER_NAME

DEPLOY = Path(__file__).resolve().parents[3] / "deploy" / "base"


def _crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load((DEPLOY / "devicebudget-crd.yaml").read_text())
    return crd


def _limits_schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    limits: dict[str, Any] = schema["properties"]["spec"]["properties"]["limits"]
    return limits


def test_the_device_class_enum_is_the_classes_deploy_base_ships() -> None:
    shipped = [
        doc["metadata"]["name"]
        for doc in yaml.safe_load_all((DEPLOY / "deviceclasses.yaml").read_text())
        if doc and doc.get("kind") == "DeviceClass"
    ]
    enum = _limits_schema(_crd())["properties"]["devices"]["items"]["properties"]["deviceClassName"]["enum"]
    assert sorted(enum) == sorted(shipped)


def test_the_crd_is_in_the_driver_group_and_in_the_base_kustomization() -> None:
    crd = _crd()
    assert crd["spec"]["group"] == DEFAULT_DRIVER_NAME
    assert crd["metadata"]["name"] == f"devicebudgets.{DEFAULT_DRIVER_NAME}"
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert "devicebudget-crd.yaml" in kustomization["resources"]


def test_the_api_server_rules_accept_the_crd_and_serve_its_names() -> None:
    crd = _crd()
    apply_defaults(CRDS, crd)
    assert validate_crd(crd) == []
    res = resource_of(crd)
    assert (res.group, res.plural, res.singular, res.kind) == (
        DEFAULT_DRIVER_NAME,
        "devicebudgets",
        "devicebudget",
        "DeviceBudget",
    )
    assert res.short_names == ("devbudget",)
    assert res.namespaced and res.status_subresource and res.versions == ("v1alpha1",)


def test_every_string_and_list_under_a_rule_is_bounded() -> None:
    """The real server's CEL cost estimator needs a maxLength/maxItems on whatever a rule walks; the
    API test server does not estimate costs, so this checks the bound is written down."""

    def walk(node: dict[str, Any], path: str, under_rule: bool) -> list[str]:
        under_rule = under_rule or bool(node.get("x-kubernetes-validations"))
        missing = []
        if under_rule and node.get("type") == "string" and "maxLength" not in node and "enum" not in node:
            missing.append(path)
        if under_rule and node.get("type") == "array" and "maxItems" not in node:
            missing.append(path)
        for name, sub in (node.get("properties") or {}).items():
            missing += walk(sub, f"{path}.{name}", under_rule)
        if isinstance(node.get("items"), dict):
            missing += walk(node["items"], f"{path}[]", under_rule)
        return missing

    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert walk(schema, "", False) == []
