"""What the rendered overlays must hold together: references that resolve, the plugin's host
contract with the kubelet, high availability of the central roles, least privilege, and one driver
name everywhere."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.support.deploy import (
    DEPLOY_DIR,
    DRIVER_NAME,
    Container,
    containers,
    find,
    overlay_params,
    pod_templates,
)

Obj = dict[str, Any]

#: Kinds fabric-dra renders that live outside any namespace.
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "DeviceClass",
    "CustomResourceDefinition",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
}
NAMESPACE = "fabric-dra"


@pytest.fixture(params=overlay_params())
def objects(request: pytest.FixtureRequest, rendered_overlays: dict[str, list[Obj]]) -> list[Obj]:
    return rendered_overlays[request.param]


def _flag(args: list[str], name: str) -> str | None:
    """The value of --name=value or --name value in a command line."""
    for i, arg in enumerate(args):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(args):
            return args[i + 1]
    return None


def _container(objects: list[Obj], workload: str, name: str) -> Container:
    found = [c for c in containers(objects) if c.workload_name == workload and c.name == name]
    assert len(found) == 1, f"{workload}/{name}"
    return found[0]


def _labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# --- references resolve ------------------------------------------------------------------------


def test_namespaces(objects: list[Obj]) -> None:
    for obj in objects:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in CLUSTER_SCOPED:
            assert namespace is None, f"{obj['kind']} {obj['metadata']['name']} is cluster-scoped"
        else:
            assert namespace == NAMESPACE, f"{obj['kind']} {obj['metadata']['name']}"


def test_service_accounts_and_role_bindings_resolve(objects: list[Obj]) -> None:
    accounts = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in find(objects, "ServiceAccount")}
    for workload, pod in pod_templates(objects):
        where = workload["metadata"]
        assert (where["namespace"], pod["serviceAccountName"]) in accounts, where
    for binding in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding"):
        ref = binding["roleRef"]
        if ref["kind"] == "Role":
            assert find(objects, "Role", ref["name"]), binding["metadata"]["name"]
        else:
            assert find(objects, "ClusterRole", ref["name"]), binding["metadata"]["name"]
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount"
            assert (subject["namespace"], subject["name"]) in accounts, binding["metadata"]["name"]


def test_volumes_mounts_and_probe_ports_resolve(objects: list[Obj]) -> None:
    for workload, pod in pod_templates(objects):
        volumes = {v["name"] for v in pod.get("volumes", [])}
        mounted: set[str] = set()
        for c in pod["containers"]:
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, (workload["metadata"]["name"], mount)
                mounted.add(mount["name"])
            ports = {p["name"] for p in c.get("ports", []) if "name" in p}
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                handler = c.get(probe, {})
                port = (handler.get("httpGet") or handler.get("tcpSocket") or {}).get("port")
                if isinstance(port, str):
                    assert port in ports, (workload["metadata"]["name"], probe, port)
        assert volumes == mounted, f"{workload['metadata']['name']}: unused volumes {volumes - mounted}"


def test_services_select_pods_and_their_ports(objects: list[Obj]) -> None:
    templates = [(w, w["spec"]["template"]) for w, _ in pod_templates(objects)]
    for service in find(objects, "Service"):
        selected = [
            t
            for _, t in templates
            if _labels_match(service["spec"]["selector"], t["metadata"].get("labels", {}))
        ]
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            served = [
                t
                for t in selected
                for c in t["spec"]["containers"]
                for p in c.get("ports", [])
                if p.get("name") == target or p["containerPort"] == target
            ]
            assert served, (
                f"Service {service['metadata']['name']} port {port['name']}: no pod serves {target}"
            )


def test_urls_in_command_lines_name_rendered_services(objects: list[Obj]) -> None:
    services = {
        (s["metadata"]["name"], s["metadata"]["namespace"]): {p["port"] for p in s["spec"]["ports"]}
        for s in find(objects, "Service")
    }
    pattern = re.compile(r"https?://([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.cluster\.local)?(?::(\d+))?")
    for c in containers(objects):
        for arg in c.args:
            for match in pattern.finditer(arg):
                name, namespace, port = match.group(1), match.group(2), match.group(3)
                assert (name, namespace) in services, f"{c.id}: {arg} names no Service"
                if port:
                    assert int(port) in services[(name, namespace)], f"{c.id}: {arg}: no such port"


def test_paths_in_command_lines_are_mounted(objects: list[Obj]) -> None:
    """A file or directory a fabric-dra container is told about must come from a volume: the root
    filesystem is read-only and holds nothing of the host's."""
    for c in containers(objects):
        if not c.is_fabric_dra:
            continue
        for arg in c.args[1:]:
            value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
            if not value.startswith("/"):
                continue
            assert any(value == m or value.startswith(m.rstrip("/") + "/") for m in c.mount_paths()), (
                f"{c.id}: {arg} is not on a mounted volume {c.mount_paths()}"
            )


