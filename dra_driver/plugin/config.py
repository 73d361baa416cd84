"""The plugin's configuration: every setting declared once in :class:`PluginConfig`, read from
flags, the environment and a settings file (:mod:`plumbing.settings`: flag > environment > file >
default), validated once.

A DaemonSet passes ``NODE_NAME`` and ``POD_UID`` through the downward API; every other variable
carries the project's prefix (``FABRIC_DRA_PLUGIN_DIR``, …; ``--help`` names each). The unprefixed
names of earlier releases (``DRIVER_NAME``, ``REGISTRY_DIR``, ``PLUGIN_DIR``, ``CDI_ROOT``,
``SYSFS_ROOT``, ``HOST_MODE``, ``DEVICE_BACKEND``) are still read, with a warning, for one release.
"""

from __future__ import annotations

import argparse
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dra_driver.plugin.cdihook import DEFAULT_HOOK_PATH
from manager_api.fleet import ManagerEndpoint, endpoints_of, managers_problem
from plumbing import DEFAULT_DRIVER_NAME
from plumbing.names import is_dns1123_subdomain
from plumbing.settings import Setting, SettingsError, add_settings_arguments, read_settings

__all__ = [
    "DEFAULT_CDI_ROOT",
    "DEFAULT_DRIVER_NAME",
    "DEFAULT_PLUGINS_DIR",
    "DEFAULT_REGISTRY_DIR",
    "MAX_SOCKET_PATH",
    "DeviceBackendKind",
    "HostMode",
    "MemoryMode",
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


class MemoryMode(StrEnum):
    """How a CXL memory share is handed to its container (docs/plugin.md, "CXL memory shares")."""

    #: the region's dax device node in the container
    DEVDAX = "devdax"
    #: onlined as system RAM of a CPU-less NUMA node, the container bound to that node
    KMEM = "kmem"


class HostMode(StrEnum):
    #: a real host: device nodes in CDI specs, udev events, host-side removal
    REAL = "real"
    #: the emulator's per-host sysfs tree: env vars and a read-only mount, no device nodes
    EMULATED = "emulated"


_NODE, _PATHS, _HOST, _FABRIC, _KUBE, _RUNTIME = (
    "node",
    "paths",
    "host devices",
    "fabric manager",
    "kubernetes",
    "runtime",
)


class PluginConfig(BaseModel):
    """Every setting of ``fabric-dra plugin``, declared once (:mod:`plumbing.settings`): a flag, an
    environment variable (``FABRIC_DRA_…``; ``NODE_NAME``, ``POD_UID`` and ``KUBECONFIG`` as
    Kubernetes names them) and a key of the ``--config`` file each."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node_name: Annotated[
        str,
        Setting(
            "Kubernetes node this plugin serves (from the downward API; required)", _NODE, env="NODE_NAME"
        ),
    ] = Field(min_length=1)
    pod_uid: Annotated[
        str | None,
        Setting(
            "UID of this plugin's pod; when set, sockets get per-pod names so two pods can overlap "
            "during a rolling update (kubelet >= 1.33)",
            _NODE,
            env="POD_UID",
        ),
    ] = None
    driver_name: Annotated[str, Setting("DRA driver name", _NODE, old_env=("DRIVER_NAME",))] = (
        DEFAULT_DRIVER_NAME
    )
    registry_dir: Annotated[
        Path, Setting("kubelet plugin registration directory", _PATHS, old_env=("REGISTRY_DIR",))
    ] = Path(DEFAULT_REGISTRY_DIR)
    plugin_dir: Annotated[
        Path,
        Setting(
            "directory for the DRA socket, checkpoint and lock file",
            _PATHS,
            old_env=("PLUGIN_DIR",),
            shown_default=f"{DEFAULT_PLUGINS_DIR}/<driver-name>",
        ),
    ] = Path(DEFAULT_PLUGINS_DIR) / DEFAULT_DRIVER_NAME  # by --driver-name when not given (_derived_defaults)
    cdi_root: Annotated[
        Path, Setting("directory for transient CDI spec files", _PATHS, old_env=("CDI_ROOT",))
    ] = Path(DEFAULT_CDI_ROOT)
    sysfs_root: Annotated[
        Path,
        Setting(
            "sysfs to scan for attached devices; point it at the emulator's "
            "<state-dir>/hosts/<host>/sys for an emulated host",
            _PATHS,
            old_env=("SYSFS_ROOT",),
        ),
    ] = Path("/sys")
    host_mode: Annotated[
        HostMode,
        Setting(
            "real: device nodes in CDI specs, udev events, host-side removal; emulated: env vars "
            "and a read-only mount of the device's emulated sysfs directory; auto: real when "
            "--sysfs-root is /sys",
            _HOST,
            old_env=("HOST_MODE",),
            choices=("auto", *(m.value for m in HostMode)),
            shown_default="auto",
        ),
    ] = HostMode.REAL  # auto when not given (_derived_defaults)
    device_backend: Annotated[
        DeviceBackendKind,
        Setting(
            "fabric: attach through the fabric manager; noop: no fabric and no host checks, for "
            "measuring the plugin's own overhead",
            _HOST,
            old_env=("DEVICE_BACKEND",),
        ),
    ] = DeviceBackendKind.FABRIC
    pci_rescan: Annotated[
        bool,
        Setting(
            "write 1 to <sysfs-root>/bus/pci/rescan while waiting for an attached PCIe device "
            "(for hosts whose hot-plug slots do not announce new devices)",
            _HOST,
        ),
    ] = False
    host_removal: Annotated[
        bool,
        Setting(
            "on unprepare, unbind the device's driver and remove it through sysfs before the "
            "fabric detaches it (real hosts only)",
            _HOST,
        ),
    ] = True
    memory_mode: Annotated[
        MemoryMode,
        Setting(
            "how a CXL memory share reaches its container unless the claim's configuration says: "
            "devdax (the /dev/dax device) or kmem (system RAM of its own NUMA node, the container "
            "bound to it by a CDI hook)",
            _HOST,
        ),
    ] = MemoryMode.DEVDAX
    cdi_hook_path: Annotated[
        str,
        Setting(
            "the fabric-dra command on the node (not in the plugin's container) that the kmem mode's "
            "CDI hook runs to set the container's cpuset.mems",
            _HOST,
        ),
    ] = Field(default=DEFAULT_HOOK_PATH, pattern=r"^/")
    #: how long a device may take to appear on the host once the fabric bound it
    visible_timeout: Annotated[
        float, Setting("seconds a bound device may take to appear on the host before prepare fails", _HOST)
    ] = Field(default=120.0, gt=0)
    manager_url: Annotated[
        str | None,
        Setting(
            "base URL of the fabric manager, e.g. https://fabric-dra-manager:8443 "
            "(required with --device-backend fabric)",
            _FABRIC,
        ),
    ] = None
    managers: Annotated[
        dict[str, str],
        Setting(
            "one fabric manager per Redfish service, again and again (pcie=https://…): each device's "
            "attach goes to the manager whose inventory reports its pool (--manager-url's first, "
            "then in the order given, when two report one pool)",
            _FABRIC,
            flag="--manager",
            metavar="NAME=URL",
        ),
    ] = Field(default_factory=dict)
    manager_token_file: Annotated[
        Path | None,
        Setting(
            "bearer token for the manager, re-read every minute: the pod's projected service-account token",
            _FABRIC,
        ),
    ] = None
    manager_ca_file: Annotated[
        Path | None, Setting("CA bundle that signed the manager's TLS certificate", _FABRIC)
    ] = None
    manager_token_files: Annotated[
        dict[str, Path],
        Setting(
            "a named manager's own bearer token file (default: --manager-token-file)",
            _FABRIC,
            metavar="NAME=FILE",
        ),
    ] = Field(default_factory=dict)
    manager_ca_files: Annotated[
        dict[str, Path],
        Setting("a named manager's own CA bundle (default: --manager-ca-file)", _FABRIC, metavar="NAME=FILE"),
    ] = Field(default_factory=dict)
    #: how long one attach keeps retrying while the manager or the fabric is unavailable
    attach_retry_seconds: Annotated[
        float,
        Setting(
            "seconds an attach keeps retrying while the manager or the fabric is unavailable before "
            "the claim gets the error (the manager keeps the attach; the kubelet's retry picks it up)",
            _FABRIC,
        ),
    ] = Field(default=60.0, gt=0)
    #: how often the manager is told which claims this node has prepared (orphan protection)
    report_seconds: Annotated[
        float,
        Setting(
            "how often the manager is told which claims this node has prepared, so its orphan "
            "reconciler never releases them",
            _FABRIC,
        ),
    ] = Field(default=30.0, gt=0)
    kubeconfig: Annotated[
        str | None,
        Setting(
            "kubeconfig to reach the API server; in a pod the in-cluster service account is used "
            "when this is not set",
            _KUBE,
            env="KUBECONFIG",
        ),
    ] = None
    link_hold_seconds: Annotated[
        float,
        Setting(
            "seconds a device's PCIe link must stay below what it negotiated at attach before the "
            "device is reported unhealthy (a retrain blip moves nothing)",
            _FABRIC,
        ),
    ] = Field(default=30.0, ge=0)
    link_recover_seconds: Annotated[
        float,
        Setting(
            "seconds a degraded device's link must stay back at what it negotiated before it is "
            "reported healthy again",
            _FABRIC,
        ),
    ] = Field(default=120.0, ge=0)
    link_correctable_per_minute: Annotated[
        float,
        Setting(
            "correctable PCIe errors per minute (counted over --link-hold-seconds) above which a "
            "device is reported unhealthy; any fatal or non-fatal error is reported at once",
            _FABRIC,
        ),
    ] = Field(default=10.0, ge=0)
    claim_status: Annotated[
        bool,
        Setting(
            "write each prepared device's Ready condition and whereabouts into its ResourceClaim's "
            "status.devices (needs patch on resourceclaims/status)",
            _KUBE,
        ),
    ] = True
    ready_file: Annotated[
        Path | None, Setting("once serving, write the DRA socket path to this file (atomically)", _RUNTIME)
    ] = None
    #: answer the kubelet this long before its deadline
    deadline_margin: Annotated[
        float,
        Setting(
            "answer a retriable error this many seconds before the kubelet's call deadline while "
            "the fabric is still attaching",
            _RUNTIME,
        ),
    ] = Field(default=3.0, ge=0)
    #: used when the kubelet's call carries no deadline (it always does: 45 s)
    default_call_timeout: float = Field(default=45.0, gt=0)
    #: exit non-zero when the kubelet rejected the registration and has not accepted it since
    registration_timeout: Annotated[
        float,
        Setting(
            "exit with status 1 when the kubelet rejected the registration and has not accepted it "
            "within this many seconds, so the DaemonSet restarts the pod",
            _RUNTIME,
        ),
    ] = Field(default=300.0, gt=0)
    metrics_port: Annotated[
        int | None,
        Setting(
            "serve Prometheus metrics (per-phase latency histograms) on this port; 0 picks a free "
            "port; off by default",
            _RUNTIME,
        ),
    ] = Field(default=None, ge=0, le=65535)
    metrics_host: Annotated[str, Setting("address for --metrics-port", _RUNTIME)] = "127.0.0.1"

    @model_validator(mode="before")
    @classmethod
    def _derived_defaults(cls, data: Any) -> Any:
        """``--plugin-dir`` under the kubelet's plugins directory by driver name; ``--host-mode
        auto``: real when ``--sysfs-root`` is /sys."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if not data.get("plugin_dir"):
            data["plugin_dir"] = Path(DEFAULT_PLUGINS_DIR) / str(
                data.get("driver_name") or DEFAULT_DRIVER_NAME
            )
        if data.get("host_mode") in (None, "auto"):
            sysfs_root = Path(data.get("sysfs_root") or "/sys")
            data["host_mode"] = HostMode.REAL if sysfs_root.resolve() == Path("/sys") else HostMode.EMULATED
        return data

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

    def endpoints(self) -> list[ManagerEndpoint]:
        """Every fabric manager, in the order that decides which serves a pool two report."""
        return endpoints_of(
            self.manager_url,
            self.managers,
            token_file=self.manager_token_file,
            ca_file=self.manager_ca_file,
            token_files=self.manager_token_files,
            ca_files=self.manager_ca_files,
        )

    def socket_flags(self) -> tuple[tuple[Path, str], ...]:
        """Each socket the plugin listens on, with the flag that decides its directory."""
        return ((self.registration_socket, "--registry-dir"), (self.dra_socket, "--plugin-dir"))

    @property
    def checkpoint_file(self) -> Path:
        return self.plugin_dir / "checkpoint.json"

    @property
    def lock_file(self) -> Path:
        return self.plugin_dir / "claims.lock"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every flag of ``fabric-dra plugin``, from :class:`PluginConfig`."""
    add_settings_arguments(parser, PluginConfig)


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
    """The validated configuration from flags, environment and ``--config`` file; raises
    ``ValueError`` (:class:`plumbing.settings.SettingsError`) with a one-line reason."""
    config = read_settings(PluginConfig, args)
    if config.device_backend is DeviceBackendKind.FABRIC and not config.manager_url and not config.managers:
        raise SettingsError(
            "the fabric manager URL is not set: pass --manager-url (or --device-backend noop)"
        )
    problem = managers_problem(config.manager_url, config.managers) if config.managers else None
    unknown = sorted((set(config.manager_token_files) | set(config.manager_ca_files)) - set(config.managers))
    if problem is None and unknown:
        problem = f"token or CA file for a manager not given with --manager: {', '.join(unknown)}"
    if problem is not None:
        raise SettingsError(problem)
    problem = socket_path_problem(config)
    if problem is not None:
        raise SettingsError(problem)
    return config
