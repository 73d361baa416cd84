"""The manager's configuration: flags and the Redfish credentials, validated in one place.

Redfish credentials come from ``--redfish-credentials-file`` — a YAML/JSON file
``{"username": ..., "password": ...}`` (the emulator writes one in its state dir), or a directory
holding ``username`` and ``password`` files (a Kubernetes Secret mounted as a volume) — or from the
environment (``FABRIC_DRA_REDFISH_USERNAME`` / ``FABRIC_DRA_REDFISH_PASSWORD``). The password is a
:class:`pydantic.SecretStr` from the moment it is read: it prints as ``**********``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from fabric.backends.discovery import BindingPlan
from fabric.binder import BinderSettings
from fabric.redfish.client import RedfishSettings

__all__ = ["ENV_PASSWORD", "ENV_USERNAME", "ManagerSettings", "RedfishCredentials", "load_credentials"]

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
        raise ValueError(f"cannot read Redfish credentials {path}: {err.strerror}") from None
    except yaml.YAMLError:
        raise ValueError(f"Redfish credentials {path} are not YAML/JSON") from None
    try:
        return RedfishCredentials.model_validate(raw)
    except ValidationError as err:
        fields = ", ".join(".".join(str(p) for p in e["loc"]) or "file" for e in err.errors())
        raise ValueError(
            f"Redfish credentials {path}: missing or invalid {fields} (need username and password)"
        ) from None


class ManagerSettings(BaseModel):
    """Everything ``fabric-dra manager serve`` was told."""

    model_config = ConfigDict(extra="forbid")

    redfish: RedfishSettings
    fabric_name: str = "fabric"
    binding: BindingPlan = Field(default_factory=BindingPlan)
    binder: BinderSettings = Field(default_factory=BinderSettings)
    ledger: Literal["file", "configmap"] = "file"
    state_dir: Path | None = None
    ledger_name: str = "fabric-dra-manager-ledger"
    kubeconfig: str | None = None
    in_cluster: bool = False
    namespace: str | None = None
    node_map: Path | None = None
    static_tokens: Path | None = None
    insecure_no_auth: bool = False
    plugin_accounts: list[str] = Field(default_factory=list)
    controller_accounts: list[str] = Field(default_factory=list)
    operator_groups: list[str] = Field(default_factory=lambda: ["fabric-dra:operators"])
    operator_users: list[str] = Field(default_factory=list)
    token_audiences: list[str] = Field(default_factory=list)
    leader_elect: bool = False
    orphan_grace_seconds: float = Field(default=600.0, ge=0)
    orphan_interval_seconds: float = Field(default=60.0, gt=0)
    plugin_report_ttl_seconds: float = Field(default=90.0, gt=0)
    lease_name: str = "fabric-dra-manager"
    identity: str | None = None
    lease_duration: float = Field(default=15.0, gt=0)
    renew_deadline: float = Field(default=10.0, gt=0)
    retry_period: float = Field(default=2.0, gt=0)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    ready_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    resync_seconds: float = Field(default=60.0, gt=0)
    poll_seconds: float = Field(default=10.0, gt=0)
    events: bool = True

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
