"""What a production cluster needs beyond a valid render: an image the manifests can pull (the one
`make image` tags, pointed at your registry), probes that mean what a rollout needs, the plugin
scheduled where accelerators are, the critical pods admitted, metrics scraped with the right
scheme, and the plugin's SELinux type on enforcing hosts."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import (
    COMPOSITIONS,
    DEPLOY_DIR,
    OVERLAYS_DIR,
    REPO_ROOT,
    Container,
    containers,
    find,
    make_image_refs,
    overlay_params,
    pod_templates,
    render,
    run_make,
)

Obj = dict[str, Any]


@pytest.fixture(params=overlay_params())
def objects(request: pytest.FixtureRequest, rendered_overlays: dict[str, list[Obj]]) -> list[Obj]:
    return rendered_overlays[request.param]


def _flag(args: list[str], name: str) -> str | None:
    for arg in args:
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
    return None


def _container(objects: list[Obj], workload: str) -> Container:
    (found,) = [c for c in containers(objects) if c.workload_name == workload and c.is_fabric_dra]
    return found


def _components(name: str) -> tuple[str, ...]:
    return COMPOSITIONS[name][1] if name in COMPOSITIONS else ()


# --- the image -------------------------------------------------------------------------------


def test_make_image_tags_the_image_the_manifests_name(rendered_overlays: dict[str, list[Obj]]) -> None:
    """deploy/base and the production overlay name <registry>/fabric-dra:<version>: one of the
    references `make image` tags with its defaults."""
    refs = make_image_refs()
    assert len(refs) == 2
    version = re.search(r'^version = "(.+)"$', (REPO_ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version
    assert refs[0] == f"ghcr.io/fabric-dra/fabric-dra:{version.group(1)}"
    assert re.fullmatch(
        rf"ghcr\.io/fabric-dra/fabric-dra:{re.escape(version.group(1))}-g(\w+)(-dirty)?", refs[1]
    )
    for name in ("production", "production-complete"):
        images = {c.spec["image"] for c in containers(rendered_overlays[name]) if c.is_fabric_dra}
        assert images == {refs[0]}, name
    base = {c.spec["image"] for c in containers(render(DEPLOY_DIR / "base")) if c.is_fabric_dra}
    assert base == {refs[0]}


def test_make_image_builds_exactly_the_tags_it_prints() -> None:
    """`make -n image` (what it would run) tags the build with `make print-image`'s references, for
    the defaults and for a registry of your own."""
    for variables in ([], ["REGISTRY=registry.example.com/team"], ["REGISTRY=", "IMAGE_TAG=kind"]):
        dry = run_make("-n", "image", *variables).stdout
        (build,) = [line for line in dry.replace("\\\n", " ").splitlines() if "docker build" in line]
        assert re.findall(r"--tag (\S+)", build) == make_image_refs(*variables)
        assert build.rstrip().endswith(" ."), "the build context is the repository"
        assert "--build-arg VERSION=" in build and "--build-arg REVISION=" in build
    assert make_image_refs("REGISTRY=registry.example.com/team")[0].startswith(
        "registry.example.com/team/fabric-dra:"
    )


def test_make_push_names_a_registry_and_pushes_both_tags() -> None:
    dry = run_make("-n", "push", "REGISTRY=registry.example.com/team").stdout
    pushed = re.findall(r"docker push (\S+)", dry)
    assert pushed == make_image_refs("REGISTRY=registry.example.com/team")
    # Without a registry of your own, push stops before anything is built or pushed (DOCKER=false
    # would fail any docker command it reached).
    refused = run_make("push", "DOCKER=false", "ALLOW_DIRTY=1", check=False)
    assert refused.returncode != 0
    assert "make push: name your registry, e.g. make push REGISTRY=" in refused.stderr
    assert "docker" not in refused.stdout + refused.stderr.replace("make push", "")


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (
            {"newName": "registry.example.com/team/fabric-dra", "newTag": "0.1.0-g0123456789ab"},
            "registry.example.com/team/fabric-dra:0.1.0-g0123456789ab",
        ),
        (
            {"newName": "registry.example.com/team/fabric-dra", "digest": "sha256:" + "0f" * 32},
            "registry.example.com/team/fabric-dra@sha256:" + "0f" * 32,
        ),
    ],
    ids=["tag", "digest"],
)
def test_set_image_points_every_container_at_your_registry(
    tmp_path: Path, kustomize: list[str], entry: dict[str, str], expected: str
) -> None:
    """What `kustomize edit set image ghcr.io/fabric-dra/fabric-dra=<yours>` writes into the
    production overlay's images: entry moves every fabric-dra container, and nothing else."""
    copy = tmp_path / "deploy"
    shutil.copytree(DEPLOY_DIR, copy)
    path = copy / "overlays" / "production" / "kustomization.yaml"
    kustomization = yaml.safe_load(path.read_text())
    (image,) = kustomization["images"]
    assert image["name"] == "ghcr.io/fabric-dra/fabric-dra"
    kustomization["images"] = [{"name": image["name"], **entry}]
    path.write_text(yaml.safe_dump(kustomization))
    rendered = yaml.safe_load_all(
        subprocess.run(
            [*kustomize, str(copy / "overlays" / "production")],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        ).stdout
    )
    images = {c.spec["image"] for c in containers([o for o in rendered if o])}
    assert images == {expected}


