"""``fabric-dra controller``: the command line of the ResourceSlice publisher and binding controller."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from pathlib import Path

from plumbing import DEFAULT_DRIVER_NAME
from plumbing.cli import SubParsers, positive_seconds

__all__ = ["register"]


def register(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "controller",
        help="publish fabric pools as ResourceSlices; drive the binding-condition flow",
        description=(
            "Publish each fabric pool of the fabric manager's inventory as ResourceSlices "
            "(resource.k8s.io/v1), keep the nodes' pool labels right, and with --binding-conditions "
            "attach allocated devices to the chosen node before the pod is bound. Run two replicas "
            "with --leader-elect; only the leader writes."
        ),
    )
    manager = parser.add_argument_group("fabric manager")
    manager.add_argument(
        "--manager-url",
        default=os.environ.get("FABRIC_DRA_MANAGER_URL"),
        help="base URL of the fabric manager, e.g. http://fabric-dra-manager:8080 "
        "(default: $FABRIC_DRA_MANAGER_URL)",
    )
    manager.add_argument(
        "--manager-token-file",
        type=Path,
        help="file holding the bearer token for the manager (re-read every minute: projected "
        "service-account tokens rotate); the manager must grant it the controller role",
    )
    manager.add_argument(
        "--manager-ca-file", type=Path, help="CA bundle to verify the manager's TLS certificate"
    )
    manager.add_argument(
        "--manager-insecure",
        action="store_true",
        help="do not verify the manager's TLS certificate (development only)",
    )
    kube = parser.add_argument_group("Kubernetes")
    kube.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG or ~/.kube/config)",
    )
    kube.add_argument(
        "--driver-name",
        default=DEFAULT_DRIVER_NAME,
        help="DRA driver name written into slices, attributes and conditions "
        f"(default: {DEFAULT_DRIVER_NAME})",
    )
    kube.add_argument(
        "--publisher",
        default="default",
        help="name of this controller among several that publish one driver (one per fabric manager); "
        "it owns only the slices and node labels it wrote (default: default)",
    )
    kube.add_argument(
        "--leader-elect",
        action="store_true",
        help="elect one writer among replicas through a coordination.k8s.io Lease (use with >1 replica)",
    )
    kube.add_argument(
        "--lease-name",
        default="fabric-dra-controller",
        help="name of the Lease (default: fabric-dra-controller)",
    )
    kube.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the Lease (default: $POD_NAMESPACE, else the kubeconfig's namespace)",
    )
    kube.add_argument(
        "--plugin-pod-selector",
        default=None,
        help="label selector of the kubelet plugin's pods (e.g. app.kubernetes.io/component=plugin): "
        "label a node for a pool only while one of them is Ready on it (default: every node the "
        "fabric reaches)",
    )
    kube.add_argument(
        "--plugin-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the plugin's pods (default: $POD_NAMESPACE, else the kubeconfig's namespace)",
    )
    kube.add_argument(
        "--identity",
        default=None,
        help="this replica's identity in the Lease (default: $POD_NAME, else hostname-pid)",
    )
    publish = parser.add_argument_group("publishing")
    publish.add_argument(
        "--device-taints",
        choices=["auto", "on", "off"],
        default="auto",
        help="unhealthy devices get a NoSchedule taint (on) or are withheld from the slices (off); "
        "auto: taint when the API server keeps a taint on a dry-run write (default: auto)",
    )
    publish.add_argument(
        "--binds-to-node",
        choices=["auto", "on", "off"],
        default="auto",
        help="publish devices with bindsToNode, so pods sharing a claim all run on the node it was "
        "allocated for; auto: when the API server keeps the field on a dry-run write (default: auto)",
    )
    publish.add_argument(
        "--resync-period",
        type=positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="re-read every slice from the API server this often and repair drift; an unchanged "
        "pool costs no write (default: 300)",
    )
    binding = parser.add_argument_group(
        "binding conditions (Kubernetes >= 1.36, or the DRADeviceBindingConditions gate)"
    )
    binding.add_argument(
        "--binding-conditions",
        action="store_true",
        help="publish devices with bindsToNode and the binding conditions <driver>/Attached and "
        "<driver>/AttachFailed, and attach each allocated device before the pod is bound",
    )
    binding.add_argument(
        "--quarantine-after",
        type=int,
        default=3,
        metavar="N",
        help="take a device out of allocation (attach-failed taint, or withheld) after N consecutive "
        "failed attaches, or one that retrying cannot cure (default: 3)",
    )
    binding.add_argument(
        "--quarantine-seconds",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how long a failing device stays out of allocation; doubles each time it is taken out "
        "again, up to an hour; a successful attach ends it (default: 60)",
    )
    binding.add_argument(
        "--bind-timeout",
        type=positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="after this long without a finished attach, report AttachFailed so the scheduler "
        "picks again (default: 300; the scheduler itself gives up after 600)",
    )
    binding.add_argument(
        "--busy-timeout",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="how long a device may stay busy (held by another claim or node) before AttachFailed "
        "(default: 30)",
    )
    binding.add_argument(
        "--release-grace",
        type=positive_seconds,
        default=30.0,
        metavar="SECONDS",
        help="after an attached device's allocation is gone, wait this long for the node plugin's own "
        "detach before detaching it here (default: 30)",
    )
    serve = parser.add_argument_group("probes and metrics")
    serve.add_argument(
        "--host",
        default="0.0.0.0",  # noqa: S104 - kubelet probes reach the pod IP
        help="address for /healthz, /readyz, /metrics, /status (default: 0.0.0.0)",
    )
    serve.add_argument(
        "--port", type=int, default=8081, help="port for the same (default: 8081; 0 picks a free one)"
    )
    serve.add_argument(
        "--ready-file",
        type=Path,
        help="once running, write the probe endpoint's URL to this file (atomically)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from dra_driver.controller.app import Controller, ControllerOptions
    from dra_driver.controller.features import ResourceApiMissing
    from dra_driver.controller.resourcenames import is_driver_name
    from manager_api.client import ManagerClient
    from plumbing.cli import CliError
    from plumbing.kube import KubeClient, load_config
    from plumbing.names import is_label_value
    from plumbing.netutil import ListenError

    if not args.manager_url:
        raise CliError(
            "--manager-url is required (or set FABRIC_DRA_MANAGER_URL): the fabric manager's base URL"
        )
    if not args.manager_url.startswith(("http://", "https://")):
        raise CliError(f"--manager-url {args.manager_url!r}: expected an http:// or https:// URL")
    if not is_driver_name(args.driver_name):
        raise CliError(
            f"--driver-name {args.driver_name!r}: must be a lowercase DNS subdomain of at most 63 characters"
        )
    if not is_label_value(args.publisher) or not args.publisher:
        raise CliError(
            f"--publisher {args.publisher!r}: must be a label value (letters, digits, '-', '_', '.'; ≤ 63)"
        )
    if args.manager_token_file and not Path(args.manager_token_file).is_file():
        raise CliError(f"--manager-token-file {args.manager_token_file}: no such file")
    if not 0 <= args.port <= 65535:
        raise CliError(f"--port {args.port}: must be between 0 and 65535")
    try:
        config = load_config(args.kubeconfig)
    except Exception as err:
        where = args.kubeconfig or "the default kubeconfig"
        raise CliError(f"cannot load Kubernetes configuration from {where}: {err}") from None
    options = ControllerOptions(
        driver=args.driver_name,
        publisher=args.publisher,
        leader_elect=args.leader_elect,
        lease_name=args.lease_name,
        lease_namespace=args.lease_namespace or config.namespace,
        identity=args.identity or "",
        binding_conditions=args.binding_conditions,
        device_taints=args.device_taints,
        binds_to_node=args.binds_to_node,
        resync_period=args.resync_period,
        bind_timeout=args.bind_timeout,
        busy_timeout=args.busy_timeout,
        release_grace=args.release_grace,
        quarantine_after=args.quarantine_after,
        quarantine_seconds=args.quarantine_seconds,
        host=args.host,
        port=args.port,
        ready_file=str(args.ready_file) if args.ready_file else None,
        plugin_pod_selector=args.plugin_pod_selector or None,
        plugin_namespace=args.plugin_namespace or config.namespace,
    )

    # One line per HTTP request would drown the controller's own events (a pass writes ~80 slices).
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with (
            KubeClient(config) as kube,
            ManagerClient(
                args.manager_url,
                token_file=args.manager_token_file,
                ca_file=str(args.manager_ca_file) if args.manager_ca_file else None,
                insecure=args.manager_insecure,
            ) as manager,
        ):
            await Controller(options, kube, manager).run(stop)

    try:
        asyncio.run(main())
    except (ResourceApiMissing, ListenError) as err:  # their message is the whole line
        raise CliError(str(err)) from None
    except OSError as err:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from None
    return 0
