"""The state a start finds, made consistent before the service answers: tasks a crash or a
shutdown left running are marked Interrupted (their targets as they were), and what the
topology no longer has — bindings, zones, connections — is dropped."""

from __future__ import annotations

from emulator.errors import Interrupted
from emulator.redfish.engine.operation import fmt_targets
from emulator.redfish.model.errors import error_body, redfish_error
from emulator.redfish.model.registries import message
from emulator.redfish.model.state import FabricState, OperationKind, TaskResult, utcnow
from emulator.topology import FabricIndex
from plumbing.logs import get_logger

__all__ = ["drop_what_the_topology_lacks", "interrupt_unfinished_tasks"]

log = get_logger(__name__)


def interrupt_unfinished_tasks(state: FabricState) -> None:
    """End every task still running as Interrupted, saying what became of its targets."""
    now = utcnow()
    for task in state.tasks.values():
        if task.finished:
            continue
        held = [t for t in task.targets if t in state.bindings]
        if task.kind == OperationKind.RELEASE:
            # a chunk's release changes the state only when it completes: the chunk is still there
            outcome = f"{fmt_targets(task.targets)} was not deleted"
        elif task.kind == OperationKind.BIND:
            outcome = f"{fmt_targets(task.targets)} was not bound to {task.host}"
        else:
            outcome = f"{fmt_targets(held)} is still bound to {task.host}" if held else "nothing was unbound"
        detail = f"Task {task.id} was interrupted by a restart of the fabric service; {outcome}."
        task.state = "Interrupted"
        task.status = "Critical"
        task.end = now
        error = redfish_error(Interrupted(detail))
        task.messages = (message("TaskAborted", task.id, prefix="TaskEvent"), *error.messages)
        task.result = TaskResult(status=error.status, body=error_body(error))
        log.warning(
            "task interrupted by a restart",
            task=task.id,
            node=task.host,
            device=fmt_targets(task.targets),
        )


def drop_what_the_topology_lacks(state: FabricState, index: FabricIndex) -> None:
    """Bindings of targets or hosts the topology no longer has, their zones and connections."""
    for target, binding in list(state.bindings.items()):
        if target not in index.targets or binding.host not in index.hosts:
            log.warning("dropping a binding the topology no longer has", device=target, node=binding.host)
            del state.bindings[target]
    for zone_id, zone in list(state.zones.items()):
        if zone.host not in index.hosts:
            del state.zones[zone_id]
    for conn_id, conn in list(state.connections.items()):
        if conn.host not in index.hosts or not any(c in state.bindings for c in conn.chunks):
            del state.connections[conn_id]
