"""No ``assert`` on a production path: ``python -O`` drops every assert statement, so a check
written as one silently stops checking (issue 14, item 13). Invariants raise real errors.

The product packages are scanned; the Kubernetes stand-ins (``kube_standin``) and the stack builder
with the stand-ins around a role (``fabric_dra/stack.py``, ``fabric_dra/standins.py``) are test
equipment and may assert."""

from __future__ import annotations

import ast
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("plumbing", "manager_api", "dra_driver", "fabric", "emulator", "fabric_dra")
TEST_EQUIPMENT = {Path("fabric_dra/stack.py"), Path("fabric_dra/standins.py")}


def _asserts(root: Path) -> list[str]:
    found = []
    for package in PRODUCT:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if rel in TEST_EQUIPMENT or ("proto" in rel.parts and path.name.endswith("_pb2.py")):
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
