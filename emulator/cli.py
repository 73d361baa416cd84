"""``fabric-dra emulator``: the Redfish fabric emulator and its tools.

Subcommands: ``serve`` (run the emulator); ``fault`` (inject and reset faults in a running one)
and ``bindings`` (print its binding table), both through its OEM admin API
(``/redfish/v1/Oem/FabricDRA``); ``topology validate|show|generate``. Each handler imports what
it runs only when it runs, so ``--help`` stays quick.

``serve``'s settings are declared once in :class:`~emulator.settings.EmulatorSettings` and read
from flags, ``FABRIC_DRA_EMULATOR_<FLAG>`` variables and ``--config FILE`` alike. The clients of a
running emulator and the topology tools keep plain options (``--url`` defaults to
``FABRIC_DRA_EMULATOR_URL``): they are a command's arguments, not a role's settings.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emulator.settings import ENV_PREFIX, EmulatorSettings
from plumbing.cli import CliError, SubParsers, add_output_option, dump_document, emit, format_table, usage
from plumbing.settings import add_settings_arguments

if TYPE_CHECKING:  # what a command runs is imported when it runs: ``--help`` stays quick
    from emulator.redfish.model.latency import LatencyProfile
    from emulator.redfish.tree.auth import Credentials
    from emulator.topology import Device, FabricIndex, TopologyError

__all__ = ["FAULT_COMMANDS", "register"]


def register(subparsers: SubParsers) -> None:
    _command_group(
        subparsers,
        "emulator",
        "a Redfish composable PCIe/CXL fabric in software, and its tools",
        "Emulate a DMTF Redfish composable fabric (PCIe switches with GPUs, NVMe drives, NICs, "
        "FPGAs; a CXL fabric with memory chunks) that binds devices to hosts, and show each host "
        "a sysfs tree of what is bound to it. See docs/emulator.md.",
        (_register_serve, _register_fault, _register_bindings, _register_topology),
    )


def _command_group(
    commands: SubParsers,
    name: str,
    help_text: str,
    description: str,
    members: tuple[Callable[[SubParsers], None], ...],
) -> None:
    """A command of commands (``emulator``, ``emulator topology``): alone, it prints its usage."""
    p = commands.add_parser(name, help=help_text, description=description)
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
    for register_member in members:
        register_member(sub)
    p.set_defaults(handler=usage(p))


# --- serve ----------------------------------------------------------------------------------------


def _register_serve(commands: SubParsers) -> None:
    p = commands.add_parser(
        "serve",
        help="run the emulated Redfish fabric service",
        description=(
            "Serve a Redfish fabric service for the hosts and pooled devices of a topology. Bindings, "
            "tasks and faults persist in --state-dir; each host's sysfs view is kept under "
            "<state-dir>/hosts/<host>/sys. Authentication is required unless --insecure-no-auth. "
            "Each setting is also read from its environment variable and from --config FILE "
            "(flag > environment > file > default)."
        ),
    )
    add_settings_arguments(p, EmulatorSettings, env_prefix=ENV_PREFIX)
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from emulator.redfish.service.server import ServeConfig, serve
    from plumbing.settings import SettingsError, read_settings

    try:
        settings = read_settings(EmulatorSettings, args, env_prefix=ENV_PREFIX)
    except SettingsError as err:
        raise CliError(str(err)) from None
    index = _topology(settings.topology)
    latency = _latency(settings.latency)
    _check_tls(settings.tls_cert, settings.tls_key)
    if settings.password is not None and settings.password_file is not None:
        raise CliError("give the password with --password or --password-file, not both")
    state_dir = _state_dir(settings.state_dir)
    config = ServeConfig(
        index=index,
        state_dir=state_dir,
        latency=latency,
        credentials=_credentials(settings),
        host=settings.host,
        port=settings.port,
        ready_file=settings.ready_file,
        tls_cert=settings.tls_cert,
        tls_key=settings.tls_key,
    )
    try:
        _run(serve(config))
    except (OSError, ValueError) as err:  # ValueError: a ConfigError among them (emulator.errors)
        raise CliError(f"the emulator stopped: {err}") from None
    return 0


def _topology(path: Path | None) -> FabricIndex:
    """The topology of ``--topology`` (the packaged one without it); every problem printed."""
    from emulator.topology import TopologyError, default_topology_path, load_topology, resolve_topology

    try:
        return load_topology(resolve_topology(path) if path else default_topology_path())
    except TopologyError as err:
        if len(err.problems) > 1:
            emit(f"fabric-dra: {err}:\n{err.details()}", file=sys.stderr)
        raise CliError(f"{err}; fix the file and start again") from None


def _latency(spec: str) -> LatencyProfile:
    from emulator.errors import ConfigError
    from emulator.redfish.model.latency import load_latency_profile

    try:
        return load_latency_profile(spec)
    except ConfigError as err:
        raise CliError(str(err)) from None


def _check_tls(cert: Path | None, key: Path | None) -> None:
    if (cert is None) != (key is None):
        raise CliError("--tls-cert and --tls-key go together: give both to serve HTTPS, or neither")
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not path.is_file():
            raise CliError(f"{flag} {path}: no such file")


def _state_dir(state_dir: Path) -> Path:
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(f"cannot create the state directory {state_dir}: {err.strerror}") from None
    return state_dir


def _credentials(settings: EmulatorSettings) -> Credentials | None:
    """The account to serve with: none with ``--insecure-no-auth``; the password given; or the
    stored one (created on first start)."""
    from emulator.errors import ConfigError
    from emulator.redfish.tree.auth import Credentials, load_or_create_credentials
    from plumbing.logs import get_logger

    log = get_logger("emulator.cli")
    if settings.insecure_no_auth:
        if settings.username or settings.password is not None or settings.password_file:
            raise CliError("--insecure-no-auth serves without accounts; drop --username/--password")
        log.warning(
            "authentication is disabled (--insecure-no-auth): anyone who can connect can change the fabric"
        )
        return None
    given = None if settings.password is None else settings.password.get_secret_value()
    password = _password(given, settings.password_file)
    if password is not None:
        return Credentials(username=settings.username or "admin", password=password)
    try:
        credentials, created = load_or_create_credentials(settings.state_dir, settings.username)
    except (OSError, ConfigError) as err:
        raise CliError(f"cannot set up credentials: {err}") from None
    log.info(
        "created account credentials" if created else "using stored account credentials",
        username=credentials.username,
        credentials_file=str(settings.state_dir / "credentials.json"),
    )
    return credentials


def _password(given: str | None, password_file: Path | None) -> str | None:
    """The password of ``--password-file`` or ``--password``; None when neither is given."""
    if password_file is not None:
        try:
            password = password_file.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise CliError(f"cannot read --password-file {password_file}: {err.strerror}") from None
        if not password:
            raise CliError(f"--password-file {password_file} is empty")
        return password
    if given is not None and not given.strip():
        raise CliError(
            "--password is empty: give a password, or leave it out to have one generated "
            "(--insecure-no-auth serves without authentication, for development only)"
        )
    return given


def _run(coro: Coroutine[Any, Any, None]) -> None:
    import asyncio

    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(coro)


# --- a client of a running emulator ---------------------------------------------------------------


_FAULTS = "/redfish/v1/Oem/FabricDRA/Faults"
_BINDINGS = "/redfish/v1/Oem/FabricDRA/Bindings"


def _add_client_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=os.environ.get("FABRIC_DRA_EMULATOR_URL"),
        help="base URL of the emulator, e.g. http://127.0.0.1:40123 (env FABRIC_DRA_EMULATOR_URL)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        help="the emulator's state directory: its credentials.json supplies user name and password",
    )
    p.add_argument("--username", help="user name (default: from --state-dir, or 'admin')")
    p.add_argument("--password-file", type=Path, help="file holding the password")
    p.add_argument("--ca-file", type=Path, help="CA bundle to verify an HTTPS emulator with")
    p.add_argument("--insecure", action="store_true", help="do not verify the emulator's TLS certificate")


class _Admin:
    """A small synchronous client of the OEM admin API (a CLI does one request at a time)."""

    def __init__(self, args: argparse.Namespace) -> None:
        if not args.url:
            raise CliError("say which emulator: --url http://HOST:PORT (or set FABRIC_DRA_EMULATOR_URL)")
        self.url = args.url.rstrip("/")
        self.auth = _basic_auth(args.state_dir, args.username, args.password_file)
        self.verify = _tls_verify(args.insecure, args.ca_file)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        import logging

        import httpx

        logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise here

        try:
            response = httpx.request(
                method, self.url + path, json=body, auth=self.auth, verify=self.verify, timeout=30.0
            )
        except httpx.HTTPError as err:
            raise CliError(f"cannot reach the emulator at {self.url}: {err}") from None
        if response.status_code == 401:
            raise CliError(
                f"the emulator at {self.url} refused the credentials; pass --state-dir of the emulator "
                "or --username/--password-file"
            )
        data = response.json() if response.content else {}
        if response.status_code >= 400:
            error = data.get("error", {}) if isinstance(data, dict) else {}
            raise CliError(f"{method} {path} failed ({response.status_code}): {error.get('message') or data}")
        return data


def _basic_auth(
    state_dir: Path | None, username: str | None, password_file: Path | None
) -> tuple[str, str] | None:
    """User name and password: the emulator's stored credentials, ``--password-file`` over them."""
    password = None
    if state_dir is not None:
        from emulator.errors import ConfigError
        from emulator.redfish.tree.auth import CREDENTIALS_FILE, read_credentials

        path = state_dir / CREDENTIALS_FILE
        if path.exists():
            try:
                creds = read_credentials(path)
            except ConfigError as err:
                raise CliError(str(err)) from None
            username, password = username or creds.username, creds.password
    if password_file is not None:
        try:
            password = password_file.read_text(encoding="utf-8").strip()
        except OSError as err:
            raise CliError(f"cannot read --password-file {password_file}: {err.strerror}") from None
    return (username or "admin", password) if password is not None else None


