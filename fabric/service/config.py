"""The manager's configuration: flags and the Redfish credentials, validated in one place.

Every setting of ``fabric-dra manager serve`` is a field of :class:`ManagerSettings` with a
:class:`~plumbing.settings.Setting` in its ``Annotated`` metadata (or a field of a nested settings
model named by a :class:`~plumbing.settings.Section`), declared nowhere else: :mod:`plumbing.settings`
derives from it the flag, the environment variable (``FABRIC_DRA_<FLAG_NAME>``; ``POD_NAME`` from the
downward API) and the key of the ``--config`` file (flag > environment > file > default).

Redfish credentials come from ``--redfish-credentials-file`` — a YAML/JSON file
``{"username": ..., "password": ...}`` (the emulator writes one in its state dir), or a directory
holding ``username`` and ``password`` files (a Kubernetes Secret mounted as a volume) — or from the
environment (``FABRIC_DRA_REDFISH_USERNAME`` / ``FABRIC_DRA_REDFISH_PASSWORD``). The password is a
:class:`pydantic.SecretStr` from the moment it is read: it prints as ``**********``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from fabric.backends.discovery import BindingPlan
from fabric.bindings.attribution import DEFAULT_VALUES_MAX, check_label_key
from fabric.bindings.trees import TreeRootLabel
from fabric.bindings.warm_policy import WarmSettings
from fabric.driver.settings import OperationSettings
from fabric.errors import ConfigError
from fabric.redfish.client import RedfishSettings
from fabric.state.ledger import DEFAULT_MAX_ENTRIES_PER_NODE
from manager_api.devices import BindingStyle, spoken_list
from plumbing.names import DNS1123_SUBDOMAIN_MAX_LENGTH, DNS1123_SUBDOMAIN_PATTERN
from plumbing.settings import OptionKind, Section, Setting, SettingOption, settings_options

__all__ = [
    "ENV_PASSWORD",
    "ENV_USERNAME",
    "FlagKind",
    "ManagerSettings",
    "RedfishCredentials",
    "load_credentials",
    "manager_flags",
]

ENV_USERNAME = "FABRIC_DRA_REDFISH_USERNAME"
ENV_PASSWORD = "FABRIC_DRA_REDFISH_PASSWORD"  # noqa: S105 - the variable's name, not a password


class RedfishCredentials(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    username: str = Field(min_length=1)
    password: SecretStr


def load_credentials(
    path: Path | None, environ: Mapping[str, str] | None = None
) -> RedfishCredentials | None:
    """The Redfish credentials, or None when none are configured. Errors never echo the secret."""
    env = os.environ if environ is None else environ
    if path is None:
        if env.get(ENV_USERNAME):
            return RedfishCredentials(
                username=env[ENV_USERNAME], password=SecretStr(env.get(ENV_PASSWORD, ""))
            )
        return None
    try:
        if path.is_dir():
            raw: object = {
                "username": (path / "username").read_text().strip(),
                "password": (path / "password").read_text().strip(),
            }
        else:
            raw = yaml.safe_load(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read Redfish credentials {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise ConfigError(f"Redfish credentials {path} are not YAML/JSON") from None
    try:
        return RedfishCredentials.model_validate(raw)
    except ValidationError as err:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) or "file" for e in err.errors())
        raise ConfigError(
            f"Redfish credentials {path}: missing or invalid {fields} (need username and password)"
        ) from None


def _label_key_flag(text: str) -> str:
    """``--attribution-label``'s check as the parser reads it: a usage error in one line."""
    try:
        return check_label_key(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: the argument groups of ``fabric-dra manager serve --help``, in the order they are shown
REDFISH, FABRIC, STATE, ACCOUNTING, AUTH, LISTENER = (
    "Redfish service",
    "fabric",
    "state and cluster",
    "accounting",
    "authentication",
    "listener",
)
_OPERATORS = "fabric-dra:operators"


class ManagerSettings(BaseModel):
    """Everything ``fabric-dra manager serve`` was told: each field with a ``Setting`` (or a
    ``Section`` of them) is one setting of its command line, environment and settings file."""

    model_config = ConfigDict(extra="forbid")

    redfish_credentials_file: Annotated[Path | None, Setting(group=REDFISH)] = Field(
        default=None,
        description="YAML/JSON file {username, password}, or a mounted Secret directory with username and "
        f"password files; without it, the variables {ENV_USERNAME} and "
        f"{ENV_PASSWORD.removeprefix('FABRIC_DRA_REDFISH')}",
    )
    redfish: Annotated[
        RedfishSettings,
        Section(
            {
                "base_url": Setting(
                    group=REDFISH,
                    flag="--redfish-url",
                    help="scheme://host[:port] of the Redfish fabric service",
                ),
                "ca_file": Setting(
                    group=REDFISH, help="CA bundle that signs the Redfish service's certificate"
                ),
                "insecure": Setting(
                    group=REDFISH, help="do not verify the Redfish service's TLS certificate (dev)"
                ),
                "auth": Setting(
                    group=REDFISH,
                    help="Redfish authentication: a session (X-Auth-Token, re-created when it expires), "
                    "HTTP Basic, or none",
                ),
                "connect_timeout": Setting(group=REDFISH, help="seconds to connect"),
                "read_timeout": Setting(
                    group=REDFISH, flag="--redfish-timeout", help="seconds to wait for each answer"
                ),
                "get_attempts": Setting(group=REDFISH, help="tries per GET (mutations: always one)"),
                "max_workers": Setting(
                    group=REDFISH, flag="--redfish-concurrency", help="Redfish requests in flight at most"
                ),
            },
            prefix="redfish",
        ),
    ]
    fabric_name: Annotated[str, Setting(group=FABRIC)] = Field(
        default="fabric", description="name of this fabric service; pools are <fabric-name>-<fabric id>"
    )
    binding: Annotated[
        BindingPlan,
        Section(
            {
                "default": Setting(
                    group=FABRIC,
                    flag="--binding-style",
                    help="how devices are bound: auto (per fabric, from what the service offers), "
                    + spoken_list([s.value for s in BindingStyle]),
                ),
                "fabrics": Setting(
                    group=FABRIC,
                    flag="--fabric-binding",
                    metavar="FABRIC=STYLE",
                    help="binding style for one Redfish fabric Id (or Composition): auto, "
                    + ", ".join(s.value for s in BindingStyle)
                    + " or none (ignore it)",
                ),
            }
        ),
    ] = Field(default_factory=BindingPlan)
    node_map: Annotated[Path | None, Setting(group=FABRIC)] = Field(
        default=None,
        description="YAML/JSON {hosts: {<ComputerSystem Id|UUID|HostName>: <node>}}; else nodes are matched "
        "by system UUID, then by name",
    )
    resync_seconds: Annotated[float, Setting(group=FABRIC)] = Field(
        default=60.0, gt=0, description="full re-read while events flow"
    )
    poll_seconds: Annotated[float, Setting(group=FABRIC)] = Field(
        default=10.0, gt=0, description="full re-read while no event stream is up"
    )
    events: Annotated[
        bool, Setting(group=FABRIC, help="follow Redfish server-sent events (--no-events: poll only)")
    ] = True
    change_history_versions: Annotated[int, Setting(group=FABRIC)] = Field(
        default=1024,
        ge=1,
        description="inventory versions whose changed devices GET /api/v1/inventory/changes can answer; "
        "a consumer further behind reads the whole inventory again",
    )
    change_history_devices: Annotated[int, Setting(group=FABRIC)] = Field(
        default=65536,
        ge=1,
        description="device changes the change history holds in all (the oldest versions go first)",
    )
    binder: Annotated[
        OperationSettings,
        Section(
            {
                "operation_timeout": Setting(
                    group=FABRIC,
                    help="seconds one attach/detach keeps trying while the fabric is unreachable",
                ),
                "task_timeout": Setting(
                    group=FABRIC,
                    help="seconds a Redfish task may run before it is cancelled and the attach rolled back",
                ),
            }
        ),
    ] = Field(default_factory=OperationSettings)
    warm: Annotated[
        WarmSettings,
        Section(
            {
                "mode": Setting(
                    group=FABRIC,
                    help="warm pool: off; fixed (--warm-size devices per node); auto (sized from each "
                    "node's claim rate and the hot-add time, docs/manager.md)",
                ),
                "size": Setting(group=FABRIC, help="devices kept warm on each node the pool covers (fixed)"),
                "device_type": Setting(group=FABRIC, help="warm only devices of this type"),
                "model": Setting(
                    group=FABRIC,
                    help="warm only devices of this model (as the inventory names it); a model "
                    "the fabric lacks stops the manager at start with the list of its models",
                ),
                "nodes": Setting(
                    group=FABRIC,
                    flag="--warm-node",
                    metavar="PATTERN",
                    help="warm only on nodes whose name matches this glob (default: every node)",
                ),
                "interval_seconds": Setting(group=FABRIC, help="how often the pool is brought to its target"),
                "epsilon": Setting(group=FABRIC, help="probability of a cold start the auto size allows"),
                "max_per_model": Setting(
                    group=FABRIC, help="warm devices of one model at most, over all nodes (auto)"
                ),
                "min_per_model": Setting(group=FABRIC),
                "idle_ttl_seconds": Setting(
                    group=FABRIC,
                    help="a node's warm devices of a model go after this long without a claim (auto)",
                ),
                "rate_half_life_seconds": Setting(
                    group=FABRIC, help="half-life of the weighting of the claim arrival rate (auto)"
                ),
                "size_by": Setting(
                    group=FABRIC,
                    help="auto: one pool per device model (claims ask for a model), or per device type "
                    "(claims take any model of the type)",
                ),
                "scope": Setting(
                    group=FABRIC,
                    help="auto: size the pool of each reachability group from its nodes' summed claim "
                    "rate and place it by their shares (group), or each node from its own rate (node)",
                ),
            },
            prefix="warm",
        ),
    ] = Field(default_factory=WarmSettings)
    state_dir: Annotated[Path | None, Setting(group=STATE)] = Field(
        default=None, description="directory of the ledger file (ledger.json)"
    )
    ledger: Annotated[Literal["file", "configmap"], Setting(group=STATE)] = Field(
        default="file", description="where the ledger lives"
    )
    ledger_name: Annotated[str, Setting(group=STATE)] = Field(
        default="fabric-dra-manager-ledger",
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        max_length=DNS1123_SUBDOMAIN_MAX_LENGTH,
        description="name of the ledger: its entries are the ConfigMaps <name>-<device> (a ConfigMap "
        "of this name is an earlier release's ledger, migrated at start)",
    )
    max_bindings_per_node: Annotated[int, Setting(group=STATE)] = Field(
        default=DEFAULT_MAX_ENTRIES_PER_NODE,
        ge=1,
        description="devices one node may hold (bound or in flight); its further attaches are refused",
    )
    kubeconfig: Annotated[str | None, Setting(group=STATE)] = Field(
        default=None, description="kubeconfig of the cluster (default: in-cluster when run in a pod)"
    )
    #: not a flag: true when run in a pod (``KUBERNETES_SERVICE_HOST``) without ``--kubeconfig``
    in_cluster: bool = False
    namespace: Annotated[str | None, Setting(group=STATE)] = Field(
        default=None, description="namespace of the Lease and ledger ConfigMap (default: the pod's)"
    )
    leader_elect: Annotated[bool, Setting(group=STATE)] = Field(
        default=False, description="run as one of several replicas (Lease)"
    )
    orphan_grace_seconds: Annotated[float, Setting(group=STATE)] = Field(
        default=600.0,
        ge=0,
        description="detach a device fabric-dra bound once no claim (existing, allocating it, reserved or "
        "waiting on binding conditions) and no plugin report has explained it for this long; "
        "0 turns orphan detaching off",
    )
    orphan_interval_seconds: Annotated[float, Setting(group=STATE)] = Field(
        default=60.0, gt=0, description="how often bindings are checked"
    )
    orphaned_trees: Annotated[Literal["off", "report", "release"], Setting(group=STATE)] = Field(
        default="report",
        description="claims whose agent tree's root is gone and that no pod uses: report them (metric, "
        "Event, status), also release their bindings, or do nothing (docs/manager.md, orphaned agent trees)",
    )
    orphaned_tree_grace_seconds: Annotated[float, Setting(group=STATE)] = Field(
        default=600.0,
        ge=0,
        description="how long a claim's pods must be gone, or stuck Terminating since their deletion, "
        "before its tree counts as orphaned",
    )
    tree_root_label: Annotated[str | None, Setting(group=STATE)] = Field(
        default=None,
        description="KEY=apiVersion/Kind: claims labelled KEY belong to the tree whose root is the object of "
        "that kind named by the label's value (e.g. agents.example.com/tree=batch/v1/Job); without it, "
        "trees are found by the claims' owner references",
    )
    plugin_report_ttl_seconds: Annotated[float, Setting(group=STATE)] = Field(
        default=90.0,
        gt=0,
        description="a plugin's report of its prepared claims counts this long (plugins report every 30 s)",
    )
    lease_name: Annotated[str, Setting(group=STATE)] = Field(
        default="fabric-dra-manager", description="coordination.k8s.io Lease name"
    )
    identity: Annotated[str | None, Setting(group=STATE, env="POD_NAME")] = Field(
        default=None, description="this replica's identity in the Lease (default: hostname-pid)"
    )
    lease_duration: Annotated[float, Setting(group=STATE)] = Field(
        default=15.0, gt=0, description="seconds a Lease holds without renewal"
    )
    renew_deadline: Annotated[float, Setting(group=STATE)] = Field(
        default=10.0, gt=0, description="seconds the leader may fail renewing before it steps down"
    )
    retry_period: Annotated[float, Setting(group=STATE)] = Field(
        default=2.0, gt=0, description="seconds between Lease renewals and attempts"
    )
    attribution_labels: Annotated[
        list[str], Setting(group=ACCOUNTING, flag="--attribution-label", metavar="KEY", check=_label_key_flag)
    ] = Field(
        default_factory=list,
        description="a ResourceClaim label key device-seconds are also counted by (repeatable; "
        "fabric-dra usage --by label:KEY, the FOCUS export's Tags)",
    )
    attribution_values_max: Annotated[int, Setting(group=ACCOUNTING)] = Field(
        default=DEFAULT_VALUES_MAX,
        ge=1,
        le=10000,
        description="values of each attribution label kept (the top N by device-seconds), the rest "
        "reported as other (logged once when capped)",
    )
    price_list: Annotated[Path | None, Setting(group=ACCOUNTING)] = Field(
        default=None,
        description="YAML {currency: USD, models: {<model>: {perHour: 2.5}}}: the prices of the FOCUS "
        "export (per device-hour; memory pools per GiB-hour)",
    )
    static_tokens: Annotated[Path | None, Setting(group=AUTH)] = Field(
        default=None,
        description="YAML/JSON {tokens: [{token, role: plugin|controller|operator|metrics, node}]} for "
        "local runs",
    )
    metrics_token_file: Annotated[Path | None, Setting(group=AUTH)] = Field(
        default=None,
        description="file holding the bearer token that may read /metrics and nothing else (a Secret "
        "the scraper presents too); re-read when it changes, no such token while it is missing",
    )
    insecure_no_auth: Annotated[bool, Setting(group=AUTH)] = Field(
        default=False, description="accept every request without a token (development only)"
    )
    plugin_accounts: Annotated[
        list[str], Setting(group=AUTH, flag="--plugin-service-account", metavar="NS:NAME")
    ] = Field(
        default_factory=list,
        description="service account of the node plugins (default <namespace>:fabric-dra-plugin)",
    )
    controller_accounts: Annotated[
        list[str], Setting(group=AUTH, flag="--controller-service-account", metavar="NS:NAME")
    ] = Field(
        default_factory=list,
        description="service account of the controller (default <namespace>:fabric-dra-controller)",
    )
    operator_groups: Annotated[list[str], Setting(group=AUTH, flag="--operator-group", metavar="GROUP")] = (
        Field(
            default_factory=lambda: [_OPERATORS],
            description="Kubernetes group with read access",
        )
    )
    operator_users: Annotated[list[str], Setting(group=AUTH, flag="--operator-user", metavar="USER")] = Field(
        default_factory=list, description="user with read access"
    )
    token_audiences: Annotated[list[str], Setting(group=AUTH, flag="--token-audience")] = Field(
        default_factory=list, description="audience the tokens must carry"
    )
    host: Annotated[str, Setting(group=LISTENER)] = Field(
        default="127.0.0.1", description="address to listen on (0.0.0.0 in a pod)"
    )
    port: Annotated[int, Setting(group=LISTENER)] = Field(
        default=8080, ge=0, le=65535, description="port to listen on; 0 picks a free one"
    )
    ready_file: Annotated[Path | None, Setting(group=LISTENER)] = Field(
        default=None, description="write the base URL here once accepting connections"
    )
    max_connections: Annotated[int, Setting(group=LISTENER)] = Field(
        default=1024,
        ge=1,
        description="open client connections beyond which requests are answered 503 (each node's plugin "
        "keeps one long poll open: allow a few per node)",
    )
    tls_cert: Annotated[Path | None, Setting(group=LISTENER)] = Field(
        default=None, description="serve HTTPS with this certificate (PEM)"
    )
    tls_key: Annotated[Path | None, Setting(group=LISTENER)] = Field(
        default=None, description="private key of --tls-cert (PEM)"
    )

    @field_validator("attribution_labels")
    @classmethod
    def _label_keys(cls, keys: list[str]) -> list[str]:
        """The same check for keys from the environment or a --config file."""
        return [check_label_key(key) for key in keys]

    @field_validator("tree_root_label")
    @classmethod
    def _tree_root_label(cls, text: str | None) -> str | None:
        if text is not None:
            TreeRootLabel.parse(text)  # ValueError in one line
        return text

    @property
    def uses_kube(self) -> bool:
        return self.kubeconfig is not None or self.in_cluster

    def problems(self) -> list[str]:
        """What is wrong with this configuration, one clear line each."""
        found = []
        if self.ledger == "file" and self.state_dir is None:
            found.append("give --state-dir DIR for the ledger file, or --ledger configmap in a cluster")
        if self.ledger == "configmap" and not self.uses_kube:
            found.append("--ledger configmap needs Kubernetes API access (--kubeconfig, or run in a pod)")
        if self.leader_elect and not self.uses_kube:
            found.append("--leader-elect needs Kubernetes API access (--kubeconfig, or run in a pod)")
        if not self.insecure_no_auth and self.static_tokens is None and not self.uses_kube:
            found.append(
                "refusing to start without authentication: give --static-tokens FILE, or Kubernetes API "
                "access for TokenReview (--kubeconfig, or run in a pod), or --insecure-no-auth for local "
                "development"
            )
        if self.leader_elect and not self.retry_period < self.renew_deadline < self.lease_duration:
            found.append("need --retry-period < --renew-deadline < --lease-duration")
        if (self.tls_cert is None) != (self.tls_key is None):
            found.append("--tls-cert and --tls-key go together")
        return found


def manager_flags() -> list[SettingOption]:
    """The options of ``fabric-dra manager serve``, in the order ``--help`` shows them."""
    return settings_options(ManagerSettings)


#: the kinds of :func:`manager_flags`' options, under the name they had here
FlagKind = OptionKind
