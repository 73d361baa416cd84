"""CustomResourceDefinitions on the API test server, as strict as kube-apiserver: the DeviceBudget
CRD of deploy/base is accepted and served, good budgets read back with their defaults, and each
malformed budget is refused at write with the real server's Status (field, reason, message)."""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from plumbing.kube import ApiError, Invalid, KubeClient, NotFound
from plumbing.kube.resources import NAMESPACES, Resource
from tests.support.apiserver import ApiServerProcess, start_apiserver

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "deploy" / "base" / "devicebudget-crd.yaml"

CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
BUDGETS = Resource("fabric-dra.io", "v1alpha1", "devicebudgets", "DeviceBudget", True)
WIDGETS = Resource("example.com", "v1", "widgets", "Widget", True)
NS = "default"


def budget_crd() -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(CRD_FILE.read_text())
    return crd


def widget_crd() -> dict[str, Any]:
    """A small CRD with what DeviceBudget does not use: a transition rule, messageExpression,
    reason and fieldPath, a map list, a nested default, preserved unknown fields."""
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "size": {
                        "type": "string",
                        "maxLength": 16,
                        "x-kubernetes-validations": [
                            {
                                "rule": "self == oldSelf",
                                "message": "size is immutable",
                                "reason": "FieldValueForbidden",
                            }
                        ],
                    },
                    "replicas": {"type": "integer", "maximum": 5, "default": 1},
                    "ports": {
                        "type": "array",
                        "maxItems": 4,
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["name"],
                        "items": {
                            "type": "object",
                            "required": ["name"],
                            "properties": {
                                "name": {"type": "string", "maxLength": 15},
                                "protocol": {"type": "string", "enum": ["TCP", "UDP"], "default": "TCP"},
                            },
                        },
                    },
                    "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
                "x-kubernetes-validations": [
                    {
                        "rule": "!has(self.replicas) || self.replicas != 4",
                        "messageExpression": "'replicas may not be ' + string(self.replicas)",
                        "fieldPath": ".replicas",
                    }
                ],
            },
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Widget", "plural": "widgets"},
            "scope": "Namespaced",
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }


@pytest.fixture(scope="module")
def crd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    """One server for the module, with the DeviceBudget and Widget CRDs created."""
    with start_apiserver(tmp_path_factory.mktemp("crd-apiserver")) as server:
        with server.http() as http:
            for crd in (budget_crd(), widget_crd()):
                created = http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", json=crd)
                assert created.status_code == 201, created.text
        yield server


@pytest_asyncio.fixture
async def kube(crd_server: ApiServerProcess) -> AsyncIterator[KubeClient]:
    async with crd_server.client() as client:
        yield client


def budget(name: str, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tree": {"label": {"key": "agents.example.com/tree", "value": "task-847"}},
        "limits": {"devices": [{"deviceClassName": "fabric-gpu", "max": 3}]},
    }
    body.update(spec)
    return {
        "apiVersion": "fabric-dra.io/v1alpha1",
        "kind": "DeviceBudget",
        "metadata": {"name": name},
        "spec": body,
    }


# -- the CRD ----------------------------------------------------------------------------------------


async def test_the_budget_crd_is_established_and_served_in_discovery(kube: KubeClient) -> None:
    crd = await kube.get(CRDS, "devicebudgets.fabric-dra.io")
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}
    assert crd["status"]["storedVersions"] == ["v1alpha1"]
    assert crd["status"]["acceptedNames"]["shortNames"] == ["devbudget"]
    groups = await kube.request("GET", "/apis")
    assert {
        "name": "fabric-dra.io",
        "versions": [{"groupVersion": "fabric-dra.io/v1alpha1", "version": "v1alpha1"}],
        "preferredVersion": {"groupVersion": "fabric-dra.io/v1alpha1", "version": "v1alpha1"},
    } in groups["groups"]
    group = await kube.request("GET", "/apis/fabric-dra.io")
    assert group["preferredVersion"]["version"] == "v1alpha1"
    listing = await kube.request("GET", "/apis/fabric-dra.io/v1alpha1")
    by_name = {r["name"]: r for r in listing["resources"]}
    assert by_name["devicebudgets"]["kind"] == "DeviceBudget"
    assert by_name["devicebudgets"]["namespaced"] is True
    assert by_name["devicebudgets"]["shortNames"] == ["devbudget"]
    assert by_name["devicebudgets/status"]["verbs"] == ["get", "patch", "update"]
    crds, _ = await kube.list_all(CRDS)
    assert {c["metadata"]["name"] for c in crds} >= {"devicebudgets.fabric-dra.io", "widgets.example.com"}


