"""Warm changes as the real controller publishes them, against the API test server (issue 20).

* The warm-count label of a node never runs ahead of the node-local slice it promises: with the
  slice writes failing, the inventory's new warm device is not counted on its node, and once the
  label is there, so is the slice.
"""

from __future__ import annotations

import time
from typing import Any

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
        # Every slice write fails for a while (the publisher backs off 0.1, 0.2, 0.4 … s).
        apiserver.fault("resourceslices", verbs=["create", "update", "delete"], count=6, code=500)
        manager.update_devices(lambda current: _warm(current, "gpu-3", "wo-2"))
        deadline = time.monotonic() + 60
        # The labeller has read the same inventory; it must wait for the publisher.
        while key not in apiserver.node_labels("wo-2"):
            assert time.monotonic() < deadline, "the warm count never came"
            time.sleep(0.05)
        assert "gpu-3" in _warm_on(apiserver, driver, "wo-2"), "labelled warm before the slice existed"
        assert apiserver.node_labels("wo-2")[key] == "1"
        assert apiserver.faults_left() == 0
