"""Start every fabric-dra process of the local demo for real, on its real sockets.

One :class:`DemoStack` owns a work directory::

    <workdir>/fabric/            the emulator's state dir (credentials, hosts/<node>/sys)
    <workdir>/kube/              tokens, kubeconfigs and state of the API test server
    <workdir>/manager/           the fabric manager's ledger
    <workdir>/nodes/<node>/      each node's kubelet dirs: plugins_registry/, plugins/, cdi/
    <workdir>/logs/<role>.log    every process's log

and stops everything it started, in reverse order, whatever happens.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from kube_standin.apiserver.kubeconfig import write_kubeconfig
from plumbing import DEFAULT_DRIVER_NAME
from plumbing.fsutil import atomic_write
from plumbing.procs import RoleProcess

__all__ = ["DemoStack", "NodeDirs", "StackOptions"]

#: The namespace fabric-dra's own service accounts live in, as deploy/ installs them.
SYSTEM_NAMESPACE = "fabric-dra"
PLUGIN_ACCOUNT = "fabric-dra-plugin"
CONTROLLER_ACCOUNT = "fabric-dra-controller"


@dataclass(frozen=True)
class StackOptions:
    workdir: Path
    latency: str = "instant"
    binding_conditions: bool = False
    driver_name: str = DEFAULT_DRIVER_NAME


@dataclass
class NodeDirs:
    name: str
    root: Path

    @property
    def registry_dir(self) -> Path:
        return self.root / "plugins_registry"

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugins" / DEFAULT_DRIVER_NAME

    @property
    def cdi_root(self) -> Path:
        return self.root / "cdi"

    @property
    def token_file(self) -> Path:
        return self.root / "token"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"


@dataclass
class DemoStack:
    options: StackOptions
    progress: Callable[[str], None]
    processes: dict[str, RoleProcess] = field(default_factory=dict)
    nodes: list[NodeDirs] = field(default_factory=list)
    redfish_url: str = ""
    redfish_credentials: tuple[str, str] = ("", "")
    apiserver_url: str = ""
    manager_url: str = ""
    admin_token: str = ""
    operator_token: str = ""
    _short_root: Path | None = None

    # -- paths ----------------------------------------------------------------------------------

    @property
    def workdir(self) -> Path:
        return self.options.workdir

    @property
    def fabric_dir(self) -> Path:
        return self.workdir / "fabric"

    @property
    def kube_dir(self) -> Path:
        return self.workdir / "kube"

    @property
    def logs_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kube_dir / "admin.kubeconfig"

    def sysfs_root(self, node: str) -> Path:
        return self.fabric_dir / "hosts" / node / "sys"

    def log_file(self, role: str) -> Path:
        return self.logs_dir / f"{role}.log"

    # -- lifecycle ------------------------------------------------------------------------------

    def _start(self, name: str, args: list[str], *, ready: bool = True, timeout: float = 45.0) -> RoleProcess:
        ready_file = self.workdir / "run" / f"{name}.ready" if ready else None
        if ready_file is not None:
            ready_file.parent.mkdir(parents=True, exist_ok=True)
            args = [*args, "--ready-file", str(ready_file)]
        proc = RoleProcess(
            ["--log-format", "logfmt", *args],
            ready_file=ready_file,
            log_file=self.log_file(name),
            name=name,
            start_timeout=timeout,
        )
        self.processes[name] = proc
        proc.start()
        return proc

    def stop(self) -> None:
        for name in reversed(list(self.processes)):
            with contextlib.suppress(Exception):
                self.processes[name].stop()
        self.processes.clear()
        if self._short_root is not None:
            shutil.rmtree(self._short_root, ignore_errors=True)

    def start_fabric(self) -> list[str]:
        """The Redfish emulator with its packaged topology; returns the hosts it serves."""
        proc = self._start(
            "emulator",
            ["emulator", "serve", "--state-dir", str(self.fabric_dir), "--latency", self.options.latency],
        )
        self.redfish_url = proc.address
        creds = json.loads((self.fabric_dir / "credentials.json").read_text())
        self.redfish_credentials = (creds["username"], creds["password"])
        systems = self.redfish_get("/redfish/v1/Systems")
        hosts = [member["@odata.id"].rsplit("/", 1)[-1] for member in systems.get("Members", [])]
        self.progress(f"emulator    {self.redfish_url}  Redfish fabric, hosts {', '.join(hosts)}")
        return hosts

    def redfish_get(self, path: str) -> dict[str, Any]:
        response = httpx.get(f"{self.redfish_url}{path}", auth=self.redfish_credentials, timeout=10.0)
        response.raise_for_status()
        result: dict[str, Any] = response.json()
        return result

    def start_apiserver(self, hosts: list[str]) -> None:
        """The Kubernetes API test server, with a token per identity as the real cluster would issue."""
        self.admin_token = secrets.token_hex(24)
        self.operator_token = secrets.token_hex(24)
        tokens: dict[str, Any] = {
            self.admin_token: {"username": "kubernetes-admin", "groups": ["system:masters"]},
            self.operator_token: {"username": "demo-operator", "groups": ["fabric-dra:operators"]},
        }
        sa_groups = ["system:serviceaccounts", f"system:serviceaccounts:{SYSTEM_NAMESPACE}"]
        controller_token = secrets.token_hex(24)
        tokens[controller_token] = {
            "username": f"system:serviceaccount:{SYSTEM_NAMESPACE}:{CONTROLLER_ACCOUNT}",
            "groups": sa_groups,
        }
        nodes_root = self._nodes_root(hosts)
        for host in hosts:
            node = NodeDirs(host, nodes_root / host)
            for path in (node.registry_dir, node.plugin_dir, node.cdi_root):
                path.mkdir(parents=True, exist_ok=True)
            token = secrets.token_hex(24)
            # Bound service-account tokens carry the pod's node; the manager trusts only that.
            tokens[token] = {
                "username": f"system:serviceaccount:{SYSTEM_NAMESPACE}:{PLUGIN_ACCOUNT}",
                "groups": sa_groups,
                "extra": {"authentication.kubernetes.io/node-name": [host]},
            }
            atomic_write(node.token_file, token, mode=0o600, durable=False)
            self.nodes.append(node)
        self.kube_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.kube_dir / "tokens.yaml", yaml.safe_dump({"tokens": tokens}), mode=0o600)
        atomic_write(self.kube_dir / "controller.token", controller_token, mode=0o600, durable=False)
        proc = self._start(
            "apiserver",
            [
                "standin",
                "apiserver",
                "--tokens",
                str(self.kube_dir / "tokens.yaml"),
                "--write-kubeconfig",
                str(self.admin_kubeconfig),
                "--kubeconfig-token",
                self.admin_token,
            ],
        )
        self.apiserver_url = proc.address
        # deploy/ installs fabric-dra into its own namespace: its Leases and ledger live there.
        response = httpx.post(
            f"{self.apiserver_url}/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}},
            headers={"Authorization": f"Bearer {self.admin_token}"},
            timeout=10.0,
        )
        response.raise_for_status()
        for node in self.nodes:
            write_kubeconfig(node.kubeconfig, self.apiserver_url, token=node.token_file.read_text())
        write_kubeconfig(self.kube_dir / "controller.kubeconfig", self.apiserver_url, token=controller_token)
        self.progress(
            f"apiserver   {self.apiserver_url}  Kubernetes API test server (strict schemas 1.34-1.37)"
        )

    def register_nodes(self) -> None:
        """Create the Node objects as each node's kubelet would, with the host's system UUID (the
        manager maps Redfish ComputerSystems to nodes by it)."""
        headers = {"Authorization": f"Bearer {self.admin_token}"}
        with httpx.Client(base_url=self.apiserver_url, headers=headers, timeout=10.0) as api:
            for node in self.nodes:
                system = self.redfish_get(f"/redfish/v1/Systems/{node.name}")
                body = {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {"name": node.name, "labels": {"kubernetes.io/hostname": node.name}},
                }
                api.post("/api/v1/nodes", json=body).raise_for_status()
                status = {
                    "status": {
                        "nodeInfo": {
                            "systemUUID": system.get("UUID", ""),
                            "machineID": "",
                            "bootID": "",
                            "kernelVersion": "",
                            "osImage": "fabric-dra demo host",
                            "containerRuntimeVersion": "",
                            "kubeletVersion": "",
                            "kubeProxyVersion": "",
                            "operatingSystem": "linux",
                            "architecture": "amd64",
                        },
                        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                    }
                }
                api.patch(
                    f"/api/v1/nodes/{node.name}/status",
                    json=status,
                    headers={"Content-Type": "application/merge-patch+json"},
                ).raise_for_status()
        self.progress(f"nodes       {len(self.nodes)} Node objects registered with their hosts' system UUIDs")

    def _nodes_root(self, hosts: list[str]) -> Path:
        """Where the nodes' kubelet dirs go: under the work dir unless its sockets' paths would pass
        the 107 bytes a unix socket address holds; then a short private dir under /tmp."""
        root = self.workdir / "nodes"
        longest = max((len(h) for h in hosts), default=0)
        sample = root / ("x" * longest) / "plugins_registry" / f"{self.options.driver_name}-reg.sock"
        if len(str(sample).encode()) <= 100:
            return root
        self._short_root = Path(tempfile.mkdtemp(prefix="fdra-", dir="/tmp"))
        return self._short_root

    def start_manager(self) -> None:
        proc = self._start(
            "manager",
            [
                "manager",
                "serve",
                "--redfish-url",
                self.redfish_url,
                "--redfish-credentials-file",
                str(self.fabric_dir / "credentials.json"),
                "--kubeconfig",
                str(self.admin_kubeconfig),
                "--namespace",
                SYSTEM_NAMESPACE,
                "--ledger",
                "configmap",
                "--operator-user",
                "demo-operator",
                "--port",
                "0",
            ],
        )
        self.manager_url = proc.address
        self.progress(f"manager     {self.manager_url}  fabric manager (Redfish session, TokenReview auth)")

    def start_controller(self, *, binding_conditions: bool) -> None:
        if "controller" in self.processes:
            self.processes.pop("controller").stop()
        args = [
            "controller",
            "--manager-url",
            self.manager_url,
            "--manager-token-file",
            str(self.kube_dir / "controller.token"),
            "--kubeconfig",
            str(self.kube_dir / "controller.kubeconfig"),
            "--leader-elect",
            "--lease-namespace",
            SYSTEM_NAMESPACE,
        ]
        if binding_conditions:
            args.append("--binding-conditions")
        self._start("controller", args, ready=False)
        mode = "binding conditions" if binding_conditions else "plain"
        self.progress(f"controller  pid {self.processes['controller'].pid}  ResourceSlice publisher ({mode})")

    def start_plugins(self) -> None:
        for node in self.nodes:
            self._start(
                f"plugin-{node.name}",
                [
                    "plugin",
                    "--node-name",
                    node.name,
                    "--registry-dir",
                    str(node.registry_dir),
                    "--plugin-dir",
                    str(node.plugin_dir),
                    "--cdi-root",
                    str(node.cdi_root),
                    "--sysfs-root",
                    str(self.sysfs_root(node.name)),
                    "--manager-url",
                    self.manager_url,
                    "--manager-token-file",
                    str(node.token_file),
                    "--kubeconfig",
                    str(node.kubeconfig),
                ],
            )
        names = ", ".join(node.name for node in self.nodes)
        where = self.nodes[0].root.parent if self.nodes else self.workdir
        self.progress(f"plugins     one per node ({names}), kubelet sockets under {where}")
