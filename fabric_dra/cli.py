"""The ``fabric-dra`` command line: one subcommand per role, one image runs them all.

Each role module contributes its subcommand through ``register(subparsers)``; heavy imports happen
inside the handlers, so ``--help`` is fast. A command that names its role imports only that role's
module: starting the emulator does not pay for the scheduler's CEL environment that ``explain``
loads (every process of a local stack starts through here).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from plumbing import __version__
from plumbing.cli import SubParsers, add_log_options, run

__all__ = ["ROLES", "build_parser", "main"]

#: (module, its ``register(subparsers)``, the subcommands it adds), in the order ``--help`` lists them.
ROLES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("emulator.cli", "register", ("emulator",)),
    ("fabric.cli", "register", ("manager", "status")),
    ("dra_driver.plugin.cli", "register", ("plugin",)),
    ("dra_driver.controller.cli", "register", ("controller",)),
    ("dra_driver.explain", "register", ("explain",)),
    ("fabric_dra.demo.cli", "register", ("demo",)),
    ("kube_standin.cli", "register_role", ("standin",)),
)


#: the options before the role that take a separate value (add_log_options)
_GLOBAL_WITH_VALUE = ("--log-level", "--log-format")


def _registers(argv: Sequence[str] | None) -> list[Callable[[SubParsers], None]]:
    """Every role's ``register``; only the named role's when ``argv`` names one."""
    words = list(argv or ())
    while words and words[0].startswith("-"):  # the global options, with their values
        option = words.pop(0)
        if option in _GLOBAL_WITH_VALUE and words:
            words.pop(0)
    named = [r for r in ROLES if words and words[0] in r[2]]
    return [getattr(importlib.import_module(module), name) for module, name, _ in named or ROLES]


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
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
    add_log_options(parser)
    subparsers: SubParsers = parser.add_subparsers(title="roles", metavar="ROLE")
    for register in _registers(argv):
        register(subparsers)
    _accept_global_options_after(subparsers)
    return parser


def _accept_global_options_after(subparsers: SubParsers) -> None:
    """The global options also after the subcommand (``fabric-dra status --log-level debug``), on
    every level of subcommands."""
    for command in subparsers.choices.values():
        add_log_options(command, after_command=True)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _accept_global_options_after(action)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    return run(build_parser(args), args)


if __name__ == "__main__":
    sys.exit(main())
