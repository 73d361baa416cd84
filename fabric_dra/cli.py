"""The ``fabric-dra`` command line: one subcommand per role, one image runs them all.

Each role module contributes its subcommand through ``register(subparsers)``; heavy imports happen
inside the handlers, so ``--help`` is fast. A command that names its role imports only that role's
module: starting the emulator does not pay for the scheduler's CEL environment that ``explain``
loads (every process of a local stack starts through here).

The testbed (``fabric-dra-testbed``: ``demo``, ``standin``) is a distribution of its own that the
product never imports: it adds its subcommands through the :data:`COMMANDS_GROUP` entry points, and
without it ``fabric-dra demo`` says in one line how to get it.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path

from plumbing import __version__
from plumbing.cli import SubParsers, add_log_options, emit, run, skip_unused_imports

__all__ = ["COMMANDS_GROUP", "ROLES", "TESTBED_COMMANDS", "added_commands", "build_parser", "main"]

#: (module, its ``register(subparsers)``, the subcommands it adds), in the order ``--help`` lists them.
ROLES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("emulator.cli", "register", ("emulator",)),
    ("fabric.commands.cli", "register", ("manager", "status", "usage")),
    ("fabric.commands.drains", "register", ("drain", "undrain")),
    ("fabric.commands.budgets", "register", ("budget",)),
    ("dra_driver.plugin.cli", "register", ("plugin",)),
    ("dra_driver.controller.cli", "register", ("controller",)),
    ("dra_driver.explain", "register", ("explain",)),
    ("dra_driver.plugin.cdihook", "register", ("cdi-hook",)),
)
#: The entry points through which another distribution adds subcommands: name → ``register(subparsers)``.
COMMANDS_GROUP = "fabric_dra.commands"
#: The subcommands the testbed adds (testbed/pyproject.toml), named here only so that asking for one
#: without the testbed says how to get it.
TESTBED_COMMANDS = ("demo", "standin")
TESTBED_EXTRA = "pip install 'fabric-dra[testbed]'"


#: the options before the role that take a separate value (add_log_options)
_GLOBAL_WITH_VALUE = ("--log-level", "--log-format")


def _command(argv: Sequence[str] | None) -> str | None:
    """The subcommand ``argv`` names (the first word after the global options), if any."""
    words = list(argv or ())
    while words and words[0].startswith("-"):  # the global options, with their values
        option = words.pop(0)
        if option in _GLOBAL_WITH_VALUE and words:
            words.pop(0)
    return words[0] if words else None


@functools.cache
def added_commands() -> dict[str, EntryPoint]:
    """The subcommands installed distributions add (:data:`COMMANDS_GROUP`), by name."""
    return {point.name: point for point in entry_points(group=COMMANDS_GROUP)}


def _registers(argv: Sequence[str] | None) -> list[Callable[[SubParsers], None]]:
    """Every role's ``register``; only the named role's when ``argv`` names one. The installed
    distributions' entry points are read only when no role of the product is named."""
    command = _command(argv)
    named = [r for r in ROLES if command in r[2]]
    if named:
        return [getattr(importlib.import_module(module), name) for module, name, _ in named]
    added = added_commands()
    if command in added:
        return [added[command].load()]
    return [
        *(getattr(importlib.import_module(module), name) for module, name, _ in ROLES),
        *(point.load() for point in added.values()),
        *(_listed_without_testbed(name) for name in TESTBED_COMMANDS if name not in added),
    ]


def _listed_without_testbed(command: str) -> Callable[[SubParsers], None]:
    """A testbed subcommand that is not installed, as ``--help`` lists it (:func:`main` answers it)."""

    def register(subparsers: SubParsers) -> None:
        subparsers.add_parser(command, help=f"not installed: it comes with the testbed ({TESTBED_EXTRA})")

    return register


def _without_testbed(command: str | None) -> str | None:
    """The one line that says a testbed subcommand is not installed, and how to install it."""
    if command not in TESTBED_COMMANDS or command in added_commands():
        return None
    return f"fabric-dra {command}: the {command} command comes with the testbed: {TESTBED_EXTRA}"


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
    _absolute_paths(parser)
    subparsers: SubParsers = parser.add_subparsers(title="roles", metavar="ROLE")
    for register in _registers(argv):
        register(subparsers)
    _on_every_command(subparsers)
    return parser


def absolute_path(text: str) -> Path:
    """A path argument as an absolute path (``~`` expanded), so that every message names the real
    file and a process that changes directory, or a unix socket address (``unix:rel/dra.sock`` would
    read ``rel`` as a host name), still finds it."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    try:
        return Path(text).expanduser().absolute()
    except (OSError, RuntimeError) as err:  # a vanished working directory; ~user of no such user
        raise argparse.ArgumentTypeError(f"cannot make {text!r} an absolute path: {err}") from None


def _absolute_paths(parser: argparse.ArgumentParser) -> None:
    """Every option of ``type=Path`` on this parser is resolved by :func:`absolute_path` — also
    those a parser adds only when it is first used (``manager serve``), and defaults taken from
    the environment, which argparse converts the same way."""
    parser.register("type", Path, absolute_path)


def _on_every_command(subparsers: SubParsers) -> None:
    """On every level of subcommands: the global options also after the subcommand (``fabric-dra
    status --log-level debug``), and path options resolved to absolute paths."""
    for command in subparsers.choices.values():
        add_log_options(command, after_command=True)
        _absolute_paths(command)
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                _on_every_command(action)


def main(argv: Sequence[str] | None = None) -> int:
    skip_unused_imports()  # before build_parser imports the role
    args = list(sys.argv[1:] if argv is None else argv)
    missing = _without_testbed(_command(args))
    if missing is not None:
        emit(missing, file=sys.stderr)
        return 2
    try:
        return run(build_parser(args), args)
    except BrokenPipeError:
        # ``fabric-dra ... | head``: the reader is gone, which is no error of this command. Python
        # would print a traceback flushing stdout at exit; point it at /dev/null instead.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command killed by it


if __name__ == "__main__":
    sys.exit(main())
