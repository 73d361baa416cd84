"""``fabric-dra standin apiserver`` and ``fabric-dra standin kubelet``: the stand-ins for the
Kubernetes control plane and for the kubelet's plugin and DRA managers.

``register_role(subparsers)`` adds the ``standin`` role to the root command line;
``python -m kube_standin`` offers the same commands on their own.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kube_standin.errors import ConfigError
from plumbing.cli import CliError, SubParsers, positive_seconds, usage
from plumbing.netutil import ListenError

if TYPE_CHECKING:  # the server's modules are imported when it runs, not for --help
    from kube_standin.apiserver.app import ApiServerConfig

__all__ = ["register", "register_role"]


def _versions(text: str) -> tuple[str, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    versions = tuple(v.strip().removeprefix("v") for v in text.split(",") if v.strip())
    for version in versions:
        parts = version.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"{version!r} is not a Kubernetes minor version like 1.34")
    return versions


def register_role(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "standin",
        help="stand-ins for the Kubernetes API server and the kubelet (tests, demo, debugging a plugin)",
        description=(
            "A Kubernetes API test server that validates every object strictly, and the kubelet's side "
            "of the plugin-registration and DRA protocols. See docs/testing.md."
        ),
    )
    register(parser.add_subparsers(title="commands", metavar="COMMAND"))
    parser.set_defaults(handler=usage(parser))


def register(subparsers: SubParsers) -> None:
    _register_apiserver(subparsers)
    _register_kubelet(subparsers)


def _register_apiserver(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "apiserver",
        help="a Kubernetes API server for tests and the local demo (in memory, strict validation)",
        description=(
            "Serve the Kubernetes REST API for the resources fabric-dra uses (core namespaces, nodes, "
            "pods, configmaps, secrets, events; leases; deployments; tokenreviews; resource.k8s.io v1, "
            "v1beta2, v1beta1) from memory. Every object written is validated against the official "
            "JSON schemas of each --validate-versions release, strictly. Test hooks under /testing/v1/ "
            "inject failures and count requests (see docs/testing.md)."
        ),
    )
    # in the order --help lists them
    _listening_options(parser)
    _authentication_options(parser)
    _release_options(parser)
    _storage_options(parser)
    _tls_and_kubeconfig_options(parser)
    parser.set_defaults(handler=_run_apiserver)


def _listening_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default: 0)")
    parser.add_argument(
        "--ready-file",
        type=Path,
        help="once serving, write the base URL (e.g. http://127.0.0.1:40123) to this file atomically",
    )


def _authentication_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens",
        type=Path,
        metavar="FILE",
        help="YAML/JSON file mapping bearer tokens to identities (docs/testing.md); when given, every "
        "request needs a known token, and TokenReview answers from this file. Re-read when it changes.",
    )
    parser.add_argument(
        "--allow-anonymous",
        action="store_true",
        help="with --tokens: also accept requests that carry no token at all "
        "(a wrong token is still rejected)",
    )


def _release_options(parser: argparse.ArgumentParser) -> None:
    """The Kubernetes releases the server stands in for: schemas, version, gates, API versions."""
    parser.add_argument(
        "--validate-versions",
        type=_versions,
        default="1.34,1.35,1.36,1.37",
        metavar="LIST",
        help="Kubernetes releases whose strict schemas every written object must satisfy, comma-separated, "
        "or 'none' (default: 1.34,1.35,1.36,1.37)",
    )
    parser.add_argument(
        "--server-version",
        metavar="X.Y.Z",
        help="version reported by /version, and the release whose feature gates are on by default "
        "(default: the newest of --validate-versions, e.g. 1.37.0)",
    )
    parser.add_argument(
        "--feature-gates",
        metavar="A=true,B=false",
        help="change feature gates from the release's defaults, as kube-apiserver's flag; fields of "
        "disabled gates are dropped on write (docs/testing.md)",
    )
    parser.add_argument(
        "--runtime-config",
        metavar="GROUP/VERSION=true,...",
        help="serve API versions that are off by default (resource.k8s.io/v1beta1, v1beta2), as "
        "kube-apiserver's flag",
    )


def _storage_options(parser: argparse.ArgumentParser) -> None:
    """What the server keeps: objects across restarts, changes for watches and pages."""
    parser.add_argument(
        "--state-file",
        type=Path,
        help="load objects from this file at start and save them there (atomically) after changes and at "
        "exit, so a restarted server keeps its objects; watches from before a restart get 410 Gone",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=20_000,
        metavar="N",
        help="changes kept for watch resumption and paginated lists; older resourceVersions get 410 Gone "
        "(default: 20000)",
    )
    parser.add_argument(
        "--bookmark-interval",
        type=positive_seconds,
        default=60.0,
        metavar="SECONDS",
        help="how often an idle watch that allows bookmarks receives one (default: 60, as a real server)",
    )


def _tls_and_kubeconfig_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls-cert-file", type=Path, help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--tls-private-key-file", type=Path, help="private key of --tls-cert-file (PEM)")
    parser.add_argument(
        "--write-kubeconfig",
        type=Path,
        metavar="FILE",
        help="once serving, write a kubeconfig for this server (for kubectl and the roles' --kubeconfig)",
    )
    parser.add_argument(
        "--kubeconfig-token",
        metavar="TOKEN",
        help="bearer token to put into --write-kubeconfig (one of the --tokens)",
    )


def _apiserver_config(args: argparse.Namespace) -> ApiServerConfig:
    """The server's configuration from the command line; one line for what cannot be served."""
    from kube_standin.apiserver.app import ApiServerConfig
    from kube_standin.apiserver.features import parse_feature_gates, parse_runtime_config

    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise CliError("--tls-cert-file and --tls-private-key-file go together; give both or neither")
    if args.history < 100:
        raise CliError("--history must be at least 100 changes")
    try:
        gates = parse_feature_gates(args.feature_gates)
        runtime_config = parse_runtime_config(args.runtime_config)
    except ConfigError as err:
        raise CliError(str(err)) from err
    versions = (
        args.validate_versions
        if isinstance(args.validate_versions, tuple)
        else _versions(args.validate_versions)
    )
    return ApiServerConfig(
        validate_versions=versions,
        server_version=args.server_version,
        tokens_file=args.tokens,
        allow_anonymous=args.allow_anonymous,
        state_file=args.state_file,
        history=args.history,
        bookmark_interval=args.bookmark_interval,
        feature_gates=gates,
        runtime_config=runtime_config,
    )


