"""One exception tree: every error class the fabric manager declares derives from one of its two
roots (``fabric.errors``), and each becomes its wire body in one place."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

import fabric
from fabric.errors import ManagerError, error_body
from manager_api.errors import DeviceBusy, FabricError, error_class

PACKAGE = Path(fabric.__file__).parent

ROOTS = (FabricError, ManagerError)


def strays(root: Path, package: str, *, apart: frozenset[str] = frozenset()) -> list[str]:
    """``module.Class`` of every exception class declared under ``root/package`` (imported from
    ``root``) that derives from neither root, leaving out the modules ``apart``."""
    found = []
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module in apart:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.bases:
                cls = getattr(importlib.import_module(module), node.name, None)
                if inspect.isclass(cls) and issubclass(cls, BaseException) and not issubclass(cls, ROOTS):
                    found.append(f"{module}.{node.name}")
    return found


def test_every_fabric_exception_derives_from_one_of_the_roots() -> None:
    assert strays(PACKAGE.parent, "fabric") == []


def test_the_check_sees_a_stray(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check itself: a class outside both roots is reported, one inside either is not, nor a
    class that is no exception."""
    (tmp_path / "probe_pkg").mkdir()
    (tmp_path / "probe_pkg" / "__init__.py").write_text(
        "from fabric.errors import ManagerError\n"
        "from manager_api.errors import DeviceBusy\n"
        "class Lost(RuntimeError): ...\n"
        "class Kept(ManagerError): ...\n"
        "class Busy(DeviceBusy): ...\n"
        "class Plain(dict): ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert strays(tmp_path, "probe_pkg") == ["probe_pkg.Lost"]


def test_the_wire_body_names_the_class_the_client_raises_again() -> None:
    """The API and the operation log both answer with :func:`error_body`; a client turns the body
    back into the same class."""
    err = DeviceBusy("gpu0 is bound to node-1", device="gpu0", held_by="node-1/c1", retry_after=2.0)
    body = error_body(err)
    assert (body.code, body.device, body.held_by, body.retry_after_seconds) == (
        "DeviceBusy",
        "gpu0",
        "node-1/c1",
        2.0,
    )
    assert error_class(body.code) is DeviceBusy
