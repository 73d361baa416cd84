"""docs/controller.md's RBAC tables say exactly what the rendered overlays grant the controller:
the plain table against deploy/overlays/kind, plain plus the binding-condition table against
deploy/overlays/binding-conditions. A verb the manifests drop (or add) fails here until the page
says so too; test_rbac_code.py ties the manifests to the code's calls, so docs, manifests and code
agree."""

from __future__ import annotations

import re
from typing import Any

from tests.support.deploy import REPO_ROOT, find

Obj = dict[str, Any]
#: (Role or ClusterRole, API group, resource, verb, resourceNames)
Grant = tuple[str, str, str, str, tuple[str, ...]]

ACCOUNT = "fabric-dra-controller"
DOC = REPO_ROOT / "docs" / "controller.md"


def _granted(objects: list[Obj], account: str) -> set[Grant]:
    grants: set[Grant] = set()
    for binding in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding"):
        if not any(s["kind"] == "ServiceAccount" and s["name"] == account for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        (role,) = find(objects, ref["kind"], ref["name"])
        for rule in role["rules"]:
            names = tuple(sorted(rule.get("resourceNames", [])))
            for group in rule.get("apiGroups", []):
                for resource in rule.get("resources", []):
                    grants |= {(ref["kind"], group, resource, verb, names) for verb in rule["verbs"]}
    return grants


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]*)`", cell)


def _row_grants(cells: list[str]) -> set[Grant]:
    """One row of a table | apiGroup | resource | verbs | why |, as the grants it states.

    resource: "`leases` (Role in …)" names a Role, else a ClusterRole; "`resourceNames: [x]`"
    limits the row to x. verbs: "create; get, update on `name` only" — groups separated by ";",
    each optionally limited to the resource name after "on"."""
    group_cell, resource_cell, verbs_cell = cells[:3]
    (group,) = _ticked(group_cell)
    group = "" if group == '""' else group
    resource = _ticked(resource_cell)[0]
    kind = "Role" if "(Role" in resource_cell else "ClusterRole"
    row_names: tuple[str, ...] = ()
    if found := re.search(r"resourceNames: \[([^\]]*)\]", resource_cell):
        row_names = tuple(sorted(n.strip() for n in found.group(1).split(",")))
    grants: set[Grant] = set()
    for part in verbs_cell.split(";"):
        verbs, _, limit = part.partition(" on ")
        names = tuple(sorted(_ticked(limit))) or row_names
        for verb in verbs.replace("`", "").split(","):
            grants.add((kind, group, resource, verb.strip(), names))
    return grants


def _tables(text: str) -> list[set[Grant]]:
    """The grants of each RBAC table in the "## RBAC" section, in order (non-resource rows —
    discovery, granted to every authenticated user by system:discovery — left out)."""
    section = text.split("\n## RBAC\n", 1)[1].split("\n## ", 1)[0]
    tables: list[set[Grant]] = []
    current: set[Grant] | None = None
    for line in section.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "apiGroup" or set(cells[0]) <= {"-"}:
            if current is None:
                current = set()
                tables.append(current)
            continue
        assert current is not None, line
        if cells[0] == "(non-resource)":
            continue
        current |= _row_grants(cells)
    return tables


def test_the_tables_are_read() -> None:
    """The parser reads what the page says (a parser that found nothing would pass the test
    below for a role that grants nothing)."""
    plain, binding_conditions = _tables(DOC.read_text())
    assert ("Role", "coordination.k8s.io", "leases", "create", ()) in plain
    assert ("Role", "coordination.k8s.io", "leases", "get", (ACCOUNT,)) in plain
    assert ("ClusterRole", "", "nodes", "patch", ()) in plain
    assert (
        "ClusterRole",
        "resource.k8s.io",
        "resourceclaims/driver",
        "arbitrary-node:update",
        ("fabric-dra.io",),
    ) in binding_conditions


def test_controller_md_lists_exactly_the_rights_the_overlays_grant(
    rendered_overlays: dict[str, list[Obj]],
) -> None:
    plain, binding_conditions = _tables(DOC.read_text())
    assert _granted(rendered_overlays["kind"], ACCOUNT) == plain
    assert _granted(rendered_overlays["binding-conditions"], ACCOUNT) == plain | binding_conditions
