"""Imports point down: each package may import only the floors below it (docs/architecture.md).

Read from the source with ``ast``, so an import inside a function, behind ``TYPE_CHECKING`` or
through ``importlib.import_module("...")`` counts as much as one at the top of a module.

Inside a package, the floors are its folders: a package whose ``__init__.py`` declares
``FLOORS = ("model", "engine", ...)`` — its subpackages (or lone modules), from the ground up —
has every module import only its own floor or those below it, and every room of the package
stands on one of them (:func:`floor_violations`). Rooms side by side on one floor are a tuple,
``("apiserver", "cluster")``: neither imports the other. A floor may declare floors of its own
(``emulator.redfish``, ``fabric.redfish``, ``fabric.api``, ``dra_driver``'s roles do). No table of
modules: the folders and their ``FLOORS`` are the whole rule, with one exception inside ``fabric``
(:func:`driver_bypasses`: only the operation driver reaches the Redfish client and the backends).

The product and its testbed are two distributions (``pyproject.toml``, ``testbed/pyproject.toml``):
the testbed may import the product, never the reverse (:func:`test_the_product_never_imports_its_testbed`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deploy import PACKAGES, REPO_ROOT, TESTBED_PACKAGES

#: package → the packages it may import. The product's floors, from the ground up: plumbing; the
#: manager's API contract; the roles (Kubernetes side, fabric side) and the Redfish fabric emulator,
#: which never import each other; the ``fabric-dra`` command. Above them the testbed: the Kubernetes
#: stand-ins (which drive the Kubernetes side's protocol bindings and device selection), then the
#: stack builder and the demo.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "plumbing": frozenset(),
    "manager_api": frozenset({"plumbing"}),
    "dra_driver": frozenset({"plumbing", "manager_api"}),
    "fabric": frozenset({"plumbing", "manager_api"}),
    "emulator": frozenset({"plumbing", "manager_api"}),
    "fabric_dra": frozenset({"plumbing", "manager_api", "dra_driver", "fabric", "emulator"}),
    "kube_standin": frozenset({"plumbing", "dra_driver"}),
    "fabric_dra_testbed": frozenset(
        {"plumbing", "manager_api", "dra_driver", "fabric", "emulator", "fabric_dra", "kube_standin"}
    ),
}


def _package_dirs(root: Path) -> dict[str, Path]:
    """Every top-level package under the repository ``root`` → its directory: the product's at the
    root, the testbed's in ``testbed/``."""
    return {
        **{package: root / package for package in PACKAGES},
        **{package: root / "testbed" / package for package in TESTBED_PACKAGES},
    }


def _module_name(path: Path, root: Path) -> str:
    """The dotted name of ``path``, a file of one of the packages under the repository ``root``."""
    for directory in _package_dirs(root).values():
        if path.is_relative_to(directory):
            parts = list(path.relative_to(directory.parent).with_suffix("").parts)
            break
    else:
        raise AssertionError(f"{path} is in no package of {root}")
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
    for directory in _package_dirs(root).values():
        for path in sorted(directory.rglob("*.py")):
            if "__pycache__" not in path.parts:
                yield path


Floors = tuple[tuple[str, ...], ...]
"""A package's floors from the ground up, each the rooms that stand side by side on it."""


def declared_floors(init: Path) -> Floors | None:
    """The ``FLOORS`` a package's ``__init__.py`` declares, from the ground up, each floor as its
    rooms (a lone name is a floor of one room); None without one."""
    for node in ast.parse(init.read_text(), filename=str(init)).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and target.id == "FLOORS"):
            continue
        floors = []
        for element in value.elts if isinstance(value, ast.Tuple | ast.List) else [value]:
            rooms = element.elts if isinstance(element, ast.Tuple) else [element]
            if not (isinstance(value, ast.Tuple | ast.List) and rooms) or not all(
                isinstance(r, ast.Constant) and isinstance(r.value, str) for r in rooms
            ):
                raise AssertionError(
                    f"{init}: FLOORS must be a literal tuple of folder (or module) names, "
                    "or of tuples of the names side by side on one floor"
                )
            floors.append(tuple(str(r.value) for r in rooms if isinstance(r, ast.Constant)))
        return tuple(floors)
    return None


def floored_packages(root: Path) -> dict[str, Floors]:
    """Dotted name → floors, of every package under ``root`` that declares them."""
    found = {}
    for directory in _package_dirs(root).values():
        for init in sorted(directory.rglob("__init__.py")):
            floors = declared_floors(init)
            if floors is not None:
                found[_module_name(init, root)] = floors
    return found


