"""What every role's command line shares: the error a user can act on, argparse types, the global
logging options, the one way a parsed command is run and the one way it prints.

Every table, document and line a command prints goes through :func:`emit` (and a table's cells
through :func:`format_table`), which show each control, bidi or other invisible character as an
escape (:mod:`plumbing.terminal`): names from a Redfish service or a Kubernetes object reach the
operator's terminal as text, never as control sequences or forged rows.

Each role module defines ``register(subparsers)``; :mod:`fabric_dra.cli` puts them together.
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Sequence
from typing import Any, TextIO, TypeAlias

from plumbing.errors import PlumbingError
from plumbing.logs import configure
from plumbing.terminal import has_unsafe, visible, visible_lines

__all__ = [
    "OUTPUT_FORMATS",
    "BadInput",
    "CliError",
    "Handler",
    "SubParsers",
    "add_log_options",
    "add_output_option",
    "dump_document",
    "emit",
    "format_table",
    "positive_seconds",
    "run",
    "skip_unused_imports",
    "usage",
]

#: ``-o`` of every command that prints data, in kubectl's words: a table, a wider table, or the
#: whole document as JSON or YAML
OUTPUT_FORMATS = ("table", "wide", "json", "yaml")

SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[argparse.Namespace], int]


#: modules a library imports eagerly for a feature no fabric-dra command uses: ``httpx._main`` is
#: httpx's own command line, which pulls in click, rich and pygments wherever they are installed
#: (~100 modules, ~140 ms of CPU at every start of a role that talks HTTP)
UNUSED_MODULES = ("httpx._main",)


def skip_unused_imports() -> None:
    """Make :data:`UNUSED_MODULES` fail to import in this process, so the libraries take their own
    fallback (httpx defines a ``main`` that says the CLI is not installed). Called first thing by
    the command lines, before any role module is imported; a module already imported stays."""
    for name in UNUSED_MODULES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type] # None: "import fails", by design


class CliError(PlumbingError):
    """A failure the user can act on: printed as one line, without a traceback; exit status 1."""

    exit_code = 1


class BadInput(CliError):
    """The command names something that does not exist (a device, a switch): exit status 2, as a
    command line that argparse refuses."""

    exit_code = 2


def positive_seconds(text: str) -> float:
    """An argparse ``type`` for a duration option: a number of seconds greater than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def add_log_options(parser: argparse.ArgumentParser, *, after_command: bool = False) -> None:
    """``--log-level`` and ``--log-format``. ``after_command``: the same options on a subcommand, so
    they may come before or after it; without a default of their own there, the top level's stays."""
    parser.add_argument(
        "--log-level",
        default=argparse.SUPPRESS if after_command else "info",
        choices=["debug", "info", "warning", "error"],
        help="minimum level of log events written to stderr (default: info)",
    )
    parser.add_argument(
        "--log-format",
        default=argparse.SUPPRESS if after_command else "logfmt",
        choices=["logfmt", "json"],
        help="one event per line as key=value pairs or as JSON (default: logfmt)",
    )


def add_output_option(parser: argparse.ArgumentParser, *, aliases: Sequence[str] = ()) -> None:
    """``-o/--output table|wide|json|yaml`` (``aliases``: older words a command keeps accepting)."""
    parser.add_argument(
        "-o",
        "--output",
        choices=[*OUTPUT_FORMATS, *aliases],
        default="table",
        help="table (default), wide (more columns or every device), json or yaml",
    )


def dump_document(document: object, fmt: str) -> str:
    """``document`` (JSON-compatible) as ``json`` or ``yaml`` text that shows no unsafe character
    raw and reads back as ``document``: JSON escapes every character outside printable ASCII; YAML
    puts a string that holds an unsafe character in double quotes and escapes it there."""
    import json

    if fmt == "yaml":
        import yaml

        text: str = yaml.dump(document, Dumper=_yaml_dumper(), sort_keys=False, allow_unicode=True)
        # Only double-quoted scalars hold unsafe characters now; PyYAML's emitter leaves some of them
        # raw (it calls the bidi controls printable), and in double quotes their escapes read back
        # as the same characters.
        return visible_lines(text.rstrip("\n"))
    return json.dumps(document, indent=2)


@functools.cache
def _yaml_dumper() -> Any:
    """PyYAML's safe dumper, writing a string that holds an unsafe character double-quoted (built
    on first use: importing yaml costs every command line otherwise)."""
    import yaml

    class Dumper(yaml.SafeDumper):
        def represent_str(self, data: str) -> Any:
            if has_unsafe(data):
                return self.represent_scalar("tag:yaml.org,2002:str", data, style='"')
            return super().represent_str(data)

    Dumper.add_representer(str, Dumper.represent_str)
    return Dumper


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns as wide as their widest cell, two spaces apart (kubectl's plain table). Every cell is
    shown :func:`~plumbing.terminal.visible`: one line, no control character raw."""
    shown_headers = [visible(h) for h in headers]
    shown_rows = [[visible(c) for c in row] for row in rows]
    widths = [len(h) for h in shown_headers]
    for row in shown_rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(shown_headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in shown_rows]
    return "\n".join(lines)


def emit(text: str, *, file: TextIO | None = None) -> None:
    """Print ``text`` (lines joined by ``\\n``) and a line end, flushed: the one way a command
    prints. Every unsafe character but the line feed is shown as an escape
    (:func:`~plumbing.terminal.visible_lines`); a value that might hold a line feed is made
    :func:`~plumbing.terminal.visible` where it is put in a line."""
    stream = file if file is not None else sys.stdout
    print(visible_lines(text), file=stream, flush=True)


def usage(parser: argparse.ArgumentParser) -> Handler:
    """The handler of a command that only groups subcommands: print its help, exit 2."""

    def handler(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return handler


def run(parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen handler: a :class:`CliError` is one line on stderr, exit 1."""
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    configure(level=args.log_level, fmt=args.log_format)
    try:
        return int(handler(args))
    except CliError as err:
        # One line, whatever the message quotes (a manager's answer, a name from the fabric).
        emit(f"fabric-dra: error: {visible(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
