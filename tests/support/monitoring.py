"""The monitoring component (deploy/components/monitoring): its alert rules and dashboard, and the
metric names they use, for the tests that check them against promtool and a running stack."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "DASHBOARD",
    "MONITORING_DIR",
    "RULES",
    "dashboard",
    "exposed_names",
    "metric_names",
    "recorded_names",
    "rule_groups",
    "used_expressions",
]

MONITORING_DIR = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring"
RULES = MONITORING_DIR / "prometheusrule.yaml"
DASHBOARD = MONITORING_DIR / "fabric-dra-dashboard.json"

# PromQL functions, keywords and label names that look like metric names are never fabric-dra's:
# only names of the project's families and the process/build collectors are checked.
_METRIC = re.compile(r"\b((?:fabric_dra|process)_[a-z0-9_]+)\b")
# The recording rules' series (``level:metric:operation``, Prometheus' naming convention).
_RECORDED = re.compile(r"\b(fabric_dra:[a-z0-9_:]+)")


def rule_groups() -> dict[str, Any]:
    """The PrometheusRule's spec: a Prometheus rules file (``groups:``) as promtool reads it."""
    spec: dict[str, Any] = yaml.safe_load(RULES.read_text())["spec"]
    return spec


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def used_expressions() -> dict[str, str]:
    """Where → PromQL, for every alert, recording rule and dashboard panel target (an alert or a
    recording rule defined twice, for two label sets, is listed as such)."""
    found: dict[str, str] = {}
    for group in rule_groups()["groups"]:
        for rule in group["rules"]:
            where = f"alert {rule['alert']}" if "alert" in rule else f"record {rule['record']}"
            labels = sorted(rule.get("labels", {}).items())
            where += "".join(f" {k}={v}" for k, v in labels if k != "severity")
            found[where] = rule["expr"]
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            found[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    return found


def metric_names(expr: str) -> set[str]:
    return set(_METRIC.findall(expr))


def recorded_names(expr: str) -> set[str]:
    """The recording rules' series ``expr`` reads."""
    return set(_RECORDED.findall(expr))


def exposed_names(exposition: str) -> set[str]:
    """Every series name a scrape declares: families with their samples' names, and the names a
    histogram or counter has once observed (``_bucket``, ``_total``...) even before it is."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + suffix for suffix in ("_bucket", "_count", "_sum"))
    return names
