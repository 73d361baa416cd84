"""``fabric-dra status``: the pool, the bindings per node and the operations in flight, and first
what the fabric has that cannot be offered (the inventory's notices).

``--watch`` redraws on every inventory change (the long poll) and at least every few seconds, so
the ages of operations in flight move.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, TextIO

from pydantic import ValidationError

from manager_api import models as api
from manager_api.client import ManagerClient
from manager_api.errors import FabricError, FabricUnavailable, NotFoundError, Unauthenticated
from manager_api.partitions import parse_partition
from plumbing.cli import CliError, dump_document, emit
from plumbing.cli import format_table as _table
from plumbing.terminal import visible

__all__ = [
    "explain_failure",
    "manager_client",
    "render_json",
    "render_table",
    "run_status",
    "status_document",
]


def _summary(inventory: api.Inventory) -> list[dict[str, Any]]:
    counts: Counter[tuple[str, str, str, str, str]] = Counter()
    for d in inventory.devices:
        counts[(d.pool, d.fabric, str(d.type), d.model or "-", str(d.state))] += 1
    groups: dict[tuple[str, str, str, str], dict[str, int]] = {}
    for (pool, fabric, kind, model, state), n in counts.items():
        groups.setdefault((pool, fabric, kind, model), {})[state] = n
    result = []
    for (pool, fabric, kind, model), states in sorted(groups.items()):
        result.append(
            {
                "pool": pool,
                "fabric": fabric,
                "type": kind,
                "model": model,
                "free": states.get("free", 0),
                "bound": states.get("bound", 0),
                "busy": states.get("attaching", 0) + states.get("detaching", 0),
                "unavailable": states.get("unavailable", 0),
            }
        )
    return result


def _wide_columns(device: api.Device) -> list[str]:
    link = (
        f"gen{device.pcie_generation} x{device.pcie_width}"
        if device.pcie_generation and device.pcie_width
        else "-"
    )
    return [device.host or "-", str(device.binding_style) or "-", device.serial or "-", link]


def _holder_names(inventory: api.Inventory, device: api.Device) -> str:
    """Who holds ``device``: its node, or — held by several systems at once — every holder's node
    (or host, when it is no node)."""
    if len(device.holders) < 2:
        return device.node or f"(host {device.host})"
    nodes = {n.host: n.name for n in inventory.nodes}
    return ", ".join(nodes.get(h, f"(host {h})") for h in device.holders)


def _age(started: datetime) -> str:
    seconds = int((datetime.now(UTC) - started).total_seconds())
    return f"{seconds}s" if seconds < 120 else f"{seconds // 60}m"


def _task_progress(op: api.Operation) -> str:
    """The Redfish task's percent complete and how long ago the manager read it: ``40% (3s ago)``."""
    if op.redfish_task_percent is None:
        return "-"
    read = f" ({_age(op.redfish_task_percent_at)} ago)" if op.redfish_task_percent_at else ""
    return f"{op.redfish_task_percent}%{read}"


def status_document(
    inventory: api.Inventory, operations: list[api.Operation], orphaned: api.OrphanedTreeClaims | None = None
) -> dict[str, Any]:
    """What ``-o json`` and ``-o yaml`` print."""
    bindings = [
        d.model_dump(
            mode="json",
            by_alias=True,
            include={
                *("name", "node", "host", "holders", "claim_uid", "state"),
                *("managed", "switch", "port", "health"),
            },
        )
        for d in inventory.devices
        if d.state not in (api.BindingState.FREE, api.BindingState.UNAVAILABLE)
    ]
    in_flight = [
        o.model_dump(mode="json", by_alias=True)
        for o in operations
        if o.state in (api.OperationState.PENDING, api.OperationState.RUNNING)
    ]
    partitioned = [
        {
            "gpu": d.name,
            "partitions": [h.model_dump(mode="json", by_alias=True) for h in d.partitions],
        }
        for d in inventory.devices
        if d.partitions
    ]
    memory_pools = [
        {"pool": d.name, **d.memory_pool.model_dump(mode="json", by_alias=True)}
        for d in inventory.devices
        if d.memory_pool is not None
    ]
    return {
        "inventoryVersion": inventory.version,
        "pools": _summary(inventory),
        "nodes": [n.model_dump(mode="json", by_alias=True) for n in inventory.nodes],
        "bindings": bindings,
        "partitions": partitioned,
        "memoryPools": memory_pools,
        "operations": in_flight,
        "notices": inventory.notices,
        "orphanedTreeClaims": [c.model_dump(mode="json", by_alias=True) for c in orphaned.claims]
        if orphaned is not None
        else [],
    }


