"""No ``assert`` on a production path: ``python -O`` drops every assert statement, so a check
written as one silently stops checking (issue 14, item 13). Invariants raise real errors.

The product's packages are scanned; the testbed (``testbed/``: the Kubernetes stand-ins, the stack
builder with the stand-ins around a role, the demo) is test equipment and may assert."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.deploy import PACKAGES, REPO_ROOT

PRODUCT = PACKAGES


def _asserts(root: Path) -> list[str]:
    found = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if "proto" in rel.parts and path.name.endswith("_pb2.py"):
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            found += [f"{rel}:{node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Assert)]
    return found


def test_no_assert_in_product_code() -> None:
    assert _asserts(REPO_ROOT) == []


def test_the_scan_finds_an_assert(tmp_path: Path) -> None:
    (tmp_path / "fabric").mkdir()
    (tmp_path / "fabric" / "service.py").write_text("def f(x):\n    assert x is not None\n    return x\n")
    assert _asserts(tmp_path) == ["fabric/service.py:2"]
