"""How :meth:`fabric_dra_testbed.stack.Stack.stop` groups a stack's parts: roles of one tier next to each
other in reverse start order stop side by side; nothing stops before a part it used to follow."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from fabric_dra_testbed.stack import CLIENT_TIER, MANAGER_TIER, SERVICE_TIER, Role, Stack


def _order(stack: Stack) -> list[list[str]]:
    """The runs ``stop`` would take, each as its callbacks' and roles' names in order."""
    runs = []
    while stack.stop_order:
        callbacks, roles = stack.stop_order.next_run()
        runs.append([getattr(c, "__name__", "?") for c in callbacks] + [r.name for r in roles])
    return runs


def _stack(tmp_path: Path, *parts: tuple[str, str | None] | str) -> Stack:
    """A stack of unstarted roles ``(name, tier)`` and callbacks (a bare name), in that order."""
    stack = Stack(tmp_path)
    for part in parts:
        if isinstance(part, str):
            stack.callback(_named_callback(part))
        else:
            stack.role(part[0], list, tier=part[1])
    return stack


def _named_callback(name: str) -> Callable[[], None]:
    def close() -> None:
        pass

    close.__name__ = name
    return close


def test_runs_follow_tiers_and_keep_callbacks_in_place(tmp_path: Path) -> None:
    stack = _stack(
        tmp_path,
        ("apiserver", SERVICE_TIER),
        "hooks",
        ("emulator", SERVICE_TIER),
        "monitor",
        ("manager", MANAGER_TIER),
        ("plugin-a", CLIENT_TIER),
        ("controller", CLIENT_TIER),
        ("odd", None),  # no tier: alone
        ("plugin-b", CLIENT_TIER),
    )
    assert _order(stack) == [
        ["plugin-b"],
        ["odd"],
        ["controller", "plugin-a"],
        ["manager"],
        ["monitor", "hooks", "emulator", "apiserver"],
    ]


def test_a_callback_after_the_last_role_of_a_run_waits_for_that_run(tmp_path: Path) -> None:
    stack = _stack(tmp_path, ("emulator", SERVICE_TIER), "after-emulator", ("manager", MANAGER_TIER), "last")
    assert _order(stack) == [["last", "manager"], ["after-emulator", "emulator"]]


def test_one_tier_stops_side_by_side(tmp_path: Path) -> None:
    """Four processes that each take a second to exit on SIGTERM stop in about one second."""
    slow_exit = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), sys.exit(0)))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    script = tmp_path / "slow_exit.py"
    script.write_text(slow_exit)
    stack = Stack(tmp_path)
    roles: list[Role] = []
    for index in range(4):
        role = stack.role(f"slow-{index}", list, ready=False, module="slow_exit", tier=CLIENT_TIER)
        role.env["PYTHONPATH"] = str(tmp_path)
        roles.append(role.start())
    deadline = time.monotonic() + 30
    while not all("up" in r.log_since_start() for r in roles) and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    stack.stop()
    took = time.monotonic() - started
    assert [r.proc.returncode for r in roles] == [0, 0, 0, 0], [r.tail() for r in roles]
    assert took < 3.0, f"stopping four 1 s shutdowns took {took:.1f}s: one after another"
