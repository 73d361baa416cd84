"""``fabric-dra plugin``: the DRA kubelet plugin (one per node, as a DaemonSet)."""

from __future__ import annotations

import argparse
import asyncio

from dra_driver.plugin.config import add_arguments
from plumbing.cli import SubParsers

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from dra_driver.plugin.config import config_from_args
    from dra_driver.plugin.server import PluginError, serve
    from plumbing.cli import CliError

    try:
        config = config_from_args(args)
    except ValueError as err:
        raise CliError(str(err).splitlines()[0] if "\n" not in str(err) else _pydantic_line(err)) from None
    try:
        return asyncio.run(serve(config))
    except PluginError as err:
        raise CliError(str(err)) from None


def _pydantic_line(err: ValueError) -> str:
    errors = getattr(err, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return f"invalid plugin configuration: {where}: {first.get('msg')}"
    return str(err).splitlines()[0]


def register(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "plugin",
        help="run the DRA kubelet plugin on this node (DaemonSet)",
        description=(
            "Serve the kubelet's DRA plugin protocol for composable fabric devices: register on "
            "<registry-dir>/<driver>-reg.sock, answer NodePrepareResources (attach through the fabric "
            "manager, wait until this host sees the device, write a CDI spec) and "
            "NodeUnprepareResources (remove host-side, detach, drop the spec) on <plugin-dir>/dra.sock, "
            "and stream device health."
        ),
    )
    add_arguments(parser)
    parser.set_defaults(handler=_run)
