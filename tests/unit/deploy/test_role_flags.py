"""The manifests and the code cannot drift: every ``fabric-dra`` command line in every rendered
overlay is accepted by that role's own argparse parser (``fabric_dra.cli.build_parser()``), and
every environment variable the manifests give a fabric-dra container is either consumed by
Kubernetes itself (``$(VAR)`` in args) or read by the role's parser.

Every role a manifest names must be one the CLI has: a missing role fails the check.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import os
from collections.abc import Iterator
from typing import Any

import pytest

from fabric_dra.cli import build_parser
from tests.support.deploy import (
    OVERLAYS_DIR,
    Container,
    containers,
    kustomize_command,
    overlay_names,
    references,
    render,
)


def _fabric_dra_containers() -> list[Any]:
    """One parameter per (overlay, fabric-dra container); rendering failures surface in
    test_schemas.py::test_overlay_renders, so they only yield nothing here."""
    if kustomize_command() is None:
        return []
    params = []
    for overlay in overlay_names():
        try:
            objects = render(OVERLAYS_DIR / overlay)
        except RuntimeError:
            continue
        for container in containers(objects):
            if container.is_fabric_dra:
                params.append(pytest.param(container, id=f"overlays/{overlay}:{container.id}"))
    return params


@contextlib.contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    """The process environment as the container would have it (parsers read env defaults when
    they are built), restored afterwards."""
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class _Rejected(Exception):
    pass


def _parse(args: list[str], env: dict[str, str]) -> argparse.Namespace:
    """Parse like the container's entrypoint would; a usage error becomes _Rejected(message)."""
    stderr = io.StringIO()
    with _environment(env), contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        parser = build_parser()
        try:
            return parser.parse_args(args)
        except SystemExit as exit_:
            raise _Rejected(stderr.getvalue().strip() or f"exit {exit_.code}") from None


def _roles() -> set[str]:
    parser = build_parser()
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(actions[0].choices) if actions else set()


def _values(namespace: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(namespace).items() if k != "handler"}


def command_line_problems(container: Container) -> list[str]:
    """Why the container's command line would not start the role it names (empty: it would)."""
    if "command" in container.spec:
        return ["overrides the image's entrypoint; fabric-dra containers give only args"]
    args = container.args
    unresolved = {ref for arg in args for ref in references(arg)}
    if unresolved:
        return [f"args reference undefined variables {sorted(unresolved)}"]
    try:
        namespace = _parse(args, container.env)
    except _Rejected as err:
        return [f"fabric-dra {' '.join(args)}\n  is rejected by the parser: {err}"]
    if not callable(getattr(namespace, "handler", None)):
        return [f"'fabric-dra {' '.join(args[:2])}' selects no command"]
    return []


def unread_env(container: Container) -> list[str]:
    """Env vars that do nothing: neither expanded by Kubernetes into an argument nor read by the
    role's parser. A variable counts as read when changing its value changes what the parser
    produces (or makes it refuse)."""
    problems = [
        f"env {name} references {sorted(references(value))}, which are not defined before it "
        "(Kubernetes expands only variables defined earlier in the list)"
        for name, value in container.env.items()
        if references(value)
    ]
    args = container.args
    baseline = _values(_parse(args, container.env))
    for name in sorted(container.env.keys() - container.expanded_by_kubernetes):
        probe = {**container.env, name: f"probe-{name.lower()}-value"}
        try:
            changed = _values(_parse(args, probe)) != baseline
        except _Rejected:
            changed = True
        if not changed:
            problems.append(
                f"env {name} is set but 'fabric-dra {args[0]}' does not read it: drop it or pass a flag"
            )
    return problems


def _require_role(container: Container) -> None:
    args = container.args
    assert args, f"{container.id} names no role"
    assert args[0] in _roles(), f"{container.id} runs 'fabric-dra {args[0]}', which is no role of the CLI"


@pytest.mark.parametrize("container", _fabric_dra_containers())
def test_command_line_is_accepted_by_the_role(container: Container) -> None:
    _require_role(container)
    assert command_line_problems(container) == [], container.id


@pytest.mark.parametrize("container", _fabric_dra_containers())
def test_every_env_var_is_used(container: Container) -> None:
    _require_role(container)
    assert unread_env(container) == [], container.id


def test_the_checks_notice_drift() -> None:
    """The two checks above fail on a manifest that drifted from the code."""
    plugins = [
        p.values[0] for p in _fabric_dra_containers() if p.values[0].workload_name == "fabric-dra-plugin"
    ]
    assert plugins, "no overlay renders the fabric-dra-plugin container"
    plugin = plugins[0]
    _require_role(plugin)
    assert command_line_problems(plugin) == []
    assert unread_env(plugin) == []

    renamed_flag = copy.deepcopy(plugin)
    renamed_flag.spec["args"] = [*plugin.spec["args"], "--sysfs-dir=/host/sys"]
    assert "rejected by the parser" in command_line_problems(renamed_flag)[0]

    dangling = copy.deepcopy(plugin)
    dangling.spec["args"] = [*plugin.spec["args"], "--cdi-root=$(CDI_DIR)"]
    assert "undefined variables ['CDI_DIR']" in command_line_problems(dangling)[0]

    ignored_env = copy.deepcopy(plugin)
    ignored_env.env["FABRIC_DRA_SYSFS"] = "/host/sys"
    assert unread_env(ignored_env) == [
        "env FABRIC_DRA_SYSFS is set but 'fabric-dra plugin' does not read it: drop it or pass a flag"
    ]
