"""The ``manager`` (``fabric-dra manager serve``) and ``status`` roles of the command line."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any

from plumbing.cli import CliError, SubParsers, usage

__all__ = ["register"]

_STYLES = ("auto", "zone", "connection", "composition", "none")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name) or default


def register(subparsers: SubParsers) -> None:
    manager = subparsers.add_parser(
        "manager",
        help="the fabric manager: the one holder of Redfish credentials, binding devices to nodes",
        description="The fabric manager talks Redfish to the fabric and serves node plugins and operators.",
    )
    manager_commands = manager.add_subparsers(title="commands", metavar="COMMAND")
    serve = manager_commands.add_parser(
        "serve",
        help="run the manager's REST API",
        description=(
            "Serve the fabric manager REST API (/api/v1, /healthz, /readyz, /metrics, /docs). "
            "Attach and detach are idempotent per claim UID + device; a device bound to one node is never "
            "bound to another before its detach completed."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    _serve_flags(serve)
    serve.set_defaults(handler=_serve)
    manager.set_defaults(handler=usage(manager))

    status = subparsers.add_parser(
        "status",
        help="show the pool, bindings per node and operations in flight",
        description="A readable view of the fabric manager's pool, bindings per node and operations "
        "in flight.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    status.add_argument(
        "--manager-url",
        default=_env("FABRIC_DRA_MANAGER_URL", "http://127.0.0.1:8080"),
        help="base URL of the fabric manager (env FABRIC_DRA_MANAGER_URL)",
    )
    status.add_argument(
        "--token-file",
        type=Path,
        default=_env("FABRIC_DRA_TOKEN_FILE"),
        help="file with the bearer token to present (env FABRIC_DRA_TOKEN_FILE; or FABRIC_DRA_TOKEN)",
    )
    status.add_argument("--ca-file", help="CA bundle that signs the manager's TLS certificate")
    status.add_argument("--insecure", action="store_true", help="do not verify the manager's TLS certificate")
    status.add_argument("--output", "-o", choices=["table", "json"], default="table", help="output format")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the manager")
    status.set_defaults(handler=_status)


def _serve_flags(p: argparse.ArgumentParser) -> None:
    rf = p.add_argument_group("Redfish service")
    rf.add_argument(
        "--redfish-url",
        default=_env("FABRIC_DRA_REDFISH_URL"),
        help="scheme://host[:port] of the Redfish fabric service (env FABRIC_DRA_REDFISH_URL)",
    )
    rf.add_argument(
        "--redfish-credentials-file",
        type=Path,
        default=_env("FABRIC_DRA_REDFISH_CREDENTIALS_FILE"),
        help="YAML/JSON file {username, password}, or a mounted Secret directory with username and password "
        "files (env FABRIC_DRA_REDFISH_CREDENTIALS_FILE; or FABRIC_DRA_REDFISH_USERNAME/_PASSWORD)",
    )
    rf.add_argument("--redfish-ca-file", help="CA bundle that signs the Redfish service's certificate")
    rf.add_argument(
        "--redfish-insecure",
        action="store_true",
        help="do not verify the Redfish service's TLS certificate (dev)",
    )
    rf.add_argument(
        "--redfish-auth",
        choices=["session", "basic", "none"],
        default="session",
        help="Redfish authentication: a session (X-Auth-Token, re-created when it expires), HTTP Basic, "
        "or none",
    )
    rf.add_argument("--redfish-connect-timeout", type=float, default=5.0, help="seconds to connect")
    rf.add_argument("--redfish-timeout", type=float, default=30.0, help="seconds to wait for each answer")
    rf.add_argument(
        "--redfish-get-attempts", type=int, default=4, help="tries per GET (mutations: always one)"
    )
    rf.add_argument("--redfish-concurrency", type=int, default=32, help="Redfish requests in flight at most")

    fab = p.add_argument_group("fabric")
    fab.add_argument(
        "--fabric-name",
        default="fabric",
        help="name of this fabric service; pools are <fabric-name>-<fabric id>",
    )
    fab.add_argument(
        "--binding-style",
        choices=_STYLES[:-1],
        default="auto",
        help="how devices are bound: auto (per fabric, from what the service offers), zone, connection or "
        "composition",
    )
    fab.add_argument(
        "--fabric-binding",
        action="append",
        default=[],
        metavar="FABRIC=STYLE",
        help="binding style for one Redfish fabric Id (or Composition): auto, zone, connection, "
        "composition or none (ignore it); repeatable",
    )
    fab.add_argument(
        "--node-map",
        type=Path,
        help="YAML/JSON {hosts: {<ComputerSystem Id|UUID|HostName>: <node>}}; else nodes are matched by "
        "system UUID, then by name",
    )
    fab.add_argument("--resync-seconds", type=float, default=60.0, help="full re-read while events flow")
    fab.add_argument(
        "--poll-seconds", type=float, default=10.0, help="full re-read while no event stream is up"
    )
    fab.add_argument(
        "--no-events", action="store_true", help="do not follow Redfish server-sent events; poll only"
    )
    fab.add_argument(
        "--operation-timeout",
        type=float,
        default=120.0,
        help="seconds one attach/detach keeps trying while the fabric is unreachable",
    )
    fab.add_argument(
        "--task-timeout",
        type=float,
        default=60.0,
        help="seconds a Redfish task may run before it is cancelled and the attach rolled back",
    )

    st = p.add_argument_group("state and cluster")
    st.add_argument("--state-dir", type=Path, help="directory of the ledger file (ledger.json)")
    st.add_argument("--ledger", choices=["file", "configmap"], default="file", help="where the ledger lives")
    st.add_argument("--ledger-name", default="fabric-dra-manager-ledger", help="ConfigMap name of the ledger")
    st.add_argument("--kubeconfig", help="kubeconfig of the cluster (default: in-cluster when run in a pod)")
    st.add_argument("--namespace", help="namespace of the Lease and ledger ConfigMap (default: the pod's)")
    st.add_argument("--leader-elect", action="store_true", help="run as one of several replicas (Lease)")
    st.add_argument(
        "--orphan-grace-seconds",
        type=float,
        default=600.0,
        help=(
            "detach a device fabric-dra bound once no claim (existing, allocating it, reserved or "
            "waiting on binding conditions) and no plugin report has explained it for this long; "
            "0 turns orphan detaching off"
        ),
    )
    st.add_argument(
        "--orphan-interval-seconds", type=float, default=60.0, help="how often bindings are checked"
    )
    st.add_argument(
        "--plugin-report-ttl-seconds",
        type=float,
        default=90.0,
        help="a plugin's report of its prepared claims counts this long (plugins report every 30 s)",
    )
    st.add_argument("--lease-name", default="fabric-dra-manager", help="coordination.k8s.io Lease name")
    st.add_argument(
        "--identity", help="this replica's identity in the Lease (default: $POD_NAME, else hostname-pid)"
    )
    st.add_argument(
        "--lease-duration", type=float, default=15.0, help="seconds a Lease holds without renewal"
    )
    st.add_argument(
        "--renew-deadline",
        type=float,
        default=10.0,
        help="seconds the leader may fail renewing before it steps down",
    )
    st.add_argument(
        "--retry-period", type=float, default=2.0, help="seconds between Lease renewals and attempts"
    )

    auth = p.add_argument_group("authentication")
    auth.add_argument(
        "--static-tokens",
        type=Path,
        help="YAML/JSON {tokens: [{token, role: plugin|controller|operator, node}]} for local runs",
    )
    auth.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="accept every request without a token (development only)",
    )
    auth.add_argument(
        "--plugin-service-account",
        action="append",
        default=[],
        metavar="NS:NAME",
        help="service account of the node plugins (default <namespace>:fabric-dra-plugin); repeatable",
    )
    auth.add_argument(
        "--controller-service-account",
        action="append",
        default=[],
        metavar="NS:NAME",
        help="service account of the controller (default <namespace>:fabric-dra-controller); repeatable",
    )
    auth.add_argument(
        "--operator-group",
        action="append",
        default=[],
        metavar="GROUP",
        help="Kubernetes group with read access (default fabric-dra:operators); repeatable",
    )
    auth.add_argument(
        "--operator-user", action="append", default=[], metavar="USER", help="user with read access"
    )
    auth.add_argument("--token-audience", action="append", default=[], help="audience the tokens must carry")

    srv = p.add_argument_group("listener")
    srv.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a pod)")
    srv.add_argument("--port", type=int, default=8080, help="port to listen on; 0 picks a free one")
    srv.add_argument("--ready-file", type=Path, help="write the base URL here once accepting connections")
    srv.add_argument("--tls-cert", type=Path, help="serve HTTPS with this certificate (PEM)")
    srv.add_argument("--tls-key", type=Path, help="private key of --tls-cert (PEM)")


def _settings(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from fabric.backends.discovery import BindingPlan
    from fabric.binder import BinderSettings
    from fabric.config import ManagerSettings, load_credentials
    from fabric.redfish.client import RedfishSettings

    if not args.redfish_url:
        raise CliError("--redfish-url is required (or set FABRIC_DRA_REDFISH_URL)")
    try:
        credentials = load_credentials(args.redfish_credentials_file)
    except ValueError as err:
        raise CliError(str(err)) from None
    if credentials is None and args.redfish_auth != "none":
        raise CliError(
            "no Redfish credentials: give --redfish-credentials-file (or FABRIC_DRA_REDFISH_USERNAME and "
            "_PASSWORD), or --redfish-auth none for a service without authentication"
        )
    per_fabric: dict[str, str] = {}
    for item in args.fabric_binding:
        fabric, sep, style = item.partition("=")
        if not sep or not fabric or style not in _STYLES:
            raise CliError(
                f"--fabric-binding {item!r}: expected FABRIC=STYLE with STYLE one of {', '.join(_STYLES)}"
            )
        per_fabric[fabric] = style
    try:
        redfish = RedfishSettings(
            base_url=args.redfish_url,
            username=credentials.username if credentials else None,
            password=credentials.password if credentials else None,
            auth=args.redfish_auth,
            ca_file=args.redfish_ca_file,
            insecure=args.redfish_insecure,
            connect_timeout=args.redfish_connect_timeout,
            read_timeout=args.redfish_timeout,
            get_attempts=args.redfish_get_attempts,
            max_workers=args.redfish_concurrency,
        )
        settings = ManagerSettings(
            redfish=redfish,
            fabric_name=args.fabric_name,
            binding=BindingPlan.model_validate({"default": args.binding_style, "fabrics": per_fabric}),
            binder=BinderSettings(operation_timeout=args.operation_timeout, task_timeout=args.task_timeout),
            ledger=args.ledger,
            state_dir=args.state_dir,
            ledger_name=args.ledger_name,
            kubeconfig=args.kubeconfig,
            in_cluster=bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and not args.kubeconfig,
            namespace=args.namespace,
            node_map=args.node_map,
            static_tokens=args.static_tokens,
            insecure_no_auth=args.insecure_no_auth,
            plugin_accounts=args.plugin_service_account,
            controller_accounts=args.controller_service_account,
            operator_groups=args.operator_group or ["fabric-dra:operators"],
            operator_users=args.operator_user,
            token_audiences=args.token_audience,
            leader_elect=args.leader_elect,
            orphan_grace_seconds=args.orphan_grace_seconds,
            orphan_interval_seconds=args.orphan_interval_seconds,
            plugin_report_ttl_seconds=args.plugin_report_ttl_seconds,
            lease_name=args.lease_name,
            identity=args.identity or os.environ.get("POD_NAME") or None,
            lease_duration=args.lease_duration,
            renew_deadline=args.renew_deadline,
            retry_period=args.retry_period,
            host=args.host,
            port=args.port,
            ready_file=args.ready_file,
            tls_cert=args.tls_cert,
            tls_key=args.tls_key,
            resync_seconds=args.resync_seconds,
            poll_seconds=args.poll_seconds,
            events=not args.no_events,
        )
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CliError(f"invalid setting {where}: {first['msg']}") from None
    problems = settings.problems()
    if problems:
        raise CliError("; ".join(problems))
    return settings


def _serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    for path in (settings.node_map, settings.static_tokens):
        if path is not None and not path.is_file():
            raise CliError(f"{path} does not exist")
    for secret in (settings.static_tokens, args.redfish_credentials_file):
        if secret is not None and secret.is_file() and secret.stat().st_mode & 0o077:
            from plumbing.logs import get_logger

            get_logger("fabric.cli").warning(
                "a file with secrets is readable by other users; chmod 600 it", path=str(secret)
            )

    from fabric.service import ManagerService

    try:
        return asyncio.run(ManagerService(settings).run())
    except (ValueError, OSError) as err:
        raise CliError(str(err)) from None


def _status(args: argparse.Namespace) -> int:
    from fabric.status import run_status

    return asyncio.run(run_status(args))
