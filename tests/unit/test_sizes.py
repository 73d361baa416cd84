"""A room a reader can take in: no class past 400 lines and no function past 80 in the product or
its testbed unless its docstring says why (``past N lines`` and the reason), so the size is a
decision someone wrote down rather than something that grew.

Generated protocol bindings (``*_pb2*.py``) are not written by hand and are left out."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.deploy import PACKAGES, REPO_ROOT

CLASS_LINES = 400
FUNCTION_LINES = 80
_REASON = re.compile(r"past \d+ lines", re.IGNORECASE)
_ROOTS = (*PACKAGES, "testbed")


def _oversized(root: Path, packages: tuple[str, ...] = _ROOTS) -> list[str]:
    found = []
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if "_pb2" in path.name or ".venv" in rel.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.ClassDef):
                    limit = CLASS_LINES
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    limit = FUNCTION_LINES
                else:
                    continue
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > limit and not _REASON.search(ast.get_docstring(node) or ""):
                    found.append(f"{rel}:{node.lineno} {node.name} ({size} lines)")
    return found


def test_no_class_or_function_past_its_size_without_a_reason() -> None:
    assert _oversized(REPO_ROOT) == []


def test_the_scan_finds_a_long_function_and_accepts_a_reason(tmp_path: Path) -> None:
    (tmp_path / "fabric").mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(FUNCTION_LINES))
    (tmp_path / "fabric" / "long.py").write_text(
        f"def grown():\n{body}\n\ndef kept():\n    '''Past 80 lines: one table.'''\n{body}"
    )
    assert _oversized(tmp_path, ("fabric",)) == [f"fabric/long.py:1 grown ({FUNCTION_LINES + 1} lines)"]
