"""``python -m kube_standin apiserver|kubelet ...``: the same commands as ``fabric-dra standin``."""

from __future__ import annotations

import argparse
import sys

from kube_standin.cli import register
from plumbing.cli import add_log_options, run, skip_unused_imports


def main(argv: list[str] | None = None) -> int:
    skip_unused_imports()
    parser = argparse.ArgumentParser(prog="python -m kube_standin", description=__doc__)
    add_log_options(parser)
    register(parser.add_subparsers(title="commands", metavar="COMMAND"))
    return run(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
