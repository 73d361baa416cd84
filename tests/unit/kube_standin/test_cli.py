"""``fabric-dra standin apiserver`` refuses what it cannot serve in one line, exit 1, whatever
part of the server finds the problem: the options themselves, the feature gates, the release
``--server-version`` names (found only as the server starts), the schemas, the state file."""

from __future__ import annotations

from pathlib import Path

import pytest

from plumbing import procs


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--tls-cert-file", "/etc/hostname"], "--tls-cert-file and --tls-private-key-file go together"),
        (["--history", "5"], "--history must be at least 100 changes"),
        (["--feature-gates", "Bogus=true"], "unrecognized feature gate: Bogus"),
        (["--server-version", "abc"], "not a Kubernetes version: 'abc'"),
        (["--validate-versions", "1.99"], "kubernetes-validate has no strict schemas for Kubernetes 1.99"),
    ],
)
def test_an_option_it_cannot_serve_is_one_line(options: list[str], message: str) -> None:
    versions = [] if "--validate-versions" in options else ["--validate-versions", "none"]
    done = procs.run(["standin", "apiserver", "--port", "0", *versions, *options], timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fabric-dra: error: "), done.stderr
    assert message in lines[0]


def test_a_state_file_it_did_not_write_is_one_line(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text("{")
    done = procs.run(["standin", "apiserver", "--validate-versions", "none", "--state-file", str(state)])
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"fabric-dra: error: state file {state} cannot be loaded (1 validation error for StoreState); "
        "move it away to start with an empty server"
    ]
