"""A replica that becomes leader while its first discovery pass runs reads the fabric once.

Gaining leadership loads the ledger and reconciles it with the fabric's bindings; what it must
re-read for that is who is bound (a bindings-only pass), never the whole fabric again: at 10,100
devices a second full pass right after ``/readyz`` took the first attaches' CPU for seconds.
Reads are slowed (a latency profile) so that the Lease is won and the ledger loaded while the
first pass is still reading.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from plumbing.kube.resources import NAMESPACES
from tests.integration.fabric.conftest import Tls, manager_args, tls_emulator
from tests.support.apiserver import start_apiserver
from tests.support.fabric_manager import running_manager

pytestmark = pytest.mark.slow(seconds=20)

NAMESPACE = "fabric-dra"


async def test_leadership_won_during_the_first_pass_asks_no_second_full_pass(
    tmp_path: Path, tls: Tls
) -> None:
    latency = tmp_path / "slow-reads.json"
    latency.write_text(json.dumps({"name": "slow-reads", "read": {"seconds": 0.03}}))
    with (
        start_apiserver(tmp_path / "apiserver") as cluster,
        tls_emulator(tmp_path / "fabric", tls, latency=str(latency)) as fabric,
    ):
        async with cluster.client() as kube:
            await kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
        work = tmp_path / "replica"
        work.mkdir()
        args = manager_args(
            fabric,
            work,
            *("--kubeconfig", str(cluster.kubeconfig), "--namespace", NAMESPACE),
            *("--leader-elect", "--identity", "replica", "--ledger", "configmap"),
            *("--lease-duration", "3", "--renew-deadline", "2", "--retry-period", "0.5"),
        )
        ca = str(fabric.tls.ca)
        with running_manager(work, fabric.url, args=args, name="replica", ca_file=ca) as replica:
            log = replica.log_file
            # /readyz says ready once the ledger is loaded and the first pass is done; a second
            # pass asked for meanwhile begins within the debounce and ends within a few seconds.
            await asyncio.sleep(4)
            assert replica.alive()
            passes = [line for line in log.read_text().splitlines() if "fabric discovered" in line]
            assert len(passes) == 1, passes
