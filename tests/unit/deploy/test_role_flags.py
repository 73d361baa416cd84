"""The manifests and the code cannot drift: every ``fabric-dra`` command line in every rendered
overlay is accepted by that role's own argparse parser (``dra_driver.cli.build_parser()``), and
every environment variable the manifests give a fabric-dra container is either consumed by
Kubernetes itself (``$(VAR)`` in args) or read by the role's parser.

A role whose module is not part of this build yet is skipped with that reason, container by
container, so the skip list shows exactly what is not checked.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
from collections.abc import Iterator
from typing import Any

import pytest

from dra_driver.cli import build_parser
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


@pytest.mark.parametrize("container", _fabric_dra_containers())
def test_command_line_is_accepted_by_the_role(container: Container) -> None:
    assert "command" not in container.spec, (
        f"{container.id} overrides the image's entrypoint; fabric-dra containers give only args"
    )
    args = container.args
    assert args, f"{container.id} names no role"
    role = args[0]
    if role not in _roles():
        pytest.skip(f"the '{role}' role is not part of this build yet: its flags cannot be checked")
    unresolved = {ref for arg in args for ref in references(arg)}
    assert not unresolved, f"{container.id}: args reference undefined variables {sorted(unresolved)}"
    try:
        namespace = _parse(args, container.env)
    except _Rejected as err:
        pytest.fail(f"{container.id}: fabric-dra {' '.join(args)}\n  is rejected by the parser: {err}")
    assert callable(getattr(namespace, "handler", None)), (
        f"{container.id}: 'fabric-dra {' '.join(args[:2])}' selects no command"
    )


@pytest.mark.parametrize("container", _fabric_dra_containers())
def test_every_env_var_is_used(container: Container) -> None:
    """An env var the parser ignores is a setting that silently does nothing. A variable counts as
    read when changing its value changes what the parser produces (or makes it refuse)."""
    args = container.args
    if not args or args[0] not in _roles():
        pytest.skip(f"the '{args[0] if args else '?'}' role is not part of this build yet")
    for name, value in container.env.items():
        unresolved = references(value) & container.env.keys()
        assert not unresolved, (
            f"{container.id}: env {name} references {sorted(unresolved)}, defined after it "
            "(Kubernetes expands only variables defined earlier in the list)"
        )
    baseline = _values(_parse(args, container.env))
    for name in sorted(container.env.keys() - container.expanded_by_kubernetes):
        probe = {**container.env, name: f"probe-{name.lower()}-value"}
        try:
            changed = _values(_parse(args, probe)) != baseline
        except _Rejected:
            changed = True
        assert changed, (
            f"{container.id}: env {name} is set in the manifest but 'fabric-dra {args[0]}' does not "
            "read it (and no argument expands it): drop it or pass it as a flag"
        )
