"""deploy/components/monitoring: the alert rules pass ``promtool check rules`` and fire as their unit
tests say (``promtool test rules``), the dashboard is well formed, the component renders on the base,
and every role's registry carries the process and build-info metrics."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from tests.support.deploy import COMPOSITIONS, kustomize_command, render_composition
from tests.support.monitoring import (
    DASHBOARD,
    dashboard,
    exposed_names,
    metric_names,
    rule_groups,
    used_expressions,
)
from tests.support.tools import find_tool, needs_tool

PROMTOOL, NO_PROMTOOL = find_tool(["promtool"], "promtool", "prometheus")
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule_groups()))
    return path


@needs_tool(PROMTOOL, NO_PROMTOOL)
def test_promtool_checks_the_rules(rules_file: Path) -> None:
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 10 rules found" in done.stdout + done.stderr


@needs_tool(PROMTOOL, NO_PROMTOOL)
def test_each_alert_fires_on_its_situation(rules_file: Path) -> None:
    assert PROMTOOL is not None
    # The unit tests are about when each alert fires and with which labels; its texts are checked by
    # ``promtool check rules`` above (their templates), so they are left out rather than copied here.
    groups = rule_groups()
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    rules_file.write_text(yaml.safe_dump(groups))
    tests = rules_file.parent / "alerts_test.yaml"
    shutil.copy(Path(__file__).with_name("alerts_test.yaml"), tests)
    done = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {
        t["alertname"] for case in yaml.safe_load(tests.read_text())["tests"] for t in case["alert_rule_test"]
    }
    assert tested == {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}


def test_the_issue_s_alerts_and_panels_are_there() -> None:
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"]}
    assert alerts == {
        "FabricDraFabricUnreachable",
        "FabricDraAttachFailureRatio",
        "FabricDraOrphansFound",
        "FabricDraDeviceUnhealthyWhileBound",
        "FabricDraManagerWithoutLeader",
        "FabricDraClaimDevicesNotReady",
        "FabricDraClaimStatusRefused",
        "FabricDraLinkDegraded",
        "FabricDraDrainedDevicesInUse",
        "FabricDraDrainEvictionStuck",
    }
    for group in rule_groups()["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in ("warning", "critical")
            assert f'"{rule["alert"]}"' in rule["annotations"]["description"]  # names its runbook section
    used = set().union(*(metric_names(expr) for expr in used_expressions().values()))
    for metric in (
        "fabric_dra_pool_devices",
        "fabric_dra_attach_duration_seconds_bucket",
        "fabric_dra_detach_duration_seconds_bucket",
        "fabric_dra_redfish_request_errors_total",
        "fabric_dra_orphan_bindings",
        "fabric_dra_operations_in_flight",
        "fabric_dra_node_devices",
        "fabric_dra_plugin_claim_devices_not_ready",
        "fabric_dra_plugin_claim_devices_ready",
        "fabric_dra_plugin_links_degraded",
        "fabric_dra_drained_devices",
    ):
        assert metric in used, metric


def test_the_dashboard_is_well_formed() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        assert panel["targets"] and all(t["expr"].strip() for t in panel["targets"]), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}"
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "job"}


def test_the_component_renders_with_the_production_overlay() -> None:
    if kustomize_command() is None:
        pytest.skip("kubectl (or kustomize) is not installed: cannot render the component")
    assert "monitoring" in COMPOSITIONS["production-complete"][1]
    objects = {(o["kind"], o["metadata"]["name"]): o for o in render_composition("production-complete")}
    rule = objects[("PrometheusRule", "fabric-dra")]
    assert rule["spec"] == rule_groups()
    board = objects[("ConfigMap", "fabric-dra-grafana-dashboard")]
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["data"]["fabric-dra-dashboard.json"] == DASHBOARD.read_text()


@pytest.mark.parametrize("role", ["plugin", "controller"])
def test_every_role_exposes_process_and_build_info(role: str) -> None:
    """The plugin's and the controller's /metrics serve these registries (the manager's is checked
    in a scrape of a running manager, tests/integration/monitoring)."""
    if role == "plugin":
        from dra_driver.plugin.metrics import REGISTRY
    else:
        from dra_driver.controller.metrics import REGISTRY
    exposition = generate_latest(REGISTRY).decode()
    names = exposed_names(exposition)
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "fabric_dra_build_info"} <= names
    assert f'role="{role}"' in exposition
