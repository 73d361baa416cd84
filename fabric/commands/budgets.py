"""``fabric-dra budget``: every DeviceBudget with each tree's use against each limit, from the fabric
manager (``GET /api/v1/budgets``, docs/budgets.md)."""

from __future__ import annotations

import argparse
import asyncio
from typing import TYPE_CHECKING, TextIO

from plumbing.cli import BadInput, SubParsers, add_output_option, dump_document, emit, format_table
from plumbing.names import is_dns1123_label
from plumbing.terminal import visible

if TYPE_CHECKING:  # the command line builds every role's parser: the client loads when it runs
    from manager_api import models as api

__all__ = ["register", "render", "run_budget"]

_HEADINGS = ["NAMESPACE", "BUDGET", "TREE", "LIMIT", "USED", "MAX", "PERCENT", "ENFORCEMENT"]


def register(subparsers: SubParsers) -> None:
    from fabric.commands.cli import manager_options

    budget = subparsers.add_parser(
        "budget",
        help="list DeviceBudgets: what each agent tree holds against each limit",
        description="Every DeviceBudget the fabric manager enforces, one row per tree and limit: what the "
        "tree holds now (attaches in flight included) against what the budget allows. Bytes of memory "
        "are shown in GiB, device-hours over the budget's window. 'wide' adds how the budget names its "
        "trees and the last claim refused. Reads GET /api/v1/budgets: the token must be an operator's.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    budget.add_argument("--namespace", "-n", default=None, help="only the budgets of this namespace")
    manager_options(budget)
    add_output_option(budget)
    budget.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from fabric.commands.cli import resolve_token_file

    if args.namespace is not None and not is_dns1123_label(args.namespace):
        raise BadInput(f"--namespace '{visible(args.namespace)}' is no namespace name (a DNS label)")
    resolve_token_file(args)
    return asyncio.run(run_budget(args))


def _amount(limit: str, value: float) -> str:
    if limit.endswith("MemoryBytes"):
        return f"{value / (1 << 30):.2f}".rstrip("0").rstrip(".") + " GiB"
    if limit == "deviceHours":
        return f"{value:.2f}"
    return f"{value:g}"


def render(budgets: api.BudgetList, fmt: str) -> str:
    """The budgets as a table (``wide``: with the tree selector and the last refusal), json or yaml."""
    if fmt in ("json", "yaml"):
        return dump_document(budgets.model_dump(mode="json", by_alias=True), fmt)
    wide = fmt == "wide"
    rows = []
    for budget in budgets.budgets:
        for tree in budget.trees:
            for use in tree.limits:
                used = _amount(use.limit, use.used) if use.known else "unknown"
                percent = f"{100 * use.used / use.max:.0f}%" if use.known and use.max else "-"
                row = [
                    budget.namespace,
                    budget.name,
                    tree.tree,
                    use.limit,
                    used,
                    _amount(use.limit, use.max),
                    percent,
                    budget.enforcement,
                ]
                if wide:
                    row += [budget.selects, tree.last_refused or "-"]
                rows.append(row)
        if not budget.trees:
            rows.append(
                [
                    budget.namespace,
                    budget.name,
                    "(no tree holds anything)",
                    "",
                    "",
                    "",
                    "",
                    budget.enforcement,
                ]
            )
            if wide:
                rows[-1] += [budget.selects, "-"]
    if not rows:
        return "(no DeviceBudget)"
    return format_table(_HEADINGS + (["TREES", "LAST REFUSED"] if wide else []), rows)


async def run_budget(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from fabric.commands.status import manager_client, manager_errors

    client, token_given = manager_client(args)
    try:
        with manager_errors(args, token_given, "the fabric manager's budgets"):
            budgets = await client.budgets(args.namespace)
    finally:
        await client.aclose()
    emit(render(budgets, args.output), file=out)
    return 0
