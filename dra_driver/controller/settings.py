"""Every setting of ``fabric-dra controller``, declared once (:mod:`plumbing.settings`): a flag,
an environment variable (``FABRIC_DRA_…``; ``POD_NAME`` and ``POD_NAMESPACE`` from the downward
API as Kubernetes names them) and a key of the ``--config`` file each; checked once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dra_driver.controller.features import TaintsMode
from dra_driver.controller.resourcenames import is_driver_name, publisher_of
from dra_driver.linkerrors import ErrorThresholds
from manager_api.feed import FeedMode
from manager_api.fleet import ManagerEndpoint, endpoints_of, managers_problem
from plumbing import DEFAULT_DRIVER_NAME
from plumbing.cli import positive_seconds
from plumbing.names import is_label_value
from plumbing.settings import Setting

__all__ = ["ControllerSettings"]

_MANAGER, _KUBE, _PUBLISH, _PROBES = ("fabric manager", "Kubernetes", "publishing", "probes and metrics")
_LINKS = "link errors (the PCIe error counters of the switch port to each device)"
_BINDING = "binding conditions (Kubernetes >= 1.36, or the DRADeviceBindingConditions gate)"


def _seconds(help: str, group: str) -> Setting:
    return Setting(help, group, metavar="SECONDS", check=positive_seconds)


class ControllerSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    manager_url: Annotated[
        str | None,
        Setting(
            "the fabric manager's base URL, e.g. http://fabric-dra-manager:8080 (or --manager, once "
            "per Redfish service)",
            _MANAGER,
        ),
    ] = None
    managers: Annotated[
        dict[str, str],
        Setting(
            "one fabric manager per Redfish service, again and again (pcie=https://…); each one's "
            "pools are published apart, a pool two report stays with the one listed first "
            "(--manager-url's before them all)",
            _MANAGER,
            flag="--manager",
            metavar="NAME=URL",
        ),
    ] = Field(default_factory=dict)
    manager_token_files: Annotated[
        dict[str, Path],
        Setting(
            "a named manager's own bearer token file (default: --manager-token-file)",
            _MANAGER,
            metavar="NAME=FILE",
        ),
    ] = Field(default_factory=dict)
    manager_ca_files: Annotated[
        dict[str, Path],
        Setting(
            "a named manager's own CA bundle (default: --manager-ca-file)", _MANAGER, metavar="NAME=FILE"
        ),
    ] = Field(default_factory=dict)
    manager_down_grace: Annotated[
        float,
        _seconds(
            "after a manager's inventory has been unreadable this long, its pools' devices are "
            "tainted fabric-unavailable (or withheld); the other managers' pools are untouched",
            _MANAGER,
        ),
    ] = Field(default=30.0, gt=0)
    manager_token_file: Annotated[
        Path | None,
        Setting(
            "file holding the bearer token for the manager (re-read every minute: projected "
            "service-account tokens rotate); the manager must grant it the controller role",
            _MANAGER,
        ),
    ] = None
    manager_ca_file: Annotated[
        Path | None, Setting("CA bundle to verify the manager's TLS certificate", _MANAGER)
    ] = None
    manager_insecure: Annotated[
        bool, Setting("do not verify the manager's TLS certificate (development only)", _MANAGER)
    ] = False
    # Not $KUBECONFIG: the client tries the in-cluster service account first, then $KUBECONFIG.
    kubeconfig: Annotated[
        str | None,
        Setting(
            "kubeconfig file (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config)",
            _KUBE,
            env="",
        ),
    ] = None
    driver_name: Annotated[
        str, Setting("DRA driver name written into slices, attributes and conditions", _KUBE)
    ] = DEFAULT_DRIVER_NAME
    publisher: Annotated[
        str,
        Setting(
            "name of this controller among several that publish one driver (one per fabric manager); "
            "it owns only the slices and node labels it wrote",
            _KUBE,
        ),
    ] = "default"
    leader_elect: Annotated[
        bool,
        Setting(
            "elect one writer among replicas through a coordination.k8s.io Lease (use with >1 replica)", _KUBE
        ),
    ] = False
    lease_name: Annotated[str, Setting("name of the Lease", _KUBE)] = "fabric-dra-controller"
    lease_namespace: Annotated[
        str | None,
        Setting("namespace of the Lease (default: the kubeconfig's namespace)", _KUBE, env="POD_NAMESPACE"),
    ] = None
    plugin_pod_selector: Annotated[
        str | None,
        Setting(
            "label selector of the kubelet plugin's pods (e.g. app.kubernetes.io/component=plugin): "
            "label a node for a pool only while one of them is Ready on it (default: every node the "
            "fabric reaches)",
            _KUBE,
        ),
    ] = None
    plugin_namespace: Annotated[
        str | None,
        Setting(
            "namespace of the plugin's pods (default: the kubeconfig's namespace)", _KUBE, env="POD_NAMESPACE"
        ),
    ] = None
    identity: Annotated[
        str | None,
        Setting("this replica's identity in the Lease (default: hostname-pid)", _KUBE, env="POD_NAME"),
    ] = None
    device_taints: Annotated[
        TaintsMode,
        Setting(
            "unhealthy devices get a NoSchedule taint (on) or are withheld from the slices (off); "
            "auto: taint when the API server keeps a taint on a dry-run write",
            _PUBLISH,
        ),
    ] = "auto"
    binds_to_node: Annotated[
        TaintsMode,
        Setting(
            "publish devices with bindsToNode, so pods sharing a claim all run on the node it was "
            "allocated for; auto: when the API server keeps the field on a dry-run write",
            _PUBLISH,
        ),
    ] = "auto"
    drain_taints: Annotated[
        Literal["auto", "rules", "slices"],
        Setting(
            "how drained devices are tainted: one DeviceTaintRule per drained device (rules), or a "
            "taint in the driver's own slices (slices); auto: rules where the API server serves "
            "devicetaintrules, else slices",
            _PUBLISH,
        ),
    ] = "auto"
    inventory_feed: Annotated[
        FeedMode,
        Setting(
            "how the manager's inventory is followed: changes (read it whole once, then only the "
            "devices that change; whole again when the manager can no longer say what changed) or "
            "full (read it whole on every change, for a manager without the change feed)",
            _MANAGER,
        ),
    ] = "changes"
    resync_period: Annotated[
        float,
        _seconds(
            "re-read every slice from the API server this often and repair drift; an unchanged pool "
            "costs no write",
            _PUBLISH,
        ),
    ] = Field(default=300.0, gt=0)
    binding_conditions: Annotated[
        bool,
        Setting(
            "publish devices with bindsToNode and the binding conditions <driver>/Attached and "
            "<driver>/AttachFailed, and attach each allocated device before the pod is bound",
            _BINDING,
        ),
    ] = False
    quarantine_after: Annotated[
        int,
        Setting(
            "take a device out of allocation (attach-failed taint, or withheld) after N consecutive "
            "failed attaches, or one that retrying cannot cure",
            _BINDING,
            metavar="N",
        ),
    ] = 3
    quarantine_seconds: Annotated[
        float,
        _seconds(
            "how long a failing device stays out of allocation; doubles each time it is taken out "
            "again, up to an hour; a successful attach ends it",
            _BINDING,
        ),
    ] = Field(default=60.0, gt=0)
    bind_timeout: Annotated[
        float,
        _seconds(
            "after this long without a finished attach, report AttachFailed so the scheduler picks "
            "again (the scheduler itself gives up after 600)",
            _BINDING,
        ),
    ] = Field(default=300.0, gt=0)
    busy_timeout: Annotated[
        float,
        _seconds(
            "how long a device may stay busy (held by another claim or node) before AttachFailed", _BINDING
        ),
    ] = Field(default=30.0, gt=0)
    release_grace: Annotated[
        float,
        _seconds(
            "after an attached device's allocation is gone, wait this long for the node plugin's own "
            "detach before detaching it here",
            _BINDING,
        ),
    ] = Field(default=30.0, gt=0)
    link_taint_effect: Annotated[
        Literal["NoSchedule", "NoExecute", "None"],
        Setting(
            "effect of the <driver>/link-errors taint: NoSchedule keeps new claims away; NoExecute also "
            "evicts the pods using the device (only by choice: never evict on a counter by default); "
            "None only shows it (Kubernetes >= 1.35)",
            _LINKS,
        ),
    ] = "NoSchedule"
    link_correctable_per_minute: Annotated[
        float,
        Setting(
            "correctable errors a minute a link may have; more, sustained, taints it", _LINKS, metavar="N"
        ),
    ] = Field(default=10.0, gt=0)
    link_window_seconds: Annotated[
        float, _seconds("the window the correctable rate is measured over", _LINKS)
    ] = Field(default=60.0, gt=0)
    link_sustain_seconds: Annotated[
        float,
        Setting(
            "how long the correctable rate must stay above the allowed one before the device is "
            "tainted (0: at once); a fatal or non-fatal error taints at once",
            _LINKS,
            metavar="SECONDS",
        ),
    ] = Field(default=300.0, ge=0)
    link_recover_seconds: Annotated[
        float,
        _seconds("hold-down: the taint is lifted once the link has been without a fault this long", _LINKS),
    ] = Field(default=600.0, gt=0)
    host: Annotated[str, Setting("address for /healthz, /readyz, /metrics, /status", _PROBES)] = "0.0.0.0"  # noqa: S104 - kubelet probes reach the pod IP
    port: Annotated[int, Setting("port for the same (0 picks a free one)", _PROBES)] = Field(
        default=8081, ge=0, le=65535
    )
    ready_file: Annotated[
        Path | None,
        Setting("once running, write the probe endpoint's URL to this file (atomically)", _PROBES),
    ] = None

    @model_validator(mode="after")
    def _one_error_never_taints(self) -> ControllerSettings:
        if self.link_thresholds().allowed_in_window < 1:
            raise ValueError(
                "--link-correctable-per-minute * --link-window-seconds / 60 must be at least 1: "
                "one correctable error must never taint a device"
            )
        return self

    def link_thresholds(self) -> ErrorThresholds:
        """The thresholds of the link-errors taint (:mod:`dra_driver.linkerrors`)."""
        return ErrorThresholds(
            correctable_per_minute=self.link_correctable_per_minute,
            window_seconds=self.link_window_seconds,
            sustain_seconds=self.link_sustain_seconds,
            recover_seconds=self.link_recover_seconds,
        )

    @field_validator("manager_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http:// or https:// URL")
        return value

    @model_validator(mode="after")
    def _some_manager(self) -> ControllerSettings:
        problem = managers_problem(self.manager_url, self.managers)
        if problem is not None:
            raise ValueError(problem)
        for name in self.managers:
            if not is_label_value(publisher_of(self.publisher, name)):
                raise ValueError(
                    f"--publisher {self.publisher} with --manager {name}: the publisher name of its slices, "
                    f"{publisher_of(self.publisher, name)}, must be a label value (≤ 63 characters)"
                )
        unknown = sorted((set(self.manager_token_files) | set(self.manager_ca_files)) - set(self.managers))
        if unknown:
            raise ValueError(f"token or CA file for a manager not given with --manager: {', '.join(unknown)}")
        return self

    def endpoints(self) -> list[ManagerEndpoint]:
        """Every manager, in the order that decides a pool's owner."""
        return endpoints_of(
            self.manager_url,
            self.managers,
            token_file=self.manager_token_file,
            ca_file=self.manager_ca_file,
            token_files=self.manager_token_files,
            ca_files=self.manager_ca_files,
        )

    @field_validator("driver_name")
    @classmethod
    def _driver_name(cls, value: str) -> str:
        if not is_driver_name(value):
            raise ValueError("must be a lowercase DNS subdomain of at most 63 characters")
        return value

    @field_validator("publisher")
    @classmethod
    def _publisher(cls, value: str) -> str:
        if not value or not is_label_value(value):
            raise ValueError("must be a label value (letters, digits, '-', '_', '.'; ≤ 63)")
        return value

    @field_validator("manager_token_file")
    @classmethod
    def _token_file_exists(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError("no such file")
        return value
