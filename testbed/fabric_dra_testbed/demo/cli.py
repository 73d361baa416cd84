"""The ``demo`` role: the README's main job."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="run the composable-DRA article's scenario on this machine, end to end, then devices shared",
        description=(
            "Start the Redfish fabric emulator, the fabric manager, the ResourceSlice controller and one "
            "kubelet plugin per emulated node as real processes on real sockets, with a stand-in control "
            "plane and kubelets (an API server that validates every object against the official schemas, "
            "a DRA scheduler honouring DeviceClass CEL selectors). Then apply the article's manifest and "
            "verify its four steps: the claim is allocated; the pod runs and its node really sees the "
            "device; the fabric binds it to that node; after scaling to 0 the device is detached and back "
            "in the pool. Then devices shared: a pod gets 64 GiB of a CXL memory pool (a chunk carved and "
            "connected, a dax device on its node) and gives it back; with binding conditions, two pods share "
            "one GPU through two partitions (one fabric binding) and the GPU is published whole again after "
            "both end. Runs the plain flow, then the binding-condition flow. Exits 0 only if every step "
            "held; nothing is left running."
        ),
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="keep state and logs here (default: a temporary directory, removed after a passing run)",
    )
    parser.add_argument(
        "--keep-workdir", action="store_true", help="keep the temporary work directory after a passing run"
    )
    parser.add_argument(
        "--latency",
        default="instant",
        help="emulator latency profile: instant (default) or realistic (seconds per hot-add, slower)",
    )
    parser.add_argument(
        "--manifest",
        default="v1",
        help="the article's manifest as resource.k8s.io 'v1' (default) or 'v1beta1', or the path of your own",
    )
    parser.add_argument(
        "--no-binding-conditions",
        dest="binding_conditions",
        action="store_false",
        help="run only the plain flow, not the binding-condition flow after it",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=40.0,
        help="seconds each verification may wait for the system to converge (default: 40)",
    )
    parser.add_argument(
        "--deploy-dir",
        type=Path,
        metavar="DIR",
        help="take the DeviceClasses (DIR/base), the article's and the sharing manifests (DIR/kind) from a "
        "checkout's deploy/ directory instead of the copies installed with fabric-dra",
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    from fabric_dra_testbed.demo.run import DemoOptions, run_demo

    return run_demo(
        DemoOptions(
            deploy_dir=args.deploy_dir,
            workdir=args.workdir,
            keep_workdir=args.keep_workdir,
            latency=args.latency,
            manifest=args.manifest,
            binding_conditions=args.binding_conditions,
            step_timeout=args.step_timeout,
        )
    )
