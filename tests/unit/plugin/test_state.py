from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

from dra_driver.plugin.state import ClaimLocks, InflightWork


async def test_same_claim_is_serialised_other_claims_are_not(tmp_path: Path) -> None:
    locks = ClaimLocks(tmp_path / "claims.lock")
    order: list[str] = []

    async def work(uid: str, tag: str, pause: float) -> None:
        async with locks.hold(uid):
            order.append(f"{tag}-in")
            await asyncio.sleep(pause)
            order.append(f"{tag}-out")

    await asyncio.gather(work("a", "a1", 0.05), work("a", "a2", 0.0), work("b", "b1", 0.0))
    # a2 waited for a1; b1 did not wait for anybody.
    assert order.index("a1-out") < order.index("a2-in")
    assert order.index("b1-out") < order.index("a1-out")
    locks.close()


async def test_claim_lock_excludes_another_process(tmp_path: Path) -> None:
    lock_file = tmp_path / "claims.lock"
    locks = ClaimLocks(lock_file)
    holder = textwrap.dedent(
        f"""
        import asyncio, sys
        from pathlib import Path
        from dra_driver.plugin.state import ClaimLocks
        async def main():
            locks = ClaimLocks(Path({str(lock_file)!r}))
            async with locks.hold("claim-x"):
                print("held", flush=True)
                sys.stdin.readline()
        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", holder, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and (await proc.stdout.readline()).strip() == b"held"
        waiter = asyncio.create_task(_acquire(locks, "claim-x"))
        other = asyncio.create_task(_acquire(locks, "claim-y"))
        await asyncio.wait_for(other, 10)  # a different claim is not blocked by the other process
        await asyncio.sleep(0.1)
        assert not waiter.done()  # the same claim is
        assert proc.stdin is not None
        proc.stdin.write(b"\n")
        await proc.stdin.drain()
        await asyncio.wait_for(waiter, 10)
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
        locks.close()


async def _acquire(locks: ClaimLocks, uid: str) -> None:
    async with locks.hold(uid):
        pass


async def test_inflight_work_is_shared_until_consumed() -> None:
    work = InflightWork()
    started = 0
    gate = asyncio.Event()

    async def attach() -> str:
        nonlocal started
        started += 1
        await gate.wait()
        return "attached"

    first = work.get_or_start(("c", "d"), attach)
    second = work.get_or_start(("c", "d"), attach)
    assert first is second
    gate.set()
    assert await second == "attached" and started == 1
    work.finished(("c", "d"))
    assert len(work) == 0


async def test_cancel_claim_stops_its_tasks_only() -> None:
    work = InflightWork()
    never = asyncio.Event()
    a = work.get_or_start(("a", "d1"), never.wait)
    b = work.get_or_start(("b", "d1"), never.wait)
    await asyncio.sleep(0)
    await work.cancel_claim("a")
    assert a.cancelled() and not b.done()
    await work.cancel_all()
    assert b.cancelled()
