"""Start ``fabric-dra manager serve`` as a real process for tests (a thin wrapper of
:meth:`fabric_dra_testbed.stack.Stack.manager`).

:func:`running_manager` yields a started :class:`fabric_dra_testbed.stack.Role` whose ``address`` is the
manager's base URL, once its ``/readyz`` answered 200 (leader, ledger loaded, first inventory read),
and stops it afterwards. The flags are exactly the caller's: ``args`` say how it logs in to the
Redfish service, where its ledger is and how clients authenticate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from fabric_dra_testbed.stack import Role, Stack, static_tokens_file, wait_ready

__all__ = ["running_manager", "start_manager", "static_tokens_file", "wait_ready"]


@contextlib.contextmanager
def running_manager(
    work: Path,
    redfish_url: str,
    *,
    args: Sequence[str] = (),
    name: str = "manager",
    ready: bool = True,
    env: dict[str, str] | None = None,
    ca_file: str | None = None,
    ready_timeout: float = 60.0,
) -> Iterator[Role]:
    process = start_manager(
        work,
        redfish_url,
        args=args,
        name=name,
        ready=ready,
        env=env,
        ca_file=ca_file,
        ready_timeout=ready_timeout,
    )
    try:
        yield process
    finally:
        process.stop()


def start_manager(
    work: Path,
    redfish_url: str,
    *,
    args: Sequence[str] = (),
    name: str = "manager",
    ready: bool = True,
    env: dict[str, str] | None = None,
    ca_file: str | None = None,
    ready_timeout: float = 60.0,
) -> Role:
    """Start a manager logging to ``work/<name>.log``; ``args`` add flags (auth, ledger, ...).
    The caller stops it (prefer :func:`running_manager`). ``ca_file`` verifies a TLS listener;
    with ``ready`` it waits up to ``ready_timeout`` seconds for ``/readyz``."""
    stack = Stack(work, logs_dir=work)
    try:
        manager = stack.manager(
            redfish_url,
            name=name,
            ledger=None,
            redfish_args=[],
            args=args,
            env=env,
            ca_file=Path(ca_file) if ca_file else None,
            ready=ready,
            ready_timeout=ready_timeout,
        )
    except BaseException:
        stack.stop()
        raise
    return manager.role
