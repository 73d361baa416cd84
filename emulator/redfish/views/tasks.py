"""``/redfish/v1/TaskService``: tasks and their monitors (DSP0266 "Asynchronous operations").

A mutation that runs as a task answers ``202 Accepted`` with ``Location`` = its task monitor
and ``Retry-After``. ``GET`` on the monitor answers 202 (with the Task) while the task runs,
then the operation's own final response — status, ``Location`` and body, or the Redfish
error. The monitor keeps answering that until the task record is pruned (the newest 256
finished tasks are kept). ``DELETE`` on the monitor of a running task cancels it.
"""

from __future__ import annotations

from emulator.redfish.model import uris
from emulator.redfish.model.resources import Task, TaskPayload, TaskService, ref
from emulator.redfish.model.state import TaskRecord, id_order
from emulator.redfish.tree.http import Reply, Request
from emulator.redfish.tree.nodes import CollectionNode, Context, Node
from emulator.redfish.views.common import ServiceNode

__all__ = ["TaskServiceNode", "task_model"]


def _stamp(value: object) -> str | None:
    """Edm.DateTimeOffset with milliseconds: a task's duration is worth more than whole seconds
    to whoever measures what the fabric took (DSP0266 allows fractional seconds)."""
    if value is None:
        return None
    text = value.isoformat(timespec="milliseconds") if hasattr(value, "isoformat") else str(value)
    return text.replace("+00:00", "Z")


def task_model(task: TaskRecord) -> Task:
    devices = ", ".join(task.targets) or "(no devices)"
    if task.host is None:
        name = f"Task {task.id}: {task.kind.value} {devices}"
    else:
        direction = "to" if task.kind.value == "bind" else "from"
        name = f"Task {task.id}: {task.kind.value} {devices} {direction} {task.host}"
    return Task(
        odata_id=uris.task(task.id),
        Id=task.id,
        Name=name,
        TaskState=task.state,
        TaskStatus=task.status,
        StartTime=_stamp(task.start) or "",
        EndTime=_stamp(task.end),
        PercentComplete=task.percent,
        TaskMonitor=uris.task_monitor(task.id),
        Payload=TaskPayload(
            HttpOperation=task.method,
            TargetUri=task.uri,
            JsonBody=task.body or None,
            HttpHeaders=[],
        ),
        Messages=task.messages,
    )


def task_reply(ctx: Context, task: TaskRecord) -> Reply:
    """202 while running; the recorded final response afterwards."""
    if not task.finished or task.result is None:
        return Reply(
            202,
            task_model(task).payload(),
            {
                "Location": uris.task_monitor(task.id),
                "Retry-After": str(ctx.engine.latency.retry_after_seconds),
            },
        )
    headers = {"Location": task.result.location} if task.result.location else {}
    return Reply(task.result.status, task.result.body, headers)


class TaskNode(Node):
    def __init__(self, ctx: Context, task_id: str) -> None:
        super().__init__(ctx, uris.task(task_id))
        self.task_id = task_id

    def render(self) -> Task:
        return task_model(self.ctx.engine.state.tasks[self.task_id])


class TaskMonitorNode(Node):
    allow = ("GET", "HEAD", "DELETE")
    is_resource = False

    def __init__(self, ctx: Context, task_id: str) -> None:
        super().__init__(ctx, uris.task_monitor(task_id))
        self.task_id = task_id

    async def get(self, request: Request) -> Reply:
        return task_reply(self.ctx, self.ctx.engine.state.tasks[self.task_id])

    async def delete(self, request: Request) -> Reply:
        await self.ctx.engine.tasks.cancel(self.task_id)
        return Reply(204)


class _MonitorsSegment(Node):
    allow = ()
    is_resource = False

    def child(self, segment: str) -> Node | None:
        if segment in self.ctx.engine.state.tasks:
            return TaskMonitorNode(self.ctx, segment)
        return None


class TaskServiceNode(ServiceNode, at=uris.TASK_SERVICE):
    def render(self) -> TaskService:
        return TaskService(**self.service(), Tasks=ref(uris.TASKS))

    def child(self, segment: str) -> Node | None:
        ctx = self.ctx
        if segment == "Tasks":
            return CollectionNode(
                ctx,
                uris.TASKS,
                "TaskCollection",
                "Tasks",
                lambda: sorted(ctx.engine.state.tasks, key=id_order),
                lambda t: TaskNode(ctx, t) if t in ctx.engine.state.tasks else None,
            )
        if segment == "TaskMonitors":
            return _MonitorsSegment(ctx, uris.TASK_MONITORS)
        return None
