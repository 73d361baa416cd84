"""Imports point down: each package may import only the floors below it (docs/architecture.md).

Read from the source with ``ast``, so an import inside a function, behind ``TYPE_CHECKING`` or
through ``importlib.import_module("...")`` counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deploy import PACKAGES, REPO_ROOT

#: package → the packages it may import. The floors, from the ground up: plumbing; the manager's
#: API contract; the roles (Kubernetes side, fabric side) and the Redfish fabric emulator, which
#: never import each other; the Kubernetes stand-ins (which drive the Kubernetes side's protocol
#: bindings and device selection); the ``fabric-dra`` command with the demo and the stack builder.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "plumbing": frozenset(),
    "manager_api": frozenset({"plumbing"}),
    "dra_driver": frozenset({"plumbing", "manager_api"}),
    "fabric": frozenset({"plumbing", "manager_api"}),
    "emulator": frozenset({"plumbing", "manager_api"}),
    "kube_standin": frozenset({"plumbing", "dra_driver"}),
    "fabric_dra": frozenset({"plumbing", "manager_api", "dra_driver", "fabric", "emulator", "kube_standin"}),
}

# The fabric manager inside ``fabric``, floor by floor from the top (docs/architecture.md, "Inside
# fabric"): what stands above each floor, which it must never import.
_FABRIC_CLI = ("fabric.cli", "fabric.status", "fabric.usage_cli")
_FABRIC_SERVICE = ("fabric.service", "fabric.config", *_FABRIC_CLI)
_FABRIC_HTTP = (
    "fabric.server",
    "fabric.orphans",
    "fabric.auth",
    "fabric.openapi",
    "fabric.ui",
    "fabric.request_guard",
    "fabric.claims",
    "fabric.usage",
    *_FABRIC_SERVICE,
)
_FABRIC_FRONT = ("fabric.attachments", "fabric.reconcile", *_FABRIC_HTTP)
_FABRIC_DRIVER = ("fabric.operations_driver", *_FABRIC_FRONT)
_FABRIC_ATTEMPTS = ("fabric.fabric_attempts", *_FABRIC_DRIVER)
_FABRIC_STATE = ("fabric.inventory", "fabric.ledger", "fabric.nodes", "fabric.operations", *_FABRIC_ATTEMPTS)
_FABRIC_BACKENDS = ("fabric.backends", *_FABRIC_STATE)
# Inside the Redfish client: transport, then sessions and task monitors, then the facade and events.
_REDFISH_FACADE = ("fabric.redfish.client", "fabric.redfish.events")
_REDFISH_ABOVE_TRANSPORT = ("fabric.redfish.sessions", "fabric.redfish.tasks", *_REDFISH_FACADE)
_REDFISH_CONVERSATION = ("fabric.redfish.transport", *_REDFISH_ABOVE_TRANSPORT)
#: the Redfish conversation and the discovery that holds the client: the operation driver is handed
#: the backends and the task control it needs instead (the error types are fine)
_FABRIC_REACH = (*_REDFISH_CONVERSATION, "fabric.backends.discovery")

#: Inside a package: module prefix → prefixes of the same package it must never import.
NEVER: dict[str, tuple[str, ...]] = {
    "dra_driver.selection": ("dra_driver.plugin", "dra_driver.controller", "dra_driver.explain"),
    "dra_driver.plugin": ("dra_driver.controller", "dra_driver.explain"),
    "dra_driver.controller": ("dra_driver.plugin", "dra_driver.explain"),
    "dra_driver.proto": ("dra_driver.plugin", "dra_driver.controller", "dra_driver.selection"),
    "emulator.topology": ("emulator.redfish", "emulator.cli"),
    "emulator.redfish": ("emulator.cli",),
    "kube_standin.apiserver": ("kube_standin.cluster", "kube_standin.kubelet_client", "kube_standin.cli"),
    "kube_standin.kubelet_client": ("kube_standin.cluster", "kube_standin.apiserver", "kube_standin.cli"),
    "kube_standin.cluster": ("kube_standin.apiserver", "kube_standin.cli"),
    "fabric.redfish": ("fabric.device_names", "fabric.metrics", "fabric.reports", *_FABRIC_BACKENDS),
    "fabric.redfish.error_mapping": ("fabric.redfish.settings", *_REDFISH_CONVERSATION),
    "fabric.redfish.settings": ("fabric.redfish.error_mapping", *_REDFISH_CONVERSATION),
    "fabric.redfish.transport": _REDFISH_ABOVE_TRANSPORT,
    "fabric.redfish.sessions": ("fabric.redfish.tasks", *_REDFISH_FACADE),
    "fabric.redfish.tasks": ("fabric.redfish.sessions", *_REDFISH_FACADE),
    "fabric.redfish.client": ("fabric.redfish.events",),
    "fabric.device_names": _FABRIC_BACKENDS,
    "fabric.metrics": _FABRIC_BACKENDS,
    "fabric.reports": _FABRIC_BACKENDS,
    "fabric.backends": _FABRIC_STATE,
    "fabric.nodes": ("fabric.inventory", *_FABRIC_ATTEMPTS),
    "fabric.ledger": ("fabric.inventory", "fabric.operations", *_FABRIC_ATTEMPTS),
    "fabric.operations": ("fabric.inventory", "fabric.ledger", *_FABRIC_ATTEMPTS),
    "fabric.inventory": _FABRIC_ATTEMPTS,
    "fabric.fabric_attempts": (*_FABRIC_DRIVER, *_FABRIC_REACH),
    "fabric.operations_driver": (*_FABRIC_FRONT, *_FABRIC_REACH),
    # The request front and reconciliation reach the fabric only through the operation driver.
    "fabric.attachments": (
        "fabric.reconcile",
        "fabric.fabric_attempts",
        "fabric.redfish",
        "fabric.backends.base",
        "fabric.backends.discovery",
        *_FABRIC_HTTP,
    ),
    # The warm pool too (fabric.warm; its policy, fabric.warm_policy, imports none of these either).
    "fabric.warm": (
        "fabric.attachments",
        "fabric.reconcile",
        "fabric.fabric_attempts",
        "fabric.redfish",
        "fabric.backends.base",
        "fabric.backends.discovery",
        *_FABRIC_HTTP,
    ),
    "fabric.reconcile": (
        "fabric.attachments",
        "fabric.fabric_attempts",
        "fabric.redfish",
        *_FABRIC_REACH,
        *_FABRIC_HTTP,
    ),
    "fabric.orphans": ("fabric.server", *_FABRIC_SERVICE),
    "fabric.server": ("fabric.orphans", *_FABRIC_SERVICE),
    "fabric.auth": ("fabric.server", "fabric.orphans", *_FABRIC_SERVICE),
    "fabric.openapi": ("fabric.server", "fabric.orphans", *_FABRIC_SERVICE),
    # the fabric map is static files: it reads the API as any client does, never the manager's insides
    "fabric.ui": ("fabric.server", "fabric.orphans", "fabric.auth", *_FABRIC_SERVICE),
    "fabric.request_guard": ("fabric.server", "fabric.orphans", "fabric.claims", *_FABRIC_SERVICE),
    "fabric.claims": (
        "fabric.server",
        "fabric.orphans",
        "fabric.auth",
        "fabric.request_guard",
        *_FABRIC_SERVICE,
    ),
    # the accounting reads the ledger, the inventory and the claims; the API serves it
    "fabric.usage": ("fabric.server", "fabric.orphans", "fabric.auth", *_FABRIC_SERVICE),
    "fabric.config": ("fabric.service", *_FABRIC_CLI),
    "fabric.service": _FABRIC_CLI,
}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every import in ``path``, relative ones resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path, root).split(".")
    if path.name != "__init__.py":
        package.pop()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module
            for alias in node.names:  # ``from pkg import submodule``
                yield node.lineno, f"{module}.{alias.name}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute | ast.Name)
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id)
            in ("import_module", "__import__", "find_spec")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value


def _source_files(root: Path) -> Iterator[Path]:
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


def test_every_package_has_a_floor() -> None:
    assert set(PACKAGES) == set(MAY_IMPORT), "add the new package to MAY_IMPORT and docs/architecture.md"


def _violations(root: Path) -> list[str]:
    found = []
    for path in _source_files(root):
        importer = _module_name(path, root)
        own = importer.split(".")[0]
        rel = path.relative_to(root)
        for line, module in _imports(path, root):
            top = module.split(".")[0]
            if top in MAY_IMPORT and top != own and top not in MAY_IMPORT[own]:
                found.append(f"{rel}:{line}: {own} imports {module} (a floor it may not use)")
            for prefix, banned in NEVER.items():
                if importer == prefix or importer.startswith(prefix + "."):
                    for other in banned:
                        if module == other or module.startswith(other + "."):
                            found.append(f"{rel}:{line}: {importer} imports {module}")
    return found


def test_imports_point_down() -> None:
    assert _violations(REPO_ROOT) == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from fabric.binder import Binder\n", "dra_driver imports fabric.binder"),
        ("import importlib\nimportlib.import_module('fabric.cli')\n", "dra_driver imports fabric.cli"),
        ("def f():\n    from kube_standin import cli\n", "dra_driver imports kube_standin"),
    ],
)
def test_the_check_sees_each_kind_of_import(source: str, expected: str, tmp_path: Path) -> None:
    """The check itself: an upward import of each form is reported."""
    (tmp_path / "dra_driver").mkdir()
    (tmp_path / "dra_driver" / "probe.py").write_text(source)
    assert any(expected in v for v in _violations(tmp_path))
