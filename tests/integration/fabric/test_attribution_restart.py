"""Usage by claim label and the FOCUS export across a manager restart, with real processes: the
emulator, the API test server holding a labelled ResourceClaim, and the manager stopped and started
again; read through the REST API, ``/metrics`` and ``fabric-dra usage``."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from fabric.bindings.focus import COLUMNS
from manager_api.client import ManagerClient
from manager_api.models import AttachmentState, UsageGrouping
from plumbing.kube.resources import NAMESPACES, NODES
from tests.integration.fabric.conftest import (
    CONTROLLER_TOKEN,
    OPERATOR_TOKEN,
    FabricAdmin,
    allocated_claim,
    manager_args,
)
from tests.support.apiserver import start_apiserver
from tests.support.fabric_manager import start_manager

pytestmark = pytest.mark.slow(seconds=31)

NODE = "kind-worker"
SLACK = 0.5
LABELS = {"client": "acme", "tier": "gold", "unrelated": "not-attributed"}
PRICE = Decimal("3.6")  # per device-hour: a second costs 0.001


def _cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FABRIC_DRA_TOKEN": OPERATOR_TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "fabric_dra", "usage", "--manager-url", address, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


async def test_usage_by_label_and_the_focus_export_across_a_restart(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    start = datetime.now(UTC)
    with start_apiserver(tmp_path / "apiserver") as cluster:
        async with cluster.client() as kube:
            await kube.create(NAMESPACES, {"metadata": {"name": "fabric-dra"}})
            await kube.create(NODES, {"metadata": {"name": NODE}})
        claim = await allocated_claim(
            cluster,
            "agent-claim",
            "gpu0",
            NODE,
            owner={"apiVersion": "v1", "kind": "Pod", "name": "agent-0", "uid": "pod-uid-a"},
            labels=LABELS,
        )
        common = (
            *("--kubeconfig", str(cluster.kubeconfig), "--namespace", "fabric-dra"),
            *("--attribution-label", "client", "--attribution-label", "tier"),
        )
        first = start_manager(tmp_path, fabric.url, args=manager_args(fabric, tmp_path, *common), name="m-1")
        try:
            before = datetime.now(UTC)
            async with ManagerClient(first.address, token=CONTROLLER_TOKEN, timeout=30) as client:
                attached = await client.attach("gpu0", NODE, claim, wait_seconds=20)
                model = (await client.device("gpu0")).model or "unknown"
            after = datetime.now(UTC)
            assert attached.state is AttachmentState.ATTACHED
            await asyncio.sleep(1)
        finally:
            first.stop()  # SIGTERM: the record, labels and all, is written on the way out
        await asyncio.sleep(1)  # down: still charged to the claim's labels

        prices = tmp_path / "prices.yaml"
        prices.write_text(json.dumps({"currency": "EUR", "models": {model: {"perHour": str(PRICE)}}}))
        args = manager_args(fabric, tmp_path, *common, "--price-list", str(prices))
        second = start_manager(tmp_path, fabric.url, args=args, name="m-2")
        try:
            async with ManagerClient(second.address, token=OPERATOR_TOKEN, timeout=30) as client:
                report = await client.usage(start, UsageGrouping.LABEL, "client")
                by_tier = await client.usage(start, UsageGrouping.LABEL, "tier")
            groups = {g.name: g for g in report.groups}
            assert report.label == "client" and set(groups) == {"acme"}, groups
            held = groups["acme"].attaching + groups["acme"].bound
            lower, upper = (report.until - after).total_seconds(), (report.until - before).total_seconds()
            assert lower - SLACK <= held <= upper + SLACK, (held, lower, upper)
            assert lower > 2  # the restart's down time is in there
            assert [g.name for g in by_tier.groups] == ["gold"]

            # The FOCUS export, through the command line, after the restart: the device is still
            # bound, so it counts the seconds since the report too (however slow the command is).
            reported = time.monotonic()
            shown = _cli(second.address, "--since", start.isoformat(), "--format", "focus")
            assert shown.returncode == 0, shown.stderr
            rows = list(csv.DictReader(io.StringIO(shown.stdout)))
            assert list(rows[0]) == [name for name, _type in COLUMNS]
            mine = [r for r in rows if r["ResourceName"] == model]
            assert mine and {r["Tags"] for r in mine} == {'{"client":"acme","tier":"gold"}'}
            assert {(r["SubAccountId"], r["BillingCurrency"], r["ConsumedUnit"]) for r in mine} == {
                ("default", "EUR", "Device-Hours")
            }
            hours = sum(Decimal(r["ConsumedQuantity"]) for r in mine)
            since_report = time.monotonic() - reported
            exported = float(hours) * 3600
            assert held - 2 * SLACK <= exported <= held + since_report + 2 * SLACK, (exported, held)
            for row in mine:
                assert Decimal(row["ListUnitPrice"]) == PRICE
                assert Decimal(row["BilledCost"]) == (PRICE * Decimal(row["PricingQuantity"])).quantize(
                    Decimal("0.000001")
                )

            # A range with no data: the header only.
            empty = _cli(
                second.address,
                *(
                    "--since",
                    "2020-01-01T00:00:00Z",
                    "--until",
                    "2020-01-01T05:00:00Z",
                    "--format",
                    "focus-csv",
                ),
            )
            assert empty.returncode == 0, empty.stderr
            assert empty.stdout.splitlines() == [",".join(name for name, _type in COLUMNS)]
            # By label on the command line; a key the manager does not attribute by is one line.
            table = _cli(second.address, "--since", start.isoformat(), "--by", "label:client", "-o", "csv")
            assert table.returncode == 0, table.stderr
            assert [row[0] for row in csv.reader(table.stdout.splitlines())] == ["label", "acme"]
            wrong = _cli(second.address, "--since", "1h", "--by", "label:unrelated")
            assert wrong.returncode == 1
            assert len(wrong.stderr.strip().splitlines()) == 1
            assert "is no attribution label of this manager" in wrong.stderr

            async with httpx.AsyncClient(
                timeout=10, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}
            ) as http:
                metrics = (await http.get(f"{second.address}/metrics")).text
            counted = [
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith("fabric_dra_attributed_seconds_total{")
                and 'key="client"' in line
                and 'value="acme"' in line
                and 'state="bound"' in line
            ]
            assert counted and counted[0] > 1, metrics  # from the record: not reset by the restart

            async with ManagerClient(second.address, token=CONTROLLER_TOKEN, timeout=30) as client:
                await client.detach("gpu0", NODE, claim, wait_seconds=20)
            assert fabric.bound_hosts() == {}
        finally:
            second.stop()
