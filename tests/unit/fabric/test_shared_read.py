"""A read shared by the callers that ask while one is under way: each gets a read sent after it
asked, never one sent before (that would be stale for it), and no caller's cancellation or
failure is another's."""

from __future__ import annotations

import asyncio

import pytest

from fabric.backends.shared_read import SharedRead


class _Reads:
    """Reads that end when the test says: the n-th answers ``n`` (or raises)."""

    def __init__(self) -> None:
        self.release: list[asyncio.Future[None]] = []

    async def __call__(self) -> int:
        n = len(self.release)
        self.release.append(asyncio.get_running_loop().create_future())
        await self.release[n]
        return n

    async def sent(self, count: int) -> None:
        """Until ``count`` reads were sent (a few turns of the loop; none comes later)."""
        for _ in range(100):
            if len(self.release) >= count:
                return
            await asyncio.sleep(0)
        raise AssertionError(f"{len(self.release)} reads sent, not {count}")


async def test_a_caller_that_asks_during_a_read_gets_the_next_one() -> None:
    reads = _Reads()
    shared = SharedRead(reads)
    first = asyncio.ensure_future(shared())
    await reads.sent(1)
    later = [asyncio.ensure_future(shared()) for _ in range(3)]  # asked after read 0 was sent
    await asyncio.sleep(0)
    reads.release[0].set_result(None)
    assert await first == 0
    await reads.sent(2)
    assert not any(t.done() for t in later), "read 0 began before they asked: not theirs"
    reads.release[1].set_result(None)
    assert await asyncio.gather(*later) == [1, 1, 1]
    assert (shared.sent, shared.answered) == (2, 4)


async def test_callers_before_the_read_is_sent_share_it() -> None:
    reads = _Reads()
    shared = SharedRead(reads)
    together = [asyncio.ensure_future(shared()) for _ in range(5)]
    await reads.sent(1)
    reads.release[0].set_result(None)
    assert await asyncio.gather(*together) == [0] * 5
    assert shared.sent == 1


async def test_a_cancelled_caller_leaves_the_read_to_the_others() -> None:
    reads = _Reads()
    shared = SharedRead(reads)
    gone, stays = asyncio.ensure_future(shared()), asyncio.ensure_future(shared())
    await reads.sent(1)
    gone.cancel()
    await asyncio.sleep(0)
    reads.release[0].set_result(None)
    assert await stays == 0
    assert gone.cancelled()


async def test_a_failed_read_fails_its_callers_and_the_next_reads_again() -> None:
    reads = _Reads()
    shared = SharedRead(reads)
    both = [asyncio.ensure_future(shared()) for _ in range(2)]
    await reads.sent(1)
    reads.release[0].set_exception(OSError("reset"))
    for task in both:
        with pytest.raises(OSError):
            await task
    again = asyncio.ensure_future(shared())
    await reads.sent(2)
    reads.release[1].set_result(None)
    assert await again == 1
