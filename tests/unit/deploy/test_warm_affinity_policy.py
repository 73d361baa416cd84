"""deploy/components/warm-affinity: the MutatingAdmissionPolicy that adds docs/manager.md's
warm-device recipe to pods.

The stand-in API server does not evaluate admission CEL, so this checks the manifest only: its
kinds and versions, what it matches, the schema of every supported Kubernetes (v1 from 1.36,
v1beta1 with the same fields before), and that the term its JSON patch adds is the recipe
(:func:`dra_driver.controller.slices.warm_node_preference`) — in particular that it names the
label key the controller writes (:func:`dra_driver.controller.resourcenames.warm_label_key`)."""

from __future__ import annotations

import copy
import re
from typing import Any

import kubernetes_validate
import pytest

from dra_driver.controller.resourcenames import warm_label_key
from dra_driver.controller.slices import warm_node_preference
from tests.support.deploy import DEPLOY_DIR, DRIVER_NAME, KUBERNETES_VERSIONS, load_yaml_documents

POLICY = DEPLOY_DIR / "components" / "warm-affinity" / "warm-affinity-policy.yaml"
#: Kubernetes serves MutatingAdmissionPolicy as v1 from 1.36 (KEP-3962: beta in 1.34, GA in 1.36)
V1_FROM = "1.36"


def _documents() -> tuple[dict[str, Any], dict[str, Any]]:
    policy, binding = load_yaml_documents(POLICY.read_text())
    return policy, binding


def test_the_policy_mutates_pod_creation_and_its_binding_names_it() -> None:
    policy, binding = _documents()
    assert (policy["apiVersion"], policy["kind"]) == (
        "admissionregistration.k8s.io/v1",
        "MutatingAdmissionPolicy",
    )
    assert (binding["apiVersion"], binding["kind"]) == (
        "admissionregistration.k8s.io/v1",
        "MutatingAdmissionPolicyBinding",
    )
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    spec = policy["spec"]
    # steering is a preference: an error in the policy must never keep a pod from being created
    assert spec["failurePolicy"] == "Ignore"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
    ]
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    assert "object.spec.resourceClaims.size() > 0" in conditions["claims-devices"]
    (mutation,) = spec["mutations"]
    # the preferred terms are an atomic list: an apply configuration would replace the pod's own
    assert mutation["patchType"] == "JSONPatch"
    patch = mutation["jsonPatch"]["expression"]
    # every shape of pod gets the term added, none replaced
    for path in (
        "/spec/affinity",
        "/spec/affinity/nodeAffinity",
        "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution",
        "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution/-",
    ):
        assert f'path: "{path}"' in re.sub(r"\s+", " ", patch), path
    assert re.findall(r'op: "(\w+)"', patch) == ["add"] * 4
    assert patch.count("variables.term") == 4


def test_the_term_it_adds_is_the_recipe_with_the_controllers_label_key() -> None:
    policy, _ = _documents()
    (term,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "term"]
    recipe = warm_node_preference(DRIVER_NAME, "gpu")
    (requirement,) = recipe["preference"]["matchExpressions"]
    assert requirement["key"] == warm_label_key(DRIVER_NAME, "gpu")
    # under NodeRestriction's namespace: no kubelet can set it on its own Node (docs/controller.md)
    assert requirement["key"] == "warm.fabric-dra.io.node-restriction.kubernetes.io/gpu"
    flat = re.sub(r"\s+", " ", term)
    assert f"weight: {recipe['weight']}," in flat
    (found,) = re.findall(r'key: "([^"]+)", operator: "(\w+)", values: \["([^"]*)"\]', flat)
    assert found == (requirement["key"], requirement["operator"], requirement["values"][0])
    # the already-steered check looks for the same key, and no other warm key (nor the key of
    # releases before NodeRestriction's namespace, which a kubelet may set) appears anywhere
    text = POLICY.read_text()
    assert set(re.findall(r"warm\.fabric-dra\.io[\w.-]*/[\w.-]+", text)) == {requirement["key"]}
    conditions = {c["name"]: c["expression"] for c in policy["spec"]["matchConditions"]}
    assert f'r.key == "{requirement["key"]}"' in conditions["not-already-steered"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_the_manifest_validates_as_each_version_serves_it(version: str) -> None:
    """v1 where served (1.36 on); before, the v1beta1 the comment tells to switch to, unchanged."""
    for obj in _documents():
        served = copy.deepcopy(obj)
        if tuple(map(int, version.split("."))) < tuple(map(int, V1_FROM.split("."))):
            served["apiVersion"] = "admissionregistration.k8s.io/v1beta1"
        kubernetes_validate.validate(served, version, strict=True)


def test_strict_validation_catches_a_misspelt_field() -> None:
    policy, _ = _documents()
    bad = copy.deepcopy(policy)
    bad["spec"]["mutations"][0]["jsonpatch"] = bad["spec"]["mutations"][0].pop("jsonPatch")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, V1_FROM, strict=True)