def _crd_with(**changes: Any) -> dict[str, Any]:
    crd = widget_crd()
    crd["metadata"]["name"] = "gadgets.example.com"
    crd["spec"]["names"] = {"kind": "Gadget", "plural": "gadgets"}
    for path, value in changes.items():
        node: Any = crd
        keys = path.split("__")
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[keys[-1]] = value
    return crd


_SCHEMA = "spec.versions[0].schema.openAPIV3Schema"


@pytest.mark.parametrize(
    ("crd", "field", "message"),
    [
        (
            _crd_with(metadata__name="gadget.example.com"),
            "metadata.name",
            'Invalid value: "gadget.example.com": must be spec.names.plural+"."+spec.group',
        ),
        (
            _crd_with(
                spec__versions=[
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object"}},
                    },
                    {
                        "name": "v2",
                        "served": True,
                        "storage": True,
                        "schema": {"openAPIV3Schema": {"type": "object"}},
                    },
                ]
            ),
            "spec.versions",
            "must have exactly one version marked as storage version",
        ),
        (
            _crd_with(
                spec__versions__0__schema={"openAPIV3Schema": {"type": "object", "properties": {"spec": {}}}}
            ),
            f"{_SCHEMA}.properties[spec].type",
            "Required value: must not be empty for specified object fields",
        ),
        (
            _crd_with(
                spec__versions__0__schema={
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {
                                "type": "object",
                                "properties": {"a": {"type": "string"}},
                                "additionalProperties": {"type": "string"},
                            }
                        },
                    }
                }
            ),
            f"{_SCHEMA}.properties[spec].additionalProperties",
            "Forbidden: additionalProperties and properties are mutual exclusive",
        ),
        (
            _crd_with(spec__versions__0__schema={"openAPIV3Schema": {"type": "string"}}),
            f"{_SCHEMA}.type",
            'Invalid value: "string": must be object',
        ),
        (
            _crd_with(
                spec__versions__0__schema={
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-validations": [{"rule": "self.a ==", "message": "m"}],
                    }
                }
            ),
            f"{_SCHEMA}.x-kubernetes-validations[0].rule",
            "compilation failed",
        ),
        (
            _crd_with(spec__group="example"),
            "spec.group",
            "should be a domain with at least one dot",
        ),
    ],
    ids=[
        "name",
        "two-storage-versions",
        "untyped-field",
        "properties-and-additional",
        "root-not-object",
        "rule-does-not-parse",
        "group-without-dot",
    ],
)
async def test_a_crd_the_real_server_refuses_is_refused(
    kube: KubeClient, crd: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(Invalid) as refused:
        await kube.create(CRDS, crd)
    causes = refused.value.body["details"]["causes"]
    assert any(c["field"] == field and message in c["message"] for c in causes), causes
    assert refused.value.message.startswith("CustomResourceDefinition.apiextensions.k8s.io")
    with pytest.raises(NotFound):
        await kube.get(CRDS, crd["metadata"]["name"])


# -- good budgets -----------------------------------------------------------------------------------


async def test_good_budgets_are_created_and_read_back_with_defaults(kube: KubeClient) -> None:
    by_label = budget(
        "by-label",
        limits={
            "devices": [{"deviceClassName": "fabric-gpu", "max": 3}, {"model": "h100", "max": 2}],
            "gpuMemory": "160Gi",
            "cxlMemory": 274877906944,
            "deviceHours": {"max": 200, "window": "24h"},
        },
    )
    created = await kube.create(BUDGETS, by_label, NS)
    assert created["spec"]["enforcement"] == "Enforce"  # the schema's default
    assert created["metadata"]["generation"] == 1
    by_owner = budget(
        "by-owner",
        tree={"owner": {"apiVersion": "batch/v1", "kind": "Job"}},
        limits={"deviceHours": {"max": 10, "window": "7d"}},
        enforcement="Warn",
    )
    await kube.create(BUDGETS, by_owner, NS)
    read = await kube.get(BUDGETS, "by-label", NS)
    assert read["spec"]["limits"] == by_label["spec"]["limits"]
    assert read["spec"]["enforcement"] == "Enforce"
    assert (await kube.get(BUDGETS, "by-owner", NS))["spec"]["enforcement"] == "Warn"
    everywhere = await kube.request("GET", "/apis/fabric-dra.io/v1alpha1/devicebudgets")
    assert {"by-label", "by-owner"} <= {b["metadata"]["name"] for b in everywhere["items"]}
    assert everywhere["kind"] == "DeviceBudgetList"


async def test_the_kind_examples_are_accepted(kube: KubeClient) -> None:
    examples = [
        d for d in yaml.safe_load_all((REPO / "deploy" / "kind" / "budget-example.yaml").read_text()) if d
    ]
    assert examples
    for example in examples:
        example["metadata"]["namespace"] = "example-budgets"
    await kube.create(NAMESPACES, {"metadata": {"name": "example-budgets"}})
    for example in examples:
        created = await kube.create(BUDGETS, example)
        assert created["spec"]["tree"] == example["spec"]["tree"]


# -- bad budgets ------------------------------------------------------------------------------------

_NOT_CHECKED = "some validation rules were not checked because the object was invalid"


@pytest.mark.parametrize(
    ("spec", "field", "reason", "message"),
    [
        (
            {"limits": {"devices": [{"deviceClassName": "fabric-tpu", "max": 1}]}},
            "spec.limits.devices[0].deviceClassName",
            "FieldValueNotSupported",
            'Unsupported value: "fabric-tpu": supported values: "cohdi-pcie-device", "fabric-gpu"',
        ),
        (
            {"tree": {"label": {"key": "t"}, "owner": {"apiVersion": "batch/v1", "kind": "Job"}}},
            "spec.tree",
            "FieldValueInvalid",
            "Invalid value: exactly one of label or owner must be set",
        ),
        (
            {"tree": {}},
            "spec.tree",
            "FieldValueInvalid",
            "Invalid value: exactly one of label or owner must be set",
        ),
        (
            {"limits": {"gpuMemory": "12XB"}},
            "spec.limits.gpuMemory",
            "FieldValueInvalid",
            'Invalid value: "12XB": must be a positive quantity, e.g. 160Gi',
        ),
        (
            {"limits": {"gpuMemory": "-1Gi"}},
            "spec.limits.gpuMemory",
            "FieldValueInvalid",
            'Invalid value: "-1Gi": must be a positive quantity, e.g. 160Gi',
        ),
        (
            {"limits": {"cxlMemory": 0}},
            "spec.limits.cxlMemory",
            "FieldValueInvalid",
            "Invalid value: 0: must be a positive quantity, e.g. 256Gi",
        ),
        (
            {"limits": {"devices": [{"model": "h100", "max": -1}]}},
            "spec.limits.devices[0].max",
            "FieldValueInvalid",
            "Invalid value: -1: spec.limits.devices[0].max in body should be greater than or equal to 0",
        ),
        (
            {"limits": {"devices": [{"deviceClassName": "fabric-gpu", "model": "h100", "max": 1}]}},
            "spec.limits.devices[0]",
            "FieldValueInvalid",
            "Invalid value: exactly one of deviceClassName or model must be set",
        ),
        (
            {"limits": {"deviceHours": {"max": 10, "window": "3s"}}},
            "spec.limits.deviceHours.window",
            "FieldValueInvalid",
            'Invalid value: "3s": must be between 1h and 31d (744h)',
        ),
        (
            {"limits": {"deviceHours": {"max": 10, "window": "90d"}}},
            "spec.limits.deviceHours.window",
            "FieldValueInvalid",
            'Invalid value: "90d": must be between 1h and 31d (744h)',
        ),
        (
            {"limits": {"deviceHours": {"max": 10, "window": "forever"}}},
            "spec.limits.deviceHours.window",
            "FieldValueTypeInvalid",
            'Invalid value: "forever": '
            'spec.limits.deviceHours.window in body must be of type duration: "forever"',
        ),
        (
            {"limits": {"deviceHours": {"max": 0, "window": "24h"}}},
            "spec.limits.deviceHours.max",
            "FieldValueInvalid",
            "Invalid value: 0: spec.limits.deviceHours.max in body should be greater than 0",
        ),
        (
            {"limits": {}},
            "spec.limits",
            "FieldValueInvalid",
            "Invalid value: at least one limit must be set",
        ),
        (
            {"limits": None},
            "spec.limits",
            "FieldValueRequired",
            "Required value",
        ),
        (
            {"limits": {"devices": [{"deviceClassName": "fabric-gpu", "max": 1}] * 33}},
            "spec.limits.devices",
            "FieldValueTooMany",
            "Too many: 33: must have at most 32 items",
        ),
        (
            {"enforcement": "Audit"},
            "spec.enforcement",
            "FieldValueNotSupported",
            'Unsupported value: "Audit": supported values: "Enforce", "Warn"',
        ),
        (
            {"limits": {"devices": [{"deviceClassName": "fabric-gpu", "max": "3"}]}},
            "spec.limits.devices[0].max",
            "FieldValueTypeInvalid",
            'Invalid value: "string": spec.limits.devices[0].max in body must be of type integer: "string"',
        ),
    ],
    ids=[
        "unknown-class",
        "label-and-owner",
        "neither-label-nor-owner",
        "gpuMemory-12XB",
        "gpuMemory-negative",
        "cxlMemory-zero",
        "max-negative",
        "class-and-model",
        "window-3s",
        "window-90d",
        "window-forever",
        "deviceHours-zero",
        "no-limits",
        "limits-missing",
        "too-many-devices",
        "unknown-enforcement",
        "max-as-string",
    ],
)
async def test_a_bad_budget_is_refused_with_the_real_servers_status(
    kube: KubeClient, spec: dict[str, Any], field: str, reason: str, message: str
) -> None:
    bad = budget("bad")
    bad["spec"].update(spec)
    if spec.get("limits", {}) is None:
        del bad["spec"]["limits"]
    with pytest.raises(Invalid) as refused:
        await kube.create(BUDGETS, bad, NS)
    status = refused.value.body
    assert status["code"] == 422
    assert status["reason"] == "Invalid"
    assert status["message"].startswith('DeviceBudget.fabric-dra.io "bad" is invalid: ')
    assert status["details"]["kind"] == "DeviceBudget"
    assert status["details"]["group"] == "fabric-dra.io"
    causes = status["details"]["causes"]
    matching = [c for c in causes if c["field"] == field and c["reason"] == reason]
    assert matching, causes
    assert message in matching[0]["message"]
    if reason in (
        "FieldValueNotSupported",
        "FieldValueTypeInvalid",
        "FieldValueRequired",
        "FieldValueTooMany",
    ):
        # The real server does not run the CEL rules of an object with a blocking error.
        assert causes[-1]["field"] == "<nil>" and _NOT_CHECKED in causes[-1]["message"]
    with pytest.raises(NotFound):
        await kube.get(BUDGETS, "bad", NS)


# -- unknown fields -----------------------------------------------------------------------------------


def test_unknown_fields_follow_field_validation(crd_server: ApiServerProcess) -> None:
    path = f"/apis/fabric-dra.io/v1alpha1/namespaces/{NS}/devicebudgets"
    with crd_server.http() as http:
        body = budget("strict")
        body["spec"]["x"] = 1
        body["spec"]["limits"]["devices"][0]["color"] = "red"
        strict = http.post(path, params={"fieldValidation": "Strict"}, json=body)
        assert strict.status_code == 400, strict.text
        assert strict.json()["reason"] == "BadRequest"
        assert strict.json()["message"] == (
            'DeviceBudget in version "v1alpha1" cannot be handled as a DeviceBudget: strict decoding error: '
            'unknown field "spec.limits.devices[0].color", unknown field "spec.x"'
        ) or strict.json()["message"] == (
            'DeviceBudget in version "v1alpha1" cannot be handled as a DeviceBudget: strict decoding error: '
            'unknown field "spec.x", unknown field "spec.limits.devices[0].color"'
        )
        assert http.get(f"{path}/strict").status_code == 404
        body["metadata"]["name"] = "warned"
        warned = http.post(path, json=body)  # no fieldValidation: Warn, as on a real server
        assert warned.status_code == 201, warned.text
        assert sorted(warned.headers.get_list("warning")) == [
            '299 - "unknown field \\"spec.limits.devices[0].color\\""',
            '299 - "unknown field \\"spec.x\\""',
        ]
        assert "x" not in warned.json()["spec"]
        assert "color" not in warned.json()["spec"]["limits"]["devices"][0]
        body["metadata"]["name"] = "ignored"
        ignored = http.post(path, params={"fieldValidation": "Ignore"}, json=body)
        assert ignored.status_code == 201
        assert ignored.headers.get_list("warning") == []
        assert "x" not in ignored.json()["spec"]


# -- status, generation, patches ---------------------------------------------------------------------


async def test_status_and_main_resource_ignore_each_others_part_and_generation_follows_the_spec(
    kube: KubeClient,
) -> None:
    await kube.create(BUDGETS, budget("gen"), NS)
    status = {
        "observedGeneration": 1,
        "trees": [
            {
                "tree": "task-847",
                "used": {"devices": [{"deviceClassName": "fabric-gpu", "used": 1, "max": 3}]},
            }
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "lastTransitionTime": "2026-12-06T10:00:00Z",
                "reason": "Observed",
                "message": "counted",
            }
        ],
    }
    current = await kube.get(BUDGETS, "gen", NS)
    sneaky = copy.deepcopy(current)
    sneaky["spec"]["limits"]["devices"][0]["max"] = 99
    sneaky["status"] = status
    written = await kube.replace(BUDGETS, sneaky, subresource="status")
    assert written["status"] == status
    assert written["spec"]["limits"]["devices"][0]["max"] == 3  # spec ignored on /status
    assert written["metadata"]["generation"] == 1  # a status write is no new generation
    main = copy.deepcopy(written)
    main["status"] = {"observedGeneration": 7}
    main["metadata"]["labels"] = {"team": "a"}
    relabelled = await kube.replace(BUDGETS, main)
    assert relabelled["status"] == status  # status ignored on the main resource
    assert relabelled["metadata"]["generation"] == 1  # metadata is no spec change
    patched = await kube.patch(BUDGETS, "gen", {"spec": {"enforcement": "Warn"}}, NS)
    assert patched["metadata"]["generation"] == 2
    json_patched = await kube.patch(
        BUDGETS,
        "gen",
        [{"op": "replace", "path": "/spec/limits/devices/0/max", "value": 4}],
        NS,
        patch_type="json",
    )
    assert json_patched["metadata"]["generation"] == 3
    assert json_patched["spec"]["limits"]["devices"][0]["max"] == 4
    with pytest.raises(Invalid, match=r"spec\.limits\.devices\[0\]\.max"):
        await kube.patch(
            BUDGETS,
            "gen",
            {"spec": {"limits": {"devices": [{"deviceClassName": "fabric-gpu", "max": -2}]}}},
            NS,
        )
    with pytest.raises(Invalid, match=r"status\.trees\[1\]: Duplicate value"):
        twice = {"status": {"trees": [{"tree": "a"}, {"tree": "a"}]}}
        await kube.patch(BUDGETS, "gen", twice, NS, subresource="status")
    with pytest.raises(ApiError) as strategic:
        await kube.patch(BUDGETS, "gen", {"spec": {"enforcement": "Enforce"}}, NS, patch_type="strategic")
    assert strategic.value.status == 415


