"""The plugin's configuration: flags and the environment a DaemonSet passes, validated once.

A DaemonSet passes ``NODE_NAME`` and ``POD_UID`` through the downward API; everything else
comes as flags (each also readable from an environment variable, named in ``--help``).
"""

from __future__ import annotations

import argparse
import os
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from plumbing import DEFAULT_DRIVER_NAME
from plumbing.names import is_dns1123_subdomain

__all__ = [
    "DEFAULT_CDI_ROOT",
    "DEFAULT_DRIVER_NAME",
    "DEFAULT_PLUGINS_DIR",
    "DEFAULT_REGISTRY_DIR",
    "MAX_SOCKET_PATH",
    "DeviceBackendKind",
    "HostMode",
    "PluginConfig",
    "add_arguments",
    "config_from_args",
    "socket_path_problem",
]

# The kubelet's defaults; k8s.io/dynamic-resource-allocation/kubeletplugin uses the same
# (KubeletRegistryDir, KubeletPluginsDir in draplugin.go).
DEFAULT_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
DEFAULT_PLUGINS_DIR = "/var/lib/kubelet/plugins"
DEFAULT_CDI_ROOT = "/var/run/cdi"
#: sockaddr_un.sun_path holds 108 bytes including the terminating NUL (unix(7)); grpc refuses a
#: longer path with a traceback ("Path name should not have more than 107 characters").
MAX_SOCKET_PATH = 107


class DeviceBackendKind(StrEnum):
    #: attach through the fabric manager, wait until the host sees the device
    FABRIC = "fabric"
    #: no fabric, no host: measures the plugin's own overhead (benchmarks only)
    NOOP = "noop"


class HostMode(StrEnum):
    #: a real host: device nodes in CDI specs, udev events, host-side removal
    REAL = "real"
    #: the emulator's per-host sysfs tree: env vars and a read-only mount, no device nodes
    EMULATED = "emulated"


class PluginConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node_name: str = Field(min_length=1)
    pod_uid: str | None = None
    driver_name: str = DEFAULT_DRIVER_NAME
    registry_dir: Path = Path(DEFAULT_REGISTRY_DIR)
    plugin_dir: Path
    cdi_root: Path = Path(DEFAULT_CDI_ROOT)
    sysfs_root: Path = Path("/sys")
    host_mode: HostMode = HostMode.REAL
    device_backend: DeviceBackendKind = DeviceBackendKind.FABRIC
    manager_url: str | None = None
    manager_token_file: Path | None = None
    manager_ca_file: Path | None = None
    kubeconfig: str | None = None
    ready_file: Path | None = None
    pci_rescan: bool = False
    host_removal: bool = True
    #: how long a device may take to appear on the host once the fabric bound it
    visible_timeout: float = Field(default=120.0, gt=0)
    #: answer the kubelet this long before its deadline
    deadline_margin: float = Field(default=3.0, ge=0)
    #: used when the kubelet's call carries no deadline (it always does: 45 s)
    default_call_timeout: float = Field(default=45.0, gt=0)
    #: exit non-zero when the kubelet rejected the registration and has not accepted it since
    registration_timeout: float = Field(default=300.0, gt=0)
    metrics_port: int | None = Field(default=None, ge=0, le=65535)
    metrics_host: str = "127.0.0.1"
    #: how often the manager is told which claims this node has prepared (orphan protection)
    report_seconds: float = Field(default=30.0, gt=0)
    #: how long one attach keeps retrying while the manager or the fabric is unavailable
    attach_retry_seconds: float = Field(default=60.0, gt=0)

    @field_validator("driver_name")
    @classmethod
    def _driver_is_dns_subdomain(cls, value: str) -> str:
        if not is_dns1123_subdomain(value):
            raise ValueError(f"driver name {value!r} is not a DNS subdomain (e.g. fabric-dra.io)")
        return value

    @field_validator("pod_uid")
    @classmethod
    def _empty_uid_is_none(cls, value: str | None) -> str | None:
        return value or None

    @property
    def registration_socket(self) -> Path:
        # <driver>-<pod uid>-reg.sock with rolling updates, as the kubeletplugin helper names it
        # (k8s.io/dynamic-resource-allocation/kubeletplugin/draplugin.go, Start: uidPart).
        uid_part = f"-{self.pod_uid}" if self.pod_uid else ""
        return self.registry_dir / f"{self.driver_name}{uid_part}-reg.sock"

    @property
    def dra_socket(self) -> Path:
        # The helper names it "dra" + uidPart + ".sock" in the plugin data directory, so two
        # pods of a DaemonSet with maxSurge can both serve while one replaces the other.
        uid_part = f"-{self.pod_uid}" if self.pod_uid else ""
        return self.plugin_dir / f"dra{uid_part}.sock"

    def socket_flags(self) -> tuple[tuple[Path, str], ...]:
        """Each socket the plugin listens on, with the flag that decides its directory."""
        return ((self.registration_socket, "--registry-dir"), (self.dra_socket, "--plugin-dir"))

    @property
    def checkpoint_file(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def lock_file(self) -> Path:
        return self.plugin_dir / "claims.lock"


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name)
    return value if value else default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``fabric-dra plugin``; defaults come from the environment where a DaemonSet sets it."""
    node = parser.add_argument_group("node")
    node.add_argument(
        "--node-name",
        default=_env("NODE_NAME"),
        help="Kubernetes node this plugin serves (env NODE_NAME, from the downward API; required)",
    )
    node.add_argument(
        "--pod-uid",
        default=_env("POD_UID"),
        help="UID of this plugin's pod (env POD_UID); when set, sockets get per-pod names so two "
        "pods can overlap during a rolling update (kubelet >= 1.33)",
    )
    node.add_argument(
        "--driver-name",
        default=_env("DRIVER_NAME", DEFAULT_DRIVER_NAME),
        help=f"DRA driver name (env DRIVER_NAME; default {DEFAULT_DRIVER_NAME})",
    )
    paths = parser.add_argument_group("paths")
    paths.add_argument(
        "--registry-dir",
        type=Path,
        default=_env("REGISTRY_DIR", DEFAULT_REGISTRY_DIR),
        help=f"kubelet plugin registration directory (default {DEFAULT_REGISTRY_DIR})",
    )
    paths.add_argument(
        "--plugin-dir",
        type=Path,
        default=_env("PLUGIN_DIR"),
        help=f"directory for the DRA socket, checkpoint and lock file "
        f"(default {DEFAULT_PLUGINS_DIR}/<driver-name>)",
    )
    paths.add_argument(
        "--cdi-root",
        type=Path,
        default=_env("CDI_ROOT", DEFAULT_CDI_ROOT),
        help=f"directory for transient CDI spec files (default {DEFAULT_CDI_ROOT})",
    )
    paths.add_argument(
        "--sysfs-root",
        type=Path,
        default=_env("SYSFS_ROOT", "/sys"),
        help="sysfs to scan for attached devices (default /sys); point it at the emulator's "
        "<state-dir>/hosts/<host>/sys for an emulated host",
    )
    host = parser.add_argument_group("host devices")
    host.add_argument(
        "--host-mode",
        choices=["auto", *[m.value for m in HostMode]],
        default=_env("HOST_MODE", "auto"),
        help="real: device nodes in CDI specs, udev events, host-side removal; emulated: env vars "
        "and a read-only mount of the device's emulated sysfs directory; auto: real when "
        "--sysfs-root is /sys (default auto)",
    )
    host.add_argument(
        "--device-backend",
        choices=[b.value for b in DeviceBackendKind],
        default=_env("DEVICE_BACKEND", DeviceBackendKind.FABRIC.value),
        help="fabric: attach through the fabric manager (default); noop: no fabric and no host "
        "checks, for measuring the plugin's own overhead",
    )
    host.add_argument(
        "--pci-rescan",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="write 1 to <sysfs-root>/bus/pci/rescan while waiting for an attached PCIe device "
        "(for hosts whose hot-plug slots do not announce new devices; default off)",
    )
    host.add_argument(
        "--host-removal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="on unprepare, unbind the device's driver and remove it through sysfs before the "
        "fabric detaches it (real hosts only; default on)",
    )
    host.add_argument(
        "--visible-timeout",
        type=float,
        default=120.0,
        help="seconds a bound device may take to appear on the host before prepare fails (default 120)",
    )
    fabric = parser.add_argument_group("fabric manager")
    fabric.add_argument(
        "--manager-url",
        default=_env("FABRIC_DRA_MANAGER_URL"),
        help="base URL of the fabric manager, e.g. https://fabric-dra-manager:8443 "
        "(env FABRIC_DRA_MANAGER_URL; required with --device-backend fabric)",
    )
    fabric.add_argument(
        "--manager-token-file",
        type=Path,
        default=_env("FABRIC_DRA_MANAGER_TOKEN_FILE"),
        help="bearer token for the manager, re-read every minute: the pod's projected "
        "service-account token (env FABRIC_DRA_MANAGER_TOKEN_FILE)",
    )
    fabric.add_argument(
        "--manager-ca-file",
        type=Path,
        default=_env("FABRIC_DRA_MANAGER_CA_FILE"),
        help="CA bundle that signed the manager's TLS certificate (env FABRIC_DRA_MANAGER_CA_FILE)",
    )
    fabric.add_argument(
        "--attach-retry-seconds",
        type=float,
        default=60.0,
        help="seconds an attach keeps retrying while the manager or the fabric is unavailable before the "
        "claim gets the error (the manager keeps the attach; the kubelet's retry picks it up; default 60)",
    )
    fabric.add_argument(
        "--report-seconds",
        type=float,
        default=30.0,
        help="how often the manager is told which claims this node has prepared, so its orphan "
        "reconciler never releases them (default 30)",
    )
    kube = parser.add_argument_group("kubernetes")
    kube.add_argument(
        "--kubeconfig",
        default=_env("KUBECONFIG"),
        help="kubeconfig to reach the API server (env KUBECONFIG); in a pod the in-cluster "
        "service account is used when this is not set",
    )
    runtime = parser.add_argument_group("runtime")
    runtime.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        help="once serving, write the DRA socket path to this file (atomically)",
    )
    runtime.add_argument(
        "--deadline-margin",
        type=float,
        default=3.0,
        help="answer a retriable error this many seconds before the kubelet's call deadline while "
        "the fabric is still attaching (default 3)",
    )
    runtime.add_argument(
        "--registration-timeout",
        type=float,
        default=300.0,
        help="exit with status 1 when the kubelet rejected the registration and has not accepted "
        "it within this many seconds, so the DaemonSet restarts the pod (default 300)",
    )
    runtime.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics (per-phase latency histograms) on this port; 0 picks a "
        "free port; off by default",
    )
    runtime.add_argument(
        "--metrics-host", default="127.0.0.1", help="address for --metrics-port (default 127.0.0.1)"
    )


def socket_path_problem(config: PluginConfig) -> str | None:
    """One line naming the flag to shorten when a socket path does not fit a unix socket."""
    for path, flag in config.socket_flags():
        size = len(os.fsencode(path))
        if size > MAX_SOCKET_PATH:
            return (
                f"socket path {path} is {size} bytes, longer than the {MAX_SOCKET_PATH} a unix socket "
                f"allows; pass a shorter {flag}"
                + (" (--pod-uid adds 37 bytes to the name)" if config.pod_uid else "")
            )
    return None


def config_from_args(args: argparse.Namespace) -> PluginConfig:
    """Build the validated configuration; raises ``ValueError`` with a one-line reason."""
    if not args.node_name:
        raise ValueError("the node name is not set: pass --node-name or set NODE_NAME (downward API)")
    sysfs_root = Path(args.sysfs_root)
    host_mode = args.host_mode
    if host_mode == "auto":
        host_mode = HostMode.REAL if sysfs_root.resolve() == Path("/sys") else HostMode.EMULATED
    backend = DeviceBackendKind(args.device_backend)
    if backend is DeviceBackendKind.FABRIC and not args.manager_url:
        raise ValueError("the fabric manager URL is not set: pass --manager-url (or --device-backend noop)")
    plugin_dir = Path(args.plugin_dir) if args.plugin_dir else Path(DEFAULT_PLUGINS_DIR) / args.driver_name
    config = PluginConfig(
        node_name=args.node_name,
        pod_uid=args.pod_uid,
        driver_name=args.driver_name,
        registry_dir=Path(args.registry_dir),
        plugin_dir=plugin_dir,
        cdi_root=Path(args.cdi_root),
        sysfs_root=sysfs_root,
        host_mode=HostMode(host_mode),
        device_backend=backend,
        manager_url=args.manager_url,
        manager_token_file=Path(args.manager_token_file) if args.manager_token_file else None,
        manager_ca_file=Path(args.manager_ca_file) if args.manager_ca_file else None,
        kubeconfig=args.kubeconfig,
        ready_file=Path(args.ready_file) if args.ready_file else None,
        pci_rescan=args.pci_rescan,
        host_removal=args.host_removal,
        visible_timeout=args.visible_timeout,
        deadline_margin=args.deadline_margin,
        registration_timeout=args.registration_timeout,
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        report_seconds=args.report_seconds,
        attach_retry_seconds=args.attach_retry_seconds,
    )
    problem = socket_path_problem(config)
    if problem is not None:
        raise ValueError(problem)
    return config
