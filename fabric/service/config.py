"""The manager's configuration: flags and the Redfish credentials, validated in one place.

Each option of ``fabric-dra manager serve`` is a field of :class:`ManagerSettings` with a :class:`Flag`
in its ``Annotated`` metadata (or a field of a nested settings model named by a :class:`Section`);
:func:`manager_flags` derives the options from them, and :mod:`fabric.commands.cli` builds its parser and the
settings from those.

Redfish credentials come from ``--redfish-credentials-file`` — a YAML/JSON file
``{"username": ..., "password": ...}`` (the emulator writes one in its state dir), or a directory
holding ``username`` and ``password`` files (a Kubernetes Secret mounted as a volume) — or from the
environment (``FABRIC_DRA_REDFISH_USERNAME`` / ``FABRIC_DRA_REDFISH_PASSWORD``). The password is a
:class:`pydantic.SecretStr` from the moment it is read: it prints as ``**********``.
"""

from __future__ import annotations

import dataclasses
import os
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from fabric.backends.discovery import BindingPlan
from fabric.bindings.warm_policy import WarmSettings
from fabric.driver.settings import OperationSettings
from fabric.errors import ConfigError
from fabric.redfish.client import RedfishSettings
from fabric.state.ledger import DEFAULT_MAX_ENTRIES_PER_NODE
from manager_api.devices import BindingStyle, spoken_list
from plumbing.names import DNS1123_SUBDOMAIN_MAX_LENGTH, DNS1123_SUBDOMAIN_PATTERN

