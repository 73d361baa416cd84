"""An Event's note may hold at most 1024 bytes (``NoteLengthLimit``, pkg/apis/core/validation/
events.go: ``len(event.Message) > NoteLengthLimit`` is Go's byte length). The API test server
refuses a longer one as the real server does, and fabric-dra's recorder cuts notes so that every
Event it writes is accepted — counted in UTF-8 bytes, not characters."""

from __future__ import annotations

from typing import Any

import pytest

from plumbing.kube import Invalid, KubeClient
from plumbing.kube.events import NOTE_LIMIT_BYTES, EventRecorder, ObjectRef
from plumbing.kube.resources import EVENTS


def _event(name: str, namespace: str, note: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "regarding": {"kind": "Pod", "name": "worker", "namespace": namespace},
        "reason": "DeviceDetached",
        "note": note,
        "type": "Normal",
        "action": "Detach",
        "reportingController": "fabric-dra.io/manager",
        "reportingInstance": "manager-0",
    }


@pytest.mark.parametrize(
    ("note", "accepted"),
    [
        ("x" * 1024, True),
        ("x" * 1025, False),
        ("é" * 512, True),  # 1024 bytes in 512 characters
        ("é" * 513, False),  # 513 characters, 1026 bytes
        ("x" * 1023 + "…", False),  # the old recorder's cut: 1024 characters, 1026 bytes
    ],
    ids=["1024-ascii", "1025-ascii", "1024-bytes-of-2-byte-chars", "1026-bytes", "old-cut"],
)
async def test_the_server_counts_note_bytes(mkube: KubeClient, ns: str, note: str, accepted: bool) -> None:
    name = f"note-{len(note)}-{len(note.encode())}"
    if accepted:
        created = await mkube.create(EVENTS, _event(name, ns, note), ns)
        assert created["note"] == note
        return
    with pytest.raises(Invalid) as rejected:
        await mkube.create(EVENTS, _event(name, ns, note), ns)
    assert 'message: Invalid value: "": can have at most 1024 characters' in rejected.value.message
    assert rejected.value.body["details"]["causes"][0]["field"] == "message"


async def test_the_limit_holds_on_update_too(mkube: KubeClient, ns: str) -> None:
    created = await mkube.create(EVENTS, _event("grows", ns, "short"), ns)
    created["note"] = "y" * 1025
    with pytest.raises(Invalid, match="can have at most 1024 characters"):
        await mkube.replace(EVENTS, created)


@pytest.mark.parametrize(
    "note",
    ["x" * 5000, "é" * 700, "∑" * 400, "x" + "😀" * 300, "a" * 1022 + "€€"],
    ids=["ascii", "2-byte", "3-byte", "4-byte", "cut-inside-a-character"],
)
async def test_the_recorder_writes_every_note_the_server_accepts(
    mkube: KubeClient, ns: str, note: str
) -> None:
    recorder = EventRecorder(mkube, controller="fabric-dra.io/manager", instance="manager-0")
    regarding = ObjectRef(kind="Pod", name="worker", namespace=ns)
    assert await recorder.record(regarding, reason="DeviceDetached", action="Detach", note=note)
    listed = await mkube.list(EVENTS, ns)
    (event,) = [e for e in listed["items"] if e["reason"] == "DeviceDetached"]
    written = event["note"]
    assert len(written.encode()) <= NOTE_LIMIT_BYTES
    assert written.endswith("…")
    # The longest prefix of whole characters that fits beside the ellipsis: one more would not.
    prefix = written.removesuffix("…")
    assert note.startswith(prefix)
    assert len((note[: len(prefix) + 1] + "…").encode()) > NOTE_LIMIT_BYTES