def _tls_verify(insecure: bool, ca_file: Path | None) -> Any:
    """What httpx verifies an HTTPS emulator with: the system's CAs, ``--ca-file``, or nothing."""
    if insecure:
        return False
    if ca_file is None:
        return True
    import ssl

    try:
        return ssl.create_default_context(cafile=str(ca_file))
    except (OSError, ssl.SSLError) as err:
        raise CliError(f"cannot use --ca-file {ca_file}: {err}") from None


# --- fault ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultOption:
    """A flag of a fault command and the property of the fault's body it fills."""

    flag: str
    prop: str
    help: str
    type: Callable[[str], Any] = str
    default: Any = None
    required: bool = False
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


@dataclass(frozen=True)
class FaultCommand:
    """``fabric-dra emulator fault NAME``: injects a fault of ``kind``."""

    name: str
    help: str
    kind: str
    options: tuple[FaultOption, ...] = ()


_DEVICE = FaultOption("--device", "Target", "device or memory chunk Id (default: any)")

FAULT_COMMANDS = (
    FaultCommand(
        "fail-binds",
        "fail the next N binds, unbinds or resets of a device with a Base MessageId",
        "FailOperations",
        (
            _DEVICE,
            FaultOption("--count", "Count", "how many operations fail (default: 1)", int, 1),
            FaultOption(
                "--message-id",
                "MessageId",
                "Base MessageId (default: OperationFailed)",
                str,
                "OperationFailed",
            ),
            FaultOption(
                "--http-status", "HttpStatus", "HTTP status to answer with (default: by MessageId)", int
            ),
            FaultOption(
                "--operation",
                "Operation",
                "default: bind; any is any bind or unbind (a reset action fails only under reset, a "
                "carved memory chunk's DELETE only under release)",
                default="bind",
                choices=("bind", "unbind", "reset", "release", "any"),
            ),
        ),
    ),
    FaultCommand(
        "hang-task",
        "run the next N operations on a device as tasks that never finish until reset",
        "HangTasks",
        (_DEVICE, FaultOption("--count", "Count", "default: 1", int, 1)),
    ),
    FaultCommand(
        "health",
        "set a device's Status.Health",
        "DeviceHealth",
        (
            FaultOption("--device", "Device", "device Id", required=True),
            FaultOption(
                "--health",
                "Health",
                "default: Critical",
                default="Critical",
                choices=("OK", "Warning", "Critical"),
            ),
        ),
    ),
    FaultCommand(
        "pcie-errors",
        "add PCIe errors to the counters of the switch port to a device (PortMetrics.PCIeErrors)",
        "PCIeErrors",
        (
            FaultOption("--device", "Device", "device Id", required=True),
            FaultOption("--correctable", "CorrectableErrorCount", "correctable errors to add", int),
            FaultOption("--non-fatal", "NonFatalErrorCount", "non-fatal errors to add", int),
            FaultOption("--fatal", "FatalErrorCount", "fatal errors to add", int),
            FaultOption("--replays", "ReplayCount", "replays to add", int),
            FaultOption("--recoveries", "L0ToRecoveryCount", "L0 to recovery transitions to add", int),
        ),
    ),
    FaultCommand(
        "port-down",
        "take a host's upstream port down (binds to it fail; its devices vanish)",
        "PortDown",
        (
            FaultOption("--host", "Host", "host (ComputerSystem Id)", required=True),
            FaultOption("--switch", "Switch", "only this switch's port (default: every switch of the host)"),
        ),
    ),
    FaultCommand(
        "unlink",
        "pull the cable of an inter-switch link (both ports NoLink; no bind is routed over it)",
        "LinkRemoved",
        (
            FaultOption("--switch", "Switch", "a switch at one end of the link", required=True),
            FaultOption("--port", "Port", "that switch's inter-switch port (ISL<n>)", required=True),
        ),
    ),
    FaultCommand(
        "slow",
        "delay every response (but the admin API's) by SECONDS",
        "SlowResponses",
        (FaultOption("--seconds", "Seconds", "delay per response", float, required=True),),
    ),
    FaultCommand(
        "drop-connections",
        "close the connection of the next N requests without a response",
        "DropConnections",
        (FaultOption("--count", "Count", "how many requests (default: all, until reset)", int),),
    ),
    FaultCommand(
        "unavailable",
        "answer every request (but the admin API's) with 503 until reset",
        "Unavailable",
        (FaultOption("--retry-after", "RetryAfterSeconds", "Retry-After seconds (default: 5)", int, 5),),
    ),
    FaultCommand("expire-sessions", "end every open session now", "ExpireSessions"),
)


