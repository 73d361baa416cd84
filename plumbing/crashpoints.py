"""Named crash points — a test facility: kill this process with SIGKILL at a chosen step.

``FABRIC_DRA_CRASH_AT=<point>[,<point>...]`` is read once, when this module is first imported
(every role imports it before it serves). When the process reaches an armed point it writes one
log line (``crash point reached``, ``point=<name>``) and sends itself SIGKILL: no ``finally``
block runs, nothing is flushed or closed — as after a power cut of the container or an OOM kill.
Unset (every real deployment), :func:`crash_point` is one truth test of an empty set.

Points are named ``<role>.<operation>.<step>``; :data:`POINTS` lists each with what has and has
not happened when it fires. The plugin's partition and memory points (:data:`SHARING_POINTS`)
fire only for a claim of a GPU partition or of a memory share. The crash-point matrix
(``tests/integration/reliability/``) kills
every role at every point, restarts it, and checks that the system converges: the claim is
prepared exactly once or fails cleanly, no binding leaks, no device is ever bound twice.
docs/reliability.md has the results.
"""

from __future__ import annotations

import os
import signal
import sys

from plumbing.cli import emit
from plumbing.logs import get_logger

__all__ = ["ENV", "POINTS", "SHARING_POINTS", "armed", "crash_point", "rearm"]

ENV = "FABRIC_DRA_CRASH_AT"

