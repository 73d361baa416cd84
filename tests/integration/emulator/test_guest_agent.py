"""The QEMU guest agent, run on this machine's loopback as the guest runs it (``python -S agent.py``):
a preloaded program starts as a fork of the project's one fork server (plumbing/forkserver.py,
which the agent loads beside it without the plumbing package), ``-m MODULE`` and scripts alike,
and a program the server does not serve starts as a new interpreter, as before."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emulator.qemu.guest import AgentError, GuestAgent
from emulator.qemu.image import GUEST_AGENT
from tests.support.waiting import wait_until

PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time
    print(json.dumps({
        "argv": sys.argv, "path0": sys.path[0], "name": __name__, "ppid": os.getppid(),
        "sid": os.getsid(0), "pid": os.getpid(), "preloaded": "warmed" in sys.modules,
        "env": os.environ.get("PROBE"),
    }), flush=True)
    if sys.argv[1] == "exit":
        sys.exit(int(sys.argv[2]))
    time.sleep(60)
    """
)


@pytest.fixture
def programs(tmp_path: Path) -> Path:
    """The programs the agent runs: a module ``probe`` and the same as a script, and ``warmed``,
    which only the fork server imports."""
    where = tmp_path / "programs"
    where.mkdir()
    (where / "probe.py").write_text(PROGRAM)
    (where / "script.py").write_text(PROGRAM)
    (where / "warmed.py").write_text("WARM = True\n")
    return where


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[tuple[GuestAgent, int]]:
    """The agent on a free loopback port, as ``guest-init.sh`` starts it: ``python -S``."""
    console = tmp_path / "console.log"
    with console.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-S", str(GUEST_AGENT), "0", "127.0.0.1"],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=tmp_path,
            start_new_session=True,
        )
    try:
        line = wait_until(
            lambda: console.read_text().partition("\n")[0] if "\n" in console.read_text() else None,
            timeout=30,
            what="the agent's first line",
        )
        assert line.startswith("fabric-dra guest agent listening on "), console.read_text()
        yield GuestAgent(int(line.rsplit(" ", 1)[1])), proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # its fork server sees it gone and stops its children
        proc.wait(10)


def _spawn(client: GuestAgent, argv: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """The agent's whole answer to a spawn (``GuestAgent.spawn`` keeps only the pid)."""
    return client.request(op="spawn", argv=argv, env=env, log=str(log))


def _said(log: Path) -> dict[str, object]:
    wait_until(lambda: log.exists() and "\n" in log.read_text(), timeout=30, what=f"{log.name}'s first line")
    said: dict[str, object] = json.loads(log.read_text().splitlines()[0])
    return said


def test_a_preloaded_module_and_script_start_as_forks_of_the_fork_server(
    agent: tuple[GuestAgent, int], programs: Path
) -> None:
    client, agent_pid = agent
    env = {"PYTHONPATH": str(programs)}
    assert client.request(op="preload", python=sys.executable, modules=["json", "warmed"], env=env) == {
        "started": True
    }
    assert client.request(op="preload", python=sys.executable, modules=["json", "warmed"], env=env) == {
        "started": False
    }
    assert client.preloaded(timeout=60) >= 0

    log = programs / "module.log"
    answer = client.request(
        op="spawn",
        argv=[sys.executable, "-m", "probe", "exit", "3"],
        env={**env, "PROBE": "seen"},
        log=str(log),
    )
    assert answer["forked"] is True
    assert client.wait(answer["pid"], 30) == 3
    said = _said(log)
    assert said["preloaded"] is True, "the child did not come from the server that imported warmed"
    assert said["ppid"] != agent_pid and said["pid"] == said["sid"] == answer["pid"]
    assert said["argv"] == [str(programs / "probe.py"), "exit", "3"] and said["name"] == "__main__"
    assert said["env"] == "seen"

    log = programs / "script.log"
    script = programs / "script.py"
    answer = client.request(
        op="spawn", argv=[sys.executable, str(script), "exit", "0"], env=env, log=str(log)
    )
    assert answer["forked"] is True
    assert client.wait(answer["pid"], 30) == 0
    said = _said(log)
    assert said["preloaded"] is True
    assert said["argv"] == [str(script), "exit", "0"] and said["path0"] == str(programs)


def test_waits_and_signals_of_a_forked_program(agent: tuple[GuestAgent, int], programs: Path) -> None:
    client, _ = agent
    env = {"PYTHONPATH": str(programs)}
    client.preload(sys.executable, ["warmed"], env=env)
    log = programs / "sleeps.log"
    pid = client.spawn([sys.executable, "-m", "probe", "sleep"], log=str(log), env=env)
    _said(log)
    assert client.wait(pid, 0) is None  # still running
    assert client.wait(pid, 0.2) is None
    assert client.signal(pid, signal.SIGTERM)
    assert client.wait(pid, 30) == -signal.SIGTERM


def test_what_the_server_does_not_serve_starts_as_a_new_interpreter(
    agent: tuple[GuestAgent, int], programs: Path
) -> None:
    client, agent_pid = agent
    client.preload(sys.executable, ["warmed"], env={"PYTHONPATH": str(programs)})
    log = programs / "other.log"
    # another PYTHONPATH: the server's interpreter was started with its own
    other = {"PYTHONPATH": f"{programs}{os.pathsep}/elsewhere"}
    answer = client.request(
        op="spawn", argv=[sys.executable, "-m", "probe", "exit", "5"], env=other, log=str(log)
    )
    assert answer["forked"] is False
    assert client.wait(answer["pid"], 30) == 5
    said = _said(log)
    assert said["preloaded"] is False and said["ppid"] == agent_pid
    with pytest.raises(AgentError, match="no child 1"):
        client.wait(1, 0)
