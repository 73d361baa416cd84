"""Startup repair: checkpoint vs CDI specs vs the fabric's bindings to this node."""

from __future__ import annotations

import os
from pathlib import Path

from dra_driver.plugin import cdi
from dra_driver.plugin.checkpoint import ClaimState
from dra_driver.plugin.reconcile import reconcile
from dra_driver.plugin.server import PluginServer
from tests.unit.plugin.conftest import DRIVER, claim_object
from tests.unit.plugin.test_driver import Harness


async def run_reconcile(h: Harness, *, rebuild: bool = False) -> list[str]:
    report = await reconcile(
        h.store,
        h.backend,
        cdi_root=h.config.cdi_root,
        driver=DRIVER,
        real_host=False,
        scanner=None,
        rebuild=rebuild,
    )
    return report.repaired + report.problems


async def test_corrupt_checkpoint_is_quarantined_and_rebuilt(short_tmp: Path) -> None:
    h = Harness(short_tmp)
    ref = h.add("c1", [("gpu", "gpu-0")])
    await h.prepare(ref)
    h.config.checkpoint_file.write_text('{"kind": "FabricDraPluginCheckpoint", "version": 1, "chec')

    server = PluginServer(h.config, claims=h.claims, backend=h.backend)
    await server.start()
    try:
        quarantined = [p for p in os.listdir(h.config.plugin_dir) if p.startswith("checkpoint.json.corrupt-")]
        assert len(quarantined) == 1
        assert server.store is not None
        entry = server.store.get(ref.uid)
        assert entry is not None and entry.state is ClaimState.PREPARE_COMPLETED
        assert [d.device for d in entry.devices] == ["gpu-0"]
        assert server.driver is not None
        errors = await server.driver.unprepare([ref], server.driver.deadline(30))
        assert errors == {ref.uid: ""}
        assert h.backend.attached == {}  # the rebuilt record was enough to detach
    finally:
        await server.stop()


async def test_missing_spec_of_a_prepared_claim_is_rewritten(short_tmp: Path) -> None:
    h = Harness(short_tmp)
    ref = h.add("c1", [("gpu", "gpu-0")])
    await h.prepare(ref)
    cdi.remove_spec_files(cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid))
    lines = await run_reconcile(h)
    assert any("rewrote missing CDI spec" in line for line in lines)
    (path,) = cdi.spec_files_of_claim(h.config.cdi_root, DRIVER, ref.uid)
    cdi.validate_spec(cdi.CdiSpec.model_validate_json(path.read_text()))


async def test_old_orphan_spec_is_removed_recent_one_left_alone(short_tmp: Path) -> None:
    h = Harness(short_tmp)
    other = Harness(short_tmp / "elsewhere")
    ref = other.add("c1", [("gpu", "gpu-0")])
    await other.prepare(ref)
    (spec,) = cdi.spec_files_of_claim(other.config.cdi_root, DRIVER, ref.uid)
    h.config.cdi_root.mkdir(parents=True, exist_ok=True)
    orphan = h.config.cdi_root / spec.name
    orphan.write_bytes(spec.read_bytes())
    other.backend.attached.clear()  # the fabric binds nothing for it
    h.backend.attached.clear()
    lines = await run_reconcile(h)
    assert orphan.exists() and any("left alone" in line for line in lines)
    os.utime(orphan, (0, 0))
    lines = await run_reconcile(h)
    assert not orphan.exists() and any("removed orphaned" in line for line in lines)


async def test_device_the_fabric_lost_sends_the_claim_back_to_prepare(short_tmp: Path) -> None:
    h = Harness(short_tmp)
    ref = h.add("c1", [("gpu", "gpu-0")])
    await h.prepare(ref)
    h.backend.attached.clear()  # e.g. unbound by hand while the plugin was down
    lines = await run_reconcile(h)
    assert any("no longer binds gpu-0" in line for line in lines)
    entry = h.store.get(ref.uid)
    assert entry is not None and entry.state is ClaimState.PREPARE_STARTED
    (devices,) = (await h.prepare(ref)).values()
    assert isinstance(devices, list) and h.backend.attached == {"gpu-0": ref.uid}  # re-attached


async def test_binding_without_a_record_is_adopted_for_unprepare(short_tmp: Path) -> None:
    h = Harness(short_tmp)
    h.backend.attached["gpu-5"] = "33333333-0000-0000-0000-000000000000"
    lines = await run_reconcile(h)
    assert any("had no record" in line for line in lines)
    entry = h.store.get("33333333-0000-0000-0000-000000000000")
    assert entry is not None and entry.state is ClaimState.PREPARE_STARTED
    from dra_driver.plugin.driver import ClaimRef

    ref = ClaimRef("33333333-0000-0000-0000-000000000000", "default", "gone")
    assert await h.unprepare(ref) == {ref.uid: ""}
    assert h.backend.attached == {}


async def test_clean_state_reports_nothing(short_tmp: Path) -> None:
    h = Harness(short_tmp)
    h.claims.add(claim_object("unused", devices=[("gpu", "gpu-0")]))
    assert await run_reconcile(h) == []