def render_json(
    inventory: api.Inventory, operations: list[api.Operation], orphaned: api.OrphanedTreeClaims | None = None
) -> str:
    return json.dumps(status_document(inventory, operations, orphaned), indent=2)


def render_table(
    inventory: api.Inventory,
    operations: list[api.Operation],
    *,
    wide: bool = False,
    orphaned: api.OrphanedTreeClaims | None = None,
) -> str:
    """The tables; ``wide`` adds each binding's host, binding style, serial and PCIe link."""
    parts = [
        *_notices_table(inventory),
        *_pool_table(inventory),
        *_bindings_table(inventory, wide=wide),
        *_sharing_table(inventory),
        *_operations_table(operations),
        *_unhealthy_table(inventory),
        *_orphaned_trees_table(orphaned),
        f"inventory version {inventory.version}; {len(inventory.nodes)} node(s)",
    ]
    return "\n".join(parts)


def _orphaned_trees_table(orphaned: api.OrphanedTreeClaims | None) -> list[str]:
    """Claims of agent trees whose root is gone: what the operator may release (docs/manager.md)."""
    if orphaned is None or not orphaned.claims:
        return []
    rows = [
        [f"{c.namespace}/{c.name}", c.reason, c.root, "; ".join(c.pods) or "-", _age(c.since)]
        for c in orphaned.claims
    ]
    return [
        f"ORPHANED AGENT TREES (policy {orphaned.policy})",
        _table(["CLAIM", "REASON", "GONE", "PODS", "FOR"], rows),
        "",
    ]


def _notices_table(inventory: api.Inventory) -> list[str]:
    if not inventory.notices:
        return []
    # A notice quotes the fabric's own names: one line each, whatever they hold.
    return ["NOTICES", *(f"- {visible(notice)}" for notice in inventory.notices), ""]


def _pool_table(inventory: api.Inventory) -> list[str]:
    rows = [
        [
            row["pool"],
            row["fabric"],
            row["type"],
            row["model"],
            str(row["free"]),
            str(row["bound"]),
            str(row["busy"]),
            str(row["unavailable"]),
        ]
        for row in _summary(inventory)
    ]
    headers = ["POOL", "FABRIC", "TYPE", "MODEL", "FREE", "BOUND", "BUSY", "UNAVAILABLE"]
    return ["POOL", _table(headers, rows) if rows else "(no devices)", ""]


def _bindings_table(inventory: api.Inventory, *, wide: bool) -> list[str]:
    bound = sorted(
        (
            d
            for d in inventory.devices
            if d.state not in (api.BindingState.FREE, api.BindingState.UNAVAILABLE)
        ),
        key=lambda d: (d.node or f"~{d.host or ''}", d.name),
    )
    rows = [
        [
            _holder_names(inventory, d),
            d.name,
            str(d.type),
            d.model or "-",
            d.switch or "-",
            d.port or "-",
            str(d.health),
            str(d.state),
            d.claim_uid or "-",
            "yes" if d.managed else "no (outside fabric-dra)",
        ]
        + (_wide_columns(d) if wide else [])
        for d in bound
    ]
    headers = ["NODE", "DEVICE", "TYPE", "MODEL", "SWITCH", "PORT", "HEALTH", "STATE", "CLAIM", "MANAGED"]
    headers += ["HOST", "STYLE", "SERIAL", "LINK"] if wide else []
    return ["BINDINGS", _table(headers, rows) if rows else "(no device is bound)", ""]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f}".rstrip("0").rstrip(".") + " GiB"


