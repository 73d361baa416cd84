"""``python -m emulator.kube apiserver|kubelet ...``: the same commands as
``fabric-dra emulator apiserver|kubelet``, usable before the emulator CLI wires them in."""

from __future__ import annotations

import argparse
import sys

from dra_driver.cli import CliError
from dra_driver.logs import configure
from emulator.kube.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emulator.kube", description=__doc__)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--log-format", default="logfmt", choices=["logfmt", "json"])
    register(parser.add_subparsers(title="commands", metavar="COMMAND"))
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    configure(level=args.log_level, fmt=args.log_format)
    try:
        return int(args.handler(args))
    except CliError as err:
        print(f"fabric-dra: error: {err}", file=sys.stderr)  # noqa: T201 - the command line's own output
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
