"""The Redfish task's ``PercentComplete`` on its way to ``GET /api/v1/operations``: read from what
the service answers (and only a sane number), kept on the operation with when it was read, and
forgotten when an attempt starts another task."""

from __future__ import annotations

import math

import pytest

from fabric.redfish.tasks import percent_complete
from fabric.state.operation_log import OperationLog
from manager_api import models as api


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"PercentComplete": 0}, 0),
        ({"PercentComplete": 50}, 50),
        ({"PercentComplete": 100}, 100),
        ({"PercentComplete": 37.0}, 37),
        ({}, None),
        ({"PercentComplete": None}, None),
        ({"PercentComplete": -1}, None),
        ({"PercentComplete": 101}, None),
        ({"PercentComplete": "50"}, None),
        ({"PercentComplete": True}, None),
        ({"PercentComplete": math.nan}, None),
        ({"PercentComplete": 10**30}, None),
        ({"PercentComplete": math.inf}, None),
    ],
)
def test_percent_complete_is_a_number_from_0_to_100_or_nothing(
    body: dict[str, object], expected: int | None
) -> None:
    assert percent_complete(body) == expected


def test_the_operation_keeps_the_percent_and_when_it_was_read() -> None:
    log = OperationLog()
    op = log.start(api.OperationKind.ATTACH, "gpu0", "node-a", "claim")
    log.running(op.id, redfish_task="/redfish/v1/TaskService/TaskMonitors/1")
    log.progress(op.id, 40)
    seen = log.get(op.id)
    assert seen is not None and seen.redfish_task_percent == 40 and seen.redfish_task_percent_at is not None
    # the wire names, as status and the map read them
    wire = seen.model_dump(mode="json", by_alias=True)
    assert wire["redfishTaskPercent"] == 40 and wire["redfishTaskPercentAt"]
    log.running(op.id, redfish_task="/redfish/v1/TaskService/TaskMonitors/1")  # the same task goes on
    assert log.get(op.id).redfish_task_percent == 40  # type: ignore[union-attr]
    log.running(op.id, redfish_task="/redfish/v1/TaskService/TaskMonitors/2")  # a new attempt's task
    again = log.get(op.id)
    assert again is not None and again.redfish_task_percent is None and again.redfish_task_percent_at is None
    log.finish(op.id)
    log.progress(op.id, 90)  # a late read after the end changes nothing
    assert log.get(op.id).redfish_task_percent is None  # type: ignore[union-attr]


def test_the_api_refuses_a_percent_out_of_range() -> None:
    with pytest.raises(ValueError):
        api.Operation.model_validate(
            {
                "id": "op-1",
                "kind": "attach",
                "device": "gpu0",
                "node": "n",
                "claimUid": "c",
                "state": "running",
                "startedAt": "2026-01-01T00:00:00Z",
                "redfishTaskPercent": 150,
            }
        )