# --- probes ----------------------------------------------------------------------------------


def _http_probe(spec: Obj, kind: str) -> tuple[str, str | int, str]:
    probe = spec[kind]["httpGet"]
    return probe["path"], probe["port"], probe.get("scheme", "HTTP")


def test_the_plugin_is_probed_for_registration_and_grpc(objects: list[Obj]) -> None:
    plugin = _container(objects, "fabric-dra-plugin")
    assert _http_probe(plugin.spec, "readinessProbe")[:2] == ("/readyz", "metrics")
    assert _http_probe(plugin.spec, "livenessProbe")[:2] == ("/healthz", "metrics")
    assert _http_probe(plugin.spec, "startupProbe")[:2] == ("/healthz", "metrics")
    # The probes reach the port the plugin serves them on, on the pod's address.
    (port,) = [p for p in plugin.spec["ports"] if p["name"] == "metrics"]
    assert _flag(plugin.args, "--metrics-port") == str(port["containerPort"])
    assert _flag(plugin.args, "--metrics-host") == "0.0.0.0"
    startup = plugin.spec["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "time to load the checkpoint"


def test_every_long_running_container_has_readiness_and_liveness(objects: list[Obj]) -> None:
    for c in containers(objects):
        assert "readinessProbe" in c.spec, c.id
        assert "livenessProbe" in c.spec, c.id


# --- scheduling ------------------------------------------------------------------------------


def test_the_scheduling_component_places_only_the_plugin(
    rendered_overlays: dict[str, list[Obj]],
) -> None:
    for name, objects in rendered_overlays.items():
        with_component = "plugin-scheduling" in _components(name)
        for workload, pod in pod_templates(objects):
            is_plugin = workload["metadata"]["name"] == "fabric-dra-plugin"
            if with_component and is_plugin:
                assert pod["nodeSelector"] == {"fabric-dra.io/fabric-node": "true"}
                keys = {(t["key"], t["operator"], t.get("effect")) for t in pod["tolerations"]}
                assert ("nvidia.com/gpu", "Exists", "NoSchedule") in keys
                assert ("fabric-dra.io/fabric-node", "Exists", "NoSchedule") in keys
            else:
                assert "tolerations" not in pod and "nodeSelector" not in pod, (
                    name,
                    workload["metadata"]["name"],
                )


def _selects(selector: str, labels: dict[str, str]) -> bool:
    """A label selector of equality terms ("a=b,c=d"), as the controller's flag takes it."""
    terms = [t.split("=", 1) for t in selector.split(",")]
    return all(labels.get(k) == v for k, v in terms)


def test_the_controller_labels_only_nodes_with_a_ready_plugin(objects: list[Obj]) -> None:
    """The controller watches exactly the plugin DaemonSet's pods, in its namespace, with rights
    to do so there and nowhere else."""
    controller = _container(objects, "fabric-dra-controller")
    (ds,) = find(objects, "DaemonSet", "fabric-dra-plugin")
    selector = _flag(controller.args, "--plugin-pod-selector")
    assert selector
    namespace = _flag(controller.args, "--plugin-namespace")
    if namespace == "downward-metadata-namespace":  # $(POD_NAMESPACE): the controller's own
        namespace = controller.namespace
    assert namespace == ds["metadata"]["namespace"]
    assert _selects(selector, ds["spec"]["template"]["metadata"]["labels"])
    for workload, _ in pod_templates(objects):
        if workload["metadata"]["name"] != "fabric-dra-plugin":
            labels = workload["spec"]["template"]["metadata"]["labels"]
            assert not _selects(selector, labels), workload["metadata"]["name"]
    pod_rules = [
        (role["kind"], role["metadata"].get("namespace"), role["metadata"]["name"], rule)
        for role in find(objects, "Role") + find(objects, "ClusterRole")
        for rule in role["rules"]
        if "pods" in rule.get("resources", [])
    ]
    # Besides the controller's watch of the plugin's pods, only the manager reads pods, one at a
    # time (get): for the owner-chain walk of DeviceBudgets (docs/budgets.md, "Trees") and the pods
    # an orphaned agent tree's claims are reserved for; it lists and watches none.
    assert pod_rules == [
        (
            "Role",
            ds["metadata"]["namespace"],
            "fabric-dra-controller",
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        ),
        (
            "ClusterRole",
            None,
            "fabric-dra-manager",
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        ),
    ]


# --- the critical priority classes' quota ----------------------------------------------------


def test_the_quota_admits_every_critical_pod(rendered_overlays: dict[str, list[Obj]]) -> None:
    for name, objects in rendered_overlays.items():
        quotas = find(objects, "ResourceQuota")
        if "critical-priority-quota" not in _components(name):
            assert quotas == [], name
            continue
        (quota,) = quotas
        (expression,) = quota["spec"]["scopeSelector"]["matchExpressions"]
        assert (expression["scopeName"], expression["operator"]) == ("PriorityClass", "In")
        classes = {pod.get("priorityClassName") for _, pod in pod_templates(objects)}
        assert classes == {"system-node-critical", "system-cluster-critical"}
        assert set(expression["values"]) == classes
        assert quota["metadata"]["namespace"] == "fabric-dra"
        # Every Deployment at full surge, and a plugin on each of several hundred nodes.
        central = sum(
            d["spec"]["replicas"] + int(d["spec"]["strategy"]["rollingUpdate"]["maxSurge"])
            for d in find(objects, "Deployment")
        )
        assert int(quota["spec"]["hard"]["pods"]) >= central + 1 + 500


# --- metrics ---------------------------------------------------------------------------------


def _serves_tls(c: Container, container_port: int) -> bool:
    """The manager serves its API, probes and /metrics on one port, over TLS with --tls-cert."""
    port = _flag(c.args, "--port")
    return _flag(c.args, "--tls-cert") is not None and port is not None and int(port) == container_port


def test_metrics_services_say_the_scheme_their_pods_serve(objects: list[Obj]) -> None:
    templates = [w["spec"]["template"] for w, _ in pod_templates(objects)]
    by_template = {id(t["spec"]): t for t in templates}
    services = [
        s
        for s in find(objects, "Service")
        if s["metadata"]["labels"].get("app.kubernetes.io/component") == "metrics"
    ]
    assert {s["metadata"]["name"] for s in services} == {"fabric-dra-metrics", "fabric-dra-manager-metrics"}
    for service in services:
        selector = service["spec"]["selector"]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["publishNotReadyAddresses"] is True
        schemes = set()
        for port in service["spec"]["ports"]:
            scheme = port["appProtocol"]
            schemes.add(scheme)
            served = []
            for c in containers(objects):
                template = by_template[id(c.pod_spec)]
                if not all(template["metadata"]["labels"].get(k) == v for k, v in selector.items()):
                    continue
                for p in c.spec.get("ports", []):
                    if p.get("name") == port["targetPort"]:
                        served.append("https" if _serves_tls(c, p["containerPort"]) else "http")
            assert served, (service["metadata"]["name"], port["name"])
            assert set(served) == {scheme}, (service["metadata"]["name"], port["name"], served)
            assert port["name"] == scheme or port["name"] == "metrics"
        assert {service["metadata"]["annotations"]["prometheus.io/scheme"]} == schemes


def test_production_scrapes_the_manager_over_https(rendered_overlays: dict[str, list[Obj]]) -> None:
    (service,) = find(rendered_overlays["production"], "Service", "fabric-dra-manager-metrics")
    assert [p["appProtocol"] for p in service["spec"]["ports"]] == ["https"]
    (service,) = find(rendered_overlays["kind"], "Service", "fabric-dra-manager-metrics")
    assert [p["appProtocol"] for p in service["spec"]["ports"]] == ["http"]


# --- SELinux ---------------------------------------------------------------------------------


def test_selinux_component_gives_only_the_plugin_spc_t(rendered_overlays: dict[str, list[Obj]]) -> None:
    for name, objects in rendered_overlays.items():
        with_component = "selinux" in _components(name)
        for c in containers(objects):
            security = {**c.pod_spec.get("securityContext", {}), **c.spec.get("securityContext", {})}
            options = security.get("seLinuxOptions")
            if with_component and c.workload_name == "fabric-dra-plugin":
                # The type only: no user, role or level of its own, nothing else relaxed.
                assert options == {"type": "spc_t"}, name
                assert security.get("privileged") is not True
                assert "ALL" in security["capabilities"]["drop"]
                assert security["seccompProfile"] == {"type": "RuntimeDefault"}
            else:
                assert options is None, (name, c.id)
        if with_component:
            # Pod Security "baseline" refuses spc_t; the namespace must enforce "privileged".
            (namespace,) = find(objects, "Namespace")
            assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_compositions_start_from_a_shipped_overlay() -> None:
    for overlay, components in COMPOSITIONS.values():
        assert (OVERLAYS_DIR / overlay / "kustomization.yaml").exists()
        assert components
