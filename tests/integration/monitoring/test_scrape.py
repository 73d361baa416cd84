"""Every metric the dashboard and the alerts of deploy/components/monitoring use is in a scrape of a
running manager (after one attach and one detach), and the manager's /metrics carries process and
build-info metrics with ``outcome`` labels in words. A real Prometheus, configured from the
component's ServiceMonitor, scrapes the manager with the token the ServiceMonitor presents, and
without it gets nothing."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client import generate_latest

from dra_driver.controller.metrics import REGISTRY as CONTROLLER_REGISTRY
from dra_driver.plugin import claimstatus, linkhealth  # noqa: F401  (register their series)
from dra_driver.plugin.metrics import REGISTRY as PLUGIN_REGISTRY
from fabric_dra_testbed.stack import Stack, free_port
from tests.support.deploy import COMPONENTS_DIR
from tests.support.monitoring import exposed_names, metric_names, used_expressions
from tests.support.tools import find_tool, needs_tool
from tests.support.uids import claim_uid
from tests.support.waiting import wait_until

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
#: what Secret fabric-dra-metrics-token holds (key ``token``)
METRICS_TOKEN = "metrics-token-0123456789abcdef0"
PROMETHEUS, NO_PROMETHEUS = find_tool(["prometheus"], "Prometheus", "prometheus")


def test_dashboard_and_alert_metrics_exist_in_a_scrape() -> None:
    with Stack.temporary("fdra-mon-") as stack:
        token_file = stack.root / "metrics-token"
        token_file.write_text(METRICS_TOKEN)
        manager = stack.manager(
            stack.emulator(auth=False),
            static_tokens={CONTROLLER_TOKEN: ("controller", None)},
            args=["--metrics-token-file", str(token_file)],
        )
        auth = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
        scraper = {"Authorization": f"Bearer {METRICS_TOKEN}"}
        with httpx.Client(base_url=manager.url, headers=auth, timeout=60) as http:
            inventory = http.get("/api/v1/inventory").json()
            node = inventory["nodes"][0]["name"]
            device = next(d["name"] for d in inventory["devices"] if d["type"] == "gpu")
            http.post(
                "/api/v1/attachments",
                params={"waitSeconds": 30},
                json={"device": device, "node": node, "claimUid": claim_uid("claim-metrics")},
            ).raise_for_status()
            bound = http.get("/metrics", headers=scraper).text
            http.delete(
                f"/api/v1/attachments/{device}",
                params={"claimUid": claim_uid("claim-metrics"), "node": node, "waitSeconds": 30},
            ).raise_for_status()
            scrape = http.get("/metrics", headers=scraper).text

    # The plugins' series (claim status) come from each node's plugin, the controller's (link
    # taints) from the controller: their registries, as their /metrics serve them.
    exposed = (
        exposed_names(scrape)
        | exposed_names(generate_latest(PLUGIN_REGISTRY).decode())
        | exposed_names(generate_latest(CONTROLLER_REGISTRY).decode())
    )
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


def _manager_endpoint() -> dict[str, Any]:
    """The ServiceMonitor's endpoint of the base manager's metrics port (``http``)."""
    monitor = yaml.safe_load((COMPONENTS_DIR / "monitoring" / "servicemonitor.yaml").read_text())
    endpoint: dict[str, Any] = next(e for e in monitor["spec"]["endpoints"] if e["port"] == "http")
    return endpoint


def _scrape_config(endpoint: dict[str, Any], target: str, secrets: Path) -> dict[str, Any]:
    """A Prometheus scrape job for ``endpoint`` as the Prometheus Operator renders one (its
    pkg/prometheus/promcfg.go: path, scheme, interval; ``authorization`` with the credentials read
    from the Secret key), here from a file holding that key, against one static target."""
    job: dict[str, Any] = {
        "job_name": "fabric-dra-manager-metrics",
        "metrics_path": endpoint["path"],
        "scheme": endpoint["scheme"],
        "scrape_interval": "1s",
        "static_configs": [{"targets": [target]}],
    }
    authorization = endpoint["authorization"]
    credentials = authorization["credentials"]
    job["authorization"] = {
        "type": authorization["type"],
        "credentials_file": str(secrets / credentials["name"] / credentials["key"]),
    }
    return job


@contextlib.contextmanager
def _prometheus(config: dict[str, Any], root: Path) -> Iterator[str]:
    """A real Prometheus with ``config`` on a free loopback port; its URL. Stopped by its PID."""
    assert PROMETHEUS is not None
    config_file = root / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    log = (root / "prometheus.log").open("wb")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config_file}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address={address}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://{address}"
        wait_until(lambda: httpx.get(f"{url}/-/ready", timeout=5).status_code == 200, what="Prometheus ready")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _query(url: str, expression: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/api/v1/query", params={"query": expression}, timeout=10).json()
    assert answer["status"] == "success", answer
    result: list[dict[str, Any]] = answer["data"]["result"]
    return result


@needs_tool(PROMETHEUS, NO_PROMETHEUS)
def test_prometheus_scrapes_the_manager_with_the_service_monitors_token(tmp_path: Path) -> None:
    endpoint = _manager_endpoint()
    secret = endpoint["authorization"]["credentials"]
    secrets = tmp_path / "secrets"
    (secrets / secret["name"]).mkdir(parents=True)
    (secrets / secret["name"] / secret["key"]).write_text(METRICS_TOKEN)
    with Stack.temporary("fdra-prom-") as stack:
        manager = stack.manager(
            stack.emulator(auth=False),
            static_tokens={CONTROLLER_TOKEN: ("controller", None)},
            # The manager mounts the same Secret key (manager-metrics-token-patch.yaml).
            args=["--metrics-token-file", str(secrets / secret["name"] / secret["key"])],
        )
        target = manager.url.removeprefix("http://").rstrip("/")
        with_token = _scrape_config(endpoint, target, secrets)
        without = {key: value for key, value in with_token.items() if key != "authorization"}
        without["job_name"] = "without-the-token"
        config = {"global": {"scrape_interval": "1s"}, "scrape_configs": [with_token, without]}
        with _prometheus(config, tmp_path) as url:

            def up() -> dict[str, float] | None:
                found = {r["metric"]["job"]: float(r["value"][1]) for r in _query(url, "up")}
                return found if len(found) == 2 else None

            started = time.monotonic()
            scraped = wait_until(up, timeout=30, what="both jobs scraped once")
            series = wait_until(
                lambda: _query(url, 'fabric_dra_inventory_version{job="fabric-dra-manager-metrics"}'),
                timeout=30,
                what="the manager's series in Prometheus",
            )
    print(f"Prometheus scraped the manager {time.monotonic() - started:.1f} s after it was ready")
    assert scraped == {"fabric-dra-manager-metrics": 1.0, "without-the-token": 0.0}, scraped
    assert float(series[0]["value"][1]) > 0
