"""What explains a binding to the orphan reconciler, and its defaults. The timeline with real
processes is tests/integration/reliability/test_orphans.py."""

from __future__ import annotations

from typing import Any

from fabric.bindings.orphans import Held, OrphanReconciler, _Claims, held_of
from fabric.redfish.client import RedfishSettings
from fabric.service.config import ManagerSettings
from fabric.state.ledger import PARTITIONS_HOLDER, LedgerEntry, LedgerState, PartitionHold, ShareRecord
from fabric.state.reports import PluginReports
from fabric_dra.cli import build_parser


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _held(device: str = "gpu0", claim: str = "uid-1", node: str = "node-a") -> Held:
    (held,) = held_of(_entry(device, claim, node))
    return held


def _entry(device: str = "gpu0", claim: str = "uid-1", node: str = "node-a") -> LedgerEntry:
    return LedgerEntry(
        device=device,
        device_key=f"/redfish/v1/Fabrics/PCIe/Endpoints/{device}",
        node=node,
        host=node,
        claim_uid=claim,
        state=LedgerState.BOUND,
        operation_id="op-1",
    )


def _claim(
    uid: str, device: str | None, *, reserved: bool, conditions: bool = False, node: str | None = None
) -> dict[str, Any]:
    result: dict[str, Any] = {
        "request": "r",
        "driver": "fabric-dra.io",
        "pool": "fabric-pcie",
        "device": device,
    }
    if conditions:
        result["bindingConditions"] = ["fabric-dra.io/Attached"]
    status: dict[str, Any] = {}
    if device is not None:
        status["allocation"] = {"devices": {"results": [result]}}
        if node is not None:
            status["allocation"]["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": "p", "uid": "pod-1"}]
    return {"metadata": {"uid": uid, "name": "c", "namespace": "ns"}, "status": status}


def _reconciler(reports: PluginReports) -> OrphanReconciler:
    return OrphanReconciler(None, None, grace_seconds=600, interval=60, reports=reports)  # type: ignore[arg-type]


def test_what_explains_a_binding() -> None:
    reports = PluginReports(ttl=90)
    orphans = _reconciler(reports)
    entry = _held()
    cases = {
        "reserved": (_claim("uid-1", "gpu0", reserved=True), None),
        "binding conditions, not reserved yet": (
            _claim("uid-1", "gpu0", reserved=False, conditions=True),
            None,
        ),
        "allocated, reserved for nobody": (_claim("uid-1", "gpu0", reserved=False), "not-reserved"),
        "allocates another device": (_claim("uid-1", "gpu1", reserved=True), "not-allocated"),
        "deallocated": (_claim("uid-1", None, reserved=False), "not-allocated"),
        "allocated to this node by name": (_claim("uid-1", "gpu0", reserved=True, node="node-a"), None),
        "allocated anew on another node": (
            _claim("uid-1", "gpu0", reserved=False, conditions=True, node="node-b"),
            "not-allocated",
        ),
        "another claim with the same name": (_claim("uid-2", "gpu0", reserved=True), "claim-deleted"),
    }
    for what, (claim, expected) in cases.items():
        claims = _Claims({claim["metadata"]["uid"]: claim})
        assert orphans.why_orphan(entry, claims) == expected, what


def test_a_fresh_plugin_report_explains_a_binding_whatever_the_claim_status_says() -> None:
    clock = _Clock()
    reports = PluginReports(ttl=90, clock=clock)
    orphans = _reconciler(reports)
    unreserved = _Claims({"uid-1": _claim("uid-1", None, reserved=False)})  # deallocated under the pod
    reports.record("node-a", {"uid-1": ["gpu0"]})
    assert orphans.why_orphan(_held(), unreserved) is None
    assert orphans.why_orphan(_held(device="gpu1"), unreserved) == "not-allocated"  # not in the report
    assert orphans.why_orphan(_held(node="node-b"), unreserved) == "not-allocated"  # another node's
    clock.now += 91
    assert orphans.why_orphan(_held(), unreserved) == "not-allocated"  # the report is too old


def test_a_report_does_not_keep_a_claim_that_does_not_exist() -> None:
    # A plugin reporting made-up (or deleted) claims as prepared must not hold devices with them.
    reports = PluginReports(ttl=90)
    orphans = _reconciler(reports)
    reports.record("node-a", {"uid-1": ["gpu0"]})
    assert orphans.why_orphan(_held(), _Claims({})) == "claim-deleted"


def test_defaults_grace_of_ten_minutes() -> None:
    settings = ManagerSettings(redfish=RedfishSettings(base_url="http://127.0.0.1:1"), state_dir=".")
    assert settings.orphan_grace_seconds == 600
    args = build_parser().parse_args(["manager", "serve", "--redfish-url", "http://127.0.0.1:1"])
    assert args.orphan_grace_seconds == 600
    assert args.plugin_report_ttl_seconds == 90


def _with_result(claim: dict[str, Any], **result: Any) -> dict[str, Any]:
    claim["status"]["allocation"]["devices"]["results"][0].update(result)
    return claim


def test_each_partition_holder_and_each_share_is_judged_on_its_own() -> None:
    reports = PluginReports(ttl=90)
    orphans = _reconciler(reports)
    gpu = _entry(device="gpu0", claim=PARTITIONS_HOLDER)
    gpu.partitions = [
        PartitionHold(partition="gpu0-1g10gb-0", claim_uid="uid-a"),
        PartitionHold(partition="gpu0-1g10gb-1", claim_uid="uid-b"),
    ]
    a, b = held_of(gpu)
    assert (a.device, a.claim_uid, a.node, a.gpu) == ("gpu0-1g10gb-0", "uid-a", "node-a", "gpu0")
    claims = _Claims({"uid-a": _claim("uid-a", "gpu0-1g10gb-0", reserved=True)})  # uid-b is gone
    assert orphans.why_orphan(a, claims) is None
    assert orphans.why_orphan(b, claims) == "claim-deleted"
    # ... unless its plugin reports it prepared? Not for a claim that does not exist
    reports.record("node-a", {"uid-b": ["gpu0-1g10gb-1"]})
    assert orphans.why_orphan(b, claims) == "claim-deleted"
    # a claim whose allocation of the GPU's partition is gone, but its plugin still reports it
    claims.by_uid["uid-b"] = _claim("uid-b", None, reserved=False)
    assert orphans.why_orphan(b, claims) is None

    share = _entry(device="pool0/s-1", claim="uid-m")
    share.share = ShareRecord(pool="pool0", share_id="s-1", memory_bytes=1 << 30, chunk_mib=1024)
    (held,) = held_of(share)
    assert (held.key, held.device, held.share_id) == ("pool0/s-1", "pool0", "s-1")
    same = _Claims({"uid-m": _with_result(_claim("uid-m", "pool0", reserved=True), shareID="s-1")})
    assert orphans.why_orphan(held, same) is None
    # the claim allocated the pool anew (another share): this share is no longer its
    anew = _Claims({"uid-m": _with_result(_claim("uid-m", "pool0", reserved=True), shareID="s-2")})
    assert orphans.why_orphan(held, anew) == "not-allocated"
