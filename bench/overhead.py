"""Section 3 — framework overhead, side by side in the same run: fabric-dra's plugin with
``--device-backend noop`` against the ``kubernetes-pydra`` baseline (:mod:`bench.pydra_baseline`),
both real processes on unix sockets, both registered and called by the same kubelet-protocol
client (:mod:`kube_standin.kubelet_client`), one claim per call, concurrency 1.

The two are run in alternating blocks, so a change of load on the machine hits both alike. A
*pair* is NodePrepareResources + NodeUnprepareResources of one claim. fabric-dra's plugin also
does work the baseline skips and must keep: it reads the ResourceClaim from the API server,
writes the CDI spec and records the claim durably in its checkpoint (fsync). Those phases are
read from its histograms around every pair and taken out:

    framework = pair - claim_read - checkpoint - cdi_write - cdi_remove
    ratio     = p50(framework) / p50(baseline pair)          target <= 1.0

and the whole fabric-dra pair has its own target: p50 <= 3 ms.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REPO_ROOT,
    BenchContext,
    ClaimSpec,
    check,
    create_claims,
    phase_delta,
    phase_sums,
    progress,
    rss_mib,
    summary_ms,
)
from fabric_dra_testbed.stack import Role, Stack, free_port
from kube_standin.kubelet_client import ClaimRef, DRAPluginClient, register_plugin

__all__ = ["run"]

_STORAGE_PHASES = ("claim_read", "checkpoint", "cdi_write", "cdi_remove")
_NODE = "node-overhead"


def _wait_for(path: Path, process: Role, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if not process.alive():
            raise RuntimeError(f"{process.name} exited:\n{process.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{process.name} did not create {path}:\n{process.tail()}")
        time.sleep(0.02)


async def _kubelet(registration_socket: Path) -> DRAPluginClient:
    attempt = await register_plugin(registration_socket)
    return DRAPluginClient(attempt.driver, attempt.endpoint, attempt.chosen_service)


async def _pairs(
    kubelet: DRAPluginClient,
    refs: list[ClaimRef],
    metrics_port: int,
    phases: dict[str, list[float]] | None = None,
) -> tuple[list[float], list[float]]:
    """(pair seconds, seconds in the claim-read/checkpoint/CDI phases) per claim; the seconds of
    each phase are added to ``phases``."""
    pairs, storage = [], []
    for ref in refs:
        before = phase_sums(metrics_port)
        # The plugin answers /metrics from a thread it starts per request: let it end before the
        # pair, or its last GIL slices land in the pair's time (the baseline has no such thread).
        await asyncio.sleep(0.002)
        started = time.perf_counter()
        prepared = await kubelet.node_prepare_resources([ref])
        unprepared = await kubelet.node_unprepare_resources([ref])
        elapsed = time.perf_counter() - started
        spent = phase_delta(before, phase_sums(metrics_port))
        if prepared[ref.uid].error or unprepared[ref.uid]:
            raise RuntimeError(f"claim {ref.name}: {prepared[ref.uid].error or unprepared[ref.uid]}")
        pairs.append(elapsed)
        storage.append(sum(spent.get(p, 0.0) for p in _STORAGE_PHASES))
        if phases is not None:
            for phase in _STORAGE_PHASES:
                phases.setdefault(phase, []).append(spent.get(phase, 0.0))
    return pairs, storage


async def _measure(root: Path, quick: bool) -> dict[str, Any]:
    if importlib.util.find_spec("pydra") is None:
        raise RuntimeError(
            "the kubernetes-pydra baseline is not installed: run `make bench`, or "
            "`pip install -e '.[bench]'` before `python -m bench`"
        )
    total = 100 if quick else 1000
    block = 25 if quick else 50
    results: dict[str, Any] = {}
    with Stack(root) as stack:
        api = stack.apiserver()
        metrics_port = free_port()
        plugin = stack.plugin(_NODE, None, api, backend="noop", metrics_port=metrics_port)
        fabric = plugin.role
        pydra = [
            "--socket",
            str(root / "pydra" / "dra.sock"),
            "--registration-socket",
            str(root / "pydra" / "reg.sock"),
        ]
        baseline = stack.role(
            "pydra",
            lambda: pydra,
            ready=False,
            env={"PYTHONPATH": str(REPO_ROOT)},
            module="bench.pydra_baseline",
        ).start()
        try:
            _wait_for(root / "pydra" / "reg.sock", baseline)
            async with api.client() as kube:
                specs = [ClaimSpec(f"ovh-{i}", _NODE, f"dev-{i}") for i in range(total + 20)]
                uids = await create_claims(kube, specs, concurrency=16)
            refs = [ClaimRef("default", s.name, uid) for s, uid in zip(specs, uids, strict=True)]
            ours = await _kubelet(plugin.registration_socket)
            theirs = await _kubelet(root / "pydra" / "reg.sock")
            try:
                await _pairs(ours, refs[:20], metrics_port)  # warm: connections, first-use imports
                await _pairs(theirs, refs[:20], metrics_port)
                idle_rss = {"fabric_dra": rss_mib(fabric.pid), "baseline": rss_mib(baseline.pid)}
                progress("overhead", f"{total} pairs each, alternating blocks of {block}")
                our_pairs: list[float] = []
                our_storage: list[float] = []
                base_pairs: list[float] = []
                our_phases: dict[str, list[float]] = {}
                for start in range(20, 20 + total, block):
                    chunk = refs[start : start + block]
                    # The baseline's pairs are bracketed by the same metrics reads as ours.
                    pairs, _ = await _pairs(theirs, chunk, metrics_port)
                    base_pairs += pairs
                    pairs, storage = await _pairs(ours, chunk, metrics_port, our_phases)
                    our_pairs += pairs
                    our_storage += storage
            finally:
                await ours.close()
                await theirs.close()
        finally:
            baseline.stop()
            fabric.stop()
    framework = [p - s for p, s in zip(our_pairs, our_storage, strict=True)]
    results["baseline_pair"] = summary_ms(base_pairs)
    results["fabric_dra_pair"] = summary_ms(our_pairs)
    results["fabric_dra_claim_read_checkpoint_cdi"] = summary_ms(our_storage)
    results["fabric_dra_phases_p50_ms"] = {k: summary_ms(v)["p50_ms"] for k, v in our_phases.items()}
    results["fabric_dra_framework"] = summary_ms(framework)
    results["ratio_p50"] = round(
        results["fabric_dra_framework"]["p50_ms"] / results["baseline_pair"]["p50_ms"], 3
    )
    results["idle_rss_mib"] = idle_rss
    return results


def run(ctx: BenchContext) -> dict[str, Any]:
    root = ctx.root / "overhead"
    root.mkdir(parents=True, exist_ok=True)
    figures = asyncio.run(_measure(root, ctx.quick))
    return {
        "figures": figures,
        "checks": [
            check("framework overhead ratio vs kubernetes-pydra (p50)", figures["ratio_p50"], 1.0, ""),
            check(
                "no-op prepare+unprepare pair p50, concurrency 1",
                figures["fabric_dra_pair"]["p50_ms"],
                3,
                "ms",
            ),
        ],
    }
