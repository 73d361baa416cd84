"""The checkpoint encodes each claim entry once while it is unchanged; the bytes must be exactly
what encoding the whole record at once gives (the checksum is over the canonical form)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from dra_driver.plugin.checkpoint import CheckpointData, ClaimState, _canonical, _decode, _EncodedEntries
from tests.unit.plugin.test_checkpoint import entry


def _reference(data: CheckpointData) -> bytes:
    return _canonical(data.model_dump(mode="json", by_alias=True))


def test_cached_encoding_matches_whole_record_and_decodes(tmp_path: Path) -> None:
    encoder = _EncodedEntries()
    data = CheckpointData(driver="fabric-dra.io", node="node-a")
    assert encoder.canonical(data).encode() == _reference(data)  # no claims

    for uid in ("b2", "a1", "c3", "ü-unicode"):
        data.claims[uid] = entry(uid)
        assert encoder.canonical(data).encode() == _reference(data)

    data.claims["a1"] = entry("a1", ClaimState.PREPARE_STARTED)  # replaced: encoded afresh
    del data.claims["c3"]
    raw = encoder.encode(data)
    assert json.loads(raw)["data"] == data.model_dump(mode="json", by_alias=True)
    checksum = json.loads(raw)["checksum"]
    assert checksum == f"sha256:{hashlib.sha256(_reference(data)).hexdigest()}"
    decoded = _decode(raw, tmp_path / "checkpoint.json")
    assert decoded == data
    assert decoded.claims["a1"].state is ClaimState.PREPARE_STARTED


#: A checkpoint the plugin wrote before a device's facts were declared once
#: (:mod:`dra_driver.plugin.facts`): a prepared GPU with its host side, a CXL chunk and an NVMe
#: drive of a claim whose prepare started. A node upgraded with claims prepared must keep them.
OLD_CHECKPOINT = Path(__file__).parent / "data" / "checkpoint-v1.json"


def test_a_checkpoint_written_before_still_loads_and_is_written_back_byte_for_byte(tmp_path: Path) -> None:
    from dra_driver.plugin.checkpoint import CheckpointStore

    path = tmp_path / "checkpoint.json"
    path.write_bytes(OLD_CHECKPOINT.read_bytes())
    store = CheckpointStore(path, driver="fabric-dra.io", node="node-a")
    store.load()
    gpu = store.claims()["8f2e8c3a-52cf-4b6e-9d0a-0c1b2d3e4f50"].devices[0]
    assert (gpu.device, gpu.type, gpu.vendor_id, gpu.device_id, gpu.memory_bytes) == (
        "gpu-0",
        "gpu",
        "0x10de",
        "0x2330",
        85899345920,
    )
    assert gpu.host is not None and gpu.host.pci_address == "0000:41:00.0"
    assert gpu.identity().serial == "1654922000123"
    chunk = store.claims()["1b0c2d3e-0000-4000-8000-000000000001"].devices[0]
    assert chunk.identity().memory_bytes == 2 << 30
    # Nothing changed: encoding what was read gives the very bytes that were on disk.
    assert _EncodedEntries().encode(CheckpointData.model_validate(store._data.model_dump())) == (
        OLD_CHECKPOINT.read_bytes()
    )


#: A checkpoint written by the plugin that first prepared GPU partitions and memory shares: a
#: prepared partition, a claim with a kmem and a devdax share of one pool, and a partition whose
#: prepare recorded its placement but was cut short. Every later plugin must read it as it is.
SHARING_CHECKPOINT = Path(__file__).parent / "data" / "checkpoint-v1-sharing.json"


def test_a_checkpoint_with_partitions_and_shares_loads_and_is_written_back_byte_for_byte(
    tmp_path: Path,
) -> None:
    from dra_driver.plugin.checkpoint import CheckpointStore
    from dra_driver.plugin.config import MemoryMode

    path = tmp_path / "checkpoint.json"
    path.write_bytes(SHARING_CHECKPOINT.read_bytes())
    store = CheckpointStore(path, driver="fabric-dra.io", node="node-a")
    store.load()
    claims = store.claims()
    (part,) = claims["5d1f0a2b-3c4d-4e5f-8a6b-7c8d9e0f1a2b"].devices
    assert (part.device, part.parent, part.type, part.key) == (
        "gpu0-1g10gb-3",
        "gpu0",
        "gpu-partition",
        "gpu0-1g10gb-3",
    )
    assert part.partition is not None
    assert (part.partition.uuid, part.partition.profile, part.partition.start, part.partition.gpu) == (
        "MIG-6e2ab5c1-7b3a-4c5d-9e8f-001122334455",
        "1g.10gb",
        3,
        "0000:41:00.0",
    )
    kmem, devdax = claims["6e2a1b3c-4d5e-4f60-9a7b-8c9d0e1f2a3b"].devices
    assert (kmem.share_id, kmem.memory_bytes, kmem.memory_mode) == (
        "3f0e6b9c-6f21-4d3b-8a51-0c8d1e2f3a4b",
        4 << 30,
        MemoryMode.KMEM,
    )
    assert kmem.memory is not None and (kmem.memory.node, kmem.memory.blocks) == (1, [1024, 1025, 1026, 1027])
    assert (
        devdax.key == "cxlpool0-9a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d"
        and devdax.identity().memory_bytes == 2 << 30
    )
    (started,) = claims["7f3b2c4d-5e6f-4071-8b8c-9d0e1f2a3b4c"].devices
    assert (started.partition_profile, started.partition_start, started.partition) == ("3g.40gb", 4, None)
    assert _EncodedEntries().encode(CheckpointData.model_validate(store._data.model_dump())) == (
        SHARING_CHECKPOINT.read_bytes()
    )


def test_a_device_of_neither_kind_is_stored_as_before_partitions_and_shares() -> None:
    data = CheckpointData(driver="fabric-dra.io", node="node-a", claims={"a1": entry("a1")})
    stored = json.loads(_EncodedEntries().encode(data))["data"]["claims"]["a1"]["devices"][0]
    for name in (
        "share_id",
        "parent",
        "partition_profile",
        "partition_start",
        "partition",
        "memory_mode",
        "memory",
    ):
        assert name not in stored