def _register_fault(commands: SubParsers) -> None:
    p = commands.add_parser(
        "fault",
        help="inject, list and reset faults in a running emulator",
        description="Inject faults into a running emulator through its OEM admin API, list or reset them.",
    )
    kinds = p.add_subparsers(title="faults", metavar="FAULT")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = kinds.add_parser(name, help=help_text, description=help_text)
        _add_client_options(sub)
        return sub

    for fault in FAULT_COMMANDS:
        sub = command(fault.name, fault.help)
        for o in fault.options:
            sub.add_argument(
                o.flag, type=o.type, default=o.default, required=o.required, choices=o.choices, help=o.help
            )
        sub.set_defaults(handler=functools.partial(_inject, fault=fault))
    sub = command("list", "print the active faults")
    add_output_option(sub)
    sub.set_defaults(handler=_list_faults)
    sub = command("reset", "remove every fault (hung tasks resume, ports come up, health returns to OK)")
    sub.add_argument("--id", help="remove only this fault")
    sub.set_defaults(handler=_reset_faults)
    p.set_defaults(handler=usage(p))


def _inject(args: argparse.Namespace, fault: FaultCommand) -> int:
    body = {"Kind": fault.kind}
    body |= {o.prop: value for o in fault.options if (value := getattr(args, o.dest)) is not None}
    result = _Admin(args).request("POST", _FAULTS, body)
    if "Id" in result:
        emit(
            f"fault {result['Id']}: {fault.kind} active "
            f"(remove it: fabric-dra emulator fault reset --id {result['Id']})"
        )
    else:
        emit(f"{fault.kind}: {result.get('Result', 'done')}")
    return 0


