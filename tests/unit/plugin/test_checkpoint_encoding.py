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
