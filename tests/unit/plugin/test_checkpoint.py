from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import pytest

from dra_driver.plugin.checkpoint import (
    CheckpointCorrupt,
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
)
from dra_driver.plugin.hostdev import HostDevice


def entry(uid: str, state: ClaimState = ClaimState.PREPARE_COMPLETED) -> ClaimEntry:
    return ClaimEntry(
        uid=uid,
        namespace="default",
        name=f"claim-{uid}",
        state=state,
        devices=[
            PreparedDevice(
                device="gpu-0",
                pool="fabric-pcie",
                type="gpu",
                request_names=["gpu"],
                attached=True,
                host=HostDevice(sysfs_path="/sys/bus/pci/devices/0000:41:00.0", pci_address="0000:41:00.0"),
                cdi_device_ids=[f"k8s.fabric-dra.io/gpu={uid}-gpu-0"],
            )
        ],
        cdi_spec_files=[f"/var/run/cdi/k8s.fabric-dra.io-gpu_{uid}.json"],
    )


def store(path: Path) -> CheckpointStore:
    s = CheckpointStore(path, driver="fabric-dra.io", node="node-a")
    s.load()
    return s


async def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    first = store(path)
    first.put(entry("u1"))
    await first.commit()
    second = store(path)
    assert second.get("u1") == first.get("u1")
    doc = json.loads(path.read_text())
    assert doc["version"] == 1 and doc["checksum"].startswith("sha256:")
    second.delete("u1")
    await second.commit()
    assert store(path).claims() == {}


async def test_concurrent_commits_are_grouped(tmp_path: Path) -> None:
    s = store(tmp_path / "checkpoint.json")

    async def change(i: int) -> None:
        s.put(entry(f"u{i}"))
        await s.commit()

    await asyncio.gather(*(change(i) for i in range(50)))
    assert len(store(tmp_path / "checkpoint.json").claims()) == 50
    assert s.writes < 50  # group commit: changes made during a write go into the next one


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda raw: raw[: len(raw) // 2], "not valid JSON"),
        (lambda raw: raw.replace('"gpu-0"', '"gpu-9"'), "checksum"),
        (lambda raw: raw.replace('"version":1', '"version":7', 1), "version 7"),
        (lambda raw: '{"hello": "world"}', "not a fabric-dra plugin checkpoint"),
    ],
)
async def test_corruption_is_detected_with_a_reason(tmp_path: Path, damage: object, reason: str) -> None:
    path = tmp_path / "checkpoint.json"
    s = store(path)
    s.put(entry("u1"))
    await s.commit()
    path.write_text(damage(path.read_text()))  # type: ignore[operator]
    with pytest.raises(CheckpointCorrupt, match=reason):
        store(path)


async def test_schema_violation_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    s = store(path)
    s.put(entry("u1"))
    await s.commit()
    doc = json.loads(path.read_text())
    doc["data"]["claims"]["u1"]["state"] = "Halfway"
    from dra_driver.plugin import checkpoint as mod

    doc["checksum"] = "sha256:" + hashlib.sha256(mod._canonical(doc["data"])).hexdigest()
    path.write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorrupt, match=r"claims\.u1\.state"):
        store(path)


async def test_quarantine_moves_the_file_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text("garbage")
    s = CheckpointStore(path, driver="fabric-dra.io", node="node-a")
    with pytest.raises(CheckpointCorrupt):
        s.load()
    moved = s.quarantine()
    assert moved is not None and moved.read_text() == "garbage" and not path.exists()
    s.put(entry("u2"))
    await s.commit()
    assert set(store(path).claims()) == {"u2"}


def test_checkpoint_of_another_node_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    other = CheckpointStore(path, driver="fabric-dra.io", node="node-b")
    other.load()
    other.put(entry("u1"))
    other.commit_now()
    with pytest.raises(CheckpointCorrupt, match="node-b"):
        store(path)


def test_stale_temp_files_are_removed(tmp_path: Path) -> None:
    leftover = tmp_path / ".checkpoint.json.abc123.tmp"
    leftover.write_text("half")
    store(tmp_path / "checkpoint.json")
    assert not leftover.exists()


async def test_two_instances_sharing_the_file_keep_each_others_claims(tmp_path: Path) -> None:
    """A rolling update: two plugin pods write the same checkpoint; neither loses the other's work."""
    path = tmp_path / "checkpoint.json"
    old, new = store(path), store(path)
    old.put(entry("from-old"))
    await old.commit()
    new.put(entry("from-new"))
    await new.commit()  # its view was stale: it re-reads, keeps its own change on top, writes
    assert set(store(path).claims()) == {"from-old", "from-new"}
    old.refresh()
    assert set(old.claims()) == {"from-old", "from-new"}
    old.delete("from-new")  # e.g. the kubelet sent the unprepare to the old pod
    await old.commit()
    new.refresh()
    assert set(new.claims()) == {"from-old"}
