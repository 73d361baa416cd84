"""Fixtures of the deployment tests: each overlay rendered once per session."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.deploy import kustomize_command, render_target, target_names


@pytest.fixture(scope="session")
def kustomize() -> list[str]:
    command = kustomize_command()
    if command is None:
        pytest.skip("kubectl (or kustomize) is not installed: cannot render deploy/overlays")
    return command


@pytest.fixture(scope="session")
def rendered_overlays(kustomize: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Every overlay under deploy/overlays and every composition of an overlay with components
    (tests.support.deploy.COMPOSITIONS), rendered by the real kustomize."""
    return {name: render_target(name) for name in target_names()}
