"""``fabric-dra drain`` and ``undrain``: take a device, a switch's devices or a node's devices out of
allocation for maintenance, and show who is affected (docs/operations.md, "Drains").

The manager keeps the drain (``POST /api/v1/drains``) and shows it on every device it covers; the
controller publishes those devices with the taint ``<driver>/drain`` (NoSchedule, or NoExecute with
``--evict``). The claims holding the devices come from the manager's bindings; their pods, when a
kubeconfig is given (``--kubeconfig`` or ``KUBECONFIG``, or in a pod), from the cluster: the pods of
the claim's namespace that name the claim (``spec.resourceClaims``, ``status.resourceClaimStatuses``)
or that the claim is reserved for."""

from __future__ import annotations

import argparse
import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from plumbing.cli import SubParsers, add_output_option

__all__ = ["Affected", "register"]

_TARGETS = ("device", "switch", "node")


def register(subparsers: SubParsers) -> None:
    from fabric.commands.cli import manager_options

    drain = subparsers.add_parser(
        "drain",
        help="take a device, a switch's or a node's devices out of allocation; list the pods affected",
        description="Drain a device, every device behind a switch, or every device a node holds through "
        "its fabric ports (maintenance of an enclosure): the devices are published with the taint "
        "<driver>/drain, so no new claim gets them; --evict makes it NoExecute, and the pods using them "
        "are evicted. Shows the claims holding the devices and, with a kubeconfig, their pods. "
        "'fabric-dra drain list' lists the drains; 'fabric-dra undrain' ends one.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    drain.add_argument("target", choices=[*_TARGETS, "list"], help="what to drain ('list': every drain)")
    drain.add_argument("name", nargs="?", help="the device, the switch (Id or POOL/Id) or the node")
    drain.add_argument(
        "--reason",
        default="maintenance",
        help="the taint's value (a label value: letters, digits, '-', '_', '.'; at most 63)",
    )
    drain.add_argument("--evict", action="store_true", help="NoExecute: evict the pods using the devices")
    _kube_option(drain)
    manager_options(drain)
    add_output_option(drain)
    drain.set_defaults(handler=_run, undrain=False)

    undrain = subparsers.add_parser(
        "undrain",
        help="end a drain: the devices are offered again",
        description="End the drain of a device, a switch or a node; devices another drain still covers "
        "stay drained.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    undrain.add_argument("target", choices=_TARGETS)
    undrain.add_argument("name")
    manager_options(undrain)
    add_output_option(undrain)
    undrain.set_defaults(handler=_run, undrain=True)


def _kube_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        default=os.environ.get("KUBECONFIG") or None,
        help="the cluster whose pods are listed (env KUBECONFIG); without one, claims only",
    )


def _run(args: argparse.Namespace) -> int:
    from fabric.commands.cli import resolve_token_file

    resolve_token_file(args)
    return asyncio.run(run_drain(args))


@dataclass
class Affected:
    """A covered device that a claim holds, with what the cluster says of the claim."""

    device: str
    state: str
    node: str
    claim_uid: str
    claim: str = ""
    pods: list[str] = field(default_factory=list)


def _holders(device: Any) -> list[tuple[str, str]]:
    """(claim UID, node) of every claim holding ``device`` (whole, a partition, a memory share)."""
    found = [(device.claim_uid, device.node or "")] if device.claim_uid else []
    found += [(p.claim_uid, p.node) for p in device.partitions]
    if device.memory_pool is not None:
        found += [(s.claim_uid, s.node) for s in device.memory_pool.shares]
    return found


async def run_drain(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from fabric.commands.status import manager_client, manager_errors
    from manager_api import models as api
    from manager_api.errors import NotFoundError
    from plumbing.cli import BadInput, emit

    if args.target == "list":
        return await _list(args, out)
    if not args.name:
        raise BadInput(f"drain {args.target}: name the {args.target}")
    target = api.DrainTarget(args.target)
    client, token_given = manager_client(args)
    try:
        with manager_errors(args, token_given, "the fabric manager's drains"):
            try:
                if args.undrain:
                    answer = await client.undrain(target, args.name)
                else:
                    request = _request(target, args)
                    answer = await client.drain(request)
            except NotFoundError as err:
                raise BadInput(err.message) from None
            devices = [d for d in await client.devices() if d.name in answer.drain.devices]
    finally:
        await client.aclose()
    if args.undrain:
        emit(_undrained(answer), file=out)
        return 0
    affected = [Affected(d.name, str(d.state), node, uid) for d in devices for uid, node in _holders(d)]
    note = await _find_pods(args, affected)
    path = await _taint_path(args, [(d.pool, d.name) for d in devices])
    if args.output in ("json", "yaml"):
        from plumbing.cli import dump_document

        document = {
            **answer.model_dump(mode="json", by_alias=True),
            "affected": [vars(a) for a in affected],
            "taintPath": {"path": path.path, "rules": path.rules},
        }
        emit(dump_document(document, args.output), file=out)
        return 0
    emit(_drained(answer, affected, note) + (f"\n{path.line}" if path.line else ""), file=out)
    return 0


def _request(target: Any, args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from manager_api import models as api
    from plumbing.cli import BadInput

    try:
        return api.DrainRequest(target=target, name=args.name, reason=args.reason, evict=args.evict)
    except ValidationError as err:
        first = err.errors()[0]
        what = "--reason" if first["loc"] == ("reason",) else args.target
        value = args.reason if what == "--reason" else args.name
        raise BadInput(
            f"{what} {value!r}: {first['msg']}"
            + (" (a label value: letters, digits, '-', '_', '.'; at most 63)" if what == "--reason" else "")
        ) from None


def _drained(answer: Any, affected: list[Affected], note: str) -> str:
    from plumbing.cli import format_table

    drain = answer.drain
    verb = "drained" if answer.changed else "already drained"
    head = (
        f"{verb} {drain.target} {drain.name} (reason {drain.reason}, {drain.effect}): "
        f"{len(drain.devices)} device(s): {', '.join(drain.devices) or 'none now'}"
    )
    if not affected:
        return f"{head}\nno claim holds them: nothing is affected"
    rows = [[a.device, a.state, a.node, a.claim or a.claim_uid, ", ".join(a.pods) or "-"] for a in affected]
    what = (
        "pods that do not tolerate the drain taint are evicted"
        if str(drain.effect) == "NoExecute"
        else "they keep the devices until they end; --evict evicts their pods"
    )
    table = format_table(["DEVICE", "STATE", "NODE", "CLAIM", "PODS"], rows)
    return f"{head}\n{len(affected)} claim(s) affected; {what}:\n{table}" + (f"\n{note}" if note else "")


def _undrained(answer: Any) -> str:
    drain = answer.drain
    if not answer.changed:
        return f"{drain.target} {drain.name} was not drained: nothing changed"
    return (
        f"undrained {drain.target} {drain.name}: {len(drain.devices)} device(s) offered again, unless "
        "another drain covers them"
    )


async def _list(args: argparse.Namespace, out: TextIO | None) -> int:
    from fabric.commands.status import manager_client, manager_errors
    from plumbing.cli import dump_document, emit, format_table

    client, token_given = manager_client(args)
    try:
        with manager_errors(args, token_given, "the fabric manager's drains"):
            found = await client.drains()
    finally:
        await client.aclose()
    if args.output in ("json", "yaml"):
        emit(dump_document(found.model_dump(mode="json", by_alias=True), args.output), file=out)
        return 0
    rows = [
        [
            str(d.target),
            d.name,
            d.reason,
            str(d.effect),
            f"{d.since:%Y-%m-%d %H:%M}",
            d.by,
            str(len(d.devices)),
        ]
        for d in found.drains
    ]
    headers = ["TARGET", "NAME", "REASON", "EFFECT", "SINCE (UTC)", "BY", "DEVICES"]
    emit(format_table(headers, rows) if rows else "no drains", file=out)
    return 0


async def _find_pods(args: argparse.Namespace, affected: list[Affected]) -> str:
    """Name each affected claim and its pods from the cluster; what to say when it cannot."""
    if not affected:
        return ""
    kubeconfig = getattr(args, "kubeconfig", None)
    if kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "pods not listed: no cluster given (--kubeconfig or KUBECONFIG); claims are shown by UID"
    from plumbing.kube import ApiError, KubeClient
    from plumbing.kube.client import load_config
    from plumbing.kube.dra import ResourceClaim
    from plumbing.kube.resources import PODS, RESOURCE_CLAIMS

    try:
        config = load_config(str(kubeconfig) if kubeconfig else None)
    except (OSError, ValueError) as err:
        return f"pods not listed: cannot read the kubeconfig {kubeconfig}: {err}"
    kube = KubeClient(config)
    try:
        claims = [ResourceClaim.read(o) for o in (await kube.list_all(RESOURCE_CLAIMS))[0]]
        by_uid = {c.metadata.uid: c for c in claims if c is not None}
        pods_of: dict[str, list[dict[str, Any]]] = {}
        for a in affected:
            claim = by_uid.get(a.claim_uid)
            if claim is None:
                continue
            namespace = claim.metadata.namespace or ""
            a.claim = f"{namespace}/{claim.metadata.name}"
            if namespace not in pods_of:
                pods_of[namespace] = (await kube.list_all(PODS, namespace))[0]
            a.pods = _pods_using(claim, pods_of[namespace])
    except ApiError as err:
        return f"pods not listed: the cluster refused: {str(err).splitlines()[0]}"
    finally:
        await kube.aclose()
    return ""


@dataclass
class TaintPath:
    """How the controller tainted the drained devices: ``rules`` (a DeviceTaintRule each),
    ``slices`` (the driver's own slice taints) or ``unknown`` (no cluster to ask)."""

    path: str
    #: what the command prints about it ("" for nothing)
    line: str
    rules: list[str] = field(default_factory=list)


async def _taint_path(
    args: argparse.Namespace, devices: list[tuple[str, str]], wait: float = 10.0
) -> TaintPath:
    """Ask the cluster which path tainted ``devices`` ((pool, name) each): where it serves
    DeviceTaintRules, the rules that select them with a ``<driver>/drain`` taint (waited for up to
    ``wait`` seconds: the controller writes them within one inventory long poll), else the slices."""
    if not devices:
        return TaintPath("unknown", "no device is covered now: nothing is tainted")
    kubeconfig = getattr(args, "kubeconfig", None)
    if kubeconfig is None and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return TaintPath("unknown", "")  # no cluster: the note on pods says so already
    from plumbing.kube import ApiError, KubeClient
    from plumbing.kube.client import load_config
    from plumbing.kube.resources import DEVICE_TAINT_RULE_VERSIONS, DEVICE_TAINT_RULES

    try:
        kube = KubeClient(load_config(str(kubeconfig) if kubeconfig else None))
    except (OSError, ValueError) as err:
        return TaintPath("unknown", f"taints: cannot read the kubeconfig {kubeconfig}: {err}")
    try:
        version = None
        for candidate in DEVICE_TAINT_RULE_VERSIONS:
            try:
                listing = await kube.request("GET", f"/apis/{DEVICE_TAINT_RULES.group}/{candidate}")
            except ApiError:
                continue
            if any(r.get("name") == DEVICE_TAINT_RULES.plural for r in listing.get("resources") or []):
                version = candidate
                break
        if version is None:
            return TaintPath(
                "slices", "tainted in the driver's ResourceSlices (the cluster serves no DeviceTaintRule)"
            )
        rules = await _drain_rules(kube, DEVICE_TAINT_RULES.with_version(version), devices, wait)
    except ApiError as err:
        return TaintPath("unknown", f"taints: the cluster refused: {str(err).splitlines()[0]}")
    finally:
        await kube.aclose()
    if rules is None:
        return TaintPath(
            "slices",
            "tainted in the driver's ResourceSlices: no DeviceTaintRule selects them (the controller runs "
            "with --drain-taints slices, or has not caught up)",
        )
    return TaintPath("rules", f"tainted through DeviceTaintRule(s): {', '.join(rules)}", rules)


async def _drain_rules(
    kube: Any, resource: Any, devices: list[tuple[str, str]], wait: float
) -> list[str] | None:
    """The names of the drain rules selecting every one of ``devices``, or None once ``wait`` passed
    without them all."""
    deadline = asyncio.get_running_loop().time() + wait
    while True:
        items, _ = await kube.list_all(resource)
        found: dict[tuple[str, str], str] = {}
        for rule in items:
            spec = rule.get("spec") or {}
            selector, taint = spec.get("deviceSelector") or {}, spec.get("taint") or {}
            if str(taint.get("key", "")).endswith("/drain"):
                found[(str(selector.get("pool")), str(selector.get("device")))] = str(
                    rule["metadata"]["name"]
                )
        if all(d in found for d in devices):
            return sorted({found[d] for d in devices})
        if asyncio.get_running_loop().time() >= deadline:
            return None
        await asyncio.sleep(0.2)


def _pods_using(claim: Any, pods: list[dict[str, Any]]) -> list[str]:
    """``namespace/name`` of the pods that name ``claim`` or that it is reserved for."""
    reserved = {r.uid for r in claim.status.reserved_for if r.resource == "pods"}
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        named = {r.get("resourceClaimName") for r in (pod.get("spec") or {}).get("resourceClaims") or []}
        named |= {
            s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        }
        if claim.metadata.name in named or meta.get("uid") in reserved:
            found.append(f"{meta.get('namespace')}/{meta.get('name')}")
    return sorted(found)
