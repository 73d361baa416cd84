"""The report a test writes shortly before its timeout names each task and the await it is in."""

from __future__ import annotations

import asyncio

import pytest

from tests.support import hangs


async def test_the_report_names_each_task_down_to_the_innermost_await(
    capsys: pytest.CaptureFixture[str],
) -> None:
    never = asyncio.Event()

    async def deepest() -> None:
        await never.wait()

    async def outer() -> None:
        await deepest()

    stuck = asyncio.create_task(outer(), name="the-stuck-one")
    await asyncio.sleep(0)
    try:
        # written from another thread, as the timer does, while this loop runs
        await asyncio.to_thread(hangs._write_tasks, "tests/x.py::test_x")
    finally:
        stuck.cancel()
    err = capsys.readouterr().err
    assert "tests/x.py::test_x: the tasks of each running event loop" in err
    block = err.split("* task the-stuck-one\n", 1)[1].split("* task", 1)[0]
    functions = [line.rsplit(" in ", 1)[1] for line in block.splitlines() if " in " in line]
    assert functions[:3] == ["outer", "deepest", "wait"], block
