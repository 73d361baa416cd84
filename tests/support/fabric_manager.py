"""Start ``fabric-dra manager serve`` as a real process for tests.

Other areas may use these too: :func:`running_manager` yields a started
:class:`plumbing.procs.RoleProcess` whose ``address`` is the manager's base URL, once its
``/readyz`` answered 200 (leader, ledger loaded, first inventory read), and stops it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from plumbing.procs import RoleProcess

__all__ = ["running_manager", "start_manager", "static_tokens_file", "wait_ready"]


def static_tokens_file(path: Path, tokens: dict[str, tuple[str, str | None]]) -> Path:
    """Write a ``--static-tokens`` file: token → (role, node)."""
    entries = [
        {"token": token, "role": role, **({"node": node} if node else {})}
        for token, (role, node) in tokens.items()
    ]
    path.write_text(json.dumps({"tokens": entries}))
    return path


def wait_ready(url: str, timeout: float = 30.0, ca_file: str | None = None) -> None:
    """Poll ``/readyz`` until it answers 200."""
    import ssl

    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/readyz", timeout=5, context=context) as answer:
                if answer.status == 200:
                    return
        except urllib.error.HTTPError as err:
            last = err.read().decode(errors="replace")
        except OSError as err:
            last = str(err)
        time.sleep(0.05)
    raise TimeoutError(f"manager at {url} not ready after {timeout:.0f}s: {last}")


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
    ready_timeout: float = 30.0,
) -> Iterator[RoleProcess]:
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
    ready_timeout: float = 30.0,
) -> RoleProcess:
    """Start a manager logging to ``work/<name>.log``; ``args`` add flags (auth, ledger, ...).
    The caller stops it (prefer :func:`running_manager`). ``ca_file`` verifies a TLS listener;
    with ``ready`` it waits up to ``ready_timeout`` seconds for ``/readyz`` (a big topology or a
    loaded machine needs longer than the default)."""
    ready_file = work / f"{name}.ready"
    process = RoleProcess(
        [
            *("manager", "serve", "--redfish-url", redfish_url),
            *("--port", "0", "--ready-file", str(ready_file)),
            *args,
        ],
        ready_file=ready_file,
        log_file=work / f"{name}.log",
        name=name,
        env=env,
    ).start()
    if ready:
        try:
            wait_ready(process.address, timeout=ready_timeout, ca_file=ca_file)
        except BaseException:
            process.stop()
            raise
    return process