def _list_faults(args: argparse.Namespace) -> int:
    result = _Admin(args).request("GET", _FAULTS)
    faults: list[dict[str, Any]] = result.get("Faults", [])
    if args.output in ("json", "yaml"):
        emit(dump_document({"faults": faults}, args.output))
    elif not faults:
        emit("no active faults")
    elif args.output == "wide":  # one column per field any fault has
        fields = list(dict.fromkeys(k for fault in faults for k in fault if k not in ("Id", "Kind")))
        rows = [[fault["Id"], fault["Kind"], *(_cell(fault.get(k)) for k in fields)] for fault in faults]
        emit(format_table(["ID", "KIND", *(k.upper() for k in fields)], rows))
    else:
        rows = [[fault["Id"], fault["Kind"], _details(fault)] for fault in faults]
        emit(format_table(["ID", "KIND", "DETAILS"], rows))
    return 0


def _details(fault: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in fault.items() if k not in ("Id", "Kind") and v is not None)


def _reset_faults(args: argparse.Namespace) -> int:
    admin = _Admin(args)
    if args.id:
        admin.request("DELETE", f"{_FAULTS}/{args.id}")
        emit(f"fault {args.id} removed")
    else:
        result = admin.request("DELETE", _FAULTS)
        removed, resumed = result.get("Removed", 0), result.get("ResumedTasks", 0)
        emit(f"removed {removed} fault(s), resumed {resumed} hung task(s)")
    return 0