def _room_of(module: str, package: str, floors: Floors) -> tuple[int, str] | None:
    """The floor of ``package`` that ``module`` stands on (its index) and its room there; None
    outside the package, for the package's face itself (its ``__init__.py``, above every floor)
    and for a room that is on no floor (:func:`test_every_room_of_a_floored_package_is_on_a_floor`
    reports those)."""
    if not module.startswith(package + "."):
        return None
    room = module[len(package) + 1 :].split(".")[0]
    return next(((level, room) for level, rooms in enumerate(floors) if room in rooms), None)


def floor_violations(root: Path) -> list[str]:
    """Every import from a floor of a package to one of its floors above, or to another room
    beside it on its own floor."""
    floored = floored_packages(root)
    found = []
    for path in _source_files(root):
        importer = _module_name(path, root)
        for line, module in _imports(path, root):
            for package, floors in floored.items():
                here, there = _room_of(importer, package, floors), _room_of(module, package, floors)
                if here is None or there is None:
                    continue
                where = f"{path.relative_to(root)}:{line}: {importer} (room {here[1]} of {package})"
                if there[0] > here[0]:
                    found.append(f"{where} imports {module} (room {there[1]}, a floor above)")
                elif there[0] == here[0] and there[1] != here[1]:
                    found.append(f"{where} imports {module} (room {there[1]}, beside it)")
    return found


#: Inside fabric, only the operation driver is handed the backends and the Redfish task control: the
#: floors above ``driver``, up to the wiring (``service``) that builds every part, import nothing of
#: these. The attach/detach front, the warm pool, reconciliation and the API reach the fabric
#: through the driver (docs/architecture.md, "Inside fabric").
THROUGH_THE_DRIVER = ("fabric.redfish", "fabric.backends")


def driver_bypasses(root: Path) -> list[str]:
    """Every import of the Redfish client or the backends from a floor of fabric between the
    operation driver and the wiring."""
    floors = declared_floors(root / "fabric" / "__init__.py") or ()
    level = {room: index for index, rooms in enumerate(floors) for room in rooms}
    between = range(level["driver"] + 1, level["service"])
    found = []
    for path in _source_files(root):
        importer = _module_name(path, root)
        here = _room_of(importer, "fabric", floors)
        if here is None or here[0] not in between:
            continue
        for line, module in _imports(path, root):
            if any(module == sealed or module.startswith(sealed + ".") for sealed in THROUGH_THE_DRIVER):
                found.append(
                    f"{path.relative_to(root)}:{line}: {importer} imports {module} "
                    "(only the operation driver is handed the fabric)"
                )
    return found


def test_every_package_has_a_floor() -> None:
    assert set(PACKAGES) | set(TESTBED_PACKAGES) == set(MAY_IMPORT), (
        "add the new package to MAY_IMPORT and docs/architecture.md"
    )


def _testbed_imports(root: Path) -> list[str]:
    """Every import of a testbed package from a product module."""
    found = []
    for path in _source_files(root):
        importer = _module_name(path, root)
        if importer.split(".")[0] not in PACKAGES:
            continue
        for line, module in _imports(path, root):
            if module.split(".")[0] in TESTBED_PACKAGES:
                found.append(f"{path.relative_to(root)}:{line}: {importer} imports {module} (the testbed)")
    return found


def test_the_product_never_imports_its_testbed() -> None:
    """The testbed may import the product, never the reverse: a plain install of the product (the
    image, ``pip install fabric-dra``) has no testbed, and the testbed's commands reach the
    ``fabric-dra`` command line through entry points (``fabric_dra.cli.COMMANDS_GROUP``)."""
    assert not set(PACKAGES) & set(TESTBED_PACKAGES)
    for package in PACKAGES:
        assert not MAY_IMPORT[package] & set(TESTBED_PACKAGES), f"{package} may not import the testbed"
    assert _testbed_imports(REPO_ROOT) == []


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
    return found


def test_imports_point_down() -> None:
    assert _violations(REPO_ROOT) == []


def test_imports_inside_a_package_point_down_its_floors() -> None:
    assert floored_packages(REPO_ROOT), "emulator declares its floors"
    assert floor_violations(REPO_ROOT) == []


def test_only_the_operation_driver_reaches_the_fabric() -> None:
    assert driver_bypasses(REPO_ROOT) == []


