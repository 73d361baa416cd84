"""The composable-DRA article's scenario on a real kind cluster: deploy/kind/e2e.sh, both flows.

Needs a Docker engine and the kind binary; tests/conftest.py skips it with the reason elsewhere.
The script creates and deletes its own cluster and prints each verification step as it goes.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.support.deploy import DEPLOY_DIR


@pytest.mark.kind
@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_article_scenario_on_kind(tmp_path_factory: pytest.TempPathFactory) -> None:
    artifacts = tmp_path_factory.mktemp("kind-e2e-artifacts")
    result = subprocess.run(
        [str(DEPLOY_DIR / "kind" / "e2e.sh")],
        env={**os.environ, "FABRIC_DRA_E2E_ARTIFACTS": str(artifacts)},
        capture_output=True,
        text=True,
        timeout=3500,
        check=False,
    )
    tail = "\n".join(result.stderr.splitlines()[-80:])
    assert result.returncode == 0, f"e2e.sh failed (diagnostics in {artifacts}):\n{tail}"
    assert "PASSED: the article's four verification steps held" in result.stderr