# --- bindings -------------------------------------------------------------------------------------


def _register_bindings(commands: SubParsers) -> None:
    p = commands.add_parser(
        "bindings",
        help="print which device is bound to which host in a running emulator",
        description="Print the binding table of a running emulator (its OEM Bindings resource).",
    )
    _add_client_options(p)
    add_output_option(p)
    # the word this command had before -o; kept so scripts that use it go on working
    p.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")
    p.set_defaults(handler=_bindings)


def _bindings(args: argparse.Namespace) -> int:
    data = _Admin(args).request("GET", _BINDINGS)
    if args.output in ("json", "yaml"):
        emit(dump_document(data, args.output))
        return 0
    wide = args.output == "wide"
    rows = [_binding_row(b, wide) for b in data.get("Bindings", [])]
    rows += [_in_flight_row(op, wide) for op in data.get("InFlight", [])]
    if not rows:
        emit("(nothing bound)")
        return 0
    headers = ["TARGET", "HOST", "STYLE", "VIA", "HOST ADDRESS"] + (
        ["FABRIC", "SINCE", "VISIBLE", "TASK"] if wide else []
    )
    emit(format_table(headers, rows))
    return 0


def _binding_row(b: dict[str, Any], wide: bool) -> list[str]:
    via = b.get("Zone") or b.get("Connection") or "-"
    address = ", ".join(f"{k}={v}" for k, v in b.get("HostAddress", {}).items()) or "-"
    row = [b["Target"], b["Host"], b["Style"], via, address]
    if wide:
        shown = b.get("VisibleToHost")
        visible = "yes" if shown is True else "no (port down)" if shown is False else "-"
        row += [_cell(b.get("Fabric")), _cell(b.get("Since")), visible, "-"]
    return row


def _in_flight_row(op: dict[str, Any], wide: bool) -> list[str]:
    task = op["Task"]
    doing = op["Operation"].removesuffix("e") + "ing"  # binding, unbinding, releasing (a chunk's DELETE)
    row = [op["Target"], _cell(op["Host"]), doing, "-", f"task {task.rsplit('/', 1)[-1]}"]
    return [*row, "-", "-", "-", task] if wide else row


# --- topology -------------------------------------------------------------------------------------


def _register_topology(commands: SubParsers) -> None:
    _command_group(
        commands,
        "topology",
        "check, summarise and generate topology files",
        "Validate, summarise or generate emulator topology files (docs/emulator.md).",
        (_register_validate, _register_show, _register_generate),
    )


# --- topology validate ----------------------------------------------------------------------------


def _register_validate(sub: SubParsers) -> None:
    v = sub.add_parser(
        "validate",
        help="check a topology file; print every problem with its line and field",
        description=(
            "Check a topology file and list every problem at once, each as FILE:LINE:COLUMN: field: what "
            "is wrong. Exit 0 when the file is valid, 1 when it is not."
        ),
    )
    v.add_argument("file", type=Path, metavar="FILE")
    add_output_option(v)
    v.set_defaults(handler=_validate)


