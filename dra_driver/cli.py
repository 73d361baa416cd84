"""The ``fabric-dra`` command line: one subcommand per role, one image runs them all.

Each role lives in its own package and contributes its subcommand through a
``register(subparsers)`` function listed in :data:`ROLE_MODULES`; a role appears
here once it works. Heavy imports happen inside the handlers, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence

from dra_driver import __version__
from dra_driver.logs import configure

__all__ = ["ROLE_MODULES", "CliError", "Handler", "build_parser", "main", "positive_seconds"]

#: Modules that each define ``register(subparsers: argparse._SubParsersAction) -> None``,
#: in the order their roles are listed by ``--help``.
ROLE_MODULES: tuple[str, ...] = (
    "emulator.cli",  # emulator
    "fabric.cli",  # manager, status
    "dra_driver.plugin.cli",  # plugin
    "dra_driver.controller.cli",  # controller
    "dra_driver.explain",  # explain
    "emulator.demo.cli",  # demo
)

Handler = Callable[[argparse.Namespace], int]


class CliError(Exception):
    """A failure the user can act on: printed as one line, without a traceback."""


def positive_seconds(text: str) -> float:
    """An argparse ``type`` for a duration option: a number of seconds greater than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fabric-dra",
        description=(
            "fabric-dra binds composable PCIe and CXL devices (GPUs, NVMe, NICs, FPGAs, CXL memory) "
            "to Kubernetes nodes only while a pod uses them: a DRA driver plus a Redfish fabric "
            "manager, with a software fabric emulator."
        ),
        epilog="Run 'fabric-dra ROLE --help' for the options of one role.",
    )
    parser.add_argument("--version", action="version", version=f"fabric-dra {__version__}")
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="minimum level of log events written to stderr (default: info)",
    )
    parser.add_argument(
        "--log-format",
        default="logfmt",
        choices=["logfmt", "json"],
        help="one event per line as key=value pairs or as JSON (default: logfmt)",
    )
    subparsers = parser.add_subparsers(title="roles", metavar="ROLE")
    for module_name in ROLE_MODULES:
        try:
            present = importlib.util.find_spec(module_name) is not None
        except ModuleNotFoundError:
            present = False
        if not present:
            continue  # a role that is not part of this build
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    configure(level=args.log_level, fmt=args.log_format)
    try:
        return handler(args)
    except CliError as err:
        print(f"fabric-dra: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