__all__ = [
    "ENV_PASSWORD",
    "ENV_USERNAME",
    "Flag",
    "FlagKind",
    "FlagSpec",
    "ManagerSettings",
    "RedfishCredentials",
    "Section",
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


#: the argument groups of ``fabric-dra manager serve --help``, in the order they are shown
REDFISH, FABRIC, STATE, AUTH, LISTENER = (
    "Redfish service",
    "fabric",
    "state and cluster",
    "authentication",
    "listener",
)
GROUPS = (REDFISH, FABRIC, STATE, AUTH, LISTENER)
_OPERATORS = "fabric-dra:operators"
_ENV_PREFIX = "FABRIC_DRA_REDFISH"


@dataclass(frozen=True, slots=True)
class Flag:
    """How a settings field is given on the command line (``Annotated`` metadata of the field).

    The option is ``--<field-name>`` unless ``name`` says otherwise; its type, default and choices
    are the field's; its help is the field's description unless ``help`` says otherwise (fields of
    nested settings declared elsewhere). ``{env}`` in the help is the environment variable that
    gives the default. A bool field that defaults to True is turned off by ``--no-<field-name>``; a
    list is repeatable; a dict takes repeatable ``KEY=VALUE`` items.
    """

    group: str
    name: str | None = None
    help: str | None = None
    env: str | None = None
    metavar: str | None = None


@dataclass(frozen=True, slots=True)
class Section:
    """Nested settings whose fields are flags too: field name → :class:`Flag`, in the order shown."""

    flags: Mapping[str, Flag]
    #: option prefix of the fields without a ``name`` (``redfish`` → ``--redfish-ca-file``)
    prefix: str = ""


class FlagKind(StrEnum):
    VALUE = "value"  # --flag VALUE
    SWITCH = "switch"  # --flag sets True
    NEGATED = "negated"  # --no-flag sets False
    REPEATED = "repeated"  # --flag VALUE, again and again: a list
    PAIRS = "pairs"  # --flag KEY=VALUE, again and again: a dict


@dataclass(frozen=True, slots=True)
class FlagSpec:
    """One command-line option, derived from a settings field."""

    path: tuple[str, ...]  # the field, within ManagerSettings (nested sections first)
    option: str
    group: str
    kind: FlagKind
    help: str
    default: Any
    required: bool
    env: str | None
    metavar: str | None
    #: a plain type argparse converts to (str, int, float, Path), or None for strings
    type: type | None
    #: the values allowed (for PAIRS: of the VALUE part)
    choices: tuple[str, ...] | None

    @property
    def dest(self) -> str:
        """The parsed value's name (argparse's, so ``--help`` shows ``--redfish-url REDFISH_URL``)."""
        return self.option.removeprefix("--").replace("-", "_")


class ManagerSettings(BaseModel):
    """Everything ``fabric-dra manager serve`` was told: each field with a :class:`Flag` is one option
    of its command line (:func:`manager_flags`), declared nowhere else."""

    model_config = ConfigDict(extra="forbid")

    redfish_credentials_file: Annotated[
        Path | None, Flag(REDFISH, env="FABRIC_DRA_REDFISH_CREDENTIALS_FILE")
    ] = Field(
        default=None,
        description="YAML/JSON file {username, password}, or a mounted Secret directory with username and "
        f"password files (env {{env}}; or {ENV_USERNAME}/{ENV_PASSWORD.removeprefix('FABRIC_DRA_REDFISH')})",
    )
    redfish: Annotated[
        RedfishSettings,
        Section(
            {
                "base_url": Flag(
                    REDFISH,
                    name="--redfish-url",
                    env="FABRIC_DRA_REDFISH_URL",
                    help="scheme://host[:port] of the Redfish fabric service (env {env})",
                ),
                "ca_file": Flag(REDFISH, help="CA bundle that signs the Redfish service's certificate"),
                "insecure": Flag(REDFISH, help="do not verify the Redfish service's TLS certificate (dev)"),
                "auth": Flag(
                    REDFISH,
                    help="Redfish authentication: a session (X-Auth-Token, re-created when it expires), "
                    "HTTP Basic, or none",
                ),
                "connect_timeout": Flag(REDFISH, help="seconds to connect"),
                "read_timeout": Flag(
                    REDFISH, name="--redfish-timeout", help="seconds to wait for each answer"
                ),
                "get_attempts": Flag(REDFISH, help="tries per GET (mutations: always one)"),
                "max_workers": Flag(
                    REDFISH, name="--redfish-concurrency", help="Redfish requests in flight at most"
                ),
            },
            prefix="redfish",
        ),
    ]
    fabric_name: Annotated[str, Flag(FABRIC)] = Field(
        default="fabric", description="name of this fabric service; pools are <fabric-name>-<fabric id>"
    )
    binding: Annotated[
        BindingPlan,
        Section(
            {
                "default": Flag(
                    FABRIC,
                    name="--binding-style",
                    help="how devices are bound: auto (per fabric, from what the service offers), "
                    + spoken_list([s.value for s in BindingStyle]),
                ),
                "fabrics": Flag(
                    FABRIC,
                    name="--fabric-binding",
                    metavar="FABRIC=STYLE",
                    help="binding style for one Redfish fabric Id (or Composition): auto, "
                    + ", ".join(s.value for s in BindingStyle)
                    + " or none (ignore it); repeatable",
                ),
            }
        ),
    ] = Field(default_factory=BindingPlan)
    node_map: Annotated[Path | None, Flag(FABRIC)] = Field(
        default=None,
        description="YAML/JSON {hosts: {<ComputerSystem Id|UUID|HostName>: <node>}}; else nodes are matched "
        "by system UUID, then by name",
    )
    resync_seconds: Annotated[float, Flag(FABRIC)] = Field(
        default=60.0, gt=0, description="full re-read while events flow"
    )
    poll_seconds: Annotated[float, Flag(FABRIC)] = Field(
        default=10.0, gt=0, description="full re-read while no event stream is up"
    )
    events: Annotated[bool, Flag(FABRIC, help="do not follow Redfish server-sent events; poll only")] = True
    binder: Annotated[
        OperationSettings,
        Section(
            {
                "operation_timeout": Flag(
                    FABRIC, help="seconds one attach/detach keeps trying while the fabric is unreachable"
                ),
                "task_timeout": Flag(
                    FABRIC,
                    help="seconds a Redfish task may run before it is cancelled and the attach rolled back",
                ),
            }
        ),
    ] = Field(default_factory=OperationSettings)
    warm: Annotated[
        WarmSettings,
        Section(
            {
                "mode": Flag(
                    FABRIC,
                    help="warm pool: off; fixed (--warm-size devices per node); auto (sized from each "
                    "node's claim rate and the hot-add time, docs/manager.md)",
                ),
                "size": Flag(FABRIC, help="devices kept warm on each node the pool covers (fixed)"),
                "device_type": Flag(FABRIC, help="warm only devices of this type"),
                "model": Flag(
                    FABRIC,
                    help="warm only devices of this model (as the inventory names it); a model "
                    "the fabric lacks stops the manager at start with the list of its models",
                ),
                "nodes": Flag(
                    FABRIC,
                    name="--warm-node",
                    metavar="PATTERN",
                    help="warm only on nodes whose name matches this glob (default: every node); repeatable",
                ),
                "interval_seconds": Flag(FABRIC, help="how often the pool is brought to its target"),
                "epsilon": Flag(FABRIC, help="probability of a cold start the auto size allows"),
                "max_per_model": Flag(
                    FABRIC, help="warm devices of one model at most, over all nodes (auto)"
                ),
                "min_per_model": Flag(FABRIC),
                "idle_ttl_seconds": Flag(
                    FABRIC, help="a node's warm devices of a model go after this long without a claim (auto)"
                ),
                "rate_half_life_seconds": Flag(
                    FABRIC, help="half-life of the weighting of the claim arrival rate (auto)"
                ),
                "size_by": Flag(
                    FABRIC,
                    help="auto: one pool per device model (claims ask for a model), or per device type "
                    "(claims take any model of the type)",
                ),
                "scope": Flag(
                    FABRIC,
                    help="auto: size the pool of each reachability group from its nodes' summed claim "
                    "rate and place it by their shares (group), or each node from its own rate (node)",
                ),
            },
            prefix="warm",
        ),
    ] = Field(default_factory=WarmSettings)
    state_dir: Annotated[Path | None, Flag(STATE)] = Field(
        default=None, description="directory of the ledger file (ledger.json)"
    )
    ledger: Annotated[Literal["file", "configmap"], Flag(STATE)] = Field(
        default="file", description="where the ledger lives"
    )
    ledger_name: Annotated[str, Flag(STATE)] = Field(
        default="fabric-dra-manager-ledger",
        pattern=DNS1123_SUBDOMAIN_PATTERN,
        max_length=DNS1123_SUBDOMAIN_MAX_LENGTH,
        description="name of the ledger: its entries are the ConfigMaps <name>-<device> (a ConfigMap "
        "of this name is an earlier release's ledger, migrated at start)",
    )
    max_bindings_per_node: Annotated[int, Flag(STATE)] = Field(
        default=DEFAULT_MAX_ENTRIES_PER_NODE,
        ge=1,
        description="devices one node may hold (bound or in flight); its further attaches are refused",
    )
    kubeconfig: Annotated[str | None, Flag(STATE)] = Field(
        default=None, description="kubeconfig of the cluster (default: in-cluster when run in a pod)"
    )
    #: not a flag: true when run in a pod (``KUBERNETES_SERVICE_HOST``) without ``--kubeconfig``
    in_cluster: bool = False
    namespace: Annotated[str | None, Flag(STATE)] = Field(
        default=None, description="namespace of the Lease and ledger ConfigMap (default: the pod's)"
    )
    leader_elect: Annotated[bool, Flag(STATE)] = Field(
        default=False, description="run as one of several replicas (Lease)"
    )
    orphan_grace_seconds: Annotated[float, Flag(STATE)] = Field(
        default=600.0,
        ge=0,
        description="detach a device fabric-dra bound once no claim (existing, allocating it, reserved or "
        "waiting on binding conditions) and no plugin report has explained it for this long; "
        "0 turns orphan detaching off",
    )
    orphan_interval_seconds: Annotated[float, Flag(STATE)] = Field(
        default=60.0, gt=0, description="how often bindings are checked"
    )
    plugin_report_ttl_seconds: Annotated[float, Flag(STATE)] = Field(
        default=90.0,
        gt=0,
        description="a plugin's report of its prepared claims counts this long (plugins report every 30 s)",
    )
    lease_name: Annotated[str, Flag(STATE)] = Field(
        default="fabric-dra-manager", description="coordination.k8s.io Lease name"
    )
    identity: Annotated[str | None, Flag(STATE, env="POD_NAME")] = Field(
        default=None, description="this replica's identity in the Lease (default: ${env}, else hostname-pid)"
    )
    lease_duration: Annotated[float, Flag(STATE)] = Field(
        default=15.0, gt=0, description="seconds a Lease holds without renewal"
    )
    renew_deadline: Annotated[float, Flag(STATE)] = Field(
        default=10.0, gt=0, description="seconds the leader may fail renewing before it steps down"
    )
    retry_period: Annotated[float, Flag(STATE)] = Field(
        default=2.0, gt=0, description="seconds between Lease renewals and attempts"
    )
    static_tokens: Annotated[Path | None, Flag(AUTH)] = Field(
        default=None,
        description="YAML/JSON {tokens: [{token, role: plugin|controller|operator|metrics, node}]} for "
        "local runs",
    )
    metrics_token_file: Annotated[Path | None, Flag(AUTH)] = Field(
        default=None,
        description="file holding the bearer token that may read /metrics and nothing else (a Secret "
        "the scraper presents too); re-read when it changes, no such token while it is missing",
    )
    insecure_no_auth: Annotated[bool, Flag(AUTH)] = Field(
        default=False, description="accept every request without a token (development only)"
    )
    plugin_accounts: Annotated[list[str], Flag(AUTH, name="--plugin-service-account", metavar="NS:NAME")] = (
        Field(
            default_factory=list,
            description="service account of the node plugins (default <namespace>:fabric-dra-plugin); "
            "repeatable",
        )
    )
    controller_accounts: Annotated[
        list[str], Flag(AUTH, name="--controller-service-account", metavar="NS:NAME")
    ] = Field(
        default_factory=list,
        description="service account of the controller (default <namespace>:fabric-dra-controller); "
        "repeatable",
    )
    operator_groups: Annotated[list[str], Flag(AUTH, name="--operator-group", metavar="GROUP")] = Field(
        default_factory=lambda: [_OPERATORS],
        description=f"Kubernetes group with read access (default {_OPERATORS}); repeatable",
    )
    operator_users: Annotated[list[str], Flag(AUTH, name="--operator-user", metavar="USER")] = Field(
        default_factory=list, description="user with read access"
    )
    token_audiences: Annotated[list[str], Flag(AUTH, name="--token-audience")] = Field(
        default_factory=list, description="audience the tokens must carry"
    )
    host: Annotated[str, Flag(LISTENER)] = Field(
        default="127.0.0.1", description="address to listen on (0.0.0.0 in a pod)"
    )
    port: Annotated[int, Flag(LISTENER)] = Field(
        default=8080, ge=0, le=65535, description="port to listen on; 0 picks a free one"
    )
    ready_file: Annotated[Path | None, Flag(LISTENER)] = Field(
        default=None, description="write the base URL here once accepting connections"
    )
    max_connections: Annotated[int, Flag(LISTENER)] = Field(
        default=1024,
        ge=1,
        description="open client connections beyond which requests are answered 503 (each node's plugin "
        "keeps one long poll open: allow a few per node)",
    )
    tls_cert: Annotated[Path | None, Flag(LISTENER)] = Field(
        default=None, description="serve HTTPS with this certificate (PEM)"
    )
    tls_key: Annotated[Path | None, Flag(LISTENER)] = Field(
        default=None, description="private key of --tls-cert (PEM)"
    )

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


def manager_flags() -> list[FlagSpec]:
    """The options of ``fabric-dra manager serve``, in the order ``--help`` shows them, derived
    from :class:`ManagerSettings`."""
    found: list[FlagSpec] = []
    for name, info in ManagerSettings.model_fields.items():
        for marker in info.metadata:
            if isinstance(marker, Flag):
                found.append(_spec((name,), marker, info.annotation, info, ""))
            elif isinstance(marker, Section) and info.annotation is not None:
                nested = _fields_of(info.annotation)
                for field_name, flag in marker.flags.items():
                    annotation, field = nested[field_name]
                    found.append(_spec((name, field_name), flag, annotation, field, marker.prefix))
    return sorted(found, key=lambda spec: GROUPS.index(spec.group))


def _fields_of(model: Any) -> dict[str, tuple[Any, FieldInfo]]:
    """field → (annotation, pydantic FieldInfo) of a pydantic model or a dataclass."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        return {name: (info.annotation, info) for name, info in model.model_fields.items()}
    hints = typing.get_type_hints(model)
    fields: dict[str, tuple[Any, FieldInfo]] = {}
    for item in dataclasses.fields(model):
        default = item.default if item.default is not dataclasses.MISSING else PydanticUndefined
        fields[item.name] = (hints[item.name], FieldInfo(default=default))
    return fields


def _spec(path: tuple[str, ...], flag: Flag, annotation: Any, info: FieldInfo, prefix: str) -> FlagSpec:
    field = path[-1]
    option = flag.name or "--" + "-".join(p for p in (prefix, field.replace("_", "-")) if p)
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    help_text = (flag.help or info.description or "").replace("{env}", flag.env or "")
    value_type = _without_none(annotation)
    origin = typing.get_origin(value_type)
    choices = _choices(value_type)
    kind = FlagKind.VALUE
    if value_type is bool:
        kind = FlagKind.NEGATED if default else FlagKind.SWITCH
        if kind is FlagKind.NEGATED and not flag.name:
            option = f"--no-{field.replace('_', '-')}"
    elif origin is list:
        kind = FlagKind.REPEATED
    elif origin is dict:
        kind = FlagKind.PAIRS
        choices = _choices(typing.get_args(value_type)[1])
    if default is not None and kind is not FlagKind.VALUE:
        default = False if kind in (FlagKind.SWITCH, FlagKind.NEGATED) else []
    return FlagSpec(
        path=path,
        option=option,
        group=flag.group,
        kind=kind,
        help=help_text,
        default=default,
        required=info.is_required(),
        env=flag.env,
        metavar=flag.metavar,
        type=value_type if value_type in (int, float, Path) else None,
        choices=choices,
    )


def _without_none(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union) and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007 - built at run time
    return annotation


def _choices(annotation: Any) -> tuple[str, ...] | None:
    """The strings a Literal, a StrEnum, or a union of them allows, in declaration order."""
    if typing.get_origin(annotation) is Literal:
        return tuple(str(a) for a in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, StrEnum):
        return tuple(m.value for m in annotation)
    if typing.get_origin(annotation) in (types.UnionType, typing.Union):
        parts = [_choices(a) for a in typing.get_args(annotation)]
        if all(parts):
            return tuple(c for part in parts for c in part or ())
    return None
