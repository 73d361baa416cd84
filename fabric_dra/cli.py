"""The ``fabric-dra`` command line: one subcommand per role, one image runs them all.

Each role module contributes its subcommand through ``register(subparsers)``; heavy imports happen
inside the handlers, so ``--help`` is fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dra_driver import explain
from dra_driver.controller import cli as controller_cli
from dra_driver.plugin import cli as plugin_cli
from emulator import cli as emulator_cli
from fabric import cli as manager_cli
from fabric_dra.demo import cli as demo_cli
from kube_standin import cli as standin_cli
from plumbing import __version__
from plumbing.cli import SubParsers, add_log_options, run

__all__ = ["ROLES", "build_parser", "main"]

#: ``register(subparsers)`` of each role, in the order ``--help`` lists them.
ROLES = (
    emulator_cli.register,  # emulator
    manager_cli.register,  # manager, status
    plugin_cli.register,  # plugin
    controller_cli.register,  # controller
    explain.register,  # explain
    demo_cli.register,  # demo
    standin_cli.register_role,  # standin
)


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
    add_log_options(parser)
    subparsers: SubParsers = parser.add_subparsers(title="roles", metavar="ROLE")
    for register in ROLES:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
