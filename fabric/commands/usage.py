"""``fabric-dra usage``: device-seconds since a time, by namespace, model or workload, read from the
fabric manager's accounting (``GET /api/v1/usage``, :mod:`fabric.bindings.usage`)."""

from __future__ import annotations

import argparse
import csv
import io
import re
from datetime import UTC, datetime, timedelta
from typing import TextIO

from fabric.commands.status import manager_client, manager_errors
from manager_api import models as api
from plumbing.cli import CliError, dump_document, emit, format_table
from plumbing.terminal import visible

__all__ = ["parse_since", "render", "run_usage"]

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
#: the two measures beside the device-seconds (``UsageGroup`` fields), and their columns
_MEASURES = ("partition_seconds", "memory_gib_seconds")
_HEADINGS = ("PARTITION", "MEMORY-GIB")


def parse_since(text: str, now: datetime) -> datetime:
    """``24h``, ``90m``, ``7d``, ``30s`` before ``now``, or an RFC 3339 time with a zone."""
    found = _DURATION.match(text.strip())
    try:
        if found:
            moment = now - timedelta(**{_UNITS[found.group(2)]: float(found.group(1))})
        else:
            parsed = api.parse_rfc3339(text.strip())
            if parsed is None:
                raise CliError(
                    f"--since '{visible(text)}': expected a duration (30m, 24h, 7d) or an RFC 3339 time "
                    "with a zone (2026-03-01T09:00:00Z)"
                )
            moment = parsed
        moment.astimezone(UTC)  # a zone offset can push 0001-01-01 or 9999-12-31 past UTC's years
    except OverflowError:  # and 3000000d reaches before the year 1
        raise CliError(
            f"--since '{visible(text)}' is before 0001-01-01 or after 9999-12-31 in UTC; the usage "
            "record keeps 7 days: give a duration such as 7d or a time within them"
        ) from None
    return moment


def _label(name: str) -> str:
    return name or "(no claim)"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f}"


def render(report: api.UsageReport, fmt: str) -> str:
    """``report`` as a table (device-hours), ``wide`` (device-seconds), json, yaml or csv (seconds):
    a column per state, the total, then the partitions' GPU-seconds at their share and the memory
    shares' GiB-seconds (hours in the table)."""
    if fmt in ("json", "yaml"):
        return dump_document(report.model_dump(mode="json", by_alias=True), fmt)
    states = list(api.USAGE_STATES)
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow([str(report.by), *states, "total", *_MEASURES])
        for group in report.groups:
            # A name is a namespace, a model from the fabric or an owner's name: shown, never raw.
            writer.writerow(
                [
                    visible(group.name),
                    *(getattr(group, s) for s in states),
                    group.total,
                    *(getattr(group, m) for m in _MEASURES),
                ]
            )
        return buffer.getvalue().rstrip("\n")
    cell = (lambda s: f"{s:.0f}") if fmt == "wide" else _hours
    unit = "device-seconds" if fmt == "wide" else "device-hours"
    # the partition and share columns only where something was partitioned or shared
    measures = [m for m in _MEASURES if any(getattr(g, m) for g in report.groups)]
    headings = [h for m, h in zip(_MEASURES, _HEADINGS, strict=True) if m in measures]
    rows = [
        [
            _label(g.name),
            *(cell(getattr(g, s)) for s in states),
            cell(g.total),
            *(cell(getattr(g, m)) for m in measures),
        ]
        for g in report.groups
    ]
    head = (
        f"{unit} from {report.since.astimezone(UTC):%Y-%m-%d %H:%M} to "
        f"{report.until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC, by {report.by}"
    )
    if measures:
        per = "seconds" if fmt == "wide" else "hours"
        head += f"; PARTITION: GPU-{per} at each partition's share of its GPU, MEMORY-GIB: GiB-{per}"
    if report.oldest is not None and report.oldest > report.since:
        head += f" (nothing recorded before {report.oldest.astimezone(UTC):%Y-%m-%d %H:%M})"
    body = (
        format_table([str(report.by).upper(), *(s.upper() for s in states), "TOTAL", *headings], rows)
        if rows
        else "(no device was counted in this time)"
    )
    return f"{head}\n{body}"


async def run_usage(args: argparse.Namespace, out: TextIO | None = None) -> int:
    since = parse_since(args.since, datetime.now(UTC))
    client, token_given = manager_client(args)
    try:
        with manager_errors(args, token_given, "the fabric manager's usage"):
            report = await client.usage(since, api.UsageGrouping(args.by))
    finally:
        await client.aclose()
    emit(render(report, args.output), file=out)
    return 0
