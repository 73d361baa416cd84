"""One exception tree per package: every exception class that dra_driver, manager_api and plumbing
define derives from its package's root (``DriverError``, ``FabricError``, ``PlumbingError``), so a
caller can catch each package's failures at the level it cares about."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

import dra_driver.errors
import manager_api.errors
import plumbing.errors
from tests.support.deploy import REPO_ROOT

#: Modules that are not the package's own code: the generated gRPC bindings, and the fork server,
#: which belongs to the test bed's process starter and keeps its own RuntimeError.
_NOT_OURS = ("dra_driver.proto.", "plumbing.forkserver")


def _exception_classes(package: str) -> list[type[BaseException]]:
    """Every class defined in ``package`` that derives from an exception, found in the source."""
    found = []
    for path in sorted((REPO_ROOT / package).rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if module.startswith(_NOT_OURS) or "__pycache__" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef) and node.bases:
                cls = getattr(importlib.import_module(module), node.name, None)
                if inspect.isclass(cls) and issubclass(cls, BaseException):
                    found.append(cls)
    return found


@pytest.mark.parametrize(
    ("package", "root", "at_least"),
    [
        ("dra_driver", dra_driver.errors.DriverError, 18),
        ("manager_api", manager_api.errors.FabricError, 18),
        ("plumbing", plumbing.errors.PlumbingError, 14),
    ],
)
def test_every_exception_of_a_package_derives_from_its_root(
    package: str, root: type[Exception], at_least: int
) -> None:
    classes = _exception_classes(package)
    assert len(classes) >= at_least, "the scan must see the package's exceptions"
    assert [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, root)] == []


def test_the_driver_errors_that_are_also_the_managers_stay_both() -> None:
    """A host-side failure the plugin reports with the manager's words (retriable) is caught by
    either tree's callers."""
    from dra_driver.plugin.backend import StillDetaching
    from dra_driver.plugin.hostdev import DeviceInUse

    for cls in (DeviceInUse, StillDetaching):
        assert issubclass(cls, dra_driver.errors.KubeletPluginError)
        assert issubclass(cls, manager_api.errors.FabricError) and cls.retriable
        err = cls("in use", device="gpu0", node="node-a")
        assert (err.message, err.device, err.node) == ("in use", "gpu0", "node-a")


def test_input_errors_are_still_value_errors_and_builtin_bases_are_kept() -> None:
    from dra_driver.controller.features import ResourceApiMissing
    from dra_driver.selection.quantity import QuantityError
    from plumbing.netutil import ListenError
    from plumbing.tokens import TokenError

    assert issubclass(QuantityError, ValueError) and issubclass(QuantityError, dra_driver.errors.InputError)
    assert issubclass(ResourceApiMissing, RuntimeError)
    assert issubclass(TokenError, ValueError)
    err = ListenError(98, "cannot listen on 127.0.0.1:80: address in use")
    assert isinstance(err, OSError) and err.errno == 98 and str(err).startswith("cannot listen")


def test_every_manager_error_maps_to_its_wire_code_and_back() -> None:
    """The REST boundary: each class the manager can answer has its own ``code``, and the client
    reads that code back into the same class (manager_api.errors.error_class)."""
    wire = [
        c
        for c in vars(manager_api.errors).values()
        if inspect.isclass(c) and issubclass(c, manager_api.errors.FabricError)
    ]
    codes = [c.code for c in wire]
    assert len(codes) == len(set(codes)), "two classes share a wire code"
    for cls in wire:
        assert manager_api.errors.error_class(cls.code) is cls
    assert manager_api.errors.error_class("SomethingNew") is manager_api.errors.FabricError


def test_kubernetes_status_reasons_map_to_their_classes() -> None:
    """The Kubernetes boundary: an error Status becomes its class in one place."""
    from plumbing.kube import client

    cases = {
        (404, "NotFound"): client.NotFound,
        (409, "AlreadyExists"): client.AlreadyExists,
        (409, "Conflict"): client.Conflict,
        (422, "Invalid"): client.Invalid,
        (401, "Unauthorized"): client.Unauthorized,
        (403, "Forbidden"): client.Forbidden,
        (410, "Expired"): client.Gone,
        (429, "TooManyRequests"): client.ApiUnavailable,
        (503, "ServiceUnavailable"): client.ApiUnavailable,
        (400, "BadRequest"): client.ApiError,
    }
    for (status, reason), cls in cases.items():
        err = client._error_for(status, {"reason": reason, "message": "m"})
        assert type(err) is cls and isinstance(err, plumbing.errors.PlumbingError)
        assert (err.status, err.reason) == (status, reason)
