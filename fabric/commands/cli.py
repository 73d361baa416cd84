"""The ``manager`` (``fabric-dra manager serve``), ``status`` and ``usage`` roles of the command line."""

from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plumbing.cli import OUTPUT_FORMATS, CliError, SubParsers, add_output_option, usage

__all__ = ["manager_options", "register", "resolve_token_file"]


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def register(subparsers: SubParsers) -> None:
    manager = subparsers.add_parser(
        "manager",
        help="the fabric manager: the one holder of Redfish credentials, binding devices to nodes",
        description="The fabric manager talks Redfish to the fabric and serves node plugins and operators.",
    )
    manager_commands = manager.add_subparsers(title="commands", metavar="COMMAND", parser_class=_ServeParser)
    serve = manager_commands.add_parser(
        "serve",
        help="run the manager's REST API",
        description=(
            "Serve the fabric manager REST API (/api/v1, /healthz, /readyz, /metrics, /openapi.json). "
            "Attach and detach are idempotent per claim UID + device; a device bound to one node is never "
            "bound to another before its detach completed."
        ),
    )
    serve.set_defaults(handler=_serve)
    manager.set_defaults(handler=usage(manager))

    status = subparsers.add_parser(
        "status",
        help="show the pool, bindings per node and operations in flight",
        description="A readable view of the fabric manager's pool, bindings per node and operations "
        "in flight.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _manager_options(status)
    add_output_option(status)
    status.add_argument(
        "--watch",
        "-w",
        action="store_true",
        help="keep showing the state: redraw on every inventory change and every 2 s (Ctrl-C ends)",
    )
    status.set_defaults(handler=_status)

    usage_command = subparsers.add_parser(
        "usage",
        help="show device-seconds by namespace, model or workload",
        description="Device-seconds from the fabric manager's accounting: how long devices were bound "
        "to claims, warm, attaching, detaching or bound outside fabric-dra, since a time, grouped by "
        "the claims' namespace, the device model or the claims' owning workload. Counted in hourly "
        "buckets: --since counts from the start of its hour.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    usage_command.add_argument(
        "--since",
        default="24h",
        metavar="DURATION|TIME",
        help="a duration before now (30m, 24h, 7d) or an RFC 3339 time with a zone (2026-03-01T09:00:00Z)",
    )
    usage_command.add_argument(
        "--by", choices=["namespace", "model", "workload"], default="namespace", help="what to group by"
    )
    usage_command.add_argument(
        "-o",
        "--output",
        choices=[*OUTPUT_FORMATS, "csv"],  # the commands' own words, and csv for spreadsheets
        default="table",
        help="table (device-hours), wide (device-seconds), json, yaml or csv (device-seconds)",
    )
    _manager_options(usage_command)
    usage_command.set_defaults(handler=_usage)


def _manager_options(parser: argparse.ArgumentParser) -> None:
    """How a command that reads the manager reaches it and authenticates."""
    parser.add_argument(
        "--manager-url",
        default=_env("FABRIC_DRA_MANAGER_URL", "http://127.0.0.1:8080"),
        help="base URL of the fabric manager (env FABRIC_DRA_MANAGER_URL)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        default=_env("FABRIC_DRA_TOKEN_FILE"),
        help="file with the bearer token to present (env FABRIC_DRA_TOKEN_FILE; or FABRIC_DRA_TOKEN)",
    )
    parser.add_argument("--ca-file", type=Path, help="CA bundle that signs the manager's TLS certificate")
    parser.add_argument("--insecure", action="store_true", help="do not verify the manager's TLS certificate")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the manager")


class _ServeParser(argparse.ArgumentParser):
    """``manager serve``'s parser: its options are added when it is first used, because they are
    derived from the manager's settings model, whose import pulls in the whole manager — a cost
    the other roles' command lines should not pay."""

    _populated = False

    def _populate(self) -> None:
        if not self._populated:
            self._populated = True
            _serve_flags(self)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._populate()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._populate()
        return super().format_help()

    def format_usage(self) -> str:
        self._populate()
        return super().format_usage()


def _serve_flags(p: argparse.ArgumentParser) -> None:
    from fabric.service.config import ManagerSettings
    from plumbing.settings import add_settings_arguments

    add_settings_arguments(p, ManagerSettings)


def _settings(args: argparse.Namespace) -> Any:
    """The manager's settings from its flags, the environment and the settings file, with the
    Redfish credentials they name; every problem one line."""
    from fabric.service.config import ManagerSettings, load_credentials
    from plumbing.settings import SettingsError, read_settings

    try:
        settings = read_settings(ManagerSettings, args)
        credentials = load_credentials(settings.redfish_credentials_file)
    except (SettingsError, ValueError) as err:
        raise CliError(str(err)) from None
    if credentials is None and settings.redfish.auth != "none":
        raise CliError(
            "no Redfish credentials: give --redfish-credentials-file (or FABRIC_DRA_REDFISH_USERNAME and "
            "_PASSWORD), or --redfish-auth none for a service without authentication"
        )
    redfish = settings.redfish
    if credentials is not None:
        redfish = redfish.model_copy(
            update={"username": credentials.username, "password": credentials.password}
        )
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not settings.kubeconfig
    settings = settings.model_copy(update={"redfish": redfish, "in_cluster": in_cluster})
    problems = settings.problems()
    if problems:
        raise CliError("; ".join(problems))
    return settings


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    for path in (settings.node_map, settings.static_tokens):
        if path is not None and not path.is_file():
            raise CliError(f"{path} does not exist")
    for secret in (settings.static_tokens, settings.redfish_credentials_file):
        if secret is not None and secret.is_file() and secret.stat().st_mode & 0o077:
            from plumbing.logs import get_logger

            get_logger("fabric.commands.cli").warning(
                "a file with secrets is readable by other users; chmod 600 it", path=str(secret)
            )

    from fabric.service.manager import ManagerService

    try:
        return asyncio.run(ManagerService(settings).run())
    except (ValueError, OSError) as err:
        raise CliError(str(err)) from None


def _resolve_token_file(args: argparse.Namespace) -> None:
    if args.token_file is not None:  # resolved before use: every message names the real file
        args.token_file = Path(args.token_file).expanduser().resolve()


def _status(args: argparse.Namespace) -> int:
    from fabric.commands.status import run_status

    _resolve_token_file(args)
    return asyncio.run(run_status(args))


def _usage(args: argparse.Namespace) -> int:
    from fabric.commands.usage import run_usage

    _resolve_token_file(args)
    return asyncio.run(run_usage(args))


#: for the other commands of the manager's command line (``fabric.commands.drains``)
manager_options = _manager_options
resolve_token_file = _resolve_token_file