def test_every_room_of_a_floored_package_is_on_a_floor() -> None:
    """A new folder or module is placed on a floor; a floor names a room that exists."""
    floored = floored_packages(REPO_ROOT)
    assert {"emulator", "emulator.redfish", "kube_standin"} <= set(floored)
    dirs = _package_dirs(REPO_ROOT)
    for package, floors in floored.items():
        top, *inner = package.split(".")
        directory = dirs[top].joinpath(*inner)
        rooms = {p.stem for p in directory.glob("*.py") if p.name != "__init__.py"}
        rooms |= {p.name for p in directory.iterdir() if (p / "__init__.py").is_file()}
        placed = [room for floor in floors for room in floor]
        assert len(set(placed)) == len(placed), f"{package}: a room is named twice"
        assert rooms == set(placed), f"{package}: rooms {sorted(rooms)}, floors {list(floors)}"


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


#: the floors of the probe package the floor check is tried on: two rooms side by side on the middle floor
_PROBE_FLOORS = ("low", ("left", "right"), "high", "cli")


@pytest.mark.parametrize(
    ("importer", "source", "reported"),
    [
        ("low/probe.py", "from emulator.high.view import Node\n", True),
        ("low/probe.py", "def f():\n    import emulator.high\n", True),
        ("high/probe.py", "from emulator.low import store\n", False),
        ("high/inner/probe.py", "from emulator.high.view import Node\n", False),
        ("cli.py", "from emulator.high import view\n", False),
        ("low/probe.py", "from emulator.cli import main\n", True),
        ("__init__.py", f"FLOORS = {_PROBE_FLOORS!r}\nfrom emulator.cli import main\n", False),
        ("left/probe.py", "from emulator.right import thing\n", True),
        ("right/probe.py", "import emulator.left.probe\n", True),
        ("left/probe.py", "from emulator.high import view\n", True),
        ("left/probe.py", "from emulator.low import store\n", False),
        ("high/probe.py", "from emulator.left import thing\n", False),
    ],
)
def test_the_floor_check_reads_folders(importer: str, source: str, reported: bool, tmp_path: Path) -> None:
    """The check itself: floors come from the package's FLOORS; an import up a floor or to a room
    beside it on its floor is reported, one within a room or down a floor is not, nor any from the
    package's face."""
    package = tmp_path / "emulator"
    for room in ("low", "high", "high/inner", "left", "right"):
        (package / room).mkdir(parents=True)
        (package / room / "__init__.py").write_text("")
    (package / "__init__.py").write_text(f"FLOORS = {_PROBE_FLOORS!r}\n")
    (package / importer).write_text(source)
    violations = floor_violations(tmp_path)
    assert bool(violations) is reported, violations


def test_the_floor_check_finds_the_testbed_in_its_folder(tmp_path: Path) -> None:
    """The check itself: the testbed's packages are read from testbed/, and a product module that
    imports one is reported."""
    (tmp_path / "fabric").mkdir()
    (tmp_path / "fabric" / "probe.py").write_text("def f():\n    import kube_standin.cli\n")
    (tmp_path / "testbed" / "kube_standin").mkdir(parents=True)
    (tmp_path / "testbed" / "kube_standin" / "probe.py").write_text("from fabric import probe\n")
    expected = "fabric/probe.py:2: fabric.probe imports kube_standin.cli (the testbed)"
    assert _testbed_imports(tmp_path) == [expected]
    assert _module_name(tmp_path / "testbed" / "kube_standin" / "probe.py", tmp_path) == "kube_standin.probe"


@pytest.mark.parametrize(
    ("importer", "source", "reported"),
    [
        ("bindings/probe.py", "from fabric.backends.base import Backend\n", True),
        ("api/probe.py", "def f():\n    from fabric.redfish import error_mapping\n", True),
        ("bindings/probe.py", "from fabric.state.model import DeviceRecord\n", False),
        ("driver/probe.py", "from fabric.backends.base import Backend\n", False),
        ("service/probe.py", "from fabric.redfish.client import RedfishClient\n", False),
    ],
)
def test_the_driver_rule_sees_a_bypass(importer: str, source: str, reported: bool, tmp_path: Path) -> None:
    """The check itself: a floor between the driver and the wiring importing the Redfish client or
    the backends is reported; the driver and the wiring may, and anyone may import the state."""
    package = tmp_path / "fabric"
    package.mkdir()
    floors = ("redfish", "state", "backends", "driver", "bindings", "api", "service")
    (package / "__init__.py").write_text(f"FLOORS = {floors!r}\n")
    for room in floors:
        (package / room).mkdir()
        (package / room / "__init__.py").write_text("")
    (package / importer).write_text(source)
    assert bool(driver_bypasses(tmp_path)) is reported
