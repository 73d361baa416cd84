"""The one attach path (:func:`manager_api.attaching.attach_until_attached`) against a real HTTP
server on loopback that answers as the manager does: each kind of answer is asked again, or
raised, as the caller's policy says."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from manager_api.attaching import AttachPolicy, AttachProgress, attach_until_attached
from manager_api.client import ManagerClient
from manager_api.errors import AttachStillRunning, BindRefused, DeviceBusy, FabricError, FabricUnavailable
from manager_api.models import Attachment, AttachmentState

CLAIM = "8f2e8c3a-52cf-4b6e-9d0a-0c1b2d3e4f50"
_DEVICE = {
    "name": "gpu0",
    "pool": "fabric-pcie",
    "fabric": "PCIe",
    "type": "gpu",
    "bindingStyle": "zone",
    "redfishUri": "/redfish/v1/Fabrics/PCIe/Endpoints/gpu0",
}
Answer = tuple[int, dict[str, Any]]


def _attachment(state: str) -> Answer:
    body = {"device": _DEVICE, "node": "node-a", "claimUid": CLAIM, "state": state, "operationId": "op-1"}
    return (200 if state == "attached" else 202), body


def _error(status: int, code: str) -> Answer:
    return status, {"code": code, "message": f"{code} from the manager", "device": "gpu0"}


class _Heard(AttachProgress):
    def __init__(self) -> None:
        self.heard: list[str] = []

    def busy(self, err: DeviceBusy) -> None:
        self.heard.append("busy")

    def retrying(self, err: FabricError) -> None:
        self.heard.append(f"retrying {err.code}")

    async def attaching(self, attachment: Attachment, waited: float) -> None:
        self.heard.append(f"attaching {attachment.operation_id}")


def _policy(**overrides: Any) -> AttachPolicy:
    now = time.monotonic()
    values: dict[str, Any] = {
        "wait_seconds": 1.0,
        "retry_until": now + 30,
        "attaching_until": now + 30,
        "backoff_initial": 0.01,
        "backoff_maximum": 0.02,
    }
    values.update(overrides)
    return AttachPolicy(**values)


async def _attach(answers: list[Answer], policy: AttachPolicy) -> tuple[Any, list[str], list[str]]:
    """Attach against a manager on a loopback socket that answers ``answers`` in turn (the last one
    from then on): the outcome (an Attachment or the error raised), the requests it got, what the
    caller heard on the way."""
    seen: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while not reader.at_eof():
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).decode()
            except asyncio.IncompleteReadError:
                return
            lines = head.split("\r\n")
            length = next((int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")), 0)
            body = json.loads(await reader.readexactly(length))
            seen.append(f"{lines[0].split(' ')[0]} {lines[0].split(' ')[1].split('?')[0]} {body['device']}")
            status, answer = answers[min(len(seen), len(answers)) - 1]
            payload = json.dumps(answer).encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\n\r\n".encode()
                + payload
            )
            await writer.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    heard = _Heard()
    async with server:
        client = ManagerClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        try:
            outcome: Any = await attach_until_attached(
                client, "gpu0", "node-a", CLAIM, policy, pool="fabric-pcie", progress=heard
            )
        except FabricError as err:
            outcome = err
        finally:
            await client.aclose()
    return outcome, seen, heard.heard


async def test_transient_failures_and_202_are_asked_again_until_attached() -> None:
    answers = [_error(503, "FabricUnavailable"), _attachment("attaching"), _attachment("attached")]
    outcome, seen, heard = await _attach(answers, _policy())
    assert isinstance(outcome, Attachment) and outcome.state is AttachmentState.ATTACHED
    assert seen == ["POST /api/v1/attachments gpu0"] * 3
    assert heard == ["retrying FabricUnavailable", "attaching op-1"]


async def test_a_refusal_for_good_is_raised_at_once() -> None:
    outcome, seen, heard = await _attach([_error(502, "BindRefused")], _policy())
    assert isinstance(outcome, BindRefused)
    assert len(seen) == 1 and heard == []


async def test_a_busy_device_is_raised_at_once_unless_the_policy_waits_for_it() -> None:
    busy = [_error(409, "DeviceBusy")]
    outcome, seen, heard = await _attach(busy, _policy())
    assert isinstance(outcome, DeviceBusy) and len(seen) == 1 and heard == []

    outcome, seen, heard = await _attach(busy, _policy(busy_for=0.2))
    assert isinstance(outcome, DeviceBusy)
    assert len(seen) > 1
    assert heard == ["busy"]  # once per run of busy answers

    outcome, seen, heard = await _attach([*busy, _attachment("attached")], _policy(busy_for=5.0))
    assert isinstance(outcome, Attachment) and len(seen) == 2


async def test_past_its_time_a_transient_failure_is_raised_and_a_running_attach_is_given_up() -> None:
    past = time.monotonic() - 1
    outcome, seen, _ = await _attach([_error(503, "FabricUnavailable")], _policy(retry_until=past))
    assert isinstance(outcome, FabricUnavailable) and len(seen) == 1

    outcome, seen, heard = await _attach([_attachment("attaching")], _policy(attaching_until=past))
    assert isinstance(outcome, AttachStillRunning)
    assert outcome.device == "gpu0" and outcome.node == "node-a" and "op-1" in outcome.message
    assert len(seen) == 1 and heard == []


@pytest.mark.parametrize("answer", [_error(503, "NotLeader"), _error(504, "AttachTimeout")])
async def test_every_retriable_answer_is_asked_again(answer: Answer) -> None:
    outcome, seen, heard = await _attach([answer, _attachment("attached")], _policy())
    assert isinstance(outcome, Attachment)
    assert len(seen) == 2 and heard == [f"retrying {answer[1]['code']}"]
