"""Every metric the dashboard and the alerts of deploy/components/monitoring use is in a scrape of a
running manager (after one attach and one detach), and the manager's /metrics carries process and
build-info metrics with ``outcome`` labels in words."""

from __future__ import annotations

import re

import httpx

from fabric_dra.stack import Stack
from tests.support.monitoring import exposed_names, metric_names, used_expressions
from tests.support.uids import claim_uid

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"


def test_dashboard_and_alert_metrics_exist_in_a_scrape() -> None:
    with Stack.temporary("fdra-mon-") as stack:
        manager = stack.manager(
            stack.emulator(auth=False), static_tokens={CONTROLLER_TOKEN: ("controller", None)}
        )
        auth = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
        with httpx.Client(base_url=manager.url, headers=auth, timeout=60) as http:
            inventory = http.get("/api/v1/inventory").json()
            node = inventory["nodes"][0]["name"]
            device = next(d["name"] for d in inventory["devices"] if d["type"] == "gpu")
            http.post(
                "/api/v1/attachments",
                params={"waitSeconds": 30},
                json={"device": device, "node": node, "claimUid": claim_uid("claim-metrics")},
            ).raise_for_status()
            bound = http.get("/metrics").text
            http.delete(
                f"/api/v1/attachments/{device}",
                params={"claimUid": claim_uid("claim-metrics"), "node": node, "waitSeconds": 30},
            ).raise_for_status()
            scrape = http.get("/metrics").text

    exposed = exposed_names(scrape)
    missing = {
        where: sorted(metric_names(expr) - exposed)
        for where, expr in used_expressions().items()
        if metric_names(expr) - exposed
    }
    assert missing == {}
    assert f'fabric_dra_node_devices{{node="{node}",pool="fabric-pcie"}} 1.0' in bound
    assert "fabric_dra_fabric_reachable 1.0" in scrape
    assert re.search(r'fabric_dra_build_info\{python="[^"]+",role="manager",version="[^"]+"\} 1.0', scrape)
    assert "process_resident_memory_bytes" in exposed and "process_cpu_seconds_total" in exposed
    outcomes = set(re.findall(r'outcome="([^"]*)"', scrape))
    assert outcomes and not any(o.isdigit() for o in outcomes), outcomes
