"""The typed ResourceClaim view: what the code reads from a claim, and how odd claims read."""

from __future__ import annotations

from typing import Any

from plumbing.kube.dra import ResourceClaim, is_allocated


def result(device: str, driver: str = "fabric-dra.io", **extra: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": driver, "pool": "fabric-pcie", "device": device, **extra}


def claim(status: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns", "uid": "u-1"}, "status": status}


ONE_NODE = {
    "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]
}


def test_allocation_results_node_and_drivers() -> None:
    view = ResourceClaim.model_validate(
        claim(
            {
                "allocation": {
                    "devices": {
                        "results": [
                            result("gpu-1", "b.example.com"),
                            result("gpu-2", bindingConditions=["fabric-dra.io/Attached"]),
                            result("gpu-3", "b.example.com"),
                        ]
                    },
                    "nodeSelector": ONE_NODE,
                },
                "reservedFor": [{"resource": "pods", "name": "p", "uid": "pod-1"}],
            }
        )
    )
    assert view.allocated
    assert view.drivers() == ["b.example.com", "fabric-dra.io"]  # first appearance, once each
    assert [r.device for r in view.results_for("fabric-dra.io")] == ["gpu-2"]
    assert view.status.allocation is not None
    assert view.status.allocation.node == "node-a"
    assert view.status.allocation.has_binding_conditions
    assert view.reserved_for_uid("pod-1") and not view.reserved_for_uid("pod-2")


def test_device_status_is_matched_by_driver_pool_device_and_share_id() -> None:
    entry = {"driver": "fabric-dra.io", "pool": "fabric-pcie", "device": "gpu-1"}
    view = ResourceClaim.model_validate(
        claim(
            {
                "allocation": {"devices": {"results": [result("gpu-1")]}},
                "devices": [
                    {**entry, "shareID": "s-1", "conditions": [{"type": "d/Attached", "status": "False"}]},
                    {**entry, "conditions": [{"type": "d/Attached", "status": "True", "reason": "Attached"}]},
                ],
            }
        )
    )
    found = view.status.device_status(view.results[0])
    assert found is not None and found.share_id is None
    assert found.is_true("d/Attached") and not found.is_true("d/AttachFailed")
    attached = found.condition("d/Attached")
    assert attached is not None and attached.reason == "Attached"


def test_odd_entries_are_left_out_and_the_claim_still_reads() -> None:
    view = ResourceClaim.model_validate(
        claim(
            {
                "allocation": {"devices": {"results": [result("gpu-1"), "junk", {"driver": "x"}, None]}},
                "reservedFor": None,
                "devices": [7, {"driver": "fabric-dra.io", "pool": "p", "device": "d", "conditions": [{}]}],
            }
        )
    )
    assert [r.device for r in view.results] == ["gpu-1"]
    assert view.status.reserved_for == []
    assert len(view.status.devices) == 1 and view.status.devices[0].conditions == []


def test_what_is_not_an_allocation() -> None:
    assert not is_allocated(claim({}))
    assert not is_allocated(claim({"allocation": {}}))  # an empty object allocates nothing
    assert not is_allocated(claim({"allocation": None}))
    assert is_allocated(claim({"allocation": {"devices": {"results": []}}}))
    assert ResourceClaim.read({"metadata": "not an object"}) is None
    assert not is_allocated({"metadata": "not an object"})
    plain = ResourceClaim.model_validate(claim({"allocation": {"nodeSelector": {"nodeSelectorTerms": []}}}))
    assert plain.status.allocation is not None and plain.status.allocation.node is None
    assert plain.results == [] and plain.drivers() == []
