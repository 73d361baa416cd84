"""Every server role listens with TCP_NODELAY, and its accepted connections have it too.

Without it a response uvicorn writes in two pieces waits for the client's delayed ACK on a
reused keep-alive connection (~40 ms per request). Nothing is timed here: the option itself is
read from the real processes' sockets (``pidfd_getfd`` duplicates a child's descriptor into this
process, as a debugger would), so the check cannot pass by accident of a fast machine.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from fabric_dra_testbed.stack import Role, Stack, free_port, short_dir, wait_ready
from plumbing.netutil import ListenError, listen_tcp
from tests.support.apiserver import ApiServerProcess, shared_apiserver  # noqa: F401 - fixture

_SYS_PIDFD_GETFD = 438  # the same number on every architecture (Linux 5.6+)


def _nodelay(sock: socket.socket) -> bool:
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def _tcp_sockets_of(pid: int, port: int) -> list[tuple[bool, bool]]:
    """(listening, TCP_NODELAY) of every TCP socket of process ``pid`` bound to local ``port``."""
    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    found = []
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            fd = libc.syscall(_SYS_PIDFD_GETFD, pidfd, int(name), 0)
            if fd < 0:
                code = ctypes.get_errno()
                if code in (errno.EPERM, errno.ENOSYS):
                    pytest.skip(f"pidfd_getfd is not allowed here ({os.strerror(code)})")
                continue  # closed meanwhile
            with socket.socket(fileno=fd) as sock:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                if sock.getsockname()[1] != port:
                    continue
                listening = bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN))
                found.append((listening, _nodelay(sock)))
    finally:
        os.close(pidfd)
    return found


def _check_role(name: str, pid: int, url: str) -> None:
    """Connect to ``url`` and wait until the server accepted: its listening socket and the accepted
    one must both have TCP_NODELAY."""
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    with socket.create_connection((parts.hostname, parts.port), timeout=10):
        for _ in range(500):  # until the server's event loop has accepted the connection
            sockets = _tcp_sockets_of(pid, parts.port)
            if any(not is_listener for is_listener, _ in sockets):
                break
            time.sleep(0.02)
    assert [nodelay for is_listener, nodelay in sockets if is_listener] == [True], f"{name}: {sockets}"
    accepted = [nodelay for is_listener, nodelay in sockets if not is_listener]
    assert accepted and all(accepted), f"{name}: accepted connection(s) without TCP_NODELAY: {sockets}"


def test_listen_tcp_sets_nodelay_on_listening_and_accepted_sockets() -> None:
    with listen_tcp("127.0.0.1", 0) as listener:
        assert _nodelay(listener)
        with socket.create_connection(listener.getsockname()[:2]) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert _nodelay(accepted)
                assert client  # connected


def test_listen_tcp_error_is_one_line_naming_address_and_hint() -> None:
    with listen_tcp("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(ListenError) as caught:
            listen_tcp("127.0.0.1", port, hint="pick another --metrics-port")
    message = str(caught.value)
    assert message.startswith(f"cannot listen on 127.0.0.1:{port}: ")
    assert message.endswith("; pick another --metrics-port") and "\n" not in message


@pytest.fixture
def work() -> Iterator[Path]:
    root = short_dir("fdn-")
    yield root
    import shutil

    shutil.rmtree(root, ignore_errors=True)


def test_every_server_role_sets_nodelay(work: Path, shared_apiserver: ApiServerProcess) -> None:  # noqa: F811
    api = shared_apiserver
    with Stack(work, logs_dir=work) as stack:
        emulator = stack.emulator(auth=False, start=False)
        metrics_port = free_port()
        plugin = stack.plugin(
            "node-nodelay", None, api, backend="noop", metrics_port=metrics_port, start=False
        )
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(Role.start, (emulator.role, plugin.role)))
        manager = stack.manager(emulator, state_dir=work / "mgr", insecure_no_auth=True, ready=False)
        controller = stack.controller(manager, api, args=["--driver-name", "nodelay.fabric-dra.io"]).role
        wait_ready(manager.url, timeout=120)

        assert api.process.proc is not None
        _check_role("emulator", emulator.role.pid, emulator.url)
        _check_role("API test server", api.process.pid, api.url)
        _check_role("manager", manager.role.pid, manager.url)
        _check_role("controller", controller.pid, controller.address)
        _check_role("plugin metrics", plugin.role.pid, f"http://127.0.0.1:{metrics_port}")