def _validate(args: argparse.Namespace) -> int:
    from emulator.topology import TopologyError, load_topology, resolve_topology

    document = args.output in ("json", "yaml")
    args.file = resolve_topology(args.file)
    try:
        index = load_topology(args.file)
    except TopologyError as err:
        if document:
            problems = _problems(err)
            emit(dump_document({"file": str(args.file), "valid": False, "problems": problems}, args.output))
        else:
            emit(f"{err.source}: {len(err.problems)} problem(s):", file=sys.stderr)
            emit(err.details(), file=sys.stderr)
        return 1
    summary = {"hosts": len(index.hosts), "devices": len(index.devices), "targets": len(index.targets)}
    if document:
        emit(dump_document({"file": str(args.file), "valid": True, "problems": [], **summary}, args.output))
        return 0
    emit(
        f"{args.file}: valid: {summary['hosts']} hosts, {summary['devices']} devices, "
        f"{summary['targets']} bindable targets"
    )
    return 0


def _problems(err: TopologyError) -> list[dict[str, Any]]:
    """Each problem of ``err`` with where the file has its field (line and column, when it does)."""
    return [
        {
            "line": pos[0] if pos else None,
            "column": pos[1] if pos else None,
            "field": p.loc,
            "problem": p.message,
        }
        for p, pos in zip(err.problems, err.positions, strict=True)
    ]


# --- topology show --------------------------------------------------------------------------------


def _register_show(sub: SubParsers) -> None:
    s = sub.add_parser(
        "show",
        help="summarise a topology (the packaged default without FILE)",
        description="Print the hosts, switches and devices of a topology file (the packaged default without "
        "FILE); -o wide adds each device's PCI ids, memory and link, -o json|yaml the whole summary.",
    )
    s.add_argument("file", type=Path, nargs="?", metavar="FILE")
    add_output_option(s)
    s.set_defaults(handler=_show)


def _show(args: argparse.Namespace) -> int:
    from emulator.topology import TopologyError, default_topology_path, load_topology, resolve_topology

    path = resolve_topology(args.file) if args.file else default_topology_path()
    try:
        index = load_topology(path)
    except TopologyError as err:
        raise CliError(str(err)) from None
    switches = _switches(index)
    if args.output in ("json", "yaml"):
        document = {"topology": str(path), "hosts": list(index.hosts), "switches": switches}
        emit(dump_document(document, args.output))
        return 0
    emit(f"topology {path}")
    emit(f"hosts ({len(index.hosts)}): {', '.join(index.hosts)}")
    wide = args.output == "wide"
    for summary in switches:
        emit(f"{summary['fabric']} switch {summary['id']}: hosts {', '.join(summary['hosts']) or '(none)'}")
        if summary["links"]:
            emit("  links " + ", ".join(f"{port} → {peer}" for port, peer in summary["links"].items()))
        rows = [_device_row(d, wide) for d in summary["devices"]]
        headers = ["PORT", "DEVICE", "TYPE", "MODEL"] + (["PCI ID", "MEMORY BYTES", "LINK"] if wide else [])
        emit("\n".join("  " + line for line in format_table(headers, rows).splitlines()))
    return 0


def _switches(index: FabricIndex) -> list[dict[str, Any]]:
    """Each switch with the hosts cabled to it and the devices behind it, as ``-o json`` shows them."""
    return [
        {
            "fabric": sw.fabric,
            "id": sw.id,
            "hosts": list(sw.upstream_ports),
            "links": {
                port: f"{peer}/{peer_port}" for port, (peer, peer_port) in sw.interswitch_ports.items()
            },
            "devices": [_device(index.devices[d]) for d in sw.devices],
        }
        for sw in index.switches.values()
    ]


def _device(d: Device) -> dict[str, Any]:
    return {
        "port": d.port,
        "id": d.id,
        "type": d.type.value,
        "model": d.model.model,
        "serial": d.serial,
        "pciId": f"{d.model.vendor_id:04x}:{d.model.device_id:04x}",
        "memoryBytes": int(d.model.memory) if d.model.memory is not None else None,
        "link": f"gen{d.model.pcie_generation} x{d.model.pcie_width}",
        "chunks": len(d.chunks),
        "chunkMib": d.chunks[0].size_mib if d.chunks else None,
        "pool": {"minChunkMiB": d.pool.min_chunk_mib, "incrementMiB": d.pool.increment_mib}
        if d.pool is not None
        else None,
        "partitions": d.model.partitions.name if d.model.partitions is not None else None,
    }


