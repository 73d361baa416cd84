"""``fabric-dra usage --format focus``: the manager's FOCUS 1.0 export (``GET /api/v1/usage/focus``,
:mod:`fabric.bindings.focus`), written as the manager renders it."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TextIO

from fabric.commands.status import manager_client, manager_errors
from plumbing.cli import emit

__all__ = ["FOCUS_FORMATS", "run_focus"]

#: the ``--format`` words of the FOCUS export
FOCUS_FORMATS = ("focus", "focus-csv")


async def run_focus(
    args: argparse.Namespace, since: datetime, until: datetime | None, out: TextIO | None
) -> int:
    client, token_given = manager_client(args)
    try:
        with manager_errors(args, token_given, "the fabric manager's FOCUS export"):
            document = await client.usage_focus(since, until)
    finally:
        await client.aclose()
    emit(document.rstrip("\n"), file=out)
    return 0
