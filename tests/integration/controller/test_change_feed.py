"""The controller following the manager's change feed, as real processes with the API test server
and the manager stand-in (which serves the feed from the manager's own bounded history class):

- over a sequence of changes (health, drain, devices added and removed, a warm device) the slices
  it publishes are those a controller reading the whole inventory on every change publishes;
- a device's health change is one slice written, not the pool;
- over a random sequence of adds, removes, health changes and drains the pool stays valid and the
  same as the full read's, and a controller restarted over it writes nothing;
- a controller that falls behind the history, or whose manager restarted (another epoch), reads the
  whole inventory once and publishes the same slices again.

Controller CPU per change is measured by ``python -m bench --only controller``, not asserted here.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from manager_api.models import BindingState, Device, DeviceDrain, DrainEffect, Health, Inventory
from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.support.controller import InventoryServer, make_device, make_inventory
from tests.support.waiting import wait_until

NODES = ["cf-a", "cf-b"]


def nodes(apiserver: ApiServer) -> None:
    """The two nodes of the pool (the API server outlives a test: made once)."""
    have = {n["metadata"]["name"] for n in apiserver.http.get("/api/v1/nodes").json()["items"]}
    for node in NODES:
        if node not in have:
            apiserver.node(node)


def gpu(i: int, **kw: Any) -> Device:
    return make_device(f"gpu-{i:04d}", switch=f"Switch{i % 3}", **kw)


def inventory_of(devices: list[Device]) -> Inventory:
    return make_inventory(devices, pools={"fabric-pcie": NODES})


def _with(device: Device) -> Callable[[list[Device]], list[Device]]:
    """A change that replaces the device of ``device``'s name with it."""
    return lambda ds: [device if d.name == device.name else d for d in ds]


def status(proc: Any) -> dict[str, Any]:
    return dict(httpx.get(f"{proc.address}/status").json())


def synced(procs: list[Any], manager: InventoryServer) -> Callable[[], bool]:
    return lambda: all(status(p).get("slicesSyncedVersion") == manager.inventory.version for p in procs)


def published(apiserver: ApiServer, driver: str) -> dict[str, Any]:
    """The stored slices of ``driver`` by name, with the driver name taken out and what the server
    or the order of writes decides left out (taint times, generation), to compare two drivers."""
    out = {}
    for obj in apiserver.slices(driver):
        spec = dict(obj["spec"])
        spec["pool"] = {k: v for k, v in spec["pool"].items() if k != "generation"}
        spec["devices"] = [
            {**d, "taints": [{k: v for k, v in t.items() if k != "timeAdded"} for t in d.get("taints", [])]}
            for d in spec.get("devices", [])
        ]
        out[obj["metadata"]["name"].replace(driver, "DRIVER")] = spec
    return {name: _undriven(spec, driver) for name, spec in out.items()}


def _undriven(value: Any, driver: str) -> Any:
    if isinstance(value, dict):
        return {_undriven(k, driver): _undriven(v, driver) for k, v in value.items()}
    if isinstance(value, list):
        return [_undriven(v, driver) for v in value]
    return value.replace(driver, "DRIVER") if isinstance(value, str) else value


