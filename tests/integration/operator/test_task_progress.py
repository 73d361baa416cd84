"""``fabric-dra status`` shows, for each operation in flight, the Redfish task's percent complete
(the DMTF Task's ``PercentComplete``) as the manager last read it while polling the task monitor,
and how long ago that read was: an emulator whose GPU hot-add takes 30 s reports 0 %, then 50 %
half way (emulator/redfish/engine/tasks.py), and the manager's API and ``status`` carry it."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fabric_dra_testbed.stack import Emulator, Manager, Stack
from plumbing import procs
from tests.support.emulator import slow_gpu_profile
from tests.support.uids import claim_uid

pytestmark = pytest.mark.slow(seconds=32)

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"
HOT_ADD_SECONDS = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Emulator, Manager]]:
    profile = slow_gpu_profile(tmp_path_factory.mktemp("profile"), HOT_ADD_SECONDS)
    with Stack.temporary("fdra-pct-") as stack:
        emulator = stack.emulator(auth=False, latency=str(profile))
        manager = stack.manager(
            emulator,
            static_tokens={CONTROLLER_TOKEN: ("controller", None), OPERATOR_TOKEN: ("operator", None)},
        )
        yield emulator, manager


def _status(manager: Manager, *args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FABRIC_DRA_")}
    return procs.run(
        ["status", "--manager-url", manager.url, *args],
        env={**environment, "FABRIC_DRA_TOKEN": OPERATOR_TOKEN},
    )


def _in_flight(manager: Manager, device: str) -> dict[str, Any] | None:
    done = _status(manager, "-o", "json")
    assert done.returncode == 0, done.stderr
    ops = [op for op in json.loads(done.stdout)["operations"] if op["device"] == device]
    return ops[0] if ops else None


def test_status_shows_the_redfish_task_percent_and_its_age(stack: tuple[Emulator, Manager]) -> None:
    _, manager = stack
    claim = claim_uid("claim-progress")
    headers = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    with httpx.Client(base_url=manager.url, timeout=60, headers=headers) as http:
        started = http.post(
            "/api/v1/attachments",
            params={"waitSeconds": 0},
            json={"device": "gpu0", "node": "kind-worker", "claimUid": claim},
        )
        assert started.status_code == 202, started.text
        try:
            seen: list[int | None] = []
            op: dict[str, Any] | None = None
            deadline = time.monotonic() + HOT_ADD_SECONDS - 1
            while 50 not in seen:
                op = _in_flight(manager, "gpu0")
                assert op is not None, f"the attach ended before its task said 50 %: saw {seen}"
                seen.append(op.get("redfishTaskPercent"))
                assert time.monotonic() < deadline, f"no 50 % within the task's time: saw {seen}"
                time.sleep(0.3)
            # The numbers only go up, and come with the time they were read.
            known = [p for p in seen if p is not None]
            assert known == sorted(known) and set(known) <= {0, 50}, seen
            assert (
                op is not None
                and op["redfishTaskPercentAt"]
                and op["redfishTask"].startswith("/redfish/v1/TaskService/")
            )

            table = _status(manager)
            assert table.returncode == 0, table.stderr
            lines = table.stdout.splitlines()
            header = next((line for line in lines if line.startswith("ID ")), table.stdout)
            assert "TASK DONE" in header and "AGE" in header
            row = next((line for line in lines if " gpu0 " in line and line.startswith("op-")), table.stdout)
            assert "50% (" in row and " ago)" in row, row
        finally:
            # Attach is idempotent per claim and device: asking again waits for this one to finish.
            http.post(
                "/api/v1/attachments",
                params={"waitSeconds": 40},
                json={"device": "gpu0", "node": "kind-worker", "claimUid": claim},
            )
            http.delete(
                "/api/v1/attachments/gpu0",
                params={"claimUid": claim, "node": "kind-worker", "waitSeconds": 30},
            )
    # Finished operations are no longer in flight.
    assert _in_flight(manager, "gpu0") is None
