"""The warm-count node labels: ``warm.<driver>.node-restriction.kubernetes.io/<type>=<count>``
(:func:`desired_warm_labels`), counting exactly the untainted devices published warm in each node's
node-local slices."""

from __future__ import annotations

import pytest

from dra_driver.controller.devices import PublishPolicy
from dra_driver.controller.resourcenames import warm_label_key
from dra_driver.controller.slices import desired_pools, desired_warm_labels, warm_node_preference
from manager_api.models import BindingState, DeviceType, Health
from plumbing.names import is_qualified_name
from tests.support.controller import make_device, make_inventory

DRIVER = "fabric-dra.io"


def test_counts_per_node_and_type_absent_at_zero() -> None:
    inventory = make_inventory(
        [
            make_device("gpu-0", state=BindingState.WARM, node="node-a"),
            make_device("gpu-1", state=BindingState.WARM, node="node-a"),
            make_device("gpu-2", state=BindingState.BOUND, node="node-b", claim_uid="u"),
            make_device("gpu-3"),
            make_device("nvme-0", type=DeviceType.NVME, state=BindingState.WARM, node="node-b"),
            # warm on a node its pool does not reach: published as if cold, so not counted
            make_device("gpu-4", state=BindingState.WARM, node="node-z"),
            # tainted (device taints) or withheld: no claim takes it without a toleration
            make_device("gpu-5", state=BindingState.WARM, node="node-b", health=Health.WARNING),
        ],
        pools={"fabric-pcie": ["node-a", "node-b", "node-c"]},
    )
    assert desired_warm_labels(inventory, DRIVER) == {
        "node-a": {"warm.fabric-dra.io.node-restriction.kubernetes.io/gpu": "2"},
        "node-b": {"warm.fabric-dra.io.node-restriction.kubernetes.io/nvme": "1"},
    }


def test_counts_match_the_untainted_devices_of_the_node_local_slices() -> None:
    devices = [make_device(f"gpu-{i}", state=BindingState.WARM, node=f"node-{i % 3}") for i in range(7)]
    devices[5] = devices[5].model_copy(update={"health": Health.CRITICAL})
    inventory = make_inventory(devices, pools={"fabric-pcie": ["node-0", "node-1", "node-2"]})
    policy = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=False)
    (pool,) = desired_pools(inventory, policy).values()
    published: dict[str, int] = {}
    for chunk, placement in zip(pool.chunks, pool.placements, strict=True):
        if "nodeName" in placement:
            untainted = [d for d in chunk if not d.get("taints")]
            published[placement["nodeName"]] = published.get(placement["nodeName"], 0) + len(untainted)
    labels = desired_warm_labels(inventory, DRIVER)
    assert {n: int(v[warm_label_key(DRIVER, "gpu")]) for n, v in labels.items()} == published
    assert published == {"node-0": 3, "node-1": 2, "node-2": 1}


def test_a_duplicate_device_name_counts_once() -> None:
    warm = make_device("gpu-0", state=BindingState.WARM, node="node-a")
    inventory = make_inventory([warm, warm.model_copy()])
    assert desired_warm_labels(inventory, DRIVER) == {
        "node-a": {"warm.fabric-dra.io.node-restriction.kubernetes.io/gpu": "1"}
    }


@pytest.mark.parametrize("publisher", ["default", "rack-2", "A Very Long Publisher Name " * 4])
@pytest.mark.parametrize("device_type", list(DeviceType))
def test_every_key_is_a_label_name_and_publishers_keep_apart(publisher: str, device_type: DeviceType) -> None:
    key = warm_label_key(DRIVER, device_type.value, publisher)
    assert is_qualified_name(key), key
    assert key.startswith("warm.fabric-dra.io.node-restriction.kubernetes.io/")
    if publisher == "default":
        assert key == f"warm.fabric-dra.io.node-restriction.kubernetes.io/{device_type.value}"
    else:
        assert key not in {warm_label_key(DRIVER, t.value) for t in DeviceType}


def test_another_publisher_writes_its_own_keys() -> None:
    inventory = make_inventory([make_device("gpu-0", state=BindingState.WARM, node="node-a")])
    labels = desired_warm_labels(inventory, DRIVER, "rack-2")
    assert labels == {"node-a": {"warm.fabric-dra.io.node-restriction.kubernetes.io/rack-2.gpu": "1"}}


def test_the_recipe_prefers_the_count_above_zero() -> None:
    assert warm_node_preference(DRIVER, "gpu") == {
        "weight": 100,
        "preference": {
            "matchExpressions": [
                {
                    "key": "warm.fabric-dra.io.node-restriction.kubernetes.io/gpu",
                    "operator": "Gt",
                    "values": ["0"],
                }
            ]
        },
    }


def test_a_warm_device_a_claim_is_allocated_is_not_counted() -> None:
    """The inventory shows it warm until the claim's prepare; no new claim can have it meanwhile."""
    inventory = make_inventory(
        [make_device(f"gpu-{i}", state=BindingState.WARM, node="node-a") for i in range(2)]
        + [make_device("gpu-2", state=BindingState.WARM, node="node-b")]
    )
    taken = {("fabric-pcie", "gpu-0"), ("fabric-pcie", "gpu-2")}
    labels = desired_warm_labels(inventory, DRIVER, allocated=taken)
    assert labels == {"node-a": {"warm.fabric-dra.io.node-restriction.kubernetes.io/gpu": "1"}}
