"""deploy/components/monitoring: the alert rules pass ``promtool check rules`` and fire as their unit
tests say (``promtool test rules``), the dashboard is well formed, the component renders on the base,
and every role's registry carries the process and build-info metrics."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest

from tests.support.deploy import COMPOSITIONS, kustomize_command, render_composition
from tests.support.monitoring import (
    DASHBOARD,
    dashboard,
    exposed_names,
    metric_names,
    recorded_names,
    rule_groups,
    used_expressions,
)
from tests.support.tools import find_tool, needs_tool

pytestmark = pytest.mark.slow(seconds=22)

PROMTOOL, NO_PROMTOOL = find_tool(["promtool"], "promtool", "prometheus")
REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).parent
OPERATIONS = REPO / "docs" / "operations.md"


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
    rules = sum(len(group["rules"]) for group in rule_groups()["groups"])
    assert f"SUCCESS: {rules} rules found" in done.stdout + done.stderr


#: Every ``*_test.yaml`` beside this module is a promtool test file of the same rules.
ALERT_TESTS = sorted(HERE.glob("*_test.yaml"))


@needs_tool(PROMTOOL, NO_PROMTOOL)
@pytest.mark.parametrize("test_file", ALERT_TESTS, ids=lambda path: path.name)
def test_each_alert_fires_on_its_situation(rules_file: Path, test_file: Path) -> None:
    """One promtool run per test file: the week-long spend replay alone is ~20 s of CPU, and as
    separate tests the files run on separate workers instead of one after another."""
    assert PROMTOOL is not None
    # The unit tests are about when each alert fires and with which labels; its texts are checked by
    # ``promtool check rules`` above (their templates), so they are left out rather than copied here.
    _write_without_annotations(rules_file, rule_groups())
    test = Path(shutil.copy(test_file, rules_file.parent))
    done = subprocess.run([PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_promtool_test() -> None:
    tested = {
        t["alertname"]
        for path in ALERT_TESTS
        for case in yaml.safe_load(path.read_text())["tests"]
        for t in case.get("alert_rule_test", [])
    }
    assert tested == {r["alert"] for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r}


def _write_without_annotations(path: Path, groups: dict[str, Any]) -> None:
    for group in groups["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    path.write_text(yaml.safe_dump(groups))


#: a day and an hour with client=acme on 1 device, then 10: an anomaly for k = 3, none for k = 20
_FACTOR_CASE = """
rule_files: [rules.yaml]
evaluation_interval: 5m
tests:
  - interval: 1m
    input_series:
      - series: fabric_dra_attributed_seconds_total{key="client",value="acme",model="H100",state="bound"}
        values: 0+60x1500 90600+600x60
    alert_rule_test:
      - eval_time: 1560m
        alertname: FabricDraSpendAnomaly
        exp_alerts: %s
"""


@needs_tool(PROMTOOL, NO_PROMTOOL)
@pytest.mark.parametrize("factor", [3, 20])
def test_the_anomaly_factor_is_set_in_one_place(rules_file: Path, factor: int) -> None:
    """k lives in the recording rule ``fabric_dra:spend_anomaly_factor`` alone: changing it there
    changes what the alert judges an anomaly."""
    assert PROMTOOL is not None
    groups = rule_groups()
    rules = [rule for group in groups["groups"] for rule in group["rules"]]
    knobs = [rule for rule in rules if rule.get("record") == "fabric_dra:spend_anomaly_factor"]
    assert [rule["expr"] for rule in knobs] == ["vector(3)"]
    knobs[0]["expr"] = f"vector({factor})"
    _write_without_annotations(rules_file, groups)
    acme = "[{exp_labels: {severity: warning, scope: label, key: client, value: acme}}]"
    tests = rules_file.with_name("factor_test.yaml")
    tests.write_text(_FACTOR_CASE % (acme if factor == 3 else "[]"))
    done = subprocess.run([PROMTOOL, "test", "rules", str(tests)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_issue_s_alerts_and_panels_are_there() -> None:
    alerts = {r["alert"] for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r}
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
        "FabricDraSpendAnomaly",
        "FabricDraBudgetNearLimit",
        "FabricDraBudgetExhausted",
        "FabricDraDevicesStranded",
        "FabricDraOrphanedAgentTrees",
    }
    alerting = [r for g in rule_groups()["groups"] for r in g["rules"] if "alert" in r]
    for rule in alerting:
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert f'"{rule["alert"]}"' in rule["annotations"]["description"]  # names its runbook section
        assert f"#### {rule['alert']}\n" in OPERATIONS.read_text()  # ... which exists
    recorded = {r["record"] for g in rule_groups()["groups"] for r in g["rules"] if "record" in r}
    for where, expr in used_expressions().items():
        assert recorded_names(expr) <= recorded, where
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
        "fabric_dra_attributed_seconds_total",
        "fabric_dra_budget_used",
        "fabric_dra_budget_limit",
        "fabric_dra_budget_refusals_total",
        "fabric_dra_stranded_devices",
        "fabric_dra_orphaned_tree_claims",
        "fabric_dra_orphaned_tree_claims_released_total",
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
