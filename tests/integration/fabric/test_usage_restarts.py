"""Device-seconds across manager restarts, with real processes: a graceful stop loses nothing (the
time the manager was down is charged to what the ledger says), a kill -9 loses at most the seconds
since the last write of the record, and only of devices whose entry changed in that time; then
``fabric-dra usage`` reads the result as json, csv and a table.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from fabric.bindings.usage import FLUSH_SECONDS, TICK_SECONDS, usage_record_name
from fabric_dra_testbed.stack import Role
from manager_api.client import ManagerClient
from manager_api.errors import NotLeader
from manager_api.models import AttachmentState, UsageGroup, UsageGrouping, UsageReport
from plumbing.kube.resources import CONFIGMAPS, NAMESPACES, NODES
from tests.integration.fabric.conftest import (
    CONTROLLER_TOKEN,
    OPERATOR_TOKEN,
    FabricAdmin,
    allocated_claim,
    leader_of,
    manager_args,
)
from tests.support.apiserver import start_apiserver
from tests.support.fabric_manager import start_manager
from tests.support.uids import claim_uid

pytestmark = pytest.mark.slow(seconds=40)

NODE = "kind-worker"
USAGE_NAMESPACE = "fabric-dra"
#: the slack of a comparison of seconds measured by the test with seconds the manager counted
SLACK = 0.5


async def _attach(address: str, device: str, claim: str) -> tuple[datetime, datetime]:
    """Attach; the wall-clock times just before the request and just after the answer."""
    before = datetime.now(UTC)
    async with ManagerClient(address, token=CONTROLLER_TOKEN, timeout=30) as client:
        attachment = await client.attach(device, NODE, claim_uid(claim), wait_seconds=20)
    assert attachment.state is AttachmentState.ATTACHED
    return before, datetime.now(UTC)


async def _model(address: str, device: str) -> str:
    async with ManagerClient(address, token=CONTROLLER_TOKEN, timeout=30) as client:
        shown = await client.device(device)
    return shown.model or str(shown.type)


#: every report counts from here (from the start of its hour: each test has a record of its own)
_START = datetime.now(UTC)


async def _usage(address: str) -> tuple[dict[str, UsageGroup], UsageReport]:
    # Device-seconds by namespace and workload are the operators' to read (docs/manager.md).
    async with ManagerClient(address, token=OPERATOR_TOKEN, timeout=30) as client:
        report = await client.usage(_START, UsageGrouping.MODEL)
    return {g.name: g for g in report.groups}, report


def _held(group: UsageGroup) -> float:
    """Seconds the manager held the device for its claim: attaching, then bound."""
    return group.attaching + group.bound + group.detaching


def _seconds(a: datetime, b: datetime) -> float:
    return (b - a).total_seconds()


async def test_device_seconds_survive_a_graceful_restart_and_a_kill(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    args = manager_args(fabric, tmp_path, "--poll-seconds", "1")
    record = tmp_path / "manager-state" / "usage.json"
    first = start_manager(tmp_path, fabric.url, args=args, name="manager-1")
    try:
        kept_from, kept_to = await _attach(first.address, "gpu0", "usage-kept")
        gone_from, gone_to = await _attach(first.address, "nvme0", "usage-gone")
        kept_model = await _model(first.address, "gpu0")
        gone_model = await _model(first.address, "nvme0")
        assert kept_model != gone_model  # told apart by model: no claims to group by here
        await asyncio.sleep(1)  # held a while before the stop
    finally:
        first.stop()  # SIGTERM: the record is written on the way out
    written = json.loads(record.read_text())
    stopped = datetime.fromisoformat(written["countedUntil"])
    await asyncio.sleep(2)  # down: still charged, the devices stayed bound

    second = start_manager(tmp_path, fabric.url, args=args, name="manager-2")
    try:
        groups, report = await _usage(second.address)
        # Graceful: nothing lost, the time down included. Held since between the attach's request
        # and its answer, up to when the report counted.
        for model, since, until in ((kept_model, kept_from, kept_to), (gone_model, gone_from, gone_to)):
            held = _held(groups[model])
            assert _seconds(until, report.until) - SLACK <= held <= _seconds(since, report.until) + SLACK, (
                model,
                held,
            )
        assert _seconds(stopped, report.until) > 2  # the down time is in there
        # The nvme goes, and at once the manager dies: its last seconds were not written.
        async with ManagerClient(second.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            detached = await client.detach("nvme0", NODE, claim_uid("usage-gone"), wait_seconds=20)
        gone_at = datetime.now(UTC)
        assert detached.state is AttachmentState.DETACHED
        second.kill()
    finally:
        second.stop()

    third = start_manager(tmp_path, fabric.url, args=args, name="manager-3")
    try:
        groups, report = await _usage(third.address)
        # gpu0 is still bound: the kill lost none of its seconds, the time down included.
        kept = _held(groups[kept_model])
        assert _seconds(kept_to, report.until) - SLACK <= kept <= _seconds(kept_from, report.until) + SLACK
        # nvme0 left while the record was unwritten: lost at most one flush interval of it.
        gone = _held(groups[gone_model])
        lost = _seconds(gone_from, gone_at) - gone
        print(f"kill -9 lost {lost:.1f} s of a device detached just before it")
        assert -SLACK <= lost <= FLUSH_SECONDS + TICK_SECONDS + SLACK, lost
        _cli_reads_the_same(third.address, report, kept_model)
        async with ManagerClient(third.address, token=CONTROLLER_TOKEN, timeout=30) as client:
            await client.detach("gpu0", NODE, claim_uid("usage-kept"), wait_seconds=20)
        assert fabric.bound_hosts() == {}  # the module's fabric is left as found
    finally:
        third.stop()


def _cli_started(address: str, *args: str) -> subprocess.Popen[str]:
    """``fabric-dra usage`` started, not waited for (:func:`_finished`): the runs that compare
    nothing with each other go side by side (each is mostly Python importing the command)."""
    env = {**os.environ, "FABRIC_DRA_TOKEN": OPERATOR_TOKEN}
    return subprocess.Popen(
        [sys.executable, "-m", "fabric_dra", "usage", "--manager-url", address, "--by", "model", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _finished(process: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        stdout, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _cli(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    return _finished(_cli_started(address, *args))


def _cli_reads_the_same(address: str, report: UsageReport, model: str) -> None:
    since = ["--since", _START.isoformat()]
    # The table and the refused --since compare with nothing else: started now, read at the end.
    # The csv is compared with the json, so it runs after it.
    as_text = _cli_started(address, "--since", "2h")
    refused = _cli_started(address, "--since", "yesterday")
    shown = _cli(address, *since, "-o", "json")
    assert shown.returncode == 0, shown.stderr
    document = UsageReport.model_validate_json(shown.stdout)
    assert (document.by, document.since) == (UsageGrouping.MODEL, report.since)
    assert {g.name for g in document.groups} == {g.name for g in report.groups}
    # Counted on since the report above: never less.
    later = {g.name: g for g in document.groups}
    assert later[model].bound >= next(g for g in report.groups if g.name == model).bound

    table = _cli(address, *since, "-o", "csv")
    assert table.returncode == 0, table.stderr
    rows = list(csv.reader(table.stdout.splitlines()))
    assert rows[0] == [
        *("model", "bound", "warm", "attaching", "detaching", "outside", "total"),
        *("partition_seconds", "memory_gib_seconds"),
    ]
    by_model = {row[0]: row for row in rows[1:]}
    assert float(by_model[model][1]) >= later[model].bound
    assert abs(sum(float(c) for c in by_model[model][1:6]) - float(by_model[model][6])) < 0.01

    text = _finished(as_text)
    assert text.returncode == 0, text.stderr
    head, columns, *lines = text.stdout.splitlines()
    assert head.startswith("device-hours from ") and "UTC, by model" in head
    assert head.endswith(f"(nothing recorded before {report.oldest:%Y-%m-%d %H:%M})"), head
    assert columns.split() == ["MODEL", "BOUND", "WARM", "ATTACHING", "DETACHING", "OUTSIDE", "TOTAL"]
    assert any(line.startswith(model) for line in lines), text.stdout

    wrong = _finished(refused)
    assert wrong.returncode == 1
    assert wrong.stderr.strip().splitlines() == [
        "fabric-dra: error: --since 'yesterday': expected a duration (30m, 24h, 7d) or an RFC 3339 "
        "time with a zone (2026-03-01T09:00:00Z)"
    ]


async def _by(
    address: str, by: UsageGrouping, within: float = 30
) -> tuple[dict[str, UsageGroup], UsageReport]:
    """The report of the replica at ``address``; retried while it is (again) not the leader: on a
    loaded machine a renewal can still be missed, and the Lease is taken back."""
    deadline = time.monotonic() + within
    async with ManagerClient(address, token=OPERATOR_TOKEN, timeout=30) as client:
        while True:
            try:
                report = await client.usage(_START, by)
            except NotLeader:
                assert time.monotonic() < deadline, f"{address} never led again"
                await asyncio.sleep(0.2)
                continue
            return {g.name: g for g in report.groups}, report


async def test_a_leader_change_carries_the_record_by_namespace_and_workload(
    fabric: FabricAdmin, tmp_path: Path
) -> None:
    """Two replicas, a Lease and the ConfigMap ledger: the record is the ConfigMap beside it, the
    claim's namespace and owner label the seconds, and neither a graceful hand-over nor a kill -9
    of the leader loses any; the Prometheus counter carries on instead of starting again."""
    with start_apiserver(tmp_path / "apiserver") as cluster:
        async with cluster.client() as kube:
            await kube.create(NAMESPACES, {"metadata": {"name": USAGE_NAMESPACE}})
            await kube.create(NODES, {"metadata": {"name": NODE}})  # matched by name
        claim = await allocated_claim(
            cluster,
            "train-claim",
            "gpu2",
            NODE,
            owner={"apiVersion": "v1", "kind": "Pod", "name": "train-0", "uid": "pod-uid-0"},
        )

        def start(name: str) -> Role:
            work = tmp_path / name
            work.mkdir(exist_ok=True)
            args = manager_args(
                fabric,
                work,
                *("--kubeconfig", str(cluster.kubeconfig), "--namespace", USAGE_NAMESPACE),
                *("--leader-elect", "--identity", name, "--ledger", "configmap"),
                # A renewal missed on a loaded machine must not hand the Lease back and forth.
                *("--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "0.5"),
            )
            return start_manager(work, fabric.url, args=args, name=name, ready=False)

        managers = {name: start(name) for name in ("replica-1", "replica-2")}
        try:
            before = datetime.now(UTC)
            while True:  # a new leader that misses its first renewal on a loaded machine steps down
                leader = await leader_of(managers)
                async with ManagerClient(
                    managers[leader].address, token=CONTROLLER_TOKEN, timeout=30
                ) as client:
                    try:
                        attached = await client.attach("gpu2", NODE, claim, wait_seconds=20)
                        break
                    except NotLeader:
                        assert _seconds(before, datetime.now(UTC)) < 60, "no replica stayed leader"
            after = datetime.now(UTC)
            assert attached.state is AttachmentState.ATTACHED
            await asyncio.sleep(1)  # held a while before the hand-over

            managers[leader].stop()  # SIGTERM: written, then the Lease released
            follower = await leader_of({n: p for n, p in managers.items() if n != leader})
            groups, report = await _by(managers[follower].address, UsageGrouping.WORKLOAD)
            held = _held(groups["default/Pod/train-0"])
            assert _seconds(after, report.until) - SLACK <= held <= _seconds(before, report.until) + SLACK
            by_namespace, _ = await _by(managers[follower].address, UsageGrouping.NAMESPACE)
            assert set(by_namespace) == {"default"}, by_namespace
            async with cluster.client() as kube:
                record = await kube.get(
                    CONFIGMAPS, usage_record_name("fabric-dra-manager-ledger"), USAGE_NAMESPACE
                )
            assert set(record["binaryData"]) == {"usage.json.gz"}
            counted = _counter(await _scrape(managers[follower].address), "default", "bound")
            assert counted >= groups["default/Pod/train-0"].bound - SLACK  # from the record: not reset

            # The old leader comes back as a follower; the new one dies without a word.
            managers[leader] = start(leader)
            await _following(managers[leader])
            managers[follower].kill()
            assert await leader_of({leader: managers[leader]}) == leader
            groups, report = await _by(managers[leader].address, UsageGrouping.WORKLOAD)
            held = _held(groups["default/Pod/train-0"])
            # Nothing changed since the last write: the kill and the Lease's expiry lost nothing.
            assert _seconds(after, report.until) - SLACK <= held <= _seconds(before, report.until) + SLACK
            assert _counter(await _scrape(managers[leader].address), "default", "bound") >= counted
            async with ManagerClient(managers[leader].address, token=CONTROLLER_TOKEN, timeout=30) as client:
                await client.detach("gpu2", NODE, claim, wait_seconds=20)
            assert fabric.bound_hosts() == {}
        finally:
            for process in managers.values():
                process.stop()


async def _following(process: Role, within: float = 30) -> None:
    """Until the replica's /readyz says it is not the leader: it read the Lease another holds."""
    deadline = time.monotonic() + within
    async with httpx.AsyncClient(timeout=5) as http:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                answer = await http.get(f"{process.address}/readyz")
                reason = str(answer.json().get("reason", "")) if answer.status_code == 503 else ""
                if reason.startswith("not the leader") and "leader: unknown" not in reason:
                    return
            assert time.monotonic() < deadline, f"{process.name} never said it follows"
            await asyncio.sleep(0.1)


async def _scrape(address: str) -> str:
    async with httpx.AsyncClient(timeout=10, headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}) as http:
        return (await http.get(f"{address}/metrics")).text


def _counter(text: str, namespace: str, state: str) -> float:
    """The sum of ``fabric_dra_device_seconds_total`` samples of that namespace and state."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith("fabric_dra_device_seconds_total{") and (
            f'namespace="{namespace}"' in line and f'state="{state}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total