def _placement(gpu: api.Device, partition: str) -> str:
    """``1g.10gb @ slice 3`` (``slices 0-1`` for two): the profile and where it sits, from the
    GPU's table; the device name alone when the table does not name it."""
    table = gpu.partition_table
    found = parse_partition(partition, {gpu.name: table}) if table is not None else None
    if found is None:
        return "-"
    first, last = found.slices[0], found.slices[-1]
    where = f"slice {first}" if first == last else f"slices {first}-{last}"
    return f"{found.profile.name} @ {where}"


def _sharing_table(inventory: api.Inventory) -> list[str]:
    """Each GPU serving partitions (its node, every holder with its placement and claim) and each
    memory pool (used and free, every share with its node, size and claim); nothing when the
    fabric has neither."""
    gpus = sorted((d for d in inventory.devices if d.partitions), key=lambda d: d.name)
    pools = sorted((d for d in inventory.devices if d.memory_pool is not None), key=lambda d: d.name)
    if not gpus and not pools:
        return []
    lines = ["PARTITIONS AND SHARES"]
    if gpus:
        rows = [
            [gpu.name, h.node, h.partition, _placement(gpu, h.partition), h.claim_uid]
            for gpu in gpus
            for h in sorted(gpu.partitions, key=lambda h: h.partition)
        ]
        lines.append(_table(["GPU", "NODE", "PARTITION", "PLACEMENT", "CLAIM"], rows))
    if pools:
        rows = []
        for pool in pools:
            mp = pool.memory_pool
            if mp is None:
                continue
            used, free = _gib(mp.used_bytes), _gib(max(0, mp.size_bytes - mp.used_bytes))
            shares = sorted(mp.shares, key=lambda s: (s.node, s.share_id))
            rows += [
                [pool.name, used, free, s.share_id, s.node, _gib(s.memory_bytes), str(s.state), s.claim_uid]
                for s in shares
            ] or [[pool.name, used, free, "-", "-", "-", "-", "-"]]
        if gpus:
            lines.append("")
        lines.append(_table(["POOL", "USED", "FREE", "SHARE", "NODE", "SIZE", "STATE", "CLAIM"], rows))
    return [*lines, ""]


def _operations_table(operations: list[api.Operation]) -> list[str]:
    running = [o for o in operations if o.state in (api.OperationState.PENDING, api.OperationState.RUNNING)]
    rows = [
        [
            o.id,
            str(o.kind),
            o.device,
            o.node,
            o.claim_uid,
            _age(o.started_at),
            _task_progress(o),
            o.redfish_task or "-",
            o.error.message if o.error else "-",
        ]
        for o in running
    ]
    headers = ["ID", "KIND", "DEVICE", "NODE", "CLAIM", "AGE", "TASK DONE", "REDFISH TASK", "LAST ERROR"]
    return ["OPERATIONS IN FLIGHT", _table(headers, rows) if rows else "(none)", ""]


def _unhealthy_table(inventory: api.Inventory) -> list[str]:
    unhealthy = sorted((d for d in inventory.devices if d.health is not api.Health.OK), key=lambda d: d.name)
    if not unhealthy:
        return []
    rows = [
        [d.name, d.pool, d.switch or "-", d.port or "-", str(d.health), str(d.state), d.node or "-"]
        for d in unhealthy
    ]
    return [
        "UNHEALTHY DEVICES",
        _table(["DEVICE", "POOL", "SWITCH", "PORT", "HEALTH", "STATE", "NODE"], rows),
        "",
    ]


#: with --watch: redraw at least this often, so the ages of operations in flight move
WATCH_REDRAW_SECONDS = 2.0
_CLEAR = "\x1b[H\x1b[2J"


