"""What explains a binding to the orphan reconciler, and its defaults. The timeline with real
processes is tests/integration/reliability/test_orphans.py."""

from __future__ import annotations

from typing import Any

from fabric.bindings.orphans import OrphanReconciler, _Claims
from fabric.redfish.client import RedfishSettings
from fabric.service.config import ManagerSettings
from fabric.state.ledger import LedgerEntry, LedgerState
from fabric.state.reports import PluginReports
from fabric_dra.cli import build_parser


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


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
    entry = _entry()
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
    assert orphans.why_orphan(_entry(), unreserved) is None
    assert orphans.why_orphan(_entry(device="gpu1"), unreserved) == "not-allocated"  # not in the report
    assert orphans.why_orphan(_entry(node="node-b"), unreserved) == "not-allocated"  # another node's
    clock.now += 91
    assert orphans.why_orphan(_entry(), unreserved) == "not-allocated"  # the report is too old


def test_a_report_does_not_keep_a_claim_that_does_not_exist() -> None:
    # A plugin reporting made-up (or deleted) claims as prepared must not hold devices with them.
    reports = PluginReports(ttl=90)
    orphans = _reconciler(reports)
    reports.record("node-a", {"uid-1": ["gpu0"]})
    assert orphans.why_orphan(_entry(), _Claims({})) == "claim-deleted"


def test_defaults_grace_of_ten_minutes() -> None:
    settings = ManagerSettings(redfish=RedfishSettings(base_url="http://127.0.0.1:1"), state_dir=".")
    assert settings.orphan_grace_seconds == 600
    args = build_parser().parse_args(["manager", "serve", "--redfish-url", "http://127.0.0.1:1"])
    assert args.orphan_grace_seconds == 600
    assert args.plugin_report_ttl_seconds == 90
