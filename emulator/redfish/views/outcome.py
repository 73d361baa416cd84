"""The HTTP reply to a bind or unbind: its final response, or 202 with a task monitor."""

from __future__ import annotations

from emulator.redfish.engine.operation import Operation
from emulator.redfish.tree.http import Reply, Request
from emulator.redfish.tree.nodes import Context
from emulator.redfish.views.tasks import task_reply

__all__ = ["reply_for"]


async def reply_for(ctx: Context, op: Operation, request: Request) -> Reply:
    outcome = await ctx.engine.execute(op, force_task=request.prefers_async)
    if outcome.task is not None:
        return task_reply(ctx, outcome.task)
    if outcome.status == 201 and outcome.location:
        return Reply(201, ctx.engine.render(outcome.location), {"Location": outcome.location})
    return Reply(outcome.status)
