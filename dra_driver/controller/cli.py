"""``fabric-dra controller``: the command line of the ResourceSlice publisher and binding controller.

Its settings are declared once in :class:`~dra_driver.controller.settings.ControllerSettings`;
running it is four steps: read the settings, load the Kubernetes configuration, turn both into the
controller's options, serve until SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING

from dra_driver.controller.settings import ControllerSettings
from plumbing.cli import SubParsers
from plumbing.settings import add_settings_arguments

if TYPE_CHECKING:
    from dra_driver.controller.app import ControllerOptions
    from plumbing.kube import KubeConfig

__all__ = ["register", "run"]


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
    add_settings_arguments(parser, ControllerSettings)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import logging

    settings = _settings(args)
    config = _kube_config(settings)
    # One line per HTTP request would drown the controller's own events (a pass writes ~80 slices).
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    _serve(settings, config, _options(settings, config))
    return 0


def _settings(args: argparse.Namespace) -> ControllerSettings:
    from plumbing.cli import CliError
    from plumbing.settings import SettingsError, read_settings

    try:
        return read_settings(ControllerSettings, args)
    except SettingsError as err:
        raise CliError(str(err)) from None


def _kube_config(settings: ControllerSettings) -> KubeConfig:
    from plumbing.cli import CliError
    from plumbing.kube import load_config

    try:
        return load_config(settings.kubeconfig)
    except Exception as err:
        where = settings.kubeconfig or "the default kubeconfig"
        raise CliError(f"cannot load Kubernetes configuration from {where}: {err}") from None


def _options(settings: ControllerSettings, config: KubeConfig) -> ControllerOptions:
    from dra_driver.controller.app import ControllerOptions

    return ControllerOptions(
        driver=settings.driver_name,
        publisher=settings.publisher,
        leader_elect=settings.leader_elect,
        lease_name=settings.lease_name,
        lease_namespace=settings.lease_namespace or config.namespace,
        identity=settings.identity or "",
        binding_conditions=settings.binding_conditions,
        device_taints=settings.device_taints,
        binds_to_node=settings.binds_to_node,
        resync_period=settings.resync_period,
        inventory_feed=settings.inventory_feed,
        bind_timeout=settings.bind_timeout,
        busy_timeout=settings.busy_timeout,
        release_grace=settings.release_grace,
        quarantine_after=settings.quarantine_after,
        quarantine_seconds=settings.quarantine_seconds,
        drain_taints=settings.drain_taints,
        link_taint_effect=settings.link_taint_effect,
        link_thresholds=settings.link_thresholds(),
        host=settings.host,
        port=settings.port,
        ready_file=str(settings.ready_file) if settings.ready_file else None,
        plugin_pod_selector=settings.plugin_pod_selector or None,
        plugin_namespace=settings.plugin_namespace or config.namespace,
        manager_down_grace=settings.manager_down_grace,
    )


def _serve(settings: ControllerSettings, config: KubeConfig, options: ControllerOptions) -> None:
    """Run the controller until SIGTERM or SIGINT; a failure to start is one line."""
    from dra_driver.controller.app import Controller
    from dra_driver.controller.features import ResourceApiMissing
    from manager_api.client import ManagerClient
    from plumbing.cli import CliError
    from plumbing.kube import KubeClient
    from plumbing.netutil import ListenError

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        async with contextlib.AsyncExitStack() as clients:
            kube = await clients.enter_async_context(KubeClient(config))
            managers = [
                (
                    endpoint,
                    await clients.enter_async_context(
                        ManagerClient(
                            endpoint.url,
                            token_file=endpoint.token_file,
                            ca_file=str(endpoint.ca_file) if endpoint.ca_file else None,
                            insecure=settings.manager_insecure,
                        )
                    ),
                )
                for endpoint in settings.endpoints()
            ]
            await Controller(options, kube, managers).run(stop)

    try:
        asyncio.run(main())
    except (ResourceApiMissing, ListenError) as err:  # their message is the whole line
        raise CliError(str(err)) from None
    except OSError as err:
        raise CliError(f"cannot listen on {settings.host}:{settings.port}: {err.strerror or err}") from None