#: every crash point, with what is (not) done when it fires
POINTS: dict[str, str] = {
    # -- plugin: NodePrepareResources ------------------------------------------------------------
    "plugin.prepare.before-checkpoint-started": "claim read; PrepareStarted not yet written",
    "plugin.prepare.after-checkpoint-started": "PrepareStarted written; no attach request sent",
    "plugin.prepare.before-attach": "about to send POST /attachments to the manager",
    "plugin.prepare.after-attach": "the manager answered attached; the host has not been checked",
    "plugin.prepare.before-partition": (
        "a partition's GPU is bound and visible, the claim's record names the placement it makes; "
        "no partition yet"
    ),
    "plugin.prepare.after-partition": (
        "the partition is made on the GPU; the claim's record does not say so yet"
    ),
    "plugin.prepare.before-memory-online": (
        "a share's memory is connected and visible, the claim's record names its region; its blocks "
        "are offline"
    ),
    "plugin.prepare.after-memory-online": (
        "the share's blocks are online; the claim's record does not say so yet"
    ),
    "plugin.prepare.after-visible": "the device is visible on the host; no CDI spec yet",
    "plugin.prepare.before-cdi-write": "about to write the CDI spec files",
    "plugin.prepare.after-cdi-write": "CDI specs written; the checkpoint still says PrepareStarted",
    "plugin.prepare.before-checkpoint-completed": "about to record PrepareCompleted",
    "plugin.prepare.after-checkpoint-completed": "PrepareCompleted durable; the kubelet has no answer",
    # -- plugin: NodeUnprepareResources ----------------------------------------------------------
    "plugin.unprepare.after-partition-destroy": "the claim's partition is gone from its GPU; no detach sent",
    "plugin.unprepare.after-memory-offline": "the share's blocks are offline; no detach sent",
    "plugin.unprepare.before-detach": "about to send DELETE /attachments to the manager",
    "plugin.unprepare.after-detach": "the manager answered detached; CDI specs and entry still there",
    "plugin.unprepare.after-cdi-remove": "CDI specs removed; the checkpoint entry still there",
    "plugin.unprepare.after-checkpoint": "entry removed durably; the kubelet has no answer",
    # -- manager: attach -------------------------------------------------------------------------
    "manager.attach.before-intent": "attach request accepted; the ledger has no entry yet",
    "manager.attach.after-intent": "ledger entry 'attaching' durable; nothing sent to the fabric",
    "manager.attach.task-accepted": "the fabric answered 202 (a task runs); its monitor is not recorded",
    "manager.attach.task-recorded": "the task monitor is recorded durably; the task is still running",
    "manager.attach.after-fabric-call": "the fabric bound the device; the ledger still says 'attaching'",
    "manager.attach.after-result": "ledger entry 'bound', its write not waited for; no answer yet",
    # -- manager: detach -------------------------------------------------------------------------
    "manager.detach.before-intent": "detach request accepted; the ledger still says 'bound'",
    "manager.detach.after-intent": "ledger entry 'detaching' durable; nothing sent to the fabric",
    "manager.detach.task-recorded": "the unbind task monitor is recorded; the task is still running",
    "manager.detach.after-fabric-call": "the fabric unbound the device; the ledger entry is still there",
    "manager.detach.after-result": "ledger entry removed, its write not waited for; no answer yet",
    # -- manager: the warm pool (tests/integration/fabric/test_warm.py; not in the prepare matrix)
    "manager.warm.before-transfer": "a claim asked for a warm device; its entry says 'bound' in memory only",
    "manager.warm.after-transfer": "the entry 'bound' to the claim is durable; no answer yet",
    "manager.warm.after-return": "a released device's entry 'warm' is durable; no answer yet",
    "manager.warm.before-reset": "a released device is 'warm', its reset 'pending' durably; none sent",
    # -- manager: partitions and shares (the matrix with such claims; fabric/test_sharing.py) ---
    "manager.partition.after-holder-recorded": "a partition's holder durable in the GPU's entry; no answer",
    "manager.share.after-chunk-created": "the fabric made the share's chunk; the ledger does not name it yet",
    "manager.share.chunk-recorded": "the share's chunk is recorded durably; no Connection sent yet",
    "manager.share.after-connection": "the fabric made the share's Connection; the ledger lacks it",
    "manager.share.after-connection-deleted": "a released share's Connection is gone; its chunk not",
    # -- controller: binding-condition flow ------------------------------------------------------
    "controller.attach.before-request": "about to ask the manager to attach for a binding condition",
    "controller.attach.after-request": "the manager answered attached; Attached=True not yet written",
    "controller.attach.after-status": "Attached=True written to the claim's status",
    "controller.release.before-detach": "the allocation is gone; about to ask the manager to detach",
    "controller.release.after-detach": "the manager answered detached; still held in the controller's memory",
    # -- emulator (the Redfish service) ----------------------------------------------------------
    "emulator.bind.before-commit": "a bind request was checked; nothing is durable, no answer sent",
    "emulator.bind.after-commit": "the binding is durable; the client has no answer",
    "emulator.unbind.before-commit": "an unbind request was checked; nothing is durable",
    "emulator.unbind.after-commit": "the unbinding is durable; the client has no answer",
    "emulator.task.before-complete": "a task's work is done; its result is not durable",
    "emulator.task.after-complete": "a task's result is durable; clients polling it have not seen it",
}

#: the plugin's points that only a GPU partition's or a memory share's prepare reaches
SHARING_POINTS = frozenset(
    p for p in POINTS if p.startswith("plugin.") and ("partition" in p or "memory" in p)
)

log = get_logger(__name__)


def _read_env() -> frozenset[str]:
    names = frozenset(n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip())
    unknown = sorted(names - POINTS.keys())
    if unknown:
        emit(f"fabric-dra: warning: {ENV} names unknown crash points: {', '.join(unknown)}", file=sys.stderr)
    return names


_ARMED: frozenset[str] = _read_env()


def armed() -> frozenset[str]:
    """The crash points this process was started with."""
    return _ARMED


def rearm() -> None:
    """Read :data:`ENV` again: for a process whose environment was replaced after this module was
    imported — a child of :mod:`plumbing.forkserver`, which imported it before the fork."""
    global _ARMED
    _ARMED = _read_env()


def crash_point(name: str) -> None:
    """SIGKILL this process if ``name`` is armed; otherwise do nothing."""
    if _ARMED and name in _ARMED:
        log.warning("crash point reached; killing this process with SIGKILL", point=name, pid=os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