def _run_apiserver(args: argparse.Namespace) -> int:
    from kube_standin.apiserver.kubeconfig import write_kubeconfig
    from kube_standin.apiserver.serve import serve_apiserver

    config = _apiserver_config(args)

    def on_ready(url: str) -> None:
        if args.write_kubeconfig is not None:
            ca_file = args.tls_cert_file.resolve() if args.tls_cert_file else None
            write_kubeconfig(args.write_kubeconfig, url, token=args.kubeconfig_token, ca_file=ca_file)

    async def main() -> None:
        await serve_apiserver(
            config,
            host=args.host,
            port=args.port,
            ready_file=args.ready_file,
            tls_cert_file=args.tls_cert_file,
            tls_key_file=args.tls_private_key_file,
            on_ready=on_ready,
        )

    try:
        asyncio.run(main())
    except ConfigError as err:  # schemas, tokens, state file, the release of --server-version
        raise CliError(str(err)) from err
    except ListenError as err:
        raise CliError(str(err)) from None
    except OSError as err:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from err
    return 0


# -- kubelet ------------------------------------------------------------------------------------


def _register_kubelet(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "kubelet",
        help="talk to DRA plugins exactly as the kubelet does (registration, prepare, unprepare, health)",
        description=(
            "The kubelet's side of the DRA plugin protocol, for debugging a plugin on its node: "
            "find registration sockets, GetInfo, validate, NotifyRegistrationStatus, then call "
            "NodePrepareResources / NodeUnprepareResources (v1, or v1beta1 if that is what the plugin "
            "offers first) with the kubelet's 45 s deadline, and follow NodeWatchResources. "
            "Results are printed as JSON."
        ),
    )
    actions = parser.add_subparsers(title="actions", metavar="ACTION")

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--registry-dir",
            type=Path,
            default=Path("/var/lib/kubelet/plugins_registry"),
            help="directory the kubelet watches for registration sockets "
            "(default: /var/lib/kubelet/plugins_registry)",
        )
        sub.add_argument(
            "--wait",
            type=positive_seconds,
            default=30.0,
            metavar="SECONDS",
            help="how long to wait for the plugin to register (default: 30)",
        )

    watch = actions.add_parser(
        "watch",
        help="register every plugin that appears and log registrations and device health until stopped",
    )
    common(watch)
    watch.add_argument("--no-health", action="store_true", help="do not open NodeWatchResources streams")
    watch.set_defaults(handler=_kubelet_watch)

    info = actions.add_parser("info", help="call GetInfo on one registration socket (no notification)")
    info.add_argument("socket", type=Path, help="the plugin's registration socket")
    info.set_defaults(handler=_kubelet_info)

    for name, helptext in (
        ("prepare", "NodePrepareResources for claims, as the kubelet does before starting a pod"),
        ("unprepare", "NodeUnprepareResources for claims, as the kubelet does after a pod is gone"),
    ):
        sub = actions.add_parser(name, help=helptext)
        common(sub)
        sub.add_argument("--driver", default="fabric-dra.io", help="DRA driver name (default: fabric-dra.io)")
        sub.add_argument(
            "--claim",
            action="append",
            required=True,
            metavar="NAMESPACE/NAME[/UID]",
            help="a claim to send (repeatable); without UID it is read from the API server (--kubeconfig)",
        )
        sub.add_argument(
            "--kubeconfig", help="kubeconfig to look claims up (default: $KUBECONFIG, ~/.kube/config)"
        )
        sub.add_argument(
            "--deadline",
            type=positive_seconds,
            default=45.0,
            metavar="SECONDS",
            help="deadline of the call (default: 45, the kubelet's)",
        )
        sub.set_defaults(handler=_kubelet_prepare if name == "prepare" else _kubelet_unprepare)

    health = actions.add_parser("health", help="print the plugin's NodeWatchResources stream as JSON lines")
    common(health)
    health.add_argument("--driver", default="fabric-dra.io", help="DRA driver name (default: fabric-dra.io)")
    health.add_argument("--count", type=int, default=0, help="stop after this many messages (default: never)")
    health.set_defaults(handler=_kubelet_health)

    parser.set_defaults(handler=usage(parser))


