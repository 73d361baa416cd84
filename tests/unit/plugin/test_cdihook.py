"""``fabric-dra cdi-hook set-mems``: the container's cgroup found from its OCI state and bound to the
share's NUMA node through ``cpuset.mems``, or the container's start refused in one line.

Against a directory laid out as cgroupfs and ``/proc`` are (the kernel's own computation of
``cpuset.mems.effective`` is the test's part there), and, where this machine lets a test make a
cgroup v2 child, against the real cgroup filesystem with a real process in it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.plugin.cdihook import HookError, set_mems, set_mems_args

CONTAINER = "kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope"


def layout(
    root: Path, *, pid: int = 4242, effective: str | None = "3", cpuset: bool = True
) -> tuple[Path, Path]:
    """``proc`` and ``cgroup`` roots: the container's process ``pid`` in cgroup ``CONTAINER``."""
    proc, cgroup = root / "proc", root / "cgroup"
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(f"0::/{CONTAINER}\n")
    (cgroup / CONTAINER).mkdir(parents=True)
    (cgroup / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    if cpuset:
        (cgroup / CONTAINER / "cpuset.mems").write_text("\n")
    if effective is not None:
        (cgroup / CONTAINER / "cpuset.mems.effective").write_text(f"{effective}\n")
    return proc, cgroup


def state(pid: int = 4242) -> str:
    return json.dumps({"ociVersion": "1.2.0", "id": "abc", "status": "created", "pid": pid, "bundle": "/b"})


def test_the_node_is_written_to_the_containers_cpuset(tmp_path: Path) -> None:
    proc, cgroup = layout(tmp_path)
    written = set_mems(3, state(), proc_root=proc, cgroup_root=cgroup)
    assert written == cgroup / CONTAINER
    assert (cgroup / CONTAINER / "cpuset.mems").read_text() == "3\n"


def test_a_node_the_parents_do_not_grant_fails_the_container(tmp_path: Path) -> None:
    # cgroup v2 treats a request it cannot grant as empty: the container would keep every node
    proc, cgroup = layout(tmp_path, effective="0-1")
    with pytest.raises(HookError) as refused:
        set_mems(3, state(), proc_root=proc, cgroup_root=cgroup)
    assert str(refused.value) == (
        f"{cgroup / CONTAINER} was given NUMA node 3 but its cpuset.mems.effective reads '0-1': a parent "
        "cgroup's cpuset.mems does not include node 3 (or the node has no memory online)"
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "the OCI state on stdin is not JSON"),
        ('{"ociVersion": "1.2.0", "id": "abc"}', "the OCI state on stdin has no pid"),
        ('{"pid": true}', "the OCI state on stdin has no pid"),
    ],
)
def test_a_state_without_a_pid_is_refused(tmp_path: Path, text: str, reason: str) -> None:
    proc, cgroup = layout(tmp_path)
    with pytest.raises(HookError, match=reason):
        set_mems(3, text, proc_root=proc, cgroup_root=cgroup)


def test_no_cpuset_controller_is_named(tmp_path: Path) -> None:
    proc, cgroup = layout(tmp_path, cpuset=False)
    with pytest.raises(HookError, match=r"has no cpuset\.mems: the cpuset controller is not enabled for it"):
        set_mems(3, state(), proc_root=proc, cgroup_root=cgroup)


def test_a_private_cgroup_namespace_is_refused(tmp_path: Path) -> None:
    proc, cgroup = layout(tmp_path)
    (proc / "4242" / "cgroup").write_text("0::/\n")
    with pytest.raises(HookError, match=r"reads its cgroup as '/'.*createRuntime"):
        set_mems(3, state(), proc_root=proc, cgroup_root=cgroup)


def test_cgroup_v1_only_is_refused(tmp_path: Path) -> None:
    proc, cgroup = layout(tmp_path)
    (proc / "4242" / "cgroup").write_text("3:cpuset:/kubepods\n1:name=systemd:/kubepods\n")
    with pytest.raises(HookError, match="no cgroup v2 hierarchy"):
        set_mems(3, state(), proc_root=proc, cgroup_root=cgroup)


def test_the_command_reads_the_state_from_stdin_and_exits_1_with_one_line(tmp_path: Path) -> None:
    """As the runtime runs it: ``args`` from the spec, the state on stdin."""
    proc, cgroup = layout(tmp_path)
    command = [sys.executable, "-m", "fabric_dra.cli", *set_mems_args(3)[1:]]
    roots = ["--proc-root", str(proc), "--cgroup-root", str(cgroup)]
    done = subprocess.run(
        [*command, *roots], input=state(), capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert (cgroup / CONTAINER / "cpuset.mems").read_text() == "3\n"
    (cgroup / CONTAINER / "cpuset.mems.effective").write_text("0\n")
    done = subprocess.run(
        [*command, *roots], input=state(), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert done.stderr.startswith("fabric-dra cdi-hook set-mems: ") and done.stderr.count("\n") == 1


# -- the real cgroup filesystem -------------------------------------------------------------------


def _cgroup2_root() -> Path | None:
    for candidate in (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/unified")):
        if (candidate / "cgroup.controllers").exists():
            return candidate
    return None


@contextlib.contextmanager
def _child_cgroup() -> Iterator[tuple[Path, Path, subprocess.Popen[bytes]]]:
    """A cgroup v2 child of the root with a sleeping process in it (removed afterwards)."""
    root = _cgroup2_root()
    if root is None:
        pytest.skip("no cgroup v2 hierarchy is mounted here")
    child = root / f"fabric-dra-test-{uuid.uuid4().hex[:8]}"
    try:
        child.mkdir()
    except OSError as err:
        pytest.skip(f"this machine does not let a test make a cgroup under {root}: {err.strerror}")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (child / "cgroup.procs").write_text(str(sleeper.pid))
        yield root, child, sleeper
    finally:
        sleeper.kill()
        sleeper.wait()
        with contextlib.suppress(OSError):
            child.rmdir()


def test_on_the_real_cgroup_filesystem() -> None:
    """The container's cgroup found from a real process; its memory bound to node 0 where the
    cpuset controller is on cgroup v2, else the clear refusal a node without it gets."""
    with _child_cgroup() as (root, child, sleeper):
        oci_state = state(sleeper.pid)
        controllers = (root / "cgroup.controllers").read_text().split()
        if "cpuset" in controllers:
            subtree = root / "cgroup.subtree_control"
            if "cpuset" not in subtree.read_text().split():
                subtree.write_text("+cpuset")
            node = min(
                int(n.split("-")[0]) for n in (root / "cpuset.mems.effective").read_text().split(",") if n
            )
            assert set_mems(node, oci_state, proc_root=Path("/proc"), cgroup_root=root) == child
            assert (child / "cpuset.mems.effective").read_text().strip() == str(node)
            return
        # cpuset is bound to cgroup v1 on this machine: the hook finds the container's v2 cgroup
        # and says the controller is missing there (what could not run here: a real write)
        with pytest.raises(HookError) as refused:
            set_mems(
                0,
                oci_state,
                proc_root=Path("/proc"),
                cgroup_root=root.parent if root.name == "unified" else root,
            )
        assert str(refused.value).startswith(
            f"{child} has no cpuset.mems: the cpuset controller is not enabled"
        )
        assert os.path.isdir(child)
