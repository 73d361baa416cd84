"""``fabric-dra emulator apiserver`` and ``fabric-dra emulator kubelet``: the stand-ins for the
Kubernetes control plane and for the kubelet's plugin and DRA managers.

``register(subparsers)`` is called by ``emulator.cli`` with the emulator's subparsers;
``python -m emulator.kube`` offers the same commands on their own.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from dra_driver.cli import CliError

__all__ = ["register"]


def _versions(text: str) -> tuple[str, ...]:
    if text.strip().lower() in ("", "none"):
        return ()
    versions = tuple(v.strip().removeprefix("v") for v in text.split(",") if v.strip())
    for version in versions:
        parts = version.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise argparse.ArgumentTypeError(f"{version!r} is not a Kubernetes minor version like 1.34")
    return versions


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError("must be greater than zero")
    return value


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    _register_apiserver(subparsers)


def _register_apiserver(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one (default: 0)")
    parser.add_argument(
        "--ready-file",
        type=Path,
        help="once serving, write the base URL (e.g. http://127.0.0.1:40123) to this file atomically",
    )
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
        help="version reported by /version (default: the newest of --validate-versions, e.g. 1.37.0)",
    )
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
        type=_positive,
        default=60.0,
        metavar="SECONDS",
        help="how often an idle watch that allows bookmarks receives one (default: 60, as a real server)",
    )
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
    parser.set_defaults(handler=_run_apiserver)


def _run_apiserver(args: argparse.Namespace) -> int:
    from emulator.kube.apiserver import ApiServerConfig
    from emulator.kube.auth import TokensFileError
    from emulator.kube.kubeconfig import write_kubeconfig
    from emulator.kube.schemas import SchemasUnavailable
    from emulator.kube.serve import serve_apiserver

    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        raise CliError("--tls-cert-file and --tls-private-key-file go together; give both or neither")
    if args.history < 100:
        raise CliError("--history must be at least 100 changes")
    versions = (
        args.validate_versions
        if isinstance(args.validate_versions, tuple)
        else _versions(args.validate_versions)
    )
    config = ApiServerConfig(
        validate_versions=versions,
        server_version=args.server_version,
        tokens_file=args.tokens,
        allow_anonymous=args.allow_anonymous,
        state_file=args.state_file,
        history=args.history,
        bookmark_interval=args.bookmark_interval,
    )

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
    except (SchemasUnavailable, TokensFileError) as err:
        raise CliError(str(err)) from err
    except OSError as err:
        raise CliError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}") from err
    return 0