def explain_failure(err: FabricError, args: argparse.Namespace, token_given: bool, reading: str) -> str:
    """What went wrong reading ``reading`` from the manager, and what to do about it, in one line."""
    if isinstance(err, Unauthenticated) and not token_given:
        why = (
            f"the fabric manager at {args.manager_url} wants a bearer token and none was given: pass "
            "--token-file FILE (or set FABRIC_DRA_TOKEN_FILE), or put the token in FABRIC_DRA_TOKEN"
        )
    elif isinstance(err, Unauthenticated):
        source = f"--token-file {args.token_file}" if args.token_file else "FABRIC_DRA_TOKEN"
        why = f"the fabric manager refused the token from {source}: {err.message}"
    elif isinstance(err, FabricUnavailable):
        why = (
            f"{err.message}; check --manager-url (or FABRIC_DRA_MANAGER_URL) and that the fabric manager runs"
        )
    else:
        why = err.message
    return f"cannot read {reading}: {why}"


def _render(
    args: argparse.Namespace,
    inventory: api.Inventory,
    operations: list[api.Operation],
    orphaned: api.OrphanedTreeClaims | None = None,
) -> str:
    if args.output in ("json", "yaml"):
        return dump_document(status_document(inventory, operations, orphaned), args.output)
    return render_table(inventory, operations, wide=args.output == "wide", orphaned=orphaned)


async def _orphaned(client: ManagerClient) -> api.OrphanedTreeClaims | None:
    """The orphaned agent-tree claims, None from a manager that does not serve them (an older one)."""
    try:
        return await client.orphaned_trees()
    except NotFoundError:
        return None


def manager_client(args: argparse.Namespace) -> tuple[ManagerClient, bool]:
    """A client of the manager the command's connection options name, and whether a token is given."""
    # One line per request at INFO would bury the table (and the one-line error) on a terminal.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    token = os.environ.get("FABRIC_DRA_TOKEN") if args.token_file is None else None
    if args.token_file is not None and not args.token_file.exists():
        raise CliError(f"token file {args.token_file} does not exist")
    # The client reads the file (and checks the variable) at its first request: a file that holds
    # no bearer token is refused there in one line, never quoted.
    client = ManagerClient(
        args.manager_url,
        token=token,
        token_file=args.token_file,
        given_as="FABRIC_DRA_TOKEN",
        ca_file=str(args.ca_file) if args.ca_file else None,
        insecure=args.insecure,
        timeout=args.timeout,
    )
    return client, bool(token or args.token_file)


@contextlib.contextmanager
def manager_errors(args: argparse.Namespace, token_given: bool, reading: str) -> Iterator[None]:
    """The manager's errors, and answers that are not the manager's, as one-line :class:`CliError`."""
    try:
        yield
    except FabricError as err:
        raise CliError(explain_failure(err, args, token_given, reading)) from None
    except ValidationError:
        raise CliError(
            f"{args.manager_url} is not a fabric-dra manager: its /api/v1 answers are not the manager's"
        ) from None


async def run_status(args: argparse.Namespace, out: TextIO | None = None) -> int:
    client, token_given = manager_client(args)
    stream = out or sys.stdout
    watch = bool(getattr(args, "watch", False))
    clear = watch and stream.isatty()
    try:
        with manager_errors(args, token_given, "the fabric manager's pool"):
            inventory = await client.inventory()
            while True:
                operations = await client.operations()
                text = _render(args, inventory, operations, await _orphaned(client))
                if clear:
                    stream.write(_CLEAR)
                elif watch:
                    stream.write(f"--- {datetime.now(UTC).strftime('%H:%M:%S')} UTC\n")
                emit(text, file=stream)
                if not watch:
                    return 0
                # Wake on the next inventory version, or after a short pause for the ages to move.
                inventory = await client.inventory(
                    after=inventory.version, timeout_seconds=WATCH_REDRAW_SECONDS
                )
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 0
    finally:
        await client.aclose()