def _device_row(d: dict[str, Any], wide: bool) -> list[str]:
    extra = f", {d['chunks']} chunks of {d['chunkMib']} MiB" if d["chunks"] else ""
    if d["pool"] is not None:
        pool = d["pool"]
        extra += f", a pool: chunks of {pool['minChunkMiB']} MiB and up by {pool['incrementMiB']} MiB"
    if d["partitions"] is not None:
        extra += f", partitions {d['partitions']}"
    row = [d["port"], d["id"], d["type"], f"{d['model']} (serial {d['serial']}{extra})"]
    return [*row, d["pciId"], _cell(d["memoryBytes"]), d["link"]] if wide else row


# --- topology generate ----------------------------------------------------------------------------


def _register_generate(sub: SubParsers) -> None:
    g = sub.add_parser(
        "generate",
        help="write a large deterministic topology (e.g. 50 hosts, 200 devices) for load tests",
        description=(
            "Generate a topology: hosts kind-worker, kind-worker2, ...; devices spread over PCIe "
            "switches of --devices-per-switch each; CXL devices split into chunks. The same arguments "
            "always give the same file."
        ),
    )
    # one flag per field of emulator.topology.generate.GenerateSpec, named as the field is
    g.add_argument("--hosts", type=int, default=4, help="number of hosts (default: 4)")
    g.add_argument("--gpus", type=int, default=8, help="GPUs, alternating between two models (default: 8)")
    g.add_argument("--nvme", type=int, default=2, help="NVMe drives (default: 2)")
    g.add_argument("--nics", type=int, default=1, help="NICs (default: 1)")
    g.add_argument("--fpgas", type=int, default=1, help="FPGAs (default: 1)")
    g.add_argument("--cxl-devices", type=int, default=2, help="CXL Type-3 memory devices (default: 2)")
    g.add_argument("--chunks", type=int, default=4, help="memory chunks per CXL device (default: 4)")
    g.add_argument(
        "--cxl-pools",
        type=int,
        default=0,
        help="CXL memory pools (256 GiB each) whose chunks clients create by the GiB (default: 0)",
    )
    g.add_argument(
        "--partitionable-gpus",
        action="store_true",
        help="the H100 model declares its built-in partition table (h100-80gb), and a third of the "
        "GPUs are A100s with theirs (a100-40gb)",
    )
    g.add_argument("--devices-per-switch", type=int, default=16, help="PCIe devices per switch (default: 16)")
    g.add_argument("--host-prefix", default="kind-worker", help="host name prefix (default: kind-worker)")
    g.add_argument("--seed", default="fabric-dra", help="seed of serials and UUIDs (default: fabric-dra)")
    g.add_argument(
        "-o", "--output", choices=["yaml", "json"], default="yaml", help="file format (default: yaml)"
    )
    g.add_argument(
        "--output-file", type=Path, metavar="FILE", help="write the topology here instead of standard output"
    )
    g.set_defaults(handler=_generate)


def _generate(args: argparse.Namespace) -> int:
    from emulator.topology.generate import GenerateSpec, generate_topology_yaml

    try:
        spec = GenerateSpec(**{field: getattr(args, field) for field in GenerateSpec.model_fields})
    except ValueError as err:
        raise CliError(str(err).splitlines()[-1] if "\n" in str(err) else str(err)) from None
    text = generate_topology_yaml(spec)
    if args.output == "json":
        import yaml

        text = dump_document(yaml.safe_load(text), "json") + "\n"
    if args.output_file is None:
        emit(text.rstrip("\n"))
        return 0
    try:
        args.output_file.write_text(text, encoding="utf-8")
    except OSError as err:
        raise CliError(f"cannot write --output-file {args.output_file}: {err.strerror}") from None
    emit(f"wrote {args.output_file}", file=sys.stderr)
    return 0


def _cell(value: object) -> str:
    """A table cell: ``-`` for a value that is not there."""
    return "-" if value is None or value == "" else str(value)
