"""deploy/components/monitoring's ServiceMonitor (monitoring.coreos.com/v1): well formed by the
ServiceMonitor API's fields, and scraping what the rendered deployment serves — every port of every
metrics Service, with the scheme that port declares (http in the base, https for the production
manager, verified with the manager's CA and certificate name), presenting to the manager the token
the manager reads."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support.deploy import COMPONENTS_DIR, find, kustomize_command, render_composition, render_target

SERVICE_MONITOR = COMPONENTS_DIR / "monitoring" / "servicemonitor.yaml"

#: The fields of the ServiceMonitor v1 API (prometheus-operator, monitoring.coreos.com/v1
#: ServiceMonitorSpec, Endpoint, SafeTLSConfig) that the component may use; an unknown or misspelt
#: one would be dropped by the API server's structural schema without a word.
SPEC_FIELDS = {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
ENDPOINT_FIELDS = {
    "port",
    "targetPort",
    "path",
    "scheme",
    "interval",
    "scrapeTimeout",
    "tlsConfig",
    "honorLabels",
    "relabelings",
    "metricRelabelings",
    "followRedirects",
    "enableHttp2",
    "authorization",
}
TLS_FIELDS = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify"}


def _monitor() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(SERVICE_MONITOR.read_text())
    return loaded


def test_the_service_monitor_is_well_formed() -> None:
    monitor = _monitor()
    assert (monitor["apiVersion"], monitor["kind"]) == ("monitoring.coreos.com/v1", "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == "fabric-dra"
    spec = monitor["spec"]
    assert set(spec) <= SPEC_FIELDS, set(spec) - SPEC_FIELDS
    assert spec["namespaceSelector"] == {"matchNames": ["fabric-dra"]}
    ports = [e["port"] for e in spec["endpoints"]]
    assert len(ports) == len(set(ports)), "one endpoint per port name"
    for endpoint in spec["endpoints"]:
        assert set(endpoint) <= ENDPOINT_FIELDS, set(endpoint) - ENDPOINT_FIELDS
        assert endpoint["scheme"] in ("http", "https")
        assert endpoint["path"] == "/metrics"
        assert endpoint["interval"].endswith("s") and int(endpoint["interval"][:-1]) > 0
        tls = endpoint.get("tlsConfig")
        assert (tls is not None) == (endpoint["scheme"] == "https"), endpoint
        authorization = endpoint.get("authorization")
        if authorization is not None:  # SafeAuthorization: a Secret key, never a literal token
            assert set(authorization) == {"type", "credentials"} and authorization["type"] == "Bearer"
            assert set(authorization["credentials"]) == {"name", "key"}
        if tls is not None:
            assert set(tls) <= TLS_FIELDS
            assert set(tls["ca"]) == {"configMap"} and set(tls["ca"]["configMap"]) == {"name", "key"}


def _metrics_services(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    selector = _monitor()["spec"]["selector"]["matchLabels"]
    return [
        s
        for s in find(objects, "Service")
        if selector.items() <= s["metadata"].get("labels", {}).items()
        and s["metadata"]["namespace"] == "fabric-dra"
    ]


@pytest.mark.parametrize("target", ["kind", "production-complete"])
def test_it_scrapes_every_metrics_port_with_its_scheme(target: str) -> None:
    """Every port of the Services it selects has an endpoint of that name and the scheme the port
    says it serves (appProtocol, which tests/unit/deploy ties to what the pods serve)."""
    if kustomize_command() is None:
        pytest.skip("kubectl (or kustomize) is not installed: cannot render deploy/")
    objects = render_target(target)
    services = _metrics_services(objects)
    assert {s["metadata"]["name"] for s in services} == {"fabric-dra-metrics", "fabric-dra-manager-metrics"}
    endpoints = {e["port"]: e for e in _monitor()["spec"]["endpoints"]}
    for service in services:
        for port in service["spec"]["ports"]:
            endpoint = endpoints.get(port["name"])
            assert endpoint is not None, f"{service['metadata']['name']} port {port['name']} is not scraped"
            assert endpoint["scheme"] == port["appProtocol"], (service["metadata"]["name"], port)


def test_in_production_it_verifies_the_manager_as_its_clients_do() -> None:
    """The https endpoint trusts the CA and the name the controller and the plugins use for the
    manager in the production overlay."""
    if kustomize_command() is None:
        pytest.skip("kubectl (or kustomize) is not installed: cannot render deploy/")
    objects = render_composition("production-complete")
    (monitor,) = find(objects, "ServiceMonitor")
    assert monitor["spec"] == _monitor()["spec"]
    tls = next(e for e in monitor["spec"]["endpoints"] if e["scheme"] == "https")["tlsConfig"]
    urls = {
        arg.split("=", 1)[1]
        for workload in find(objects, "Deployment") + find(objects, "DaemonSet")
        for container in workload["spec"]["template"]["spec"]["containers"]
        for arg in container.get("args", [])
        if arg.startswith("--manager-url=")
    }
    assert urls and {urlsplit(u).hostname for u in urls} == {tls["serverName"]}
    ca_volumes = {
        (v["configMap"]["name"], item["key"])
        for workload in find(objects, "Deployment") + find(objects, "DaemonSet")
        for v in workload["spec"]["template"]["spec"].get("volumes", [])
        if "configMap" in v
        for item in v["configMap"].get("items", [{"key": "ca.crt"}])
        if v["configMap"]["name"] == tls["ca"]["configMap"]["name"]
    }
    assert (tls["ca"]["configMap"]["name"], tls["ca"]["configMap"]["key"]) in ca_volumes


def test_it_presents_to_the_manager_the_token_the_manager_reads() -> None:
    """Every endpoint of a port the manager serves /metrics on presents a bearer token from a Secret,
    and the manager reads that very Secret key as --metrics-token-file: the scrape is authorised."""
    if kustomize_command() is None:
        pytest.skip("kubectl (or kustomize) is not installed: cannot render deploy/")
    objects = render_composition("production-complete")
    (monitor,) = find(objects, "ServiceMonitor")
    (service,) = find(objects, "Service", "fabric-dra-manager-metrics")
    endpoints = {e["port"]: e for e in monitor["spec"]["endpoints"]}
    credentials = {
        (c["name"], c["key"])
        for port in service["spec"]["ports"]
        for c in [endpoints[port["name"]]["authorization"]["credentials"]]
    }
    assert len(credentials) == 1, credentials
    ((secret, key),) = credentials
    (manager,) = find(objects, "Deployment", "fabric-dra-manager")
    pod = manager["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (token_file,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith("--metrics-token-file=")]
    directory, _, name = token_file.rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == directory]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert (volume["secret"]["secretName"], name) == (secret, key)
    # Without the Secret the manager still starts (operators scrape); the scrape waits for it.
    assert volume["secret"]["optional"] is True