def _run(coro: Any) -> int:
    from kube_standin.kubelet_client import KubeletError

    try:
        return int(asyncio.run(coro))
    except KubeletError as err:
        raise CliError(str(err)) from err


def _kubelet_watch(args: argparse.Namespace) -> int:
    from kube_standin.kubelet_client import PluginManager

    async def main() -> int:
        manager = PluginManager(args.registry_dir, watch_health=not args.no_health)
        await manager.run()
        return 0

    return _run(main())


def _kubelet_info(args: argparse.Namespace) -> int:
    import grpc

    from dra_driver.proto.pluginregistration_v1 import api_pb2 as reg_pb2
    from dra_driver.proto.pluginregistration_v1 import api_pb2_grpc as reg_grpc

    async def main() -> int:
        if not args.socket.is_socket():
            raise CliError(
                f"{args.socket} is not a unix socket; registration sockets are in the registry dir"
            )
        target = "unix://" + str(args.socket.resolve())
        async with grpc.aio.insecure_channel(target) as channel:
            try:
                await asyncio.wait_for(channel.channel_ready(), 10)
                stub: Any = reg_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=1)
            except TimeoutError as err:
                raise CliError(
                    f"nothing answers on {args.socket} (no connection within 10 s): "
                    "is the plugin running, and is this its registration socket?"
                ) from err
            except grpc.aio.AioRpcError as err:
                raise CliError(
                    f"GetInfo on {args.socket} failed: {err.code().name} {err.details()}; "
                    "is this a kubelet plugin registration socket?"
                ) from err
        out = {
            "type": info.type,
            "name": info.name,
            "endpoint": info.endpoint,
            "supportedVersions": list(info.supported_versions),
        }
        print(json.dumps(out, indent=2))
        return 0

    return _run(main())