def test_one_fabric_dra_image_per_overlay(objects: list[Obj]) -> None:
    images = {c.spec["image"] for c in containers(objects) if c.is_fabric_dra}
    assert len(images) == 1, images


# --- the kubelet plugin's contract with the node ----------------------------------------------


def test_plugin_daemonset(objects: list[Obj]) -> None:
    (ds,) = find(objects, "DaemonSet", "fabric-dra-plugin")
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    plugin = _container(objects, "fabric-dra-plugin", "plugin")
    env = {v["name"]: v for v in plugin.spec["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in plugin.spec["volumeMounts"]}
    # The kubelet connects to the socket paths the plugin reports and containerd reads the CDI
    # specs it writes: these host directories must appear at their own paths in the container.
    for flag in ("--registry-dir", "--plugin-dir", "--cdi-root"):
        path = _flag(plugin.args, flag)
        assert path, flag
        assert path in mounts, f"{flag}={path} is not a mount"
        host = volumes[mounts[path]["name"]].get("hostPath", {}).get("path")
        assert host == path, f"{flag}: host {host} is mounted at {path}"
    assert _flag(plugin.args, "--registry-dir") == "/var/lib/kubelet/plugins_registry"
    assert _flag(plugin.args, "--plugin-dir") == f"/var/lib/kubelet/plugins/{DRIVER_NAME}"
    sysfs_root = _flag(plugin.args, "--sysfs-root")
    assert sysfs_root
    sysfs_mount = max(
        (m for m in mounts if sysfs_root.startswith(m.rstrip("/") + "/") or sysfs_root == m), key=len
    )
    assert "hostPath" in volumes[mounts[sysfs_mount]["name"]], "the sysfs root is not a host path"
    # Only on real hosts does the plugin write sysfs (driver unbind, remove, rescan) and read full
    # config spaces (CAP_SYS_ADMIN): deploy/components/real-hosts grants both, together.
    added = plugin.spec["securityContext"]["capabilities"].get("add", [])
    if _flag(plugin.args, "--host-mode") == "emulated":
        assert mounts[sysfs_mount].get("readOnly") is True, "an emulated host's tree is only read"
        assert added == []
    else:
        writable = mounts[sysfs_mount].get("readOnly") is not True
        assert (added == ["SYS_ADMIN"]) == writable, (added, writable)
    token_file = _flag(plugin.args, "--manager-token-file")
    assert token_file
    token_volume = volumes[mounts[token_file.rsplit("/", 1)[0]]["name"]]
    (source,) = token_volume["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == "fabric-dra-manager"
    assert source["serviceAccountToken"]["expirationSeconds"] <= 3600


def test_only_the_plugin_mounts_kubelet_or_cdi_paths(objects: list[Obj]) -> None:
    for workload, pod in pod_templates(objects):
        for volume in pod.get("volumes", []):
            path = volume.get("hostPath", {}).get("path", "")
            if path.startswith(("/var/lib/kubelet", "/var/run/cdi", "/sys")):
                assert workload["metadata"]["name"] == "fabric-dra-plugin", (
                    workload["metadata"]["name"],
                    path,
                )


# --- the central roles -------------------------------------------------------------------------


def _budgets(objects: list[Obj], deployment: Obj) -> list[Obj]:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return [
        p
        for p in find(objects, "PodDisruptionBudget")
        if _labels_match(p["spec"]["selector"]["matchLabels"], labels)
    ]


def test_controller_is_replicated_and_protected(objects: list[Obj]) -> None:
    (deployment,) = find(objects, "Deployment", "fabric-dra-controller")
    assert deployment["spec"]["replicas"] == 2
    # Standbys are Ready too, so a new pod can become available before an old one goes.
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    (budget,) = _budgets(objects, deployment)
    assert budget["spec"]["maxUnavailable"] == 1
    assert "--leader-elect" in _container(objects, "fabric-dra-controller", "controller").args


def test_manager_is_replicated_and_can_roll(objects: list[Obj]) -> None:
    """Only the manager's leader is Ready. A rollout that had to keep a Ready pod could never stop
    the old leader, and a disruption budget could never allow evicting it: both would hang."""
    (deployment,) = find(objects, "Deployment", "fabric-dra-manager")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    assert _budgets(objects, deployment) == []
    manager = _container(objects, "fabric-dra-manager", "manager")
    assert "--leader-elect" in manager.args
    assert manager.spec["readinessProbe"]["httpGet"]["path"] == "/readyz"
    (metrics,) = find(objects, "Service", "fabric-dra-manager-metrics")
    assert metrics["spec"]["publishNotReadyAddresses"] is True, "followers' metrics are scraped too"


def test_manager_trusts_the_accounts_that_call_it(objects: list[Obj]) -> None:
    manager = _container(objects, "fabric-dra-manager", "manager")
    for role, name in (("plugin", "fabric-dra-plugin"), ("controller", "fabric-dra-controller")):
        (obj,) = [w for w, _ in pod_templates(objects) if w["metadata"]["name"] == name]
        account = f"{obj['metadata']['namespace']}:{obj['spec']['template']['spec']['serviceAccountName']}"
        assert _flag(manager.args, f"--{role}-service-account") == account
    audience = _flag(manager.args, "--token-audience")
    for workload, pod in pod_templates(objects):
        for volume in pod.get("volumes", []):
            for source in volume.get("projected", {}).get("sources", []):
                if "serviceAccountToken" in source:
                    assert source["serviceAccountToken"]["audience"] == audience, workload["metadata"]["name"]


# --- least privilege ---------------------------------------------------------------------------


def _pod_security(pod: Obj, container: Obj) -> dict[str, Any]:
    merged = dict(pod.get("securityContext", {}))
    merged.update(container.get("securityContext", {}))
    return merged


def test_containers_drop_privileges(objects: list[Obj]) -> None:
    for workload, pod in pod_templates(objects):
        for c in pod["containers"]:
            security = _pod_security(pod, c)
            who = f"{workload['metadata']['name']}/{c['name']}"
            # CAP_SYS_ADMIN (the plugin on real hosts) implies escalation; the manifest says so.
            sys_admin = "SYS_ADMIN" in security.get("capabilities", {}).get("add", [])
            assert security.get("allowPrivilegeEscalation") is sys_admin, who
            assert security.get("readOnlyRootFilesystem") is True, who
            assert "ALL" in security.get("capabilities", {}).get("drop", []), who
            assert security.get("seccompProfile", {}).get("type") == "RuntimeDefault", who
            assert security.get("privileged") is not True, who
            if workload["metadata"]["name"] != "fabric-dra-plugin":
                assert security.get("runAsNonRoot") is True, who
                assert security.get("runAsUser", 0) != 0, who
                assert not security.get("capabilities", {}).get("add"), who


def _rules(objects: list[Obj], account: str) -> Iterator[tuple[str, Obj]]:
    """(binding kind, rule) for every rule bound to ServiceAccount `account` of fabric-dra."""
    for binding in find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding"):
        if not any(s["name"] == account for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        (role,) = find(objects, ref["kind"], ref["name"])
        for rule in role["rules"]:
            yield binding["kind"], rule


def _grants(objects: list[Obj], account: str, group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", []) and resource in rule.get("resources", []) and verb in rule["verbs"]
        for _, rule in _rules(objects, account)
    )


ACCOUNTS = ["fabric-dra-plugin", "fabric-dra-manager", "fabric-dra-controller", "fabric-dra-emulator"]


def test_no_wildcards_and_no_secrets(objects: list[Obj]) -> None:
    for role in find(objects, "Role") + find(objects, "ClusterRole"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (role["metadata"]["name"], rule)
            assert "secrets" not in rule.get("resources", []), (role["metadata"]["name"], rule)


def test_each_role_holds_only_its_own_rights(objects: list[Obj]) -> None:
    resource = "resource.k8s.io"
    for account in ACCOUNTS:
        writes_slices = any(
            _grants(objects, account, resource, "resourceslices", v)
            for v in ("create", "update", "patch", "delete")
        )
        assert writes_slices == (account == "fabric-dra-controller"), account
        reviews = _grants(objects, account, "authentication.k8s.io", "tokenreviews", "create")
        assert reviews == (account == "fabric-dra-manager"), account
        labels_nodes = _grants(objects, account, "", "nodes", "patch")
        assert labels_nodes == (account == "fabric-dra-controller"), account
    plugin_rules = [rule for _, rule in _rules(objects, "fabric-dra-plugin")]
    assert plugin_rules == [
        {"apiGroups": [resource], "resources": ["resourceclaims"], "verbs": ["get"]},
        {"apiGroups": [resource], "resources": ["resourceclaims/status"], "verbs": ["patch"]},
    ]
    assert not list(_rules(objects, "fabric-dra-emulator"))


def test_named_objects_are_changed_only_by_name(objects: list[Obj]) -> None:
    """Leases and ConfigMaps in the namespace: create is unrestricted (RBAC cannot name what does
    not exist yet), anything that changes one names it."""
    for account in ACCOUNTS:
        for _, rule in _rules(objects, account):
            if set(rule.get("resources", [])) & {"leases", "configmaps"}:
                changes = set(rule["verbs"]) - {"create"}
                if changes:
                    assert rule.get("resourceNames"), (account, rule)
                    assert not {"list", "delete", "deletecollection"} & changes, (account, rule)


def test_binding_condition_rights_only_with_that_flow(objects: list[Obj]) -> None:
    controller = _container(objects, "fabric-dra-controller", "controller")
    flow = "--binding-conditions" in controller.args
    writes_status = _grants(
        objects, "fabric-dra-controller", "resource.k8s.io", "resourceclaims/status", "update"
    )
    assert writes_status == flow
    if flow:
        driver_rules = [
            rule
            for _, rule in _rules(objects, "fabric-dra-controller")
            if "resourceclaims/driver" in rule["resources"]
        ]
        assert driver_rules == [
            {
                "apiGroups": ["resource.k8s.io"],
                "resources": ["resourceclaims/driver"],
                "resourceNames": [DRIVER_NAME],
                "verbs": ["arbitrary-node:update"],
            }
        ]


@pytest.mark.parametrize(
    ("name", "resource", "operations"),
    [
        ("fabric-dra-plugin-resourceslices", "resourceslices", {"CREATE", "UPDATE", "DELETE"}),
        ("fabric-dra-plugin-claim-status", "resourceclaims/status", {"UPDATE"}),
    ],
)
def test_admission_policy_names_the_plugin_and_the_driver(
    objects: list[Obj], name: str, resource: str, operations: set[str]
) -> None:
    (policy,) = find(objects, "ValidatingAdmissionPolicy", name)
    (binding,) = find(objects, "ValidatingAdmissionPolicyBinding", name)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    (ds,) = find(objects, "DaemonSet", "fabric-dra-plugin")
    account = ds["spec"]["template"]["spec"]["serviceAccountName"]
    username = f"system:serviceaccount:{ds['metadata']['namespace']}:{account}"
    (condition,) = policy["spec"]["matchConditions"]
    assert f'"{username}"' in condition["expression"]
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert f"'{DRIVER_NAME}'" in expressions
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == [resource]
    assert set(rules[0]["operations"]) == operations


def test_one_driver_name_everywhere(objects: list[Obj]) -> None:
    names = set()
    for c in containers(objects):
        if c.is_fabric_dra and (value := _flag(c.args, "--driver-name")):
            names.add(value)
    for device_class in find(objects, "DeviceClass"):
        for selector in device_class["spec"]["selectors"]:
            names |= set(re.findall(r'device\.driver == "([^"]+)"', selector["cel"]["expression"]))
    assert names == {DRIVER_NAME}
    assert find(objects, "DeviceClass", "cohdi-pcie-device"), "the article's DeviceClass is missing"


# --- the kind overlay and the kind cluster agree -----------------------------------------------


def test_kind_overlay_matches_the_cluster_config(rendered_overlays: dict[str, list[Obj]]) -> None:
    cluster = yaml.safe_load((DEPLOY_DIR / "kind" / "cluster.yaml").read_text())
    shared = {
        tuple(sorted((m["containerPath"], m["hostPath"]) for m in node.get("extraMounts", [])))
        for node in cluster["nodes"]
    }
    assert len(shared) == 1, "every kind node must mount the same emulator directory"
    (((container_path, _host_path),),) = shared
    for overlay in ("kind", "binding-conditions"):
        objects = rendered_overlays[overlay]
        (emulator,) = find(objects, "Deployment", "fabric-dra-emulator")
        state = _container(objects, "fabric-dra-emulator", "emulator")
        state_dir = _flag(state.args, "--state-dir")
        volumes = {v["name"]: v for v in emulator["spec"]["template"]["spec"]["volumes"]}
        (state_volume,) = [v for v in volumes.values() if v.get("hostPath", {}).get("path") == container_path]
        assert state_dir == container_path, state_dir
        assert state_volume["hostPath"]["type"] == "Directory"
        plugin = _container(objects, "fabric-dra-plugin", "plugin")
        assert _flag(plugin.args, "--host-mode") == "emulated"
        # Unexpanded: each node's plugin reads the emulated host named like its node.
        assert _flag(plugin.spec["args"], "--sysfs-root") == f"{container_path}/hosts/$(NODE_NAME)/sys"


def test_e2e_script_deploys_the_image_the_kind_overlay_names(rendered_overlays: dict[str, list[Obj]]) -> None:
    script = (DEPLOY_DIR / "kind" / "e2e.sh").read_text()
    match = re.search(r'^readonly IMAGE="([^"]+)"$', script, re.MULTILINE)
    assert match, "e2e.sh no longer names the image it builds"
    for overlay in ("kind", "binding-conditions"):
        images = {c.spec["image"] for c in containers(rendered_overlays[overlay]) if c.is_fabric_dra}
        assert images == {match.group(1)}, overlay


def test_manager_connections_are_verified(objects: list[Obj]) -> None:
    """Nothing turns certificate checks off; whoever speaks https to the manager can verify it,
    and the manager serves TLS exactly when its clients expect it to."""
    manager = _container(objects, "fabric-dra-manager", "manager")
    serves_tls = _flag(manager.args, "--tls-cert") is not None
    assert serves_tls == (_flag(manager.args, "--tls-key") is not None)
    for c in containers(objects):
        if not c.is_fabric_dra:
            continue
        assert not {"--redfish-insecure", "--manager-insecure", "--insecure-no-auth"} & set(c.args), c.id
        url = _flag(c.args, "--manager-url")
        if url is None:
            continue
        assert url.startswith("https://" if serves_tls else "http://"), (c.id, url)
        if serves_tls:
            assert _flag(c.args, "--manager-ca-file"), c.id
    redfish = _flag(manager.args, "--redfish-url") or manager.env.get("FABRIC_DRA_REDFISH_URL", "")
    if not redfish.startswith("http://fabric-dra-emulator."):
        # A real fabric: its credentials and the CA of its certificate come from the cluster.
        assert _flag(manager.args, "--redfish-credentials-file")
        assert _flag(manager.args, "--redfish-ca-file")


def test_mounted_secrets_are_readable_and_private(objects: list[Obj]) -> None:
    """A Secret's files belong to root; a non-root container reads them through the pod's fsGroup,
    and nobody else may."""
    for workload, pod in pod_templates(objects):
        security = pod.get("securityContext", {})
        for volume in pod.get("volumes", []):
            if "secret" not in volume:
                continue
            mode = volume["secret"].get("defaultMode", 0o644)
            who = (workload["metadata"]["name"], volume["name"])
            assert mode & 0o007 == 0, who
            if security.get("runAsUser", 0) != 0:
                assert security.get("fsGroup") == security.get("runAsGroup"), who
                assert mode & 0o040, who
