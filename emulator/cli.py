"""``fabric-dra emulator``: the Redfish fabric emulator and its tools.

Subcommands: ``serve`` (run the emulator), ``fault`` (inject and reset faults in a running
one), ``bindings`` (print its binding table), ``topology validate|show|generate``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plumbing.cli import CliError, SubParsers, add_output_option, dump_document, format_table, usage

__all__ = ["register"]


def register(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "emulator",
        help="a Redfish composable PCIe/CXL fabric in software, and its tools",
        description=(
            "Emulate a DMTF Redfish composable fabric (PCIe switches with GPUs, NVMe drives, NICs, "
            "FPGAs; a CXL fabric with memory chunks) that binds devices to hosts, and show each host "
            "a sysfs tree of what is bound to it. See docs/emulator.md."
        ),
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    _register_serve(commands)
    _register_fault(commands)
    _register_bindings(commands)
    _register_topology(commands)
    parser.set_defaults(handler=usage(parser))


# --- serve ------------------------------------------------------------------------------------


def _register_serve(commands: SubParsers) -> None:
    p = commands.add_parser(
        "serve",
        help="run the emulated Redfish fabric service",
        description=(
            "Serve a Redfish fabric service for the hosts and pooled devices of a topology. Bindings, "
            "tasks and faults persist in --state-dir; each host's sysfs view is kept under "
            "<state-dir>/hosts/<host>/sys. Authentication is required unless --insecure-no-auth."
        ),
    )
    p.add_argument(
        "--topology",
        type=Path,
        metavar="FILE",
        help="topology file (YAML or JSON, docs/emulator.md); default: the packaged 4-host topology",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        required=True,
        metavar="DIR",
        help="directory for durable state and host views",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default: 0)")
    p.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="once serving, write the base URL (e.g. https://127.0.0.1:40123) to this file atomically",
    )
    p.add_argument(
        "--tls-cert", type=Path, metavar="PEM", help="serve HTTPS with this PEM certificate (chain)"
    )
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="PEM private key of --tls-cert")
    p.add_argument(
        "--username",
        help="account user name (default: the one in <state-dir>/credentials.json, or 'admin')",
    )
    p.add_argument(
        "--password",
        help="account password; visible in the process list, prefer --password-file. Without either, a "
        "random password is created once and kept 0600 in <state-dir>/credentials.json",
    )
    p.add_argument(
        "--password-file", type=Path, metavar="FILE", help="read the account password from this file"
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="development only: serve every resource without authentication (logs a warning)",
    )
    p.add_argument(
        "--latency",
        default="instant",
        metavar="PROFILE",
        help="'instant' (changes complete within the request), 'realistic' (202 + task monitor, seconds "
        "per hot-add with jitter) or a profile file (docs/emulator.md); default: instant",
    )
    p.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    from emulator.redfish.model.latency import load_latency_profile
    from emulator.redfish.service.server import ServeConfig, serve
    from emulator.redfish.tree.auth import Credentials, load_or_create_credentials
    from emulator.topology import TopologyError, default_topology_path, load_topology
    from plumbing.logs import get_logger

    log = get_logger("emulator.cli")
    try:
        index = load_topology(args.topology or default_topology_path())
    except TopologyError as err:
        if len(err.problems) > 1:
            print(f"fabric-dra: {err}:\n{err.details()}", file=sys.stderr)
        raise CliError(f"{err}; fix the file and start again") from None
    try:
        latency = load_latency_profile(args.latency)
    except ValueError as err:
        raise CliError(str(err)) from None
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CliError("--tls-cert and --tls-key go together: give both to serve HTTPS, or neither")
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None and not path.is_file():
            raise CliError(f"{flag} {path}: no such file")
    if args.password is not None and args.password_file is not None:
        raise CliError("give the password with --password or --password-file, not both")
    state_dir: Path = args.state_dir
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CliError(f"cannot create the state directory {state_dir}: {err.strerror}") from None

    credentials: Credentials | None
    if args.insecure_no_auth:
        if args.username or args.password or args.password_file:
            raise CliError("--insecure-no-auth serves without accounts; drop --username/--password")
        credentials = None
        log.warning(
            "authentication is disabled (--insecure-no-auth): anyone who can connect can change the fabric"
        )
    else:
        password = args.password
        if args.password_file is not None:
            try:
                password = args.password_file.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise CliError(f"cannot read --password-file {args.password_file}: {err.strerror}") from None
            if not password:
                raise CliError(f"--password-file {args.password_file} is empty")
        elif password is not None and not password.strip():
            raise CliError(
                "--password is empty: give a password, or leave it out to have one generated "
                "(--insecure-no-auth serves without authentication, for development only)"
            )
        if password is not None:
            credentials = Credentials(username=args.username or "admin", password=password)
        else:
            try:
                credentials, created = load_or_create_credentials(state_dir, args.username)
            except (OSError, ValueError) as err:
                raise CliError(f"cannot set up credentials: {err}") from None
            log.info(
                "created account credentials" if created else "using stored account credentials",
                username=credentials.username,
                credentials_file=str(state_dir / "credentials.json"),
            )

    config = ServeConfig(
        index=index,
        state_dir=state_dir,
        latency=latency,
        credentials=credentials,
        host=args.host,
        port=args.port,
        ready_file=args.ready_file,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
    )
    try:
        _run(serve(config))
    except (OSError, ValueError) as err:
        raise CliError(f"the emulator stopped: {err}") from None
    return 0


def _run(coro: Any) -> None:
    import asyncio

    loop_factory: Callable[[], asyncio.AbstractEventLoop] = asyncio.new_event_loop
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        pass
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(coro)


# --- a client of a running emulator -----------------------------------------------------------


def _add_client_args(p: argparse.ArgumentParser) -> None:
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
        self.auth: tuple[str, str] | None = None
        username = args.username
        password = None
        if args.state_dir is not None:
            from emulator.redfish.tree.auth import CREDENTIALS_FILE, read_credentials

            path = args.state_dir / CREDENTIALS_FILE
            if path.exists():
                try:
                    creds = read_credentials(path)
                except ValueError as err:
                    raise CliError(str(err)) from None
                username, password = username or creds.username, creds.password
        if args.password_file is not None:
            try:
                password = args.password_file.read_text(encoding="utf-8").strip()
            except OSError as err:
                raise CliError(f"cannot read --password-file {args.password_file}: {err.strerror}") from None
        if password is not None:
            self.auth = (username or "admin", password)
        self.verify: Any = True
        if args.insecure:
            self.verify = False
        elif args.ca_file is not None:
            import ssl

            try:
                self.verify = ssl.create_default_context(cafile=str(args.ca_file))
            except (OSError, ssl.SSLError) as err:
                raise CliError(f"cannot use --ca-file {args.ca_file}: {err}") from None

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


# --- fault ------------------------------------------------------------------------------------


def _register_fault(commands: SubParsers) -> None:
    p = commands.add_parser(
        "fault",
        help="inject, list and reset faults in a running emulator",
        description="Inject faults into a running emulator through its OEM admin API, list or reset them.",
    )
    kinds = p.add_subparsers(title="faults", metavar="FAULT")

    def kind(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = kinds.add_parser(name, help=help_text, description=help_text)
        _add_client_args(sub)
        return sub

    sub = kind("fail-binds", "fail the next N binds, unbinds or resets of a device with a Base MessageId")
    sub.add_argument("--device", help="device or memory chunk Id (default: any)")
    sub.add_argument("--count", type=int, default=1, help="how many operations fail (default: 1)")
    sub.add_argument(
        "--message-id", default="OperationFailed", help="Base MessageId (default: OperationFailed)"
    )
    sub.add_argument("--http-status", type=int, help="HTTP status to answer with (default: by MessageId)")
    sub.add_argument(
        "--operation",
        choices=["bind", "unbind", "reset", "any"],
        default="bind",
        help="default: bind; any is any bind or unbind (a reset action fails only under reset)",
    )
    sub.set_defaults(
        handler=lambda a: _inject(
            a,
            {
                "Kind": "FailOperations",
                "Target": a.device,
                "Count": a.count,
                "MessageId": a.message_id,
                "HttpStatus": a.http_status,
                "Operation": a.operation,
            },
        )
    )
    sub = kind("hang-task", "run the next N operations on a device as tasks that never finish until reset")
    sub.add_argument("--device", help="device or memory chunk Id (default: any)")
    sub.add_argument("--count", type=int, default=1, help="default: 1")
    sub.set_defaults(
        handler=lambda a: _inject(a, {"Kind": "HangTasks", "Target": a.device, "Count": a.count})
    )
    sub = kind("health", "set a device's Status.Health")
    sub.add_argument("--device", required=True, help="device Id")
    sub.add_argument(
        "--health", choices=["OK", "Warning", "Critical"], default="Critical", help="default: Critical"
    )
    sub.set_defaults(
        handler=lambda a: _inject(a, {"Kind": "DeviceHealth", "Device": a.device, "Health": a.health})
    )
    sub = kind("port-down", "take a host's upstream port down (binds to it fail; its devices vanish)")
    sub.add_argument("--host", required=True, help="host (ComputerSystem Id)")
    sub.add_argument("--switch", help="only this switch's port (default: every switch of the host)")
    sub.set_defaults(handler=lambda a: _inject(a, {"Kind": "PortDown", "Host": a.host, "Switch": a.switch}))
    sub = kind("slow", "delay every response (but the admin API's) by SECONDS")
    sub.add_argument("--seconds", type=float, required=True, help="delay per response")
    sub.set_defaults(handler=lambda a: _inject(a, {"Kind": "SlowResponses", "Seconds": a.seconds}))
    sub = kind("drop-connections", "close the connection of the next N requests without a response")
    sub.add_argument("--count", type=int, help="how many requests (default: all, until reset)")
    sub.set_defaults(handler=lambda a: _inject(a, {"Kind": "DropConnections", "Count": a.count}))
    sub = kind("unavailable", "answer every request (but the admin API's) with 503 until reset")
    sub.add_argument("--retry-after", type=int, default=5, help="Retry-After seconds (default: 5)")
    sub.set_defaults(
        handler=lambda a: _inject(a, {"Kind": "Unavailable", "RetryAfterSeconds": a.retry_after})
    )
    sub = kind("expire-sessions", "end every open session now")
    sub.set_defaults(handler=lambda a: _inject(a, {"Kind": "ExpireSessions"}))
    sub = kind("list", "print the active faults")
    add_output_option(sub)
    sub.set_defaults(handler=_list_faults)
    sub = kind("reset", "remove every fault (hung tasks resume, ports come up, health returns to OK)")
    sub.add_argument("--id", help="remove only this fault")
    sub.set_defaults(handler=_reset_faults)
    p.set_defaults(handler=usage(p))


def _inject(args: argparse.Namespace, spec: dict[str, Any]) -> int:
    body = {k: v for k, v in spec.items() if v is not None}
    result = _Admin(args).request("POST", "/redfish/v1/Oem/FabricDRA/Faults", body)
    if "Id" in result:
        print(
            f"fault {result['Id']}: {spec['Kind']} active "
            f"(remove it: fabric-dra emulator fault reset --id {result['Id']})"
        )
    else:
        print(f"{spec['Kind']}: {result.get('Result', 'done')}")
    return 0


def _list_faults(args: argparse.Namespace) -> int:
    result = _Admin(args).request("GET", "/redfish/v1/Oem/FabricDRA/Faults")
    faults: list[dict[str, Any]] = result.get("Faults", [])
    if args.output in ("json", "yaml"):
        print(dump_document({"faults": faults}, args.output))
        return 0
    if not faults:
        print("no active faults")
        return 0
    if args.output == "wide":  # one column per field any fault has
        fields = list(dict.fromkeys(k for fault in faults for k in fault if k not in ("Id", "Kind")))
        rows = [[fault["Id"], fault["Kind"], *(_cell(fault.get(k)) for k in fields)] for fault in faults]
        print(format_table(["ID", "KIND", *(k.upper() for k in fields)], rows))
        return 0
    rows = [
        [
            fault["Id"],
            fault["Kind"],
            ", ".join(f"{k}={v}" for k, v in fault.items() if k not in ("Id", "Kind") and v is not None),
        ]
        for fault in faults
    ]
    print(format_table(["ID", "KIND", "DETAILS"], rows))
    return 0


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _reset_faults(args: argparse.Namespace) -> int:
    admin = _Admin(args)
    if args.id:
        admin.request("DELETE", f"/redfish/v1/Oem/FabricDRA/Faults/{args.id}")
        print(f"fault {args.id} removed")
    else:
        result = admin.request("DELETE", "/redfish/v1/Oem/FabricDRA/Faults")
        removed, resumed = result.get("Removed", 0), result.get("ResumedTasks", 0)
        print(f"removed {removed} fault(s), resumed {resumed} hung task(s)")
    return 0


# --- bindings ---------------------------------------------------------------------------------


def _register_bindings(commands: SubParsers) -> None:
    p = commands.add_parser(
        "bindings",
        help="print which device is bound to which host in a running emulator",
        description="Print the binding table of a running emulator (its OEM Bindings resource).",
    )
    _add_client_args(p)
    add_output_option(p)
    # the word this command had before -o; kept so scripts that use it go on working
    p.add_argument("--json", dest="output", action="store_const", const="json", help="the same as -o json")
    p.set_defaults(handler=_bindings)


def _bindings(args: argparse.Namespace) -> int:
    data = _Admin(args).request("GET", "/redfish/v1/Oem/FabricDRA/Bindings")
    if args.output in ("json", "yaml"):
        print(dump_document(data, args.output))
        return 0
    wide = args.output == "wide"
    rows: list[list[str]] = []
    for b in data.get("Bindings", []):
        via = b.get("Zone") or b.get("Connection") or "-"
        address = ", ".join(f"{k}={v}" for k, v in b.get("HostAddress", {}).items()) or "-"
        rows.append([b["Target"], b["Host"], b["Style"], via, address])
        if wide:
            visible = {True: "yes", False: "no (port down)"}.get(b.get("VisibleToHost"), "-")
            rows[-1] += [_cell(b.get("Fabric")), _cell(b.get("Since")), visible, "-"]
    for op in data.get("InFlight", []):
        task = op["Task"]
        rows.append(
            [op["Target"], op["Host"], op["Operation"] + "ing", "-", f"task {task.rsplit('/', 1)[-1]}"]
        )
        if wide:
            rows[-1] += ["-", "-", "-", task]
    if not rows:
        print("(nothing bound)")
        return 0
    headers = ["TARGET", "HOST", "STYLE", "VIA", "HOST ADDRESS"] + (
        ["FABRIC", "SINCE", "VISIBLE", "TASK"] if wide else []
    )
    print(format_table(headers, rows))
    return 0


# --- topology ---------------------------------------------------------------------------------


def _register_topology(commands: SubParsers) -> None:
    p = commands.add_parser(
        "topology",
        help="check, summarise and generate topology files",
        description="Validate, summarise or generate emulator topology files (docs/emulator.md).",
    )
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
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
    s = sub.add_parser(
        "show",
        help="summarise a topology (the packaged default without FILE)",
        description="Print the hosts, switches and devices of a topology file (the packaged default without "
        "FILE); -o wide adds each device's PCI ids, memory and link, -o json|yaml the whole summary.",
    )
    s.add_argument("file", type=Path, nargs="?", metavar="FILE")
    add_output_option(s)
    s.set_defaults(handler=_show)
    g = sub.add_parser(
        "generate",
        help="write a large deterministic topology (e.g. 50 hosts, 200 devices) for load tests",
        description=(
            "Generate a topology: hosts kind-worker, kind-worker2, ...; devices spread over PCIe "
            "switches of --devices-per-switch each; CXL devices split into chunks. The same arguments "
            "always give the same file."
        ),
    )
    g.add_argument("--hosts", type=int, default=4, help="number of hosts (default: 4)")
    g.add_argument("--gpus", type=int, default=8, help="GPUs, alternating between two models (default: 8)")
    g.add_argument("--nvme", type=int, default=2, help="NVMe drives (default: 2)")
    g.add_argument("--nics", type=int, default=1, help="NICs (default: 1)")
    g.add_argument("--fpgas", type=int, default=1, help="FPGAs (default: 1)")
    g.add_argument("--cxl-devices", type=int, default=2, help="CXL Type-3 memory devices (default: 2)")
    g.add_argument("--chunks", type=int, default=4, help="memory chunks per CXL device (default: 4)")
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
    p.set_defaults(handler=usage(p))


def _validate(args: argparse.Namespace) -> int:
    from emulator.topology import TopologyError, load_topology

    try:
        index = load_topology(args.file)
    except TopologyError as err:
        if args.output in ("json", "yaml"):
            problems = [
                {
                    "line": pos[0] if pos else None,
                    "column": pos[1] if pos else None,
                    "field": p.loc,
                    "problem": p.message,
                }
                for p, pos in zip(err.problems, err.positions, strict=True)
            ]
            print(dump_document({"file": str(args.file), "valid": False, "problems": problems}, args.output))
        else:
            print(f"{err.source}: {len(err.problems)} problem(s):", file=sys.stderr)
            print(err.details(), file=sys.stderr)
        return 1
    summary = {"hosts": len(index.hosts), "devices": len(index.devices), "targets": len(index.targets)}
    if args.output in ("json", "yaml"):
        print(dump_document({"file": str(args.file), "valid": True, "problems": [], **summary}, args.output))
        return 0
    print(
        f"{args.file}: valid: {summary['hosts']} hosts, {summary['devices']} devices, "
        f"{summary['targets']} bindable targets"
    )
    return 0


def _show(args: argparse.Namespace) -> int:
    from emulator.topology import TopologyError, default_topology_path, load_topology

    path = args.file or default_topology_path()
    try:
        index = load_topology(path)
    except TopologyError as err:
        raise CliError(str(err)) from None
    switches: list[dict[str, Any]] = []
    for sw in index.switches.values():
        devices: list[dict[str, Any]] = []
        for device_id in sw.devices:
            d = index.devices[device_id]
            devices.append(
                {
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
                }
            )
        switches.append(
            {"fabric": sw.fabric, "id": sw.id, "hosts": list(sw.upstream_ports), "devices": devices}
        )
    if args.output in ("json", "yaml"):
        document = {"topology": str(path), "hosts": list(index.hosts), "switches": switches}
        print(dump_document(document, args.output))
        return 0
    print(f"topology {path}")
    print(f"hosts ({len(index.hosts)}): {', '.join(index.hosts)}")
    wide = args.output == "wide"
    for summary in switches:
        print(f"{summary['fabric']} switch {summary['id']}: hosts {', '.join(summary['hosts'])}")
        rows: list[list[str]] = []
        for d in summary["devices"]:
            extra = f", {d['chunks']} chunks of {d['chunkMib']} MiB" if d["chunks"] else ""
            rows.append([d["port"], d["id"], d["type"], f"{d['model']} (serial {d['serial']}{extra})"])
            if wide:
                rows[-1] += [d["pciId"], _cell(d["memoryBytes"]), d["link"]]
        headers = ["PORT", "DEVICE", "TYPE", "MODEL"] + (["PCI ID", "MEMORY BYTES", "LINK"] if wide else [])
        print("\n".join("  " + line for line in format_table(headers, rows).splitlines()))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from emulator.topology.generate import GenerateSpec, generate_topology_yaml

    try:
        spec = GenerateSpec(
            hosts=args.hosts,
            gpus=args.gpus,
            nvme=args.nvme,
            nics=args.nics,
            fpgas=args.fpgas,
            cxl_devices=args.cxl_devices,
            chunks=args.chunks,
            devices_per_switch=args.devices_per_switch,
            host_prefix=args.host_prefix,
            seed=args.seed,
        )
    except ValueError as err:
        raise CliError(str(err).splitlines()[-1] if "\n" in str(err) else str(err)) from None
    text = generate_topology_yaml(spec)
    if args.output == "json":
        import yaml

        text = dump_document(yaml.safe_load(text), "json") + "\n"
    if args.output_file is None:
        sys.stdout.write(text)
    else:
        try:
            args.output_file.write_text(text, encoding="utf-8")
        except OSError as err:
            raise CliError(f"cannot write --output-file {args.output_file}: {err.strerror}") from None
        print(f"wrote {args.output_file}", file=sys.stderr)
    return 0
