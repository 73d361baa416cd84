"""``fabric-dra explain CLAIM.yaml``: why a claim does (or does not) fit the published devices.

Reads a ResourceClaim, a ResourceClaimTemplate, or a workload (Pod, Deployment, StatefulSet,
Job, …) whose pod spec lists ``resourceClaims``, in ``resource.k8s.io/v1`` or ``v1beta1``;
reads DeviceClasses, ResourceSlices, Nodes and existing claims from a cluster
(``--kubeconfig``), from files (``--slices``/``--classes``, offline), or builds the slices the
controller would publish from a fabric manager's inventory (``--manager-url`` with ``--classes``,
no cluster needed); then runs the
scheduler's allocator (:mod:`dra_driver.selection`) on every node and prints, for each
request, which devices fit and what rejected the others.

Exit status: 0 when the claims fit on some node, 1 when they fit nowhere, 2 on bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import yaml
from pydantic import ValidationError

from dra_driver.errors import InputError
from dra_driver.selection import (
    AllocatedState,
    Allocator,
    ClaimToAllocate,
    DeviceClass,
    Node,
    NodeReport,
    ResourceClaimSpec,
    ResourceSlice,
    explain_node,
)
from dra_driver.selection.model import NodeSelector
from dra_driver.selection.report import DeviceVerdict, RequestReport
from plumbing.cli import SubParsers, add_output_option, dump_document, emit
from plumbing.terminal import visible

if TYPE_CHECKING:
    from manager_api.models import Inventory as FabricInventory

__all__ = ["ExplainInputError", "Workload", "main_explain", "register"]

EXIT_FITS, EXIT_NO_FIT, EXIT_BAD_INPUT = 0, 1, 2
_WORKLOAD_KINDS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}
_DEVICE_LIST_LIMIT = 8


class ExplainInputError(InputError):
    """Input that cannot be explained; the message names the file and field."""


def register(subparsers: SubParsers) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="why a claim does (not) fit the published devices",
        description=(
            "Evaluate a claim's requests, its DeviceClasses' CEL selectors and its constraints against "
            "the published ResourceSlices, node by node, the way kube-scheduler allocates devices; show "
            "which devices fit each request and what rejected the others. Exit status: 0 if the claims "
            "fit on some node, 1 if on none, 2 on bad input."
        ),
    )
    parser.add_argument(
        "manifest",
        metavar="CLAIM.yaml",
        help="a ResourceClaim, ResourceClaimTemplate, or Pod/Deployment/… with resourceClaims "
        "(several YAML documents allowed; '-' reads stdin)",
    )
    parser.add_argument(
        "--kubeconfig", help="read DeviceClasses, ResourceSlices, Nodes and claims from this cluster"
    )
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "--slices",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="offline: ResourceSlices (YAML/JSON, a List or several documents); repeatable",
    )
    parser.add_argument(
        "--classes",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="offline: DeviceClasses; repeatable",
    )
    parser.add_argument(
        "--nodes",
        type=Path,
        metavar="FILE",
        help="offline: Nodes with their labels; without it, one stand-in node per distinct slice "
        "placement is assumed",
    )
    parser.add_argument(
        "--claims",
        type=Path,
        metavar="FILE",
        help="offline: existing ResourceClaims whose allocations hold devices",
    )
    parser.add_argument(
        "--manager-url",
        default=None,
        help="no cluster: build the ResourceSlices the controller would publish from this fabric "
        "manager's inventory (with --classes; its bound devices count as allocated)",
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        help="with --manager-url: file holding a bearer token (default: $FABRIC_DRA_TOKEN)",
    )
    parser.add_argument(
        "--ca-file", type=Path, help="with --manager-url: CA bundle of the manager's TLS certificate"
    )
    parser.add_argument("--node", help="explain this node only")
    parser.add_argument(
        "-n",
        "--namespace",
        help="namespace of the claims in CLAIM.yaml when they name none (default: default)",
    )
    # "text" is what -o said before the commands shared one grammar; it is the table.
    add_output_option(parser, aliases=("text",))
    parser.add_argument(
        "--all-devices",
        action="store_true",
        help=f"list every device (default: at most {_DEVICE_LIST_LIMIT} per reason)",
    )
    parser.set_defaults(handler=main_explain)


# -- input ------------------------------------------------------------------------------------


def _load_documents(path: str | Path) -> list[dict[str, Any]]:
    label = "stdin" if path == "-" else str(path)
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as err:
        raise ExplainInputError(f"{label}: cannot read: {err.strerror or err}") from err
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise ExplainInputError(f"{label}: not valid YAML: {' '.join(str(err).split())}") from err
    flat: list[dict[str, Any]] = []
    for index, document in enumerate(documents):
        if not isinstance(document, dict):
            raise ExplainInputError(f"{label}: document {index + 1} is not an object")
        if str(document.get("kind", "")).endswith("List") and isinstance(document.get("items"), list):
            flat.extend(item for item in document["items"] if isinstance(item, dict))
        else:
            flat.append(document)
    return flat


def _where(path: str | Path, doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return f"{path}: {doc.get('kind', '?')} {meta.get('name') or meta.get('generateName') or '?'}"


def _validation_message(err: ValidationError) -> str:
    first = err.errors()[0]
    location = ".".join(str(p) for p in first["loc"])
    return f"{location}: {first['msg']}" if location else str(first["msg"])


def _parse_spec(path: str, doc: dict[str, Any], spec: Any, field_path: str) -> ResourceClaimSpec:
    if not isinstance(spec, dict):
        raise ExplainInputError(f"{_where(path, doc)}: {field_path} is missing")
    try:
        parsed = ResourceClaimSpec.model_validate(spec)
    except ValidationError as err:
        raise ExplainInputError(f"{_where(path, doc)}: {field_path}.{_validation_message(err)}") from err
    for request in parsed.devices.requests:
        if request.exactly is None and not request.first_available:
            raise ExplainInputError(
                f"{_where(path, doc)}: {field_path}.devices.requests[{request.name}] needs exactly or "
                "firstAvailable (resource.k8s.io/v1) or deviceClassName (v1beta1)"
            )
    return parsed


def _check_api(path: str, doc: dict[str, Any]) -> None:
    api = str(doc.get("apiVersion", ""))
    if doc.get("kind") in {"ResourceClaim", "ResourceClaimTemplate"} and not api.startswith(
        "resource.k8s.io/"
    ):
        raise ExplainInputError(f"{_where(path, doc)}: apiVersion {api or '(none)'} is not resource.k8s.io/*")


def _parse_objects(
    path: str | Path, documents: Iterable[dict[str, Any]], kind: str, model: type[Any]
) -> list[Any]:
    parsed = []
    for doc in documents:
        if doc.get("kind") != kind:
            continue
        try:
            parsed.append(model.model_validate(doc))
        except ValidationError as err:
            raise ExplainInputError(f"{_where(path, doc)}: {_validation_message(err)}") from err
    return parsed


@dataclass
class Workload:
    """The claims to explain together (one pod's claims), or one standalone claim."""

    title: str
    claims: list[ClaimToAllocate]
    #: claims a pod references by name that must be fetched from the cluster
    missing_claims: list[tuple[str, str]] = field(default_factory=list)


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = doc.get("spec") or {}
    if doc.get("kind") == "Pod":
        return spec if isinstance(spec, dict) else None
    if doc.get("kind") == "CronJob":
        spec = (spec.get("jobTemplate") or {}).get("spec") or {}
    template = (spec.get("template") or {}) if isinstance(spec, dict) else {}
    pod_spec = template.get("spec") if isinstance(template, dict) else None
    return pod_spec if isinstance(pod_spec, dict) else None


def workloads_from(path: str, documents: list[dict[str, Any]], namespace: str | None) -> list[Workload]:
    """Turn the manifest into claim sets: each workload's claims together, else each claim alone."""
    default_ns = namespace or "default"
    for doc in documents:
        _check_api(path, doc)
    templates: dict[tuple[str, str], tuple[dict[str, Any], ResourceClaimSpec]] = {}
    claims: dict[tuple[str, str], tuple[dict[str, Any], ResourceClaimSpec]] = {}
    for doc in documents:
        meta = doc.get("metadata") or {}
        key = (meta.get("namespace") or default_ns, meta.get("name") or "")
        if doc.get("kind") == "ResourceClaimTemplate":
            template_spec = (doc.get("spec") or {}).get("spec")
            templates[key] = (doc, _parse_spec(path, doc, template_spec, "spec.spec"))
        elif doc.get("kind") == "ResourceClaim":
            claims[key] = (doc, _parse_spec(path, doc, doc.get("spec"), "spec"))

    result: list[Workload] = []
    for doc in documents:
        if doc.get("kind") not in _WORKLOAD_KINDS:
            continue
        meta = doc.get("metadata") or {}
        ns = meta.get("namespace") or default_ns
        pod_name = meta.get("name") or "pod"
        pod_spec = _pod_spec(doc)
        entries = (pod_spec or {}).get("resourceClaims") or []
        if not entries:
            raise ExplainInputError(f"{_where(path, doc)}: the pod spec has no resourceClaims to explain")
        workload = Workload(f"{doc['kind']} {ns}/{pod_name}", [])
        for index, entry in enumerate(entries):
            name = entry.get("name") or f"#{index}"
            if entry.get("resourceClaimTemplateName"):
                template = templates.get((ns, entry["resourceClaimTemplateName"]))
                if template is None:
                    raise ExplainInputError(
                        f"{_where(path, doc)}: spec.resourceClaims[{name}] uses ResourceClaimTemplate "
                        f"{entry['resourceClaimTemplateName']}, which is not in {path}"
                    )
                workload.claims.append(ClaimToAllocate(ns, f"{pod_name}-{name}", template[1]))
            elif entry.get("resourceClaimName"):
                claim = claims.get((ns, entry["resourceClaimName"]))
                if claim is None:
                    workload.missing_claims.append((ns, entry["resourceClaimName"]))
                else:
                    workload.claims.append(ClaimToAllocate(ns, entry["resourceClaimName"], claim[1]))
            else:
                raise ExplainInputError(
                    f"{_where(path, doc)}: spec.resourceClaims[{name}] names neither resourceClaimName "
                    "nor resourceClaimTemplateName"
                )
        result.append(workload)
    if result:
        return result
    for (ns, name), (_doc, spec) in templates.items():
        result.append(Workload(f"ResourceClaimTemplate {ns}/{name}", [ClaimToAllocate(ns, name, spec)]))
    for (ns, name), (_doc, spec) in claims.items():
        result.append(Workload(f"ResourceClaim {ns}/{name}", [ClaimToAllocate(ns, name, spec)]))
    if not result:
        raise ExplainInputError(
            f"{path}: no ResourceClaim, ResourceClaimTemplate or workload with resourceClaims found"
        )
    return result


@dataclass
class Inventory:
    slices: list[ResourceSlice]
    classes: dict[str, DeviceClass]
    nodes: list[Node]
    claims: list[dict[str, Any]]
    synthetic_nodes: bool = False


def _stand_in_nodes(slices: Sequence[ResourceSlice]) -> list[Node]:
    """One node per distinct placement the slices name, when no Nodes are known (offline)."""
    nodes: dict[str, Node] = {}

    def add(name: str, labels: dict[str, str]) -> None:
        nodes.setdefault(name, Node.model_validate({"metadata": {"name": name, "labels": labels}}))

    def from_selector(selector: NodeSelector) -> None:
        for term in selector.node_selector_terms:
            labels: dict[str, str] = {}
            for req in term.match_expressions:
                if req.operator == "In" and req.values:
                    labels[req.key] = req.values[0]
                elif req.operator == "Exists":
                    labels[req.key] = ""
                elif req.operator in {"Gt", "Lt"} and req.values:
                    bound = int(req.values[0]) if req.values[0].lstrip("-").isdigit() else 0
                    labels[req.key] = str(bound + 1 if req.operator == "Gt" else bound - 1)
            names = [f.values[0] for f in term.match_fields if f.key == "metadata.name" and f.values]
            if names:
                add(names[0], labels)
            else:
                shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "no labels"
                add(f"<any node with {shown}>", labels)

    for slice_ in slices:
        spec = slice_.spec
        if spec.node_name:
            add(spec.node_name, {})
        elif spec.node_selector is not None:
            from_selector(spec.node_selector)
        elif spec.per_device_node_selection:
            for device in spec.devices:
                if device.node_name:
                    add(device.node_name, {})
                elif device.node_selector is not None:
                    from_selector(device.node_selector)
    if not nodes or any(s.spec.all_nodes for s in slices):
        add("<any node>", {})
    return list(nodes.values())


def load_offline(args: argparse.Namespace) -> Inventory:
    slices: list[ResourceSlice] = []
    for path in args.slices:
        slices.extend(_parse_objects(path, _load_documents(path), "ResourceSlice", ResourceSlice))
    classes: dict[str, DeviceClass] = {}
    for path in args.classes:
        for device_class in _parse_objects(path, _load_documents(path), "DeviceClass", DeviceClass):
            classes[device_class.name] = device_class
    if not slices:
        raise ExplainInputError(
            "no ResourceSlices: pass --kubeconfig to read them from a cluster, or --slices FILE"
        )
    nodes: list[Node] = []
    if args.nodes:
        nodes = _parse_objects(args.nodes, _load_documents(args.nodes), "Node", Node)
    claims = (
        [d for d in _load_documents(args.claims) if d.get("kind") == "ResourceClaim"] if args.claims else []
    )
    return Inventory(slices, classes, nodes or _stand_in_nodes(slices), claims, synthetic_nodes=not nodes)


async def load_cluster(args: argparse.Namespace, progress: TextIO) -> Inventory:
    from plumbing.kube import ApiError, KubeClient, NotFound, load_config
    from plumbing.kube.resources import DEVICE_CLASSES, NODES, RESOURCE_CLAIMS, RESOURCE_SLICES

    try:
        config = load_config(args.kubeconfig, args.context)
    except Exception as err:  # the kubernetes library raises several types for a bad kubeconfig
        source = args.kubeconfig or "the default kubeconfig ($KUBECONFIG or ~/.kube/config)"
        raise ExplainInputError(
            f"cannot load {source}: {' '.join(str(err).split())} "
            "(pass --kubeconfig, or --slices/--classes to explain offline)"
        ) from err
    async with KubeClient(config, user_agent="fabric-dra-explain") as kube:
        emit(
            f"reading DeviceClasses, ResourceSlices, Nodes and ResourceClaims from {config.server}",
            file=progress,
        )
        try:
            version = "v1"
            try:
                raw_slices, _ = await kube.list_all(RESOURCE_SLICES)
            except NotFound:
                version = "v1beta1"  # clusters before 1.34 serve resource.k8s.io/v1beta1
                raw_slices, _ = await kube.list_all(RESOURCE_SLICES.with_version(version))
            raw_classes, _ = await kube.list_all(DEVICE_CLASSES.with_version(version))
            raw_claims, _ = await kube.list_all(RESOURCE_CLAIMS.with_version(version))
            raw_nodes, _ = await kube.list_all(NODES)
        except ApiError as err:
            raise ExplainInputError(
                f"cannot read from the cluster at {config.server}: {err} "
                "(check the kubeconfig and that this user may list resourceslices, deviceclasses, "
                "resourceclaims and nodes)"
            ) from err
    slices = [ResourceSlice.model_validate(s) for s in raw_slices]
    classes = {c.name: c for c in (DeviceClass.model_validate(c) for c in raw_classes)}
    nodes = [Node.model_validate(n) for n in raw_nodes]
    emit(
        f"found {len(slices)} ResourceSlices ({sum(len(s.spec.devices) for s in slices)} devices), "
        f"{len(classes)} DeviceClasses, {len(nodes)} Nodes, {len(raw_claims)} ResourceClaims",
        file=progress,
    )
    return Inventory(slices, classes, nodes or _stand_in_nodes(slices), raw_claims, synthetic_nodes=not nodes)


def _manager_claims(devices: Iterable[Any], driver: str) -> list[dict[str, Any]]:
    """The manager's bindings as allocated claims, so the devices they hold count as taken."""
    held: dict[str, list[dict[str, str]]] = {}
    for device in devices:
        if device.claim_uid:
            held.setdefault(device.claim_uid, []).append(
                {"request": "held", "driver": driver, "pool": device.pool, "device": device.name}
            )
    return [
        {
            "metadata": {"namespace": "(fabric manager)", "name": uid, "uid": uid},
            "status": {"allocation": {"devices": {"results": results}}},
        }
        for uid, results in held.items()
    ]


async def load_manager(args: argparse.Namespace, progress: TextIO) -> Inventory:
    """The slices the controller would publish for the manager's inventory, its nodes labelled as
    the controller labels them, and the classes from ``--classes``."""
    from manager_api.client import ManagerClient
    from manager_api.errors import FabricError
    from plumbing import DEFAULT_DRIVER_NAME

    if not args.classes:
        raise ExplainInputError(
            "--manager-url needs --classes FILE: the manager knows devices, not DeviceClasses "
            "(fabric-dra's own are in deploy/base/deviceclasses.yaml)"
        )
    if args.slices or args.nodes:
        raise ExplainInputError(
            "--manager-url reads slices and nodes from the manager: drop --slices/--nodes"
        )
    token_file = _absolute(args.token_file)
    if token_file is not None and not token_file.exists():
        raise ExplainInputError(f"--token-file {token_file} does not exist")
    client = ManagerClient(
        args.manager_url,
        token=None if token_file else os.environ.get("FABRIC_DRA_TOKEN"),
        token_file=token_file,
        given_as="FABRIC_DRA_TOKEN",
        ca_file=str(args.ca_file) if args.ca_file else None,
    )
    emit(f"reading the fabric inventory from {args.manager_url}", file=progress)
    try:
        inventory = await client.inventory()
    except FabricError as err:
        raise ExplainInputError(
            f"cannot read the fabric manager at {args.manager_url}: {err.message}"
        ) from err
    finally:
        await client.aclose()
    driver = DEFAULT_DRIVER_NAME
    slices, nodes = published(inventory, [n.name for n in inventory.nodes], driver)
    classes: dict[str, DeviceClass] = {}
    for path in args.classes:
        for device_class in _parse_objects(path, _load_documents(path), "DeviceClass", DeviceClass):
            classes[device_class.name] = device_class
    claims = _manager_claims(inventory.devices, driver)
    emit(
        f"found {len(inventory.devices)} devices in {len(slices)} ResourceSlices, {len(nodes)} nodes, "
        f"{len(claims)} claims holding devices; {len(classes)} DeviceClasses from --classes",
        file=progress,
    )
    return Inventory(slices, classes, nodes or _stand_in_nodes(slices), claims, synthetic_nodes=not nodes)


def published(
    inventory: FabricInventory, node_names: Iterable[str], driver: str
) -> tuple[list[ResourceSlice], list[Node]]:
    """The ResourceSlices the controller writes for the manager's ``inventory`` — as it publishes
    without binding conditions: unhealthy devices tainted — and ``node_names`` labelled as the
    controller labels them (pool and reach-group labels)."""
    # the controller's code is loaded only when a manager's inventory is explained
    from dra_driver.controller.devices import PublishPolicy
    from dra_driver.controller.slices import desired_node_labels, desired_pools, plan_pool

    policy = PublishPolicy(driver=driver, device_taints=True, binding_conditions=False)
    slices: list[ResourceSlice] = []
    for name, desired in desired_pools(inventory, policy).items():
        plan = plan_pool(name, desired, {}, driver=driver)
        slices.extend(ResourceSlice.model_validate(w.obj) for w in (plan.writes if plan else []))
    labels = desired_node_labels(inventory, driver)
    nodes = [
        Node.model_validate(
            {"metadata": {"name": n, "labels": dict.fromkeys(sorted(labels.get(n, ())), "true")}}
        )
        for n in node_names
    ]
    return slices, nodes


def _absolute(path: Path | str | None) -> Path | None:
    """A path argument resolved before use, so every message names the file that was read."""
    return Path(path).expanduser().resolve() if path else None


def _check_classes(workloads: list[Workload], inventory: Inventory, path: str) -> None:
    """A request for a DeviceClass nobody defined is a typo, not a claim that fits nowhere."""
    known = sorted(inventory.classes)
    for workload in workloads:
        for claim in workload.claims:
            for request in claim.spec.devices.requests:
                wanted = [request.exactly] if request.exactly else list(request.first_available)
                for sub in wanted:
                    name = sub.device_class_name
                    if name and name not in inventory.classes:
                        raise ExplainInputError(
                            f"{path}: ResourceClaim {claim.key} request {request.name}: DeviceClass "
                            f"{name!r} is not known; known DeviceClasses: {', '.join(known) or 'none'}"
                        )


def _resolve_missing_claims(workloads: list[Workload], inventory: Inventory, path: str) -> None:
    by_key = {
        ((c.get("metadata") or {}).get("namespace", ""), (c.get("metadata") or {}).get("name", "")): c
        for c in inventory.claims
    }
    for workload in workloads:
        for ns, name in workload.missing_claims:
            found = by_key.get((ns, name))
            if found is None:
                raise ExplainInputError(f"{path}: ResourceClaim {ns}/{name} is neither in the file nor known")
            spec = ResourceClaimSpec.model_validate(found.get("spec") or {})
            workload.claims.append(ClaimToAllocate(ns, name, spec))


# -- evaluation -------------------------------------------------------------------------------


@dataclass
class WorkloadVerdict:
    title: str
    claims: list[str]
    satisfiable_on: list[str]
    nodes: list[NodeReport]


def evaluate(workloads: list[Workload], inventory: Inventory, only_node: str | None) -> list[WorkloadVerdict]:
    nodes = inventory.nodes
    if only_node:
        nodes = [n for n in nodes if n.name == only_node]
        if not nodes:
            raise ExplainInputError(f"--node {only_node}: no such node")
    verdicts = []
    for workload in workloads:
        exclude = {c.key for c in workload.claims}
        allocator = Allocator(
            inventory.slices, inventory.classes, AllocatedState.from_claims(inventory.claims, exclude)
        )
        # Best fit first: nodes that fit, then by how many devices fit the requests; the device
        # table below the node list is the first node's.
        reports = sorted(
            (explain_node(allocator, workload.claims, node) for node in nodes),
            key=lambda r: (not r.satisfiable, -_fitting(r)),
        )
        verdicts.append(
            WorkloadVerdict(
                workload.title,
                [c.key for c in workload.claims],
                [r.node for r in reports if r.satisfiable],
                reports,
            )
        )
    return verdicts


# -- output -----------------------------------------------------------------------------------


def _fitting(report: NodeReport) -> int:
    return sum(len(q.fitting) for q in report.requests)


def _reference_report(verdict: WorkloadVerdict) -> NodeReport:
    """The node whose device table is shown: the best-fitting one (:func:`evaluate` sorts them)."""
    return verdict.nodes[0]


def _grouped(rejected: list[DeviceVerdict]) -> list[tuple[str, str, list[str]]]:
    groups: dict[tuple[str, str], list[str]] = {}
    for verdict in rejected:
        groups.setdefault((verdict.reason, verdict.detail), []).append(verdict.device)
    return [(reason, detail, devices) for (reason, detail), devices in groups.items()]


def _names(devices: list[str], all_devices: bool) -> str:
    if all_devices or len(devices) <= _DEVICE_LIST_LIMIT:
        return ", ".join(devices)
    return ", ".join(devices[:_DEVICE_LIST_LIMIT]) + f", … ({len(devices) - _DEVICE_LIST_LIMIT} more)"


def _request_block(request: RequestReport, all_devices: bool, out: list[str]) -> None:
    mode = f"{request.count} device(s)" if request.mode == "ExactCount" else "all matching devices"
    out.append(f"  request {request.request} ({request.claim}): {mode} of class {request.device_class}")
    if request.chosen:
        out.append(f"    allocated: {', '.join(request.chosen)}")
    out.append(f"    fit ({len(request.fitting)}): {_names(request.fitting, all_devices) or 'none'}")
    for reason, detail, devices in _grouped(request.rejected):
        out.append(f"    {reason} ({len(devices)}): {detail}")
        out.append(f"      {_names(devices, all_devices)}")


def render_text(verdicts: list[WorkloadVerdict], inventory: Inventory, all_devices: bool) -> str:
    out: list[str] = []
    for verdict in verdicts:
        total = len(verdict.nodes)
        fits = len(verdict.satisfiable_on)
        headline = (
            f"fits on {fits} of {total} node(s): {', '.join(verdict.satisfiable_on)}"
            if fits
            else f"does NOT fit on any of {total} node(s)"
        )
        out.append(f"{verdict.title}: {headline}")
        if inventory.synthetic_nodes:
            out.append(
                "  (no Nodes known: one stand-in node per slice placement; pass --nodes for real ones)"
            )
        out.append("nodes:")
        for report in verdict.nodes:
            mark = "fits    " if report.satisfiable else "no fit  "
            out.append(f"  {mark}{report.node}: {report.summary}")
        reference = _reference_report(verdict)
        out.append(f"devices, as seen from node {reference.node}:")
        for request in reference.requests:
            _request_block(request, all_devices, out)
        for constraint in reference.constraints:
            state = "ok" if constraint.satisfiable else "fails"
            out.append(
                f"  constraint {constraint.kind} {constraint.attribute} ({state}): {constraint.message}"
            )
        out.append("")
    # Each entry is one line; the names and messages in it come from the cluster or the manager,
    # so a line feed or an escape in one of them is shown, never acted on.
    return "\n".join(visible(line) for line in out)


def render_json(verdicts: list[WorkloadVerdict]) -> str:
    return json.dumps({"workloads": [asdict(v) for v in verdicts]}, indent=2, default=str)


# -- entry point ------------------------------------------------------------------------------


def main_explain(args: argparse.Namespace) -> int:
    # A line per HTTP request would bury the verdict and the one-line errors on a terminal.
    for noisy in ("httpx", "httpcore", "kubernetes", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        for name in ("slices", "classes"):
            setattr(args, name, [str(_absolute(p)) for p in getattr(args, name)])
        for name in ("manifest", "nodes", "claims", "kubeconfig"):
            value = getattr(args, name)
            if value and value != "-":
                setattr(args, name, str(_absolute(value)))
        documents = _load_documents(args.manifest)
        workloads = workloads_from(args.manifest, documents, args.namespace)
        if args.manager_url:
            if args.kubeconfig:
                raise ExplainInputError("--manager-url and --kubeconfig are two sources: pick one")
            inventory = asyncio.run(load_manager(args, sys.stderr))
        elif args.kubeconfig or not (args.slices or args.classes):
            if args.slices or args.classes or args.nodes or args.claims:
                raise ExplainInputError(
                    "--slices/--classes/--nodes/--claims are for offline use, without --kubeconfig"
                )
            inventory = asyncio.run(load_cluster(args, sys.stderr))
        else:
            inventory = load_offline(args)
        _resolve_missing_claims(workloads, inventory, args.manifest)
        _check_classes(workloads, inventory, args.manifest)
        verdicts = evaluate(workloads, inventory, args.node)
    except ExplainInputError as err:
        emit(f"fabric-dra explain: error: {visible(str(err))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.output == "json":
        emit(render_json(verdicts))
    elif args.output == "yaml":
        emit(dump_document(json.loads(render_json(verdicts)), "yaml"))
    else:  # table (or its old name, text); wide lists every device
        wide = args.all_devices or args.output == "wide"
        emit(render_text(verdicts, inventory, wide))
    return EXIT_FITS if all(v.satisfiable_on for v in verdicts) else EXIT_NO_FIT
