"""``python -m kube_standin.cluster``: run the stand-in control plane and kubelets as a process."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from pathlib import Path

from kube_standin.cluster.runner import NodeSpec, StandInCluster
from kube_standin.cluster.scheduler import SchedulerConfig
from plumbing.fsutil import atomic_write
from plumbing.kube import KubeClient, KubeConfig, load_config
from plumbing.logs import configure


def _node(text: str) -> NodeSpec:
    """NAME[:REGISTRY_DIR][,label=value...]"""
    head, *labels = text.split(",")
    name, _, registry = head.partition(":")
    if not name:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME[:REGISTRY_DIR][,label=value...]")
    parsed: dict[str, str] = {}
    for label in labels:
        key, sep, value = label.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{text!r}: label {label!r} is not key=value")
        parsed[key] = value
    return NodeSpec(name, parsed, Path(registry) if registry else None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m kube_standin.cluster",
        description="Stand-in Kubernetes control plane (Deployment and ResourceClaim controllers, a DRA "
        "scheduler) and kubelets, against an API server.",
    )
    parser.add_argument("--kubeconfig", help="kubeconfig of the API server")
    parser.add_argument("--server", help="API server URL without authentication (instead of --kubeconfig)")
    parser.add_argument(
        "--node",
        action="append",
        type=_node,
        default=[],
        metavar="NAME[:REGISTRY_DIR][,label=value...]",
        help="a node to run a kubelet for; REGISTRY_DIR holds its DRA plugins' registration sockets "
        "(repeatable)",
    )
    parser.add_argument(
        "--binding-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for binding conditions (default: 600)",
    )
    parser.add_argument("--ready-file", type=Path, help="write the API server URL here once running")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    if not args.node:
        parser.error("give at least one --node")
    configure(level=args.log_level)
    config = KubeConfig(server=args.server) if args.server else load_config(args.kubeconfig)

    async def run() -> None:
        async with KubeClient(config, user_agent="fabric-dra-stand-in") as kube:
            cluster = StandInCluster(
                kube, args.node, scheduler=SchedulerConfig(binding_timeout=args.binding_timeout)
            )
            task = asyncio.ensure_future(cluster.run())
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, task.cancel)
            ready = asyncio.ensure_future(cluster.ready.wait())
            await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
            if cluster.ready.is_set() and args.ready_file is not None:
                atomic_write(args.ready_file, config.server + "\n")
            with contextlib.suppress(asyncio.CancelledError):
                await task

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
