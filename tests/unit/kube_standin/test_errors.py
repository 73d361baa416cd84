"""One exception tree: every error the stand-ins raise on purpose is a StandinError, under one of
the few branches a caller catches (kube_standin.errors), and keeps the built-in base it had."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import kube_standin
from kube_standin.apiserver.auth import TokensFileError
from kube_standin.apiserver.features import FeatureGateError
from kube_standin.apiserver.patchbodies import PatchError
from kube_standin.apiserver.schemas import SchemasUnavailable
from kube_standin.apiserver.selectors import SelectorError
from kube_standin.apiserver.statefile import StateFileError
from kube_standin.apiserver.status import StatusError
from kube_standin.errors import ConfigError, KubeletError, RequestError, StandinError

PACKAGE = Path(kube_standin.__file__).parent


def _exception_classes() -> list[type[BaseException]]:
    """Every class defined in kube_standin that derives from an exception."""
    classes = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] == "__main__":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.bases:
                cls = getattr(importlib.import_module(module), node.name, None)
                if inspect.isclass(cls) and issubclass(cls, BaseException):
                    classes.append(cls)
    return classes


def test_every_standin_exception_derives_from_one_root() -> None:
    classes = _exception_classes()
    assert len(classes) >= 12, "the scan must see the stand-ins' exceptions"
    strays = [f"{cls.__module__}.{cls.__qualname__}" for cls in classes if not issubclass(cls, StandinError)]
    assert strays == []


def test_the_root_has_the_few_branches_callers_catch() -> None:
    assert set(StandinError.__subclasses__()) == {ConfigError, RequestError, StatusError, KubeletError}
    branches = (ConfigError, RequestError, StatusError, KubeletError)
    for cls in _exception_classes():
        assert cls is StandinError or issubclass(cls, branches), cls


def test_each_error_keeps_its_builtin_base() -> None:
    """Code that caught the built-in type before the tree still catches it."""
    for cls, builtin in [
        (TokensFileError, ValueError),
        (FeatureGateError, ValueError),
        (StateFileError, RuntimeError),
        (SchemasUnavailable, RuntimeError),
        (SelectorError, ValueError),
        (PatchError, ValueError),
    ]:
        assert issubclass(cls, builtin), cls
    for cls in (TokensFileError, FeatureGateError, StateFileError, SchemasUnavailable):
        assert issubclass(cls, ConfigError), cls
    for cls in (SelectorError, PatchError):
        assert issubclass(cls, RequestError), cls
    assert StatusError(404, "NotFound", "gone").to_status()["reason"] == "NotFound"
