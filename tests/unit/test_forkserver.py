"""The fork server starts ``python -m MODULE`` (or a script) as a new interpreter would, and leaves
nothing behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from plumbing.crashpoints import ENV as CRASH_ENV
from plumbing.forkserver import ForkedProcess, ForkServer, ForkServerError, runs
from plumbing.procs import RoleProcess, run, use_fork_server

PROGRAM = textwrap.dedent(
    """
    import json, os, sys, time
    from plumbing import crashpoints
    what = sys.argv[1]
    print(json.dumps({
        "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0], "pid": os.getpid(),
        "sid": os.getsid(0), "env": os.environ.get("PROBE"), "armed": sorted(crashpoints.armed()),
        "name": __name__, "stdin": sys.stdin.read(),
    }), flush=True)
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "raise":
        raise RuntimeError("boom from the child")
    if what == "sleep":
        time.sleep(60)
    """
)


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    fork = ForkServer(["plumbing.crashpoints", "json"])
    try:
        yield fork
    finally:
        fork.close()


@pytest.fixture
def program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module ``probe`` in the working directory, where ``python -m`` finds it."""
    (tmp_path / "probe.py").write_text(PROGRAM)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _spawn(server: ForkServer, log: Path, *args: str, **env: str) -> ForkedProcess:
    with log.open("ab") as output:
        return server.spawn(
            ["-m", "probe", *args], env={**os.environ, **env}, stdout=output.fileno(), stderr=output.fileno()
        )


def _said(log: Path) -> dict[str, object]:
    result: dict[str, object] = json.loads(log.read_text().splitlines()[0])
    return result


def test_a_child_runs_its_module_as_a_new_interpreter_would(server: ForkServer, program: Path) -> None:
    log = program / "child.log"
    child = _spawn(server, log, "exit", "3", PROBE="seen", **{CRASH_ENV: "plugin.prepare.before-attach"})
    assert child.wait(timeout=30) == 3
    assert child.returncode == 3 and child.poll() == 3
    said = _said(log)
    assert said["argv"] == [str(program / "probe.py"), "exit", "3"]
    assert said["cwd"] == str(program) and said["path0"] == str(program)
    assert said["name"] == "__main__"
    assert said["pid"] == child.pid and said["sid"] == child.pid  # its own session, as start_new_session
    assert said["env"] == "seen"
    assert said["stdin"] == ""  # /dev/null
    # the crash points were read from the child's environment, not the server's
    assert said["armed"] == ["plugin.prepare.before-attach"]
    assert server.import_seconds is not None


def test_an_exception_is_a_traceback_and_status_1(server: ForkServer, program: Path) -> None:
    log = program / "child.log"
    child = _spawn(server, log, "raise")
    assert child.wait(timeout=30) == 1
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "RuntimeError: boom from the child" in text


def test_signals_and_timeouts_as_popen_reports_them(server: ForkServer, program: Path) -> None:
    log = program / "child.log"
    child = _spawn(server, log, "sleep")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert child.poll() is None
    deadline = time.monotonic() + 30
    while not log.exists() or (not log.read_text() and time.monotonic() < deadline):
        time.sleep(0.02)
    os.killpg(child.pid, signal.SIGTERM)
    assert child.wait(timeout=30) == -signal.SIGTERM


def test_an_optional_module_missing_is_left_to_the_child(program: Path) -> None:
    fork = ForkServer(["json", "no_such_module_anywhere.at_all"])
    try:
        assert _spawn(fork, program / "child.log", "exit", "0").wait(timeout=30) == 0
    finally:
        fork.close()


def test_a_module_function_entry_runs_once_in_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``module:function``: called once after the import; every child starts with what it made."""
    (tmp_path / "warmed.py").write_text(
        "import os\nruns = []\n\ndef preload():\n    runs.append(os.getpid())\n"
    )
    (tmp_path / "reads.py").write_text(
        "import json, os, warmed\nprint(json.dumps([warmed.runs, os.getpid()]))\n"
    )
    monkeypatch.chdir(tmp_path)
    fork = ForkServer(["warmed:preload"])
    try:
        seen = []
        for n in range(2):
            log = tmp_path / f"child{n}.log"
            with log.open("ab") as output:
                child = fork.spawn(
                    ["-m", "reads"], env=dict(os.environ), stdout=output.fileno(), stderr=output.fileno()
                )
            assert child.wait(timeout=30) == 0, log.read_text()
            seen.append(json.loads(log.read_text()))
        (runs_a, pid_a), (runs_b, pid_b) = seen
        assert runs_a == runs_b and len(runs_a) == 1  # the server's one call, not the children's
        assert runs_a[0] not in (pid_a, pid_b)
    finally:
        fork.close()


def test_a_script_runs_as_python_script_would(server: ForkServer, program: Path) -> None:
    """``python SCRIPT ARGS``: argv[0] is the script as given, sys.path[0] its directory."""
    (program / "tools").mkdir()
    script = program / "tools" / "probe_script.py"
    script.write_text(PROGRAM)
    log = program / "script.log"
    with log.open("ab") as output:
        child = server.spawn(
            [str(script), "exit", "4"], env=dict(os.environ), stdout=output.fileno(), stderr=output.fileno()
        )
    assert child.wait(timeout=30) == 4
    said = _said(log)
    assert said["argv"] == [str(script), "exit", "4"]
    assert said["path0"] == str(program / "tools") and said["cwd"] == str(program)
    assert said["name"] == "__main__"
    assert child.args == [server.python, str(script), "exit", "4"]


@pytest.mark.parametrize(
    ("argv", "served"),
    [
        (["-m", "probe"], True),
        (["probe.py", "x"], True),
        (["-c", "print(1)"], False),
        (["-m"], False),
        ([], False),
    ],
)
def test_only_a_module_or_a_script_is_forked(server: ForkServer, argv: list[str], served: bool) -> None:
    """Interpreter options take effect at an interpreter's start: a fork cannot honour them."""
    assert runs(argv) is served
    if not served:
        with pytest.raises(ForkServerError, match="a fork runs -m MODULE or a script"):
            server.spawn(argv, env=dict(os.environ), stdout=1, stderr=2)


