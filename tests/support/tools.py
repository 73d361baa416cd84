"""Outside programs some tests need (Chromium, promtool): found on PATH, or the reason they are not.

Where a tool is missing its tests skip and say why; with ``$FABRIC_DRA_REQUIRE_TOOLS`` set
(``.ci/run`` sets it after installing them) a missing tool fails the run instead, so CI cannot pass
by not running them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

import pytest

__all__ = ["find_tool", "needs_tool"]


def find_tool(names: Sequence[str], what: str, debian_package: str) -> tuple[str | None, str]:
    """(path, "") of the first of ``names`` on PATH, else (None, why not)."""
    for name in names:
        found = shutil.which(name)
        if found:
            return found, ""
    return None, f"no {what} on PATH (Debian: apt-get install {debian_package}; .ci/run installs it)"


def needs_tool(path: str | None, why_not: str) -> pytest.MarkDecorator:
    """The mark of a module whose tests need a tool: skip without it, or fail when it is required."""
    if path is None and os.environ.get("FABRIC_DRA_REQUIRE_TOOLS"):
        pytest.fail(f"$FABRIC_DRA_REQUIRE_TOOLS is set but {why_not}", pytrace=False)
    return pytest.mark.skipif(path is None, reason=why_not)
