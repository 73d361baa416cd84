"""Warm changes as the real controller publishes them, against the API test server (issue 20).

* The warm-count label of a node never runs ahead of the node-local slice it promises: with the
  slice writes failing, the inventory's new warm device is not counted on its node, and once the
  label is there, so is the slice.
* A warm change is written in place: watched write by write, the pool stays complete (one
  generation, all its slices) and valid (no device twice), and its generation does not change.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from dra_driver.controller.resourcenames import warm_label_key
from manager_api.models import BindingState
from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.support.controller import InventoryServer, make_device, make_inventory
from tests.support.waiting import wait_until


def _warm_on(apiserver: ApiServer, driver: str, node: str) -> set[str]:
    """The devices published in ``node``'s node-local slices."""
    return {
        d["name"]
        for s in apiserver.slices(driver)
        if s["spec"].get("nodeName") == node
        for d in s["spec"].get("devices") or []
    }


def _warm(devices: list[Any], name: str, node: str) -> list[Any]:
    return [
        d.model_copy(update={"state": BindingState.WARM, "node": node}) if d.name == name else d
        for d in devices
    ]


def test_a_warm_count_never_runs_ahead_of_its_slice(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    nodes = ["wo-1", "wo-2"]
    for node in nodes:
        apiserver.node(node)
    key = warm_label_key(driver, "gpu")
    devices = [make_device(f"gpu-{i}") for i in range(4)]
    with InventoryServer(make_inventory(devices, pools={"fabric-pcie": nodes})) as manager:
        start_controller(manager, driver)
        wait_until(lambda: len(apiserver.slices(driver)) == 1, what="the first publication")
        # Every slice write fails for a while (the publisher backs off 0.1, 0.2, 0.4, 0.8 s): the
        # labeller, which reacts within tens of milliseconds, has that long to run ahead.
        apiserver.fault("resourceslices", verbs=["create", "update", "delete"], count=4, code=500)
        manager.update_devices(lambda current: _warm(current, "gpu-3", "wo-2"))
        deadline = time.monotonic() + 60
        # The labeller has read the same inventory; it must wait for the publisher.
        while key not in apiserver.node_labels("wo-2"):
            assert time.monotonic() < deadline, "the warm count never came"
            time.sleep(0.05)
        assert "gpu-3" in _warm_on(apiserver, driver, "wo-2"), "labelled warm before the slice existed"
        assert apiserver.node_labels("wo-2")[key] == "1"
        assert apiserver.faults_left() == 0


class _SliceWatch:
    """Every change to ``driver``'s slices from ``resource_version`` on, read in a thread.

    Watched in short watches, each resumed from the last resourceVersion it delivered: closing
    the client does not wake a thread blocked reading a stream, so one long watch held
    :meth:`until` for its join timeout."""

    #: seconds of each watch: how long :meth:`until` may wait for the thread to end
    WATCH_SECONDS = 1

    def __init__(self, apiserver: ApiServer, driver: str, resource_version: str) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._driver = driver
        self._resource_version = resource_version
        self._stop = threading.Event()
        # a client of its own: the reading thread must not share the test's
        self._http = httpx.Client(base_url=apiserver.url, headers=apiserver.http.headers, timeout=30)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        path = "/apis/resource.k8s.io/v1/resourceslices"
        while not self._stop.is_set():
            params = {
                "watch": "true",
                "resourceVersion": self._resource_version,
                "fieldSelector": f"spec.driver={self._driver}",
                "timeoutSeconds": str(self.WATCH_SECONDS),
            }
            with self._http.stream("GET", path, params=params) as response:
                for line in response.iter_lines():
                    if line:
                        event = json.loads(line)
                        assert event["type"] != "ERROR", event  # the history the resume needs is gone
                        self.events.append((event["type"], event["object"]))
                        self._resource_version = event["object"]["metadata"]["resourceVersion"]

    def until(self, resource_version: int) -> list[tuple[str, dict[str, Any]]]:
        """The events up to ``resource_version`` (waiting for them)."""
        wait_until(
            lambda: any(int(o["metadata"]["resourceVersion"]) >= resource_version for _, o in self.events),
            what="the watch to catch up",
        )
        self._stop.set()
        self._thread.join(timeout=10 * self.WATCH_SECONDS)
        assert not self._thread.is_alive(), "the watch did not end"
        self._http.close()
        return [(t, o) for t, o in self.events if int(o["metadata"]["resourceVersion"]) <= resource_version]


def _check_pool(slices: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(generation, slice count) of the one pool in ``slices``; fails when the allocator would
    find it incomplete (fewer slices of the newest generation than it says) or invalid (a device
    twice)."""
    newest = max(s["spec"]["pool"]["generation"] for s in slices.values())
    current = [s for s in slices.values() if s["spec"]["pool"]["generation"] == newest]
    counts = {s["spec"]["pool"]["resourceSliceCount"] for s in current}
    assert counts == {len(current)}, f"incomplete: {len(current)} slices of generation {newest}, {counts}"
    names = [d["name"] for s in current for d in s["spec"].get("devices") or []]
    assert len(names) == len(set(names)), f"a device twice: {sorted(names)}"
    return newest, len(current)


def test_warm_changes_keep_the_pool_complete_and_valid_at_every_instant(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    """Devices moving between the shared slice and the nodes' node-local ones, watched write by
    write: no state the allocator could read has the pool incomplete or a device twice, and no
    warm change writes a new generation."""
    nodes = ["wc-1", "wc-2"]
    for node in nodes:
        apiserver.node(node)
    devices = [make_device(f"gpu-{i}") for i in range(6)]
    inventory = make_inventory(devices, pools={"fabric-pcie": nodes})
    inventory.devices = _warm(_warm(inventory.devices, "gpu-5", "wc-1"), "gpu-4", "wc-2")
    with InventoryServer(inventory) as manager:
        start_controller(manager, driver)
        wait_until(lambda: len(apiserver.slices(driver)) == 3, what="the first publication")
        listed = apiserver.http.get(
            "/apis/resource.k8s.io/v1/resourceslices", params={"fieldSelector": f"spec.driver={driver}"}
        ).json()
        state = {s["metadata"]["name"]: s for s in listed["items"]}
        first_generation, _ = _check_pool(state)
        watch = _SliceWatch(apiserver, driver, listed["metadata"]["resourceVersion"])

        def bound(current: list[Any], name: str, node: str) -> list[Any]:
            return [
                d.model_copy(update={"state": BindingState.BOUND, "node": node, "claim_uid": f"u-{name}"})
                if d.name == name
                else d
                for d in current
            ]

        def refill_wc1(current: list[Any]) -> list[Any]:
            # wc-1's warm GPU is claimed and a refill warms gpu-0 there
            return _warm(bound(current, "gpu-5", "wc-1"), "gpu-0", "wc-1")

        def claim_wc2(current: list[Any]) -> list[Any]:
            # wc-2's is claimed: its slice empties
            return bound(current, "gpu-4", "wc-2")

        def warm_three(current: list[Any]) -> list[Any]:
            # two warm at once on wc-2, one more on wc-1
            return _warm(_warm(_warm(current, "gpu-1", "wc-2"), "gpu-2", "wc-2"), "gpu-3", "wc-1")

        steps: list[tuple[Callable[[list[Any]], list[Any]], str, set[str]]] = [
            (refill_wc1, "wc-1", {"gpu-0"}),
            (claim_wc2, "wc-2", set()),
            (warm_three, "wc-2", {"gpu-1", "gpu-2"}),
        ]
        for change, node, want in steps:
            manager.update_devices(change)

            def published(node: str = node, want: set[str] = want) -> bool:
                return _warm_on(apiserver, driver, node) == want

            wait_until(published, what=f"{node} warm {want}")
        wait_until(lambda: _warm_on(apiserver, driver, "wc-1") == {"gpu-0", "gpu-3"}, what="the last change")
        last = max(int(s["metadata"]["resourceVersion"]) for s in apiserver.slices(driver))
        events = watch.until(last)
        assert events, "no write seen"
        for kind, obj in events:
            name = obj["metadata"]["name"]
            if kind == "DELETED":
                state.pop(name, None)
            else:
                state[name] = obj
            assert _check_pool(state) == (first_generation, 3)
        assert all(kind == "MODIFIED" for kind, _ in events)