def test_the_feed_publishes_what_a_full_read_publishes_and_writes_only_what_changed(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    nodes(apiserver)
    full_driver = "full-" + driver
    devices = [gpu(i) for i in range(150)]
    drain = DeviceDrain(
        reason="maintenance",
        effect=DrainEffect.NO_SCHEDULE,
        since=datetime.now(UTC),
        drains=["switch/Switch0"],
    )
    with InventoryServer(inventory_of(devices)) as manager:
        feed = start_controller(manager, driver)
        full = start_controller(manager, full_driver, "--inventory-feed", "full")
        wait_until(synced([feed, full], manager), what="the first publication")
        assert published(apiserver, driver) == published(apiserver, full_driver)
        steps: list[tuple[str, Callable[[list[Device]], list[Device]]]] = [
            (
                "health",
                lambda ds: [gpu(70, health=Health.CRITICAL) if d.name == "gpu-0070" else d for d in ds],
            ),
            ("drain", lambda ds: [gpu(3, drain=drain) if d.name == "gpu-0003" else d for d in ds]),
            ("add", lambda ds: [*ds, *(gpu(i) for i in range(150, 160))]),
            ("remove", lambda ds: [d for d in ds if d.name not in ("gpu-0010", "gpu-0100")]),
            (
                "warm",
                lambda ds: [
                    gpu(5, state=BindingState.WARM, node=NODES[0]) if d.name == "gpu-0005" else d for d in ds
                ],
            ),
            ("healthy", lambda ds: [gpu(70) if d.name == "gpu-0070" else d for d in ds]),
        ]
        for what, change in steps:
            apiserver.reset_counts()
            manager.update_devices(change)
            wait_until(synced([feed, full], manager), what=f"the {what} change published")
            assert published(apiserver, driver) == published(apiserver, full_driver), what
            if what == "health":
                # one device's taint: its slice alone, in place, for each of the two drivers
                assert apiserver.writes() == 2
        names = {d["name"] for s in apiserver.slices(driver) for d in s["spec"].get("devices", [])}
        assert len(names) == 158 and "gpu-0010" not in names and "gpu-0159" in names
        assert status(feed)["inventoryResyncs"] == 0
        assert manager.changes_calls > 0


def test_a_controller_behind_the_history_or_after_a_manager_restart_reads_it_whole(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    nodes(apiserver)
    devices = [gpu(i) for i in range(20)]
    with InventoryServer(inventory_of(devices), history_versions=2) as manager:
        proc = start_controller(manager, driver)
        wait_until(synced([proc], manager), what="the first publication")
        calls = manager.inventory_calls

        # held back while five versions pass: its cursor falls out of a history of two
        manager.hold_changes(True)
        for i in range(5):
            manager.update_devices(_with(gpu(i, health=Health.WARNING)))
        manager.hold_changes(False)
        wait_until(synced([proc], manager), what="publication after falling behind")
        assert status(proc)["inventoryResyncs"] == 1 and manager.inventory_calls == calls + 1
        tainted = {
            d["name"] for s in apiserver.slices(driver) for d in s["spec"]["devices"] if d.get("taints")
        }
        assert tainted == {f"gpu-{i:04d}" for i in range(5)}

        # the manager restarts: another epoch, the feed reads it whole once more
        manager.restart()
        manager.update_devices(
            lambda ds: [gpu(19, health=Health.CRITICAL) if d.name == "gpu-0019" else d for d in ds]
        )
        wait_until(synced([proc], manager), what="publication after the manager's restart")
        assert status(proc)["inventoryResyncs"] == 2 and manager.inventory_calls == calls + 2
        tainted = {
            d["name"] for s in apiserver.slices(driver) for d in s["spec"]["devices"] if d.get("taints")
        }
        assert tainted == {f"gpu-{i:04d}" for i in (*range(5), 19)}


def test_a_manager_without_the_change_feed_is_read_whole(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    nodes(apiserver)
    with InventoryServer(inventory_of([gpu(i) for i in range(5)]), changes=False) as manager:
        proc = start_controller(manager, driver)
        wait_until(synced([proc], manager), what="the first publication")
        manager.update_devices(lambda ds: [*ds, gpu(5)])
        wait_until(synced([proc], manager), what="the added device published")
        assert len({d["name"] for s in apiserver.slices(driver) for d in s["spec"]["devices"]}) == 6
        assert manager.changes_calls == 0 and manager.inventory_calls >= 2


def check_layout(apiserver: ApiServer, driver: str) -> None:
    """The pool's stored slices are one valid pool: one generation, as many slices as each says,
    each device in exactly one, none past the limit where taints are published (64)."""
    stored = apiserver.slices(driver)
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"]) for s in stored}
    assert len(pools) == 1 and next(iter(pools))[1] == len(stored), pools
    listed = [d["name"] for s in stored for d in s["spec"].get("devices", [])]
    assert len(listed) == len(set(listed)), "a device in two slices"
    assert all(len(s["spec"].get("devices", [])) <= 64 for s in stored)


def _with_all(devices: list[Device]) -> Callable[[list[Device]], list[Device]]:
    """A change that makes the manager's devices ``devices``."""
    return lambda _: devices


def random_change(rng: random.Random, devices: list[Device], step: int) -> tuple[str, list[Device]]:
    """One random change: a device added (its name sorts into the middle of the pool) or removed,
    its health turned, or a drain put on or taken off."""
    out = list(devices)
    i = rng.randrange(len(out))
    what = rng.choice(["add", "remove", "health", "health", "drain"])
    if what == "add":
        out.append(make_device(f"{out[i].name}x{step}", switch=f"Switch{step % 3}"))
    elif what == "remove" and len(out) > 100:
        del out[i]
    elif what == "drain":
        drain = DeviceDrain(
            reason="maintenance", effect=DrainEffect.NO_SCHEDULE, since=datetime.now(UTC), drains=["switch/x"]
        )
        out[i] = out[i].model_copy(update={"drain": None if out[i].drain else drain})
    else:
        what = "health"
        health = Health.CRITICAL if out[i].health is Health.OK else Health.OK
        out[i] = out[i].model_copy(update={"health": health})
    return what, out


def test_random_changes_keep_the_layout_valid_and_a_restarted_controller_writes_nothing(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    """Each change is patched into the slices the devices are in (docs/controller.md, "Pools and
    slices"): the feed's pool stays what the full read's is (both saw every version, and the layout
    depends on the order of changes only), valid after every change; a device's health is
    one slice written by each; a controller started over the stored slices takes their layout."""
    nodes(apiserver)
    rng = random.Random(37)
    full_driver = "full-" + driver
    devices = [gpu(i) for i in range(140)]
    with InventoryServer(inventory_of(devices)) as manager:
        feed = start_controller(manager, driver)
        full = start_controller(manager, full_driver, "--inventory-feed", "full")
        wait_until(synced([feed, full], manager), what="the first publication")
        for step in range(24):
            what, devices = random_change(rng, devices, step)
            apiserver.reset_counts()
            manager.update_devices(_with_all(devices))
            wait_until(synced([feed, full], manager), what=f"change {step} ({what}) published")
            assert published(apiserver, driver) == published(apiserver, full_driver), (step, what)
            check_layout(apiserver, driver)
            if what == "health":  # (a drain is a DeviceTaintRule where the server serves them)
                assert apiserver.writes() == 2, (step, what)
        names = {d["name"] for s in apiserver.slices(driver) for d in s["spec"].get("devices", [])}
        assert names == {d.name for d in devices}
        feed.stop()
        apiserver.reset_counts()
        again = start_controller(manager, driver)
        wait_until(synced([again], manager), what="the restarted controller's first pass")
        assert apiserver.writes() == 0
