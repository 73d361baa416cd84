"""What the plugin reads of a share's allocation: its shareID and consumed memory, sent with the
attach, and the mode the claim's (or its class's) configuration asks for; a claim that cannot say
these is refused in one line before anything is attached."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from dra_driver.plugin import cdi
from dra_driver.plugin.backend import ShareAsk
from dra_driver.plugin.checkpoint import CheckpointStore
from dra_driver.plugin.claims import memory_mode
from dra_driver.plugin.config import MemoryMode
from dra_driver.plugin.driver import ClaimRef, Driver
from dra_driver.plugin.state import ClaimLocks
from plumbing.kube.dra import ResourceClaim
from tests.unit.plugin.conftest import DRIVER, FakeClaims, ScriptedBackend, claim_object, make_config

SHARE_A = "3f0e6b9c-6f21-4d3b-8a51-0c8d1e2f3a4b"
SHARE_B = "9a1b2c3d-4e5f-4a6b-8c7d-0e1f2a3b4c5d"


def share_claim(
    name: str,
    shares: list[tuple[str, str, str | None]],
    *,
    config: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A claim allocated shares of ``cxlpool0``: (request, shareID, consumed memory) each."""
    obj = claim_object(name, devices=[(r, "cxlpool0") for r, _, _ in shares], pool="fabric-cxl")
    results = obj["status"]["allocation"]["devices"]["results"]
    for result, (_request, share, memory) in zip(results, shares, strict=True):
        result["shareID"] = share
        if memory is not None:
            result["consumedCapacity"] = {f"{DRIVER}/memory": memory}
    if config is not None:
        obj["status"]["allocation"]["devices"]["config"] = config
    return obj


def memory_config(mode: str, requests: list[str] | None = None, source: str = "FromClaim") -> dict[str, Any]:
    entry: dict[str, Any] = {
        "source": source,
        "opaque": {
            "driver": DRIVER,
            "parameters": {"apiVersion": "fabric-dra.io/v1alpha1", "kind": "MemoryConfig", "mode": mode},
        },
    }
    if requests is not None:
        entry["requests"] = requests
    return entry


class Harness:
    def __init__(self, root: Path, **config: Any) -> None:
        self.config = make_config(root, **config)
        self.claims = FakeClaims()
        self.backend = ScriptedBackend()
        self.store = CheckpointStore(self.config.checkpoint_file, driver=DRIVER, node=self.config.node_name)
        self.store.load()
        self.driver = Driver(
            self.config,
            store=self.store,
            locks=ClaimLocks(self.config.lock_file),
            backend=self.backend,
            claims=self.claims,
        )

    async def prepare(self, obj: dict[str, Any]) -> tuple[ClaimRef, Any]:
        ref = ClaimRef(*self.claims.add(obj))
        (outcome,) = (await self.driver.prepare([ref], self.driver._clock() + 30)).values()
        return ref, outcome


async def test_a_share_is_attached_with_its_id_and_bytes_and_gets_a_cdi_device_of_its_own(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    ref, outcome = await h.prepare(share_claim("mem", [("fast", SHARE_A, "4Gi"), ("bulk", SHARE_B, "2Gi")]))
    assert outcome.error == ""
    assert h.backend.attach_shares == {
        f"cxlpool0-{SHARE_A}": ShareAsk(SHARE_A, 4 << 30, MemoryMode.DEVDAX),
        f"cxlpool0-{SHARE_B}": ShareAsk(SHARE_B, 2 << 30, MemoryMode.DEVDAX),
    }
    # the kubelet hears of the pool's device twice, one CDI device per share
    assert [(d.device, d.request_names, d.cdi_device_ids) for d in outcome.devices] == [
        ("cxlpool0", ("fast",), (f"k8s.fabric-dra.io/cxl-memory={ref.uid}-cxlpool0-{SHARE_A}",)),
        ("cxlpool0", ("bulk",), (f"k8s.fabric-dra.io/cxl-memory={ref.uid}-cxlpool0-{SHARE_B}",)),
    ]
    (spec,) = cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid)
    assert [d.share_id for d in cdi.read_spec_devices(spec)] == [SHARE_A, SHARE_B]
    entry = h.store.get(ref.uid)
    assert entry is not None and [d.memory_bytes for d in entry.devices] == [4 << 30, 2 << 30]
    assert await h.driver.unprepare([ref], h.driver._clock() + 30) == {ref.uid: ""}
    assert h.backend.attached == {}


async def test_the_plugins_mode_unless_the_claims_configuration_says(tmp_path: Path) -> None:
    h = Harness(tmp_path, memory_mode=MemoryMode.KMEM)
    await h.prepare(share_claim("default", [("fast", SHARE_A, "4Gi")]))
    assert h.backend.attach_shares[f"cxlpool0-{SHARE_A}"] == ShareAsk(SHARE_A, 4 << 30, MemoryMode.KMEM)
    # the class's configuration first, then the claim's: the claim's wins
    configs = [memory_config("kmem", source="FromClass"), memory_config("devdax", ["fast"])]
    await h.prepare(share_claim("configured", [("fast", SHARE_B, "1Gi")], config=configs))
    assert h.backend.attach_shares[f"cxlpool0-{SHARE_B}"] == ShareAsk(SHARE_B, 1 << 30, MemoryMode.DEVDAX)


def test_a_configuration_applies_to_its_requests_and_their_subrequests() -> None:
    obj = share_claim(
        "c",
        [("fast", SHARE_A, "4Gi"), ("bulk", SHARE_B, "2Gi")],
        config=[memory_config("kmem", ["fast"]), memory_config("devdax", ["bulk"])],
    )
    obj["status"]["allocation"]["devices"]["results"][0]["request"] = "fast/small"
    claim = ResourceClaim.model_validate(obj)
    fast, bulk = claim.results
    assert memory_mode(claim, fast, DRIVER) is MemoryMode.KMEM
    assert memory_mode(claim, bulk, DRIVER) is MemoryMode.DEVDAX
    assert memory_mode(claim, fast, "other.example.com") is None


@pytest.mark.parametrize(
    ("shares", "config", "reason"),
    [
        (
            [("fast", SHARE_A, None)],
            None,
            f"allocates share {SHARE_A} of device cxlpool0 without a consumed capacity of memory",
        ),
        ([("fast", SHARE_A, "lots")], None, f"share {SHARE_A} consumes memory 'lots': "),
        ([("fast", SHARE_A, "1.5")], None, "not a whole number of bytes"),
        (
            [("fast", SHARE_A, "4Gi")],
            [memory_config("swap")],
            "the configuration of request fast for fabric-dra.io is not usable: MemoryConfig mode: Input "
            "should be",
        ),
        (
            [("fast", SHARE_A, "4Gi")],
            [{"opaque": {"driver": DRIVER, "parameters": {"kind": "GpuConfig"}}}],
            "kind 'GpuConfig' is not one this driver knows (MemoryConfig)",
        ),
    ],
)
async def test_a_share_the_plugin_cannot_read_is_refused_before_any_attach(
    tmp_path: Path,
    shares: list[tuple[str, str, str | None]],
    config: list[dict[str, Any]] | None,
    reason: str,
) -> None:
    h = Harness(tmp_path)
    _ref, outcome = await h.prepare(share_claim(f"c-{uuid.uuid4().hex[:6]}", shares, config=config))
    assert reason in outcome.error and "\n" not in outcome.error
    assert h.backend.attach_calls == []
