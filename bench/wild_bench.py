"""Stale endpoint links — issue-level acceptance of the confirmation rule: an attach or detach is
done only when the fabric's own collections show it, whatever the endpoints' links say.

Real processes: the emulator over TLS with ``behaviour.endpointLinks: stale`` (an endpoint's
Links.Zones / Links.Connections never updated, as some services do) and the fabric manager in front
of it. 200 attach/detach cycles of a GPU by zone and 50 of a CXL memory chunk by connection; after
every answer the emulator's binding table (the ground truth) is compared with what the manager
said. Targets: 0 "attached" or "detached" answers that the fabric contradicts, 0 devices left
bound, 0 of the manager's own bindings reported as made outside fabric-dra.

The suite runs the same cycles 20 times per profile (tests/integration/fabric/test_wild_services.py).
``python -m bench --only wild``.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from bench.common import BenchContext, check, progress, work_dir
from manager_api.models import BindingState
from tests.integration.fabric.conftest import make_tls
from tests.integration.fabric.test_wild_services import STYLES, link_cycles

__all__ = ["run"]

#: cycles per binding style (the quick run: a tenth)
CYCLES = {"zone": 200, "connection": 50}


def measure(quick: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with work_dir("wild-bench-") as root:
        tls = make_tls(root)
        for style, device, target in STYLES:
            cycles = CYCLES[style] // (10 if quick else 1)
            progress("wild", f"{cycles} {style} cycles with stale endpoint links")
            (root / style).mkdir()
            run = asyncio.run(
                link_cycles(
                    root / style,
                    tls,
                    style=style,
                    links="stale",
                    expand="served",
                    device=device,
                    target=target,
                    cycles=cycles,
                )
            )
            figures = asdict(run)
            figures["state"] = run.state.value
            figures["cycles_per_s"] = round(run.cycles / run.seconds, 1) if run.seconds else 0.0
            out[style] = figures
    return out


def run(ctx: BenchContext) -> dict[str, Any]:
    """Section ``wild`` of ``python -m bench``."""
    figures = measure(ctx.quick)
    checks = []
    for style, f in figures.items():
        wrong = f["wrong_attach"] + f["wrong_detach"]
        checks.append(check(f"{style}: answers the fabric contradicts in {f['cycles']} cycles", wrong, 0, ""))
        left = len(f["left_bound"]) + len(f["outside"]) + (f["state"] != BindingState.FREE.value)
        checks.append(check(f"{style}: devices left bound or shown as outside", left, 0, ""))
    return {"figures": figures, "checks": checks}
