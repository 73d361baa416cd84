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
