"""The operation record keeps every operation in flight and the newest finished ones."""

from __future__ import annotations

from fabric.state.operation_log import OperationLog
from manager_api import models as api
from manager_api.errors import BindFailed


def test_keeps_in_flight_and_the_newest_finished() -> None:
    log = OperationLog(keep_finished=3)
    running = log.start(api.OperationKind.ATTACH, "gpu-long", "node-a", "c-long")
    done = []
    for i in range(6):
        op = log.start(api.OperationKind.ATTACH, f"gpu{i}", "node-a", f"c{i}")
        log.finish(op.id, BindFailed("no") if i == 5 else None)
        done.append(op.id)
    kept = [op.id for op in log.all()]
    assert kept == [running.id, *done[-3:]]  # the oldest finished ones went, in finishing order
    assert [op.id for op in log.in_flight()] == [running.id]
    assert log.get(done[-1]).state is api.OperationState.FAILED  # type: ignore[union-attr]
    assert log.get(done[0]) is None
    finished = log.finish(running.id)
    assert finished is not None and finished.state is api.OperationState.SUCCEEDED
    assert [op.id for op in log.all()] == [*done[-2:], running.id]
