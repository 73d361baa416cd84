"""``fabric-dra cdi-hook set-mems --node K``: the CDI hook that binds a container's memory to the
NUMA node a CXL memory share became (kmem mode; docs/plugin.md, "CXL memory shares").

CDI has no field for a container's cpuset (a spec edits env, device nodes, mounts and hooks), so
the claim's CDI spec carries a ``createRuntime`` hook that runs this command. The runtime runs it
after it has made the container's cgroup and put the container's first process in it, before the
user's program starts, on the host (in the runtime's namespaces, where ``/proc`` and the cgroup
filesystem are the host's: a ``createContainer`` hook would run in the container's namespaces,
where a private cgroup namespace hides the cgroup's path), and passes the container's OCI state
(``{"ociVersion", "id", "status", "pid", "bundle", ...}``, runtime-spec ``runtime.md``) on stdin.

The command reads the container's cgroup from ``/proc/<pid>/cgroup`` (its cgroup v2 line,
``0::<path>``), writes ``K`` to ``<cgroup-root>/<path>/cpuset.mems`` and reads
``cpuset.mems.effective`` back: cgroup v2 grants a child only nodes its ancestors have, and
answers a request it cannot grant by treating it as empty — the container would silently keep
every node — so anything but exactly ``K`` there fails the hook (exit 1, one line on stderr),
and the runtime fails the container's start. cgroup v1 is refused: kubelet 1.35 and later do not
start on it by default (``failCgroupV1``, KEP-5573).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dra_driver.errors import KubeletPluginError
from plumbing.cli import SubParsers, emit

__all__ = [
    "DEFAULT_HOOK_PATH",
    "HOOK_NAME",
    "HOOK_TIMEOUT_SECONDS",
    "HookError",
    "register",
    "set_mems",
    "set_mems_args",
]

#: where the node has the ``fabric-dra`` command the hook runs (``--cdi-hook-path``): the runtime
#: runs it on the host, not in the plugin's container
DEFAULT_HOOK_PATH = "/opt/fabric-dra/bin/fabric-dra"
#: the OCI hook the spec uses (runs on the host once the container's cgroup exists)
HOOK_NAME = "createRuntime"
#: seconds the runtime gives the hook (CDI ``Hook.timeout``)
HOOK_TIMEOUT_SECONDS = 10


class HookError(KubeletPluginError):
    """Why the container cannot be bound to the node (one line)."""


def set_mems_args(node: int) -> list[str]:
    """The hook's ``args`` (OCI: ``args[0]`` is the program's name)."""
    return ["fabric-dra", "cdi-hook", "set-mems", "--node", str(node)]


def _container_pid(state_text: str) -> int:
    try:
        state = json.loads(state_text)
    except json.JSONDecodeError as err:
        raise HookError(f"the OCI state on stdin is not JSON ({err.msg})") from None
    pid = state.get("pid") if isinstance(state, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise HookError("the OCI state on stdin has no pid: run this as a createRuntime hook")
    return pid


def _cgroup_v2_path(proc_root: Path, pid: int) -> str:
    try:
        lines = (proc_root / str(pid) / "cgroup").read_text().splitlines()
    except OSError as err:
        raise HookError(f"cannot read {proc_root}/{pid}/cgroup: {err.strerror or err}") from None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":
            return path
    raise HookError(
        f"process {pid} is in no cgroup v2 hierarchy (cgroup v1 only): binding its memory needs cgroup v2"
    )


def _v2_root(cgroup_root: Path) -> Path:
    """The cgroup v2 mount: ``cgroup_root`` itself, or its ``unified`` child on a hybrid host."""
    if (cgroup_root / "cgroup.controllers").exists():
        return cgroup_root
    if (cgroup_root / "unified" / "cgroup.controllers").exists():
        return cgroup_root / "unified"
    raise HookError(f"{cgroup_root} is no cgroup v2 mount (no cgroup.controllers)")


def set_mems(node: int, state_text: str, *, proc_root: Path, cgroup_root: Path) -> Path:
    """Bind the container of ``state_text`` to NUMA node ``node``; the cgroup directory written."""
    pid = _container_pid(state_text)
    path = _cgroup_v2_path(proc_root, pid)
    if path in ("", "/"):
        raise HookError(
            f"process {pid} reads its cgroup as '/': a container's own cgroup namespace, or no cgroup of "
            "its own; the hook must run in the runtime's namespaces (createRuntime)"
        )
    cgroup = _v2_root(cgroup_root) / path.lstrip("/")
    mems = cgroup / "cpuset.mems"
    if not mems.exists():
        raise HookError(
            f"{cgroup} has no cpuset.mems: the cpuset controller is not enabled for it (its parents' "
            "cgroup.subtree_control lack +cpuset)"
        )
    try:
        # O_WRONLY without O_CREAT: a cgroup file that is not there is never made
        fd = os.open(mems, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, f"{node}\n".encode())
        finally:
            os.close(fd)
    except OSError as err:
        raise HookError(f"writing {node} to {mems} failed: {err.strerror or err}") from None
    try:
        effective = (cgroup / "cpuset.mems.effective").read_text().strip()
    except OSError as err:
        raise HookError(f"cannot read {cgroup}/cpuset.mems.effective: {err.strerror or err}") from None
    if effective != str(node):
        raise HookError(
            f"{cgroup} was given NUMA node {node} but its cpuset.mems.effective reads {effective!r}: a "
            f"parent cgroup's cpuset.mems does not include node {node} (or the node has no memory online)"
        )
    return cgroup


def _run(args: argparse.Namespace) -> int:
    try:
        set_mems(args.node, sys.stdin.read(), proc_root=args.proc_root, cgroup_root=args.cgroup_root)
    except HookError as err:
        emit(f"fabric-dra cdi-hook set-mems: {err}", file=sys.stderr)
        return 1
    return 0


def register(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "cdi-hook",
        help="hooks the plugin's CDI specs name (the container runtime runs them)",
        description="Programs the container runtime runs for a CDI spec of the plugin.",
    )
    hooks = parser.add_subparsers(dest="hook", required=True, metavar="HOOK")
    mems = hooks.add_parser(
        "set-mems",
        help="bind a container's memory to a NUMA node (cgroup v2 cpuset.mems); the OCI state on stdin",
        description=(
            "Read the container's OCI state from stdin, find its cgroup v2 directory from "
            "/proc/<pid>/cgroup and write the node to its cpuset.mems; fail unless "
            "cpuset.mems.effective is then exactly that node. Used as a createRuntime hook."
        ),
    )
    mems.add_argument("--node", type=int, required=True, help="the NUMA node (a CXL share's node)")
    mems.add_argument("--proc-root", type=Path, default=Path("/proc"), help="the host's /proc")
    mems.add_argument(
        "--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"), help="the host's cgroup v2 mount"
    )
    mems.set_defaults(handler=_run)
