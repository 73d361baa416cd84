"""Every setting of ``fabric-dra emulator serve``, declared once (:mod:`plumbing.settings`): a flag,
an environment variable (``FABRIC_DRA_EMULATOR_<FLAG>``) and a key of the ``--config`` file each
(flag > environment > file > default), checked once.

The commands that talk to a running emulator (``fault``, ``bindings``) and the topology tools keep
plain options: they are a client's arguments, not settings of a role.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from plumbing.settings import Setting

__all__ = ["ENV_PREFIX", "EmulatorSettings"]

#: the prefix of the emulator's variables: a shell that runs the emulator beside the manager (both
#: have --port, --state-dir, …) gives each its own
ENV_PREFIX = "FABRIC_DRA_EMULATOR_"

_FABRIC, _LISTENER, _ACCOUNTS = ("fabric", "listener", "accounts")


class EmulatorSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    topology: Annotated[
        Path | None,
        Setting(
            "topology file (YAML or JSON, docs/emulator.md), or a packaged preset's name: "
            "default, cascade-2tier, cascade-3tier",
            _FABRIC,
            metavar="FILE",
            shown_default="the packaged 4-host topology",
        ),
    ] = None
    state_dir: Annotated[Path, Setting("directory for durable state and host views", _FABRIC, metavar="DIR")]
    latency: Annotated[
        str,
        Setting(
            "'instant' (changes complete within the request), 'realistic' (202 + task monitor, seconds "
            "per hot-add with jitter) or a profile file (docs/emulator.md)",
            _FABRIC,
            metavar="PROFILE",
        ),
    ] = "instant"
    host: Annotated[str, Setting("address to listen on", _LISTENER)] = "127.0.0.1"
    port: Annotated[int, Setting("TCP port; 0 picks a free one", _LISTENER)] = Field(
        default=0, ge=0, le=65535
    )
    ready_file: Annotated[
        Path | None,
        Setting(
            "once serving, write the base URL (e.g. https://127.0.0.1:40123) to this file atomically",
            _LISTENER,
            metavar="PATH",
        ),
    ] = None
    tls_cert: Annotated[
        Path | None, Setting("serve HTTPS with this PEM certificate (chain)", _LISTENER, metavar="PEM")
    ] = None
    tls_key: Annotated[Path | None, Setting("PEM private key of --tls-cert", _LISTENER, metavar="PEM")] = None
    username: Annotated[
        str | None,
        Setting(
            "account user name (default: the one in <state-dir>/credentials.json, or 'admin')", _ACCOUNTS
        ),
    ] = None
    password: Annotated[
        SecretStr | None,
        Setting(
            "account password; on the command line it is visible in the process list, prefer "
            "--password-file. Without either, a random password is created once and kept 0600 in "
            "<state-dir>/credentials.json",
            _ACCOUNTS,
        ),
    ] = None
    password_file: Annotated[
        Path | None, Setting("read the account password from this file", _ACCOUNTS, metavar="FILE")
    ] = None
    insecure_no_auth: Annotated[
        bool,
        Setting("development only: serve every resource without authentication (logs a warning)", _ACCOUNTS),
    ] = False