async def test_a_watch_sees_custom_resources(kube: KubeClient) -> None:
    listed = await kube.list(BUDGETS, NS)
    await kube.create(BUDGETS, budget("watched"), NS)
    async for event in kube.watch(
        BUDGETS, NS, resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=5
    ):
        if event.type == "ADDED" and event.object["metadata"]["name"] == "watched":
            assert event.object["spec"]["enforcement"] == "Enforce"
            break
    else:
        pytest.fail("no ADDED event for the new budget")


# -- the Widget CRD: transition rules, messageExpression, map lists, defaults -----------------------


def widget(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": name}, "spec": spec}


async def test_transition_rules_message_expressions_and_nested_defaults(kube: KubeClient) -> None:
    created = await kube.create(
        WIDGETS, widget("w1", size="small", ports=[{"name": "http"}], extra={"any": {"x": 1}}), NS
    )
    assert created["spec"]["replicas"] == 1
    assert created["spec"]["ports"] == [{"name": "http", "protocol": "TCP"}]
    assert created["spec"]["extra"] == {"any": {"x": 1}}  # preserved, not pruned
    with pytest.raises(Invalid) as immutable:
        await kube.patch(WIDGETS, "w1", {"spec": {"size": "large"}}, NS)
    cause = immutable.value.body["details"]["causes"][0]
    assert cause == {
        "field": "spec.size",
        "reason": "FieldValueForbidden",
        "message": "Forbidden: size is immutable",
    }
    with pytest.raises(Invalid) as four:
        await kube.create(WIDGETS, widget("w2", replicas=4), NS)
    assert four.value.body["details"]["causes"][0] == {
        "field": "spec.replicas",
        "reason": "FieldValueInvalid",
        "message": "Invalid value: replicas may not be 4",
    }
    with pytest.raises(
        Invalid, match=r"spec\.ports\[1\]: Duplicate value: map\[string\]interface \{\}\{\"name\":\"a\"\}"
    ):
        await kube.create(WIDGETS, widget("w3", ports=[{"name": "a"}, {"name": "a", "protocol": "UDP"}]), NS)


async def test_deleting_a_crd_deletes_its_objects_and_stops_serving_them(
    crd_server: ApiServerProcess,
) -> None:
    crd = _crd_with()
    async with crd_server.client() as kube:
        await kube.create(CRDS, crd)
        gadgets = Resource("example.com", "v1", "gadgets", "Gadget", True)
        gadget = {
            "apiVersion": "example.com/v1",
            "kind": "Gadget",
            "metadata": {"name": "g"},
            "spec": {"size": "s"},
        }
        await kube.create(gadgets, gadget, NS)
        ns_name = "gadget-ns"
        await kube.create(NAMESPACES, {"metadata": {"name": ns_name}})
        await kube.create(gadgets, gadget, ns_name)
        await kube.delete(NAMESPACES, ns_name)
        with pytest.raises(NotFound):
            await kube.get(gadgets, "g", ns_name)  # the namespace took its gadgets with it
        await kube.delete(CRDS, "gadgets.example.com")
        with pytest.raises(NotFound):
            await kube.get(gadgets, "g", NS)
        listing = await kube.request("GET", "/apis")
        assert "example.com" in json.dumps(listing)  # widgets are still served
        await kube.create(CRDS, crd)
        assert (await kube.list(gadgets, NS))["items"] == []  # nothing came back with the kind
        await kube.delete(CRDS, "gadgets.example.com")
