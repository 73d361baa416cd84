"""The controller upgraded over nodes that carry the label keys of earlier releases
(``pool.<driver>/…``, ``warm.<driver>/…``, which any kubelet may set on its own Node): it writes
the keys under NodeRestriction's namespace and removes the old keys it owns — those of its pools,
reach groups and warm counts — and leaves every other key alone."""

from __future__ import annotations

from dra_driver.controller.resourcenames import pool_label_key, reach_label_key, warm_label_key
from manager_api.models import BindingState, ReachGroup
from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.support.controller import InventoryServer, make_device, make_inventory
from tests.support.waiting import wait_until


def test_an_upgrade_moves_the_labels_it_owns_to_the_restricted_keys(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    old = {
        "pool": f"pool.{driver}/fabric-pcie",
        "reach": f"pool.{driver}/fabric-pcie.r1",
        "warm": f"warm.{driver}/gpu",
    }
    # not this controller's: another manager's pool, another publisher's warm count, a user's label
    foreign = {f"pool.{driver}/other-fabric": "true", f"warm.{driver}/rack-9.gpu": "2", "keep": "me"}
    apiserver.node("mg-1", labels={old["pool"]: "true", old["reach"]: "true", old["warm"]: "1", **foreign})
    apiserver.node("mg-2", labels={old["pool"]: "true", old["reach"]: "true"})
    apiserver.node("mg-3", labels={old["warm"]: "3"})  # no longer reached at all
    devices = [
        make_device("gpu-0", state=BindingState.WARM, node="mg-1"),
        make_device("gpu-1"),
        make_device("gpu-b0", switch="Switch9", reach="r1"),
    ]
    inventory = make_inventory(devices, pools={"fabric-pcie": ["mg-1", "mg-2"]})
    inventory.pools[0].reach_groups = [ReachGroup(id="r1", nodes=["mg-1"])]
    new = {
        "pool": pool_label_key(driver, "fabric-pcie"),
        "reach": reach_label_key(driver, "fabric-pcie", "r1"),
        "warm": warm_label_key(driver, "gpu"),
    }
    assert all(new[k].endswith("node-restriction.kubernetes.io/" + old[k].split("/")[1]) for k in old)
    want = {
        "mg-1": {new["pool"]: "true", new["reach"]: "true", new["warm"]: "1", **foreign},
        "mg-2": {new["pool"]: "true"},
        "mg-3": {},
    }
    with InventoryServer(inventory) as manager:
        start_controller(manager, driver)
        wait_until(
            lambda: all(apiserver.node_labels(name) == labels for name, labels in want.items()),
            what="the new keys in place and the old ones gone",
        )
        # The slices select on the new keys only.
        keys = {
            expression["key"]
            for s in apiserver.slices(driver)
            for term in (s["spec"].get("nodeSelector") or {}).get("nodeSelectorTerms") or []
            for expression in term["matchExpressions"]
        }
        assert keys == {new["pool"], new["reach"]}
