"""Imports point down: each package may import only the floors below it (docs/architecture.md).

Read from the source with ``ast``, so an import inside a function, behind ``TYPE_CHECKING`` or
through ``importlib.import_module("...")`` counts as much as one at the top of a module.

Inside a package, the floors are its folders: a package whose ``__init__.py`` declares
``FLOORS = ("model", "engine", ...)`` — its subpackages (or lone modules), from the ground up —
has every module import only its own floor or those below it, and every room of the package
stands on one of them (:func:`floor_violations`). A floor may declare floors of its own
(``emulator`` and ``emulator.redfish`` do). Packages that do not declare them yet keep a
hand-written table of what must never be imported (:data:`NEVER`).
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
# Inside the Redfish client: the wire (HTTP, no Redfish), the transport, then sessions and task
# monitors, then the facade and events.
_REDFISH_FACADE = ("fabric.redfish.client", "fabric.redfish.events")
_REDFISH_ABOVE_TRANSPORT = ("fabric.redfish.sessions", "fabric.redfish.tasks", *_REDFISH_FACADE)
_REDFISH_ABOVE_WIRE = ("fabric.redfish.transport", *_REDFISH_ABOVE_TRANSPORT)
_REDFISH_CONVERSATION = ("fabric.redfish.wire", *_REDFISH_ABOVE_WIRE)
#: the Redfish conversation and the discovery that holds the client: the operation driver is handed
#: the backends and the task control it needs instead (the error types are fine)
_FABRIC_REACH = (*_REDFISH_CONVERSATION, "fabric.backends.discovery")

#: Inside a package: module prefix → prefixes of the same package it must never import.
NEVER: dict[str, tuple[str, ...]] = {
    "dra_driver.selection": ("dra_driver.plugin", "dra_driver.controller", "dra_driver.explain"),
    "dra_driver.plugin": ("dra_driver.controller", "dra_driver.explain"),
    "dra_driver.controller": ("dra_driver.plugin", "dra_driver.explain"),
    "dra_driver.proto": ("dra_driver.plugin", "dra_driver.controller", "dra_driver.selection"),
    "kube_standin.apiserver": ("kube_standin.cluster", "kube_standin.kubelet_client", "kube_standin.cli"),
    "kube_standin.kubelet_client": ("kube_standin.cluster", "kube_standin.apiserver", "kube_standin.cli"),
    "kube_standin.cluster": ("kube_standin.apiserver", "kube_standin.cli"),
    "fabric.redfish": ("fabric.device_names", "fabric.metrics", "fabric.reports", *_FABRIC_BACKENDS),
    "fabric.redfish.error_mapping": ("fabric.redfish.settings", *_REDFISH_CONVERSATION),
    "fabric.redfish.settings": ("fabric.redfish.error_mapping", *_REDFISH_CONVERSATION),
    "fabric.redfish.wire": (
        "fabric.redfish.settings",
        "fabric.redfish.reader",
        "fabric.redfish.links",
        *_REDFISH_ABOVE_WIRE,
    ),
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


def declared_floors(init: Path) -> tuple[str, ...] | None:
    """The ``FLOORS`` a package's ``__init__.py`` declares, from the ground up; None without one."""
    for node in ast.parse(init.read_text(), filename=str(init)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and target.id == "FLOORS"):
            continue
        if isinstance(value, ast.Tuple | ast.List) and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts
        ):
            return tuple(str(e.value) for e in value.elts if isinstance(e, ast.Constant))
        raise AssertionError(f"{init}: FLOORS must be a literal tuple of folder (or module) names")
    return None


def floored_packages(root: Path) -> dict[str, tuple[str, ...]]:
    """Dotted name → floors, of every package under ``root`` that declares them."""
    found = {}
    for package in PACKAGES:
        for init in sorted((root / package).rglob("__init__.py")):
            floors = declared_floors(init)
            if floors is not None:
                found[_module_name(init, root)] = floors
    return found


def _floor_of(module: str, package: str, floors: tuple[str, ...]) -> int | None:
    """The floor of ``package`` that ``module`` stands on (its index); None outside the package,
    for the package's face itself (its ``__init__.py``, above every floor) and for a room that is
    on no floor (:func:`test_every_room_of_a_floored_package_is_on_a_floor` reports those)."""
    if not module.startswith(package + "."):
        return None
    room = module[len(package) + 1 :].split(".")[0]
    return floors.index(room) if room in floors else None


def floor_violations(root: Path) -> list[str]:
    """Every import from a floor of a package to one of its floors above."""
    floored = floored_packages(root)
    found = []
    for path in _source_files(root):
        importer = _module_name(path, root)
        for line, module in _imports(path, root):
            for package, floors in floored.items():
                here, there = _floor_of(importer, package, floors), _floor_of(module, package, floors)
                if here is not None and there is not None and there > here:
                    found.append(
                        f"{path.relative_to(root)}:{line}: {importer} (floor {floors[here]} of {package}) "
                        f"imports {module} (floor {floors[there]}, above it)"
                    )
    return found


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


def test_imports_inside_a_package_point_down_its_floors() -> None:
    assert floored_packages(REPO_ROOT), "emulator declares its floors"
    assert floor_violations(REPO_ROOT) == []


def test_every_room_of_a_floored_package_is_on_a_floor() -> None:
    """A new folder or module is placed on a floor; a floor names a room that exists."""
    for package, floors in floored_packages(REPO_ROOT).items():
        directory = REPO_ROOT.joinpath(*package.split("."))
        rooms = {p.stem for p in directory.glob("*.py") if p.name != "__init__.py"}
        rooms |= {p.name for p in directory.iterdir() if (p / "__init__.py").is_file()}
        assert len(set(floors)) == len(floors), f"{package}: a floor is named twice"
        assert rooms == set(floors), f"{package}: rooms {sorted(rooms)}, floors {list(floors)}"


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


@pytest.mark.parametrize(
    ("importer", "source", "reported"),
    [
        ("low/probe.py", "from emulator.high.view import Node\n", True),
        ("low/probe.py", "def f():\n    import emulator.high\n", True),
        ("high/probe.py", "from emulator.low import store\n", False),
        ("high/inner/probe.py", "from emulator.high.view import Node\n", False),
        ("cli.py", "from emulator.high import view\n", False),
        ("low/probe.py", "from emulator.cli import main\n", True),
        ("__init__.py", "FLOORS = ('low', 'high', 'cli')\nfrom emulator.cli import main\n", False),
    ],
)
def test_the_floor_check_reads_folders(importer: str, source: str, reported: bool, tmp_path: Path) -> None:
    """The check itself: floors come from the package's FLOORS; an import up a floor is reported,
    one along or down a floor is not, nor any from the package's face."""
    package = tmp_path / "emulator"
    for room in ("low", "high", "high/inner"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "__init__.py").write_text("FLOORS = ('low', 'high', 'cli')\n")
    (package / importer).write_text(source)
    violations = floor_violations(tmp_path)
    assert bool(violations) is reported, violations
