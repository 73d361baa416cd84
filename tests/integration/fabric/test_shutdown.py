"""SIGTERM while the ResourceSlice publisher holds a long poll open: the poll is answered with the
inventory as it is, and the manager stops cleanly (exit 0, no exception logged) instead of holding
its clients and its own exit until uvicorn's graceful-shutdown timeout cancels them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from tests.support.emulator import run_emulator
from tests.support.fabric_manager import start_manager


def test_sigterm_answers_open_long_polls_and_exits_cleanly(tmp_path: Path) -> None:
    with run_emulator(tmp_path, extra_args=["--insecure-no-auth"]) as emu:
        manager = start_manager(
            tmp_path,
            emu.url,
            args=["--redfish-auth", "none", "--insecure-no-auth", "--state-dir", str(tmp_path)],
        )
        try:
            version = httpx.get(f"{manager.address}/api/v1/inventory", timeout=10).json()["version"]
            answers: list[httpx.Response | BaseException] = []

            def long_poll() -> None:
                try:
                    answers.append(
                        httpx.get(
                            f"{manager.address}/api/v1/inventory",
                            params={"after": version, "timeoutSeconds": 60},
                            timeout=90,
                        )
                    )
                except BaseException as err:  # recorded for the assertion below
                    answers.append(err)

            pollers = [threading.Thread(target=long_poll) for _ in range(3)]
            for poller in pollers:
                poller.start()
            _wait_for_connections(int(manager.address.rsplit(":", 1)[1]), 3)
            exit_code = manager.stop(timeout=30)
            for poller in pollers:
                poller.join(timeout=30)
        finally:
            manager.stop()
    assert exit_code == 0
    assert len(answers) == 3
    for answer in answers:
        assert isinstance(answer, httpx.Response), answer
        assert answer.status_code == 200
        assert answer.json()["version"] == version
    log = manager.log_file.read_text()
    assert "Exception in ASGI application" not in log
    assert "timeout graceful shutdown exceeded" not in log


def _wait_for_connections(port: int, count: int) -> None:
    """Until ``count`` TCP connections to ``port`` are established (read from /proc/net/tcp)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        established = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01":  # 01: TCP_ESTABLISHED
                established += 1
        if established >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"the long polls did not connect to port {port}")
