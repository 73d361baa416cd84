"""What the publisher concludes from what the API server stored (feature gates that drop fields)."""

from __future__ import annotations

import copy
from typing import Any

from dra_driver.controller.devices import CounterLayout, PublishPolicy
from dra_driver.controller.publisher import SlicePublisher
from dra_driver.controller.slices import desired_pools, plan_pool
from manager_api.models import Health
from manager_api.partitions import BUILTIN_TABLES
from plumbing.kube import KubeClient, KubeConfig
from tests.support.controller import make_device, make_inventory, make_pool

DRIVER = "fabric-dra.io"


def written(policy: PublishPolicy) -> dict[str, Any]:
    inventory = make_inventory([make_device("gpu-0", health=Health.CRITICAL), make_device("gpu-1")])
    plan = plan_pool("fabric-pcie", desired_pools(inventory, policy)["fabric-pcie"], {}, driver=DRIVER)
    assert plan is not None
    return plan.writes[0].obj


def publisher(policy: PublishPolicy) -> SlicePublisher:
    return SlicePublisher(KubeClient(KubeConfig(server="http://127.0.0.1:9")), policy)


def test_dropped_taints_switch_the_publisher_to_withholding() -> None:
    policy = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=False)
    pub = publisher(policy)
    sent = written(policy)
    stored = copy.deepcopy(sent)
    for device in stored["spec"]["devices"]:
        device.pop("taints", None)  # what a cluster without DRADeviceTaints keeps
    assert pub.dropped.check(sent, stored) is False
    assert pub.policy.device_taints is False
    assert pub.policy.binding_conditions is False


def test_dropped_binding_fields_turn_binding_conditions_off_for_publication() -> None:
    policy = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=True)
    pub = publisher(policy)
    sent = written(policy)
    stored = copy.deepcopy(sent)
    for device in stored["spec"]["devices"]:
        for key in ("bindsToNode", "bindingConditions", "bindingFailureConditions"):
            device.pop(key, None)
    assert pub.dropped.check(sent, stored) is False
    assert pub.policy.binding_conditions is False
    assert pub.policy.device_taints is True


def test_a_faithful_store_changes_nothing() -> None:
    policy = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=True)
    pub = publisher(policy)
    sent = written(policy)
    stored = copy.deepcopy(sent)
    stored["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-01-01T00:00:00Z"
    assert pub.dropped.check(sent, stored) is True
    assert pub.policy == policy


def test_dropped_counters_publish_gpus_whole_and_dropped_sharing_withholds_pools() -> None:
    """Partitions without their counters could be allocated overlapping, and a pool without
    allowMultipleAllocations would be bound whole: neither is ever left published so."""
    policy = PublishPolicy(driver=DRIVER, device_taints=True, binding_conditions=True)
    inventory = make_inventory(
        [make_device("gpu-0", partition_table=BUILTIN_TABLES["h100-80gb"]), make_pool("pool-0", 2**30)]
    )
    pub = publisher(policy)
    for pool in ("fabric-pcie", "fabric-cxl"):
        plan = plan_pool(pool, desired_pools(inventory, policy)[pool], {}, driver=DRIVER)
        assert plan is not None
        for write in plan.writes:
            stored = copy.deepcopy(write.obj)
            stored["spec"].pop("sharedCounters", None)  # what a cluster without the gates keeps
            for device in stored["spec"].get("devices") or []:
                device.pop("consumesCounters", None)
                device.pop("allowMultipleAllocations", None)
            pub.dropped.check(write.obj, stored)
    assert pub.policy.counters is CounterLayout.OFF
    assert pub.policy.shares is False
    assert pub.policy.binding_conditions is True  # the rest is kept
    again = desired_pools(inventory, pub.policy)
    assert [d["name"] for chunk in again["fabric-pcie"].chunks for d in chunk] == ["gpu-0"]
    assert again["fabric-cxl"].device_count == 0
