"""Several managers, one per Redfish service: their order, their credentials and who keeps a pool."""

from __future__ import annotations

from pathlib import Path

from manager_api.fleet import ManagerEndpoint, PoolCollision, PoolOwners, endpoints_of, managers_problem


def test_the_unnamed_manager_comes_first_and_named_ones_in_the_order_given() -> None:
    shared, own = Path("/run/token"), Path("/run/cxl-token")
    endpoints = endpoints_of(
        "http://one",
        {"pcie": "http://pcie", "cxl": "http://cxl"},
        token_file=shared,
        token_files={"cxl": own},
        ca_files={"pcie": Path("/ca/pcie.pem")},
    )
    assert [(e.name, e.label, e.url) for e in endpoints] == [
        ("", "default", "http://one"),
        ("pcie", "pcie", "http://pcie"),
        ("cxl", "cxl", "http://cxl"),
    ]
    assert [(e.token_file, e.ca_file) for e in endpoints] == [
        (shared, None),
        (shared, Path("/ca/pcie.pem")),
        (own, None),
    ]
    assert endpoints_of(None, {"a": "http://a"}) == [ManagerEndpoint("a", "http://a")]


def test_a_pool_two_managers_report_stays_with_the_one_listed_first() -> None:
    owners = PoolOwners(["pcie", "cxl"])
    assert owners.update("cxl", ["fabric-cxl", "appliance-cxl"]) == []
    assert owners.owner("fabric-cxl") == "cxl"  # nobody else reports it yet
    # the manager listed first reports it too: it keeps it, the later one's is refused
    assert owners.update("pcie", ["fabric-pcie", "fabric-cxl"]) == [
        PoolCollision("fabric-cxl", "pcie", "cxl")
    ]
    assert owners.owner("fabric-cxl") == "pcie"
    assert owners.refused("cxl") == {"fabric-cxl"}
    assert owners.owned("cxl") == {"appliance-cxl"}
    assert owners.owned("pcie") == {"fabric-pcie", "fabric-cxl"}
    assert owners.update("cxl", ["fabric-cxl", "appliance-cxl"]) == []  # reported again: nothing new
    # renamed (--fabric-name): the collision ends
    owners.update("cxl", ["appliance-cxl", "appliance-mem"])
    assert owners.collisions() == [] and owners.refused("cxl") == frozenset()
    assert owners.owner("nowhere") is None


def test_managers_are_checked_in_one_line() -> None:
    assert managers_problem("http://m", {}) is None
    assert managers_problem(None, {"pcie": "https://p", "cxl": "http://c"}) is None
    assert "--manager-url URL" in (managers_problem(None, {}) or "")
    assert "DNS label" in (managers_problem(None, {"PCIe": "http://p"}) or "")
    assert "DNS label" in (managers_problem(None, {"x" * 31: "http://p"}) or "")
    assert "http://" in (managers_problem(None, {"pcie": "p:8080"}) or "")
    assert "'default'" in (managers_problem("http://m", {"default": "http://n"}) or "")
