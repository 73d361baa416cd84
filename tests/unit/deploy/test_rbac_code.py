"""RBAC follows the code: every Kubernetes API call a role's code makes is granted to that role's
ServiceAccount in the rendered overlays.

The calls are found in the source (``<client>.get/list/list_all/watch/create/replace/patch/delete``
with a resource constant of :mod:`plumbing.kube.resources` as first argument), so a new call
without its RBAC rule fails here rather than as a 403 in a cluster. The converse — no rule that no
code needs — is checked by the exact expectations of test_workloads.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from plumbing.kube import resources
from tests.support.deploy import REPO_ROOT, find

Obj = dict[str, Any]

_VERBS = {
    "get": "get",
    "list": "list",
    "list_all": "list",
    "watch": "watch",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
}
_RESOURCES = {name: value for name, value in vars(resources).items() if isinstance(value, resources.Resource)}

#: Which source each role runs, and the overlay whose RBAC must cover it.
ROLES: dict[str, tuple[str, str, list[str]]] = {
    "plugin": ("fabric-dra-plugin", "kind", ["dra_driver/plugin"]),
    "controller": (
        "fabric-dra-controller",
        "kind",
        ["dra_driver/controller", "plumbing/kube/leader.py", "plumbing/kube/events.py"],
    ),
    "controller-binding-conditions": (
        "fabric-dra-controller",
        "binding-conditions",
        ["dra_driver/controller", "plumbing/kube/leader.py", "plumbing/kube/events.py"],
    ),
    "manager": (
        "fabric-dra-manager",
        "kind",
        ["fabric", "plumbing/kube/leader.py", "plumbing/kube/events.py"],
    ),
}


#: commands an operator runs with their own kubeconfig (``fabric-dra drain`` lists claims and pods),
#: never with a role's service account
OPERATOR_COMMANDS = frozenset({"fabric/commands/drains.py"})


def api_calls(paths: list[str]) -> Iterator[tuple[str, str, str, str]]:
    """(file:line, API group, resource[/subresource], verb) for every API call in the sources."""
    files: list[Path] = []
    for rel in paths:
        path = REPO_ROOT / rel
        found = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        files.extend(f for f in found if str(f.relative_to(REPO_ROOT)) not in OPERATOR_COMMANDS)
    for file in files:
        yield from calls_in_source(file.read_text(), str(file.relative_to(REPO_ROOT)))


def _resource_named(node: ast.expr) -> resources.Resource | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        node = node.func.value  # RESOURCE_CLAIMS.with_version(...)
    return _RESOURCES.get(node.id) if isinstance(node, ast.Name) else None


def calls_in_source(source: str, name: str) -> Iterator[tuple[str, str, str, str]]:
    """The API calls of one source file: client methods with a resource constant as first
    argument, and informers (``Informer(kube, RESOURCE, …)``), which list and watch."""
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, ast.Call):
            continue
        callee = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if callee == "Informer" and len(node.args) >= 2 and (resource := _resource_named(node.args[1])):
            for informer_verb in ("list", "watch"):
                yield f"{name}:{node.lineno}", resource.group, resource.plural, informer_verb
            continue
        verb = _VERBS.get(callee) if isinstance(node.func, ast.Attribute) else None
        if verb is None or not node.args or (resource := _resource_named(node.args[0])) is None:
            continue
        plural = resource.plural
        for keyword in node.keywords:
            if keyword.arg == "subresource" and isinstance(keyword.value, ast.Constant):
                plural = f"{plural}/{keyword.value.value!s}"
        yield f"{name}:{node.lineno}", resource.group, plural, verb


def granted(objects: list[Obj], account: str, group: str, resource: str, verb: str) -> bool:
    for binding in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding"):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        (role,) = find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            if (
                group in rule.get("apiGroups", [])
                and resource in rule.get("resources", [])
                and verb in rule["verbs"]
            ):
                return True
    return False


def test_informers_count_as_list_and_watch() -> None:
    source = "informer = Informer(kube, NODES, on_changes=handle)\nawait kube.patch(NODES, name, body)\n"
    assert sorted((g, r, v) for _, g, r, v in calls_in_source(source, "example.py")) == [
        ("", "nodes", "list"),
        ("", "nodes", "patch"),
        ("", "nodes", "watch"),
    ]


def test_calls_are_found() -> None:
    """The scan sees the calls it is meant to see (a refactor of the client API would blind it)."""
    calls = {(g, r, v) for _, g, r, v in api_calls(["dra_driver/controller", "plumbing/kube/leader.py"])}
    assert ("resource.k8s.io", "resourceslices", "create") in calls
    assert ("coordination.k8s.io", "leases", "update") in calls
    assert ("resource.k8s.io", "resourceclaims/status", "update") in calls


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_api_call_is_granted(role: str, rendered_overlays: dict[str, list[Obj]]) -> None:
    account, overlay, paths = ROLES[role]
    objects = rendered_overlays[overlay]
    calls = list(api_calls(paths))
    assert calls, f"no API call found for {role}"
    if role == "controller":
        # Claims are read and their status written only by the binding-condition flow, whose
        # rights come with that component (checked by the next parameter).
        flow = ("dra_driver/controller/binding_conditions.py", "dra_driver/controller/claimstatus.py")
        calls = [c for c in calls if not c[0].startswith(flow)]
    missing = [
        f"{where}: {verb} {group or 'core'}/{resource}"
        for where, group, resource, verb in calls
        if not granted(objects, account, group, resource, verb)
    ]
    assert missing == [], f"{account} in overlays/{overlay} lacks rights its code uses"


#: Rights no call in the code shows, each with the reason it is granted anyway.
SYNTHETIC: dict[str, set[tuple[str, str, str]]] = {
    # Not a request the controller makes: from Kubernetes 1.36 the API server authorises each
    # status.devices write a second time against this subresource (docs/controller.md, "RBAC").
    "controller-binding-conditions": {("resource.k8s.io", "resourceclaims/driver", "arbitrary-node:update")},
    # The owner-chain walks (fabric/bindings/trees.py, KindPaths.fetch: of DeviceBudgets' owner trees
    # and of the orphaned-tree check) read each owner by the path discovery gives its kind, not
    # through a resource constant: the built-in kinds agent trees are made of (docs/budgets.md,
    # "Trees"); the orphaned-tree check also reads the pods a claim is reserved for.
    "manager": {
        ("", "pods", "get"),
        ("apps", "replicasets", "get"),
        ("apps", "deployments", "get"),
        ("apps", "statefulsets", "get"),
        ("batch", "jobs", "get"),
        ("batch", "cronjobs", "get"),
    },
}


def grants(objects: list[Obj], account: str) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every rule bound to ServiceAccount ``account``."""
    out: set[tuple[str, str, str]] = set()
    for binding in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding"):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        (role,) = find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            out |= {(g, r, v) for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}
    return out


@pytest.mark.parametrize("role", sorted(ROLES))
def test_every_right_granted_is_used(role: str, rendered_overlays: dict[str, list[Obj]]) -> None:
    """The converse of the test above: RBAC holds exactly the calls the code makes (a right the
    code does not use is a right an attacker gets for free)."""
    account, overlay, paths = ROLES[role]
    used = {(group, resource, verb) for _, group, resource, verb in api_calls(paths)}
    if role == "controller":
        used = {
            (g, r, v)
            for where, g, r, v in api_calls(paths)
            if not where.startswith("dra_driver/controller/binding_conditions.py")
        }
    unused = grants(rendered_overlays[overlay], account) - used - SYNTHETIC.get(role, set())
    assert unused == set(), f"{account} in overlays/{overlay} holds rights no code uses"