def test_a_server_importing_for_long_is_waited_for_as_long_as_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """start() returns at once; wait_ready() says when the imports take longer than its timeout and
    may be called again (the guest agent preloads in the background, for minutes under TCG)."""
    (tmp_path / "slow_import.py").write_text("import time\ntime.sleep(1.5)\n")
    (tmp_path / "probe.py").write_text(PROGRAM)
    monkeypatch.chdir(tmp_path)
    fork = ForkServer(["slow_import"])
    try:
        started = time.monotonic()
        fork.start()
        assert time.monotonic() - started < 1.0
        with pytest.raises(TimeoutError, match="takes longer than"):
            fork.wait_ready(0.1)
        assert fork.failure is None
        assert fork.wait_ready(60) >= 1.5
        assert fork.import_seconds is not None and fork.import_seconds >= 1.5
        assert _spawn(fork, tmp_path / "child.log", "exit", "0").wait(timeout=30) == 0
    finally:
        fork.close()


def test_another_interpreter_setting_is_not_served(server: ForkServer) -> None:
    assert server.serves(dict(os.environ))
    assert not server.serves({**os.environ, "PYTHONPATH": "/elsewhere"})
    assert not server.serves({**os.environ, "PYTHONHASHSEED": "7"})


def test_a_role_process_falls_back_to_a_new_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that cannot start does not stop roles from starting; the reason is said once."""
    (tmp_path / "probe.py").write_text(PROGRAM)
    (tmp_path / "breaks_on_import.py").write_text("raise RuntimeError('this module cannot be imported')\n")
    monkeypatch.chdir(tmp_path)
    broken = ForkServer(["breaks_on_import"])
    previous = use_fork_server(broken)
    try:
        role = RoleProcess(["exit", "0"], ready_file=None, log_file=tmp_path / "role.log", module="probe")
        role.start()
        assert isinstance(role.proc, subprocess.Popen)  # a new interpreter
        assert role.reap(30) == 0
        with pytest.raises(ForkServerError, match="this module cannot be imported"):
            _spawn(broken, tmp_path / "x.log")
    finally:
        use_fork_server(previous)
        broken.close()


def test_children_stop_with_the_server_and_the_server_with_its_caller(tmp_path: Path) -> None:
    """A caller killed (a test process at its timeout) leaves no child running: the server sees its
    parent gone and stops its children; a server killed outright takes its children with it."""
    (tmp_path / "probe.py").write_text(PROGRAM)
    caller = textwrap.dedent(
        """
        import os, sys, time
        from plumbing.forkserver import ForkServer
        server = ForkServer(["json"])
        child = server.spawn(["-m", "probe", "sleep"], env=dict(os.environ), stdout=1, stderr=2)
        print(child.pid, server.proc.pid, flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", caller], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        child, server = (int(word) for word in proc.stdout.readline().split())
        assert _alive(child) and _alive(server)
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 15
        while (_alive(child) or _alive(server)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), "the child outlived its caller"
        assert not _alive(server), "the fork server outlived its caller"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_a_server_killed_outright_takes_its_children(program: Path) -> None:
    fork = ForkServer(["json"])
    try:
        child = _spawn(fork, program / "child.log", "sleep")
        assert fork.proc is not None
        fork.proc.kill()
        assert child.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 15
        while _alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child.pid)
    finally:
        fork.close()


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or during the read
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_run_captures_as_subprocess_run_does(server: ForkServer, program: Path) -> None:
    """A command run to its end through the server gives what ``subprocess.run`` gives."""
    (program / "speaks.py").write_text(
        "import sys\nprint('out\\r\\nline é')\nprint('err line', file=sys.stderr)\nsys.exit(2)\n"
    )
    previous = use_fork_server(None)
    try:
        plain = run(["a", "b"], module="speaks")
        use_fork_server(server)
        forked = run(["a", "b"], module="speaks")
    finally:
        use_fork_server(previous)
    assert (forked.args, forked.returncode, forked.stdout, forked.stderr) == (
        plain.args,
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert plain.returncode == 2 and plain.stdout == "out\nline é\n" and plain.stderr == "err line\n"


def test_run_kills_a_command_at_its_timeout(server: ForkServer, program: Path) -> None:
    previous = use_fork_server(server)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            run(["sleep"], module="probe", timeout=1.0)
    finally:
        use_fork_server(previous)
