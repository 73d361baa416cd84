"""A node's long poll on the change feed (``wait_changes`` with ``node``) is woken by the versions
that concern its node only: another node's attach costs an idle node's poll nothing (before, every
version woke every poll, and each wake walked back over the history since the poll began — ten
idle plugins' polls were a fifth of the manager's CPU at one claim at a time). A version that
changed no device (the pools, nodes or notices) and the manager's shutdown still answer them all."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fabric.state.inventory import wait_changes
from tests.unit.fabric.fakes import Harness, make_harness

CHANGES = 60


async def _turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def _poll(h: Harness, node: str) -> tuple[asyncio.Task[bytes], int]:
    h.inventory.flush()  # what the harness's start left to flush, before the cursor is taken
    since = h.inventory.version
    poll = asyncio.create_task(wait_changes(h.inventory, h.inventory.history.epoch, since, 30.0, node=node))
    await _turns()
    assert not poll.done()
    return poll, since


async def test_an_idle_nodes_poll_is_not_woken_by_another_nodes_changes(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=2, devices=2)
    history = h.inventory.history
    walked: list[int] = []  # per look at the history: how many versions it spans
    concerns, since_of = history.concerns, history.since

    def counted_concerns(version: int, node: str) -> bool:
        walked.append(history.current - version)
        return concerns(version, node)

    def counted_since(epoch: int, version: int, node: str | None = None) -> set[str] | None:
        walked.append(history.current - version)
        return since_of(epoch, version, node)

    history.concerns = counted_concerns  # type: ignore[method-assign]
    history.since = counted_since  # type: ignore[method-assign]

    poll, since = await _poll(h, "node-1")
    assert walked == [0]  # one look, when the poll began
    for turn in range(CHANGES):  # gpu0 bound to node-0 and freed again, outside fabric-dra
        if turn % 2 == 0:
            h.fabric.bound["gpu0"] = "node-0"
        else:
            del h.fabric.bound["gpu0"]
        await h.watch.refresh()
        h.inventory.flush()
        await _turns()
        assert not poll.done(), "node-1's poll answered a change of node-0's device"
    assert h.inventory.version - since >= CHANGES
    assert walked == [0]  # not woken: the history was not looked at again

    h.fabric.bound["gpu1"] = "node-1"  # now node-1's own device
    await h.watch.refresh()
    h.inventory.flush()
    body = json.loads(await asyncio.wait_for(poll, 5))
    assert [d["name"] for d in body["devices"]] == ["gpu1"]
    assert body["since"] == since and body["version"] == h.inventory.version
    assert len(walked) == 2  # and the answer, built once


async def test_a_version_that_changed_no_device_answers_every_nodes_poll(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=2, devices=2)
    polls = [await _poll(h, node) for node in ("node-0", "node-1")]
    h.inventory.notices = ["the fabric's ports cannot be read"]
    h.inventory.changed()
    h.inventory.flush()
    for poll, since in polls:
        body = json.loads(await asyncio.wait_for(poll, 5))
        assert body["devices"] == [] and body["version"] == h.inventory.version > since


async def test_shutting_down_answers_the_waiting_node_polls_at_once(tmp_path: Path) -> None:
    h = await make_harness(tmp_path, hosts=2, devices=2)
    polls = [await _poll(h, node) for node in ("node-0", "node-1")]
    await h.inventory.release_waiters()
    for poll, since in polls:
        body = json.loads(await asyncio.wait_for(poll, 5))
        assert body["devices"] == [] and body["since"] == since and body["version"] == h.inventory.version
