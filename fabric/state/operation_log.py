"""The record of attach and detach operations that ``GET /api/v1/operations`` shows
(:class:`OperationLog`). What runs them is :mod:`fabric.driver`."""

from __future__ import annotations

import uuid
from collections import OrderedDict
from datetime import UTC, datetime

from fabric.errors import error_body
from manager_api import models as api
from manager_api.errors import FabricError

__all__ = ["OperationLog"]


class OperationLog:
    """Every operation in flight, and the most recent finished ones."""

    def __init__(self, keep_finished: int = 1000) -> None:
        self.keep_finished = keep_finished
        self._ops: OrderedDict[str, api.Operation] = OrderedDict()
        #: finished operations in the order they finished (the oldest go first)
        self._finished: OrderedDict[str, None] = OrderedDict()

    def start(self, kind: api.OperationKind, device: str, node: str, claim_uid: str) -> api.Operation:
        op = _operation(
            f"op-{uuid.uuid4().hex[:16]}", kind, device, node, claim_uid, api.OperationState.PENDING
        )
        self._ops[op.id] = op
        return op

    def adopt(self, op_id: str, kind: api.OperationKind, device: str, node: str, claim_uid: str) -> None:
        """Show an operation that an earlier run of the manager started (resumed from the ledger)."""
        self._ops[op_id] = _operation(op_id, kind, device, node, claim_uid, api.OperationState.RUNNING)

    def get(self, op_id: str) -> api.Operation | None:
        return self._ops.get(op_id)

    def all(self) -> list[api.Operation]:
        return list(self._ops.values())

    def in_flight(self) -> list[api.Operation]:
        return [
            op
            for op in self._ops.values()
            if op.state in (api.OperationState.PENDING, api.OperationState.RUNNING)
        ]

    def running(
        self, op_id: str, *, redfish_task: str | None = None, error: FabricError | None = None
    ) -> None:
        op = self._ops.get(op_id)
        if op is None or op.finished_at is not None:
            return
        update: dict[str, object] = {
            "state": api.OperationState.RUNNING,
            "redfish_task": redfish_task if redfish_task is not None else op.redfish_task,
            "error": error_body(error) if error is not None else op.error,
        }
        if redfish_task is not None and redfish_task != op.redfish_task:  # another attempt's task
            update |= {"redfish_task_percent": None, "redfish_task_percent_at": None}
        self._ops[op_id] = op.model_copy(update=update)

    def progress(self, op_id: str, percent: int) -> None:
        """The fabric said how far the operation's Redfish task is (its ``PercentComplete``)."""
        op = self._ops.get(op_id)
        if op is None or op.finished_at is not None:
            return
        self._ops[op_id] = op.model_copy(
            update={"redfish_task_percent": percent, "redfish_task_percent_at": datetime.now(UTC)}
        )

    def finish(self, op_id: str, error: FabricError | None = None) -> api.Operation | None:
        op = self._ops.get(op_id)
        if op is None or op.finished_at is not None:
            return op
        finished = op.model_copy(
            update={
                "state": api.OperationState.FAILED if error else api.OperationState.SUCCEEDED,
                "error": error_body(error) if error else None,
                "finished_at": datetime.now(UTC),
            }
        )
        self._ops[op_id] = finished
        self._ops.move_to_end(op_id)
        self._finished[op_id] = None
        while len(self._finished) > self.keep_finished:  # no scan of every operation per finish
            oldest, _ = self._finished.popitem(last=False)
            self._ops.pop(oldest, None)
        return finished


def _operation(
    op_id: str, kind: api.OperationKind, device: str, node: str, claim_uid: str, state: api.OperationState
) -> api.Operation:
    return api.Operation(
        id=op_id,
        kind=kind,
        device=device,
        node=node,
        claim_uid=claim_uid,
        state=state,
        started_at=datetime.now(UTC),
    )
