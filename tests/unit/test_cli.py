from __future__ import annotations

import subprocess
import sys

from fabric_dra.cli import build_parser
from plumbing import __version__, procs


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return procs.run(args)


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"fabric-dra {__version__}"


EXPECTED_ROLES = {
    "emulator",
    "manager",
    "status",
    "usage",
    "drain",
    "undrain",
    "plugin",
    "cdi-hook",
    "controller",
    "explain",
    "budget",
    "demo",
    "standin",
}


def registered_roles() -> set[str]:
    parser = build_parser()
    subparsers = parser._subparsers._group_actions[0]  # type: ignore[union-attr]
    return set(subparsers.choices or {})


def test_help_lists_every_registered_role() -> None:
    result = run_cli("--help")
    assert result.returncode == 0, result.stderr
    roles = registered_roles()
    assert roles == EXPECTED_ROLES
    for role in roles:
        assert f"    {role}" in result.stdout, role


def test_no_role_prints_help_and_fails() -> None:
    result = run_cli()
    assert result.returncode == 2
    assert "usage: fabric-dra" in result.stdout


def test_unknown_role_is_a_usage_error() -> None:
    result = run_cli("teleport")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_a_role_skips_httpx_s_own_command_line_and_its_dependencies() -> None:
    """The shield the command lines raise first (``skip_unused_imports``): importing httpx then
    loads neither ``httpx._main`` nor rich and pygments, and ``httpx.main`` is httpx's fallback.
    Fails if httpx renames the module, which would silently bring the ~100 modules back."""
    probe = (
        "import sys\n"
        "from plumbing.cli import skip_unused_imports\n"
        "skip_unused_imports()\n"
        "import httpx\n"
        "loaded = sorted(m for m in ('httpx._main', 'rich', 'pygments') if sys.modules.get(m) is not None)\n"
        "print(loaded, callable(httpx.main))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] True"
    # without the shield httpx does load its command line here (the test extras install rich):
    # otherwise this test would pass whatever the shield did
    unshielded = subprocess.run(
        [sys.executable, "-c", "import sys, httpx; print('httpx._main' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert unshielded.stdout.strip() == "True", unshielded.stderr
