"""A restart keeps its bound ledger entries while the fabric is still being read (issue 37).

The reconciler runs every ``retry_seconds`` from the moment the ledger is loaded; it used to run
before the first discovery pass had ended, and took every bound entry whose device the inventory
did not hold yet for a binding removed outside fabric-dra: after a restart on a fabric of 10,100
devices, whose first pass outlasts ``retry_seconds``, the ledger was empty and every device bound
on the fabric showed as bound outside fabric-dra.
"""

from __future__ import annotations

from pathlib import Path

from fabric.backends.watch import InventoryWatch
from fabric.bindings.reconcile import Reconciler
from fabric.driver.operations import OperationDriver
from fabric.driver.settings import OperationSettings
from fabric.state.inventory import Inventory
from fabric.state.ledger import FileLedgerStore, Ledger, LedgerEntry, LedgerState
from fabric.state.nodes import NodeResolver
from tests.support.uids import claim_uid
from tests.unit.fabric.fakes import FABRIC, FakeDiscovery, FakeFabric, FakeTasks


async def test_bound_entries_are_kept_until_the_first_pass_and_after(tmp_path: Path) -> None:
    fabric = FakeFabric(hosts=["node-0", "node-1"], devices=["gpu0", "gpu1"], bound={"gpu0": "node-0"})
    before = Ledger(FileLedgerStore(tmp_path))
    await before.load()
    before.put(
        LedgerEntry(
            device="gpu0",
            device_key=f"/redfish/v1/Fabrics/{FABRIC}/Endpoints/gpu0",
            node="node-0",
            host="node-0",
            claim_uid=claim_uid("held"),
            state=LedgerState.BOUND,
            operation_id="op-1",
        )
    )
    await before.commit()
    # the restarted manager: the ledger loaded, the fabric not read yet
    discovery = FakeDiscovery(fabric)
    inventory = Inventory()
    ledger = Ledger(FileLedgerStore(tmp_path))
    await ledger.load()
    inventory.follow(ledger)
    settings = OperationSettings(
        operation_timeout=2.0, task_timeout=0.5, settle_seconds=0.01, retry_seconds=0.05
    )
    driver = OperationDriver(
        inventory, ledger, discovery.backend_for, FakeTasks(fabric), is_leader=lambda: True, settings=settings
    )
    reconciler = Reconciler(inventory, ledger, driver)
    await reconciler.reconcile()
    kept = ledger.get("gpu0")
    assert kept is not None and kept.state is LedgerState.BOUND
    # the first pass finds it bound: still held; gone from the fabric: forgotten, as before
    await InventoryWatch(discovery, inventory, NodeResolver(), use_events=False).refresh()  # type: ignore[arg-type]
    await reconciler.reconcile()
    assert ledger.get("gpu0") is not None
    fabric.bound.clear()
    await InventoryWatch(discovery, inventory, NodeResolver(), use_events=False).refresh()  # type: ignore[arg-type]
    await reconciler.reconcile()
    assert ledger.get("gpu0") is None