async def _claim_refs(args: argparse.Namespace) -> list[Any]:
    from kube_standin.kubelet_client import ClaimRef

    refs: list[ClaimRef] = []
    lookups: list[tuple[str, str]] = []
    for text in args.claim:
        parts = text.split("/")
        if len(parts) == 3 and all(parts):
            refs.append(ClaimRef(*parts))
        elif len(parts) == 2 and all(parts):
            lookups.append((parts[0], parts[1]))
        else:
            raise CliError(f"--claim {text!r}: expected NAMESPACE/NAME or NAMESPACE/NAME/UID")
    if lookups:
        from plumbing.kube import ApiError, KubeClient, load_config
        from plumbing.kube.resources import RESOURCE_CLAIMS

        try:
            config = load_config(args.kubeconfig)
        except Exception as err:
            raise CliError(
                f"cannot load a kubeconfig to look claims up ({err}); give NAMESPACE/NAME/UID"
            ) from err
        async with KubeClient(config) as kube:
            for namespace, name in lookups:
                try:
                    claim = await kube.get(RESOURCE_CLAIMS, name, namespace)
                except ApiError as err:
                    raise CliError(f"cannot read ResourceClaim {namespace}/{name}: {err}") from err
                refs.append(ClaimRef.of(claim))
    return refs


@contextlib.asynccontextmanager
async def _registered_plugin(args: argparse.Namespace) -> AsyncIterator[Any]:
    """Run the plugin manager on --registry-dir until --driver is registered; yield its client."""
    from kube_standin.kubelet_client import PluginManager

    manager = PluginManager(args.registry_dir, watch_health=False, reconcile_period=0.1)
    runner = asyncio.create_task(manager.run())
    try:
        yield await manager.wait_for_plugin(args.driver, within=args.wait)
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner


def _kubelet_prepare(args: argparse.Namespace) -> int:
    async def main() -> int:
        refs = await _claim_refs(args)
        async with _registered_plugin(args) as client:
            results = await client.node_prepare_resources(refs, deadline=args.deadline)
        out = {
            uid: {
                "error": result.error,
                "devices": [
                    {
                        "requestNames": list(d.request_names),
                        "pool": d.pool,
                        "device": d.device,
                        "cdiDeviceIDs": list(d.cdi_device_ids),
                    }
                    for d in result.devices
                ],
            }
            for uid, result in results.items()
        }
        print(json.dumps({"service": client.chosen_service, "claims": out}, indent=2))
        return 0 if all(r.ok for r in results.values()) and len(results) == len(refs) else 1

    return _run(main())


def _kubelet_unprepare(args: argparse.Namespace) -> int:
    async def main() -> int:
        refs = await _claim_refs(args)
        async with _registered_plugin(args) as client:
            errors = await client.node_unprepare_resources(refs, deadline=args.deadline)
        print(
            json.dumps(
                {"service": client.chosen_service, "claims": {k: {"error": v} for k, v in errors.items()}},
                indent=2,
            )
        )
        return 0 if not any(errors.values()) and len(errors) == len(refs) else 1

    return _run(main())


def _kubelet_health(args: argparse.Namespace) -> int:
    async def main() -> int:
        seen = 0
        async with _registered_plugin(args) as client:
            async for devices in client.watch_resources():
                print(
                    json.dumps(
                        [
                            {
                                "pool": d.pool,
                                "device": d.device,
                                "health": d.health,
                                "lastUpdated": d.last_updated,
                            }
                            for d in devices
                        ]
                    ),
                    flush=True,
                )
                seen += 1
                if args.count and seen >= args.count:
                    break
        return 0

    return _run(main())
