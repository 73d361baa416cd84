"""Task followers wake on the service's task events instead of sleeping out Retry-After."""

from __future__ import annotations

import asyncio
import time

from fabric.redfish.tasks import TaskWatch

TASK = "/redfish/v1/TaskService/Tasks/7"
MONITOR = "/redfish/v1/TaskService/TaskMonitors/7"


async def test_an_event_for_the_task_wakes_its_follower_only() -> None:
    watch = TaskWatch()
    since = time.monotonic()
    ours = asyncio.create_task(watch.pause([TASK, MONITOR], 3600, since=since))
    other = asyncio.create_task(watch.pause(["/redfish/v1/TaskService/Tasks/8"], 3600, since=since))
    await asyncio.sleep(0)
    watch.changed(TASK + "/")  # trailing slash, as some services write links
    await asyncio.wait_for(ours, 5)
    assert not other.done()
    watch.changed(None)  # an event that names no task wakes everyone
    await asyncio.wait_for(other, 5)


async def test_an_event_before_the_follower_waits_is_not_lost() -> None:
    watch = TaskWatch()
    since = time.monotonic()
    watch.changed(TASK)  # the task ended between the 202 and the first wait
    await asyncio.wait_for(watch.pause([TASK], 3600, since=since), 5)
    # a change from before ``since`` does not count: the follower already read after it
    later = time.monotonic()
    waiting = asyncio.create_task(watch.pause([TASK], 3600, since=later))
    await asyncio.sleep(0)
    assert not waiting.done()
    waiting.cancel()


async def test_without_events_the_pause_lasts_its_time() -> None:
    watch = TaskWatch()
    await asyncio.wait_for(watch.pause([TASK], 0.01, since=time.monotonic()), 5)
    assert watch._waiters == {}  # nothing left registered


async def test_a_task_event_for_a_waited_task_shows_the_service_sends_them() -> None:
    watch = TaskWatch()
    watch.changed("/redfish/v1/TaskService/Tasks/99")  # nobody waited for it: no evidence
    assert not watch.evented
    watch.follow([TASK, MONITOR])
    since = time.monotonic()
    waiting = asyncio.create_task(watch.pause([TASK, MONITOR], 3600, since=since))
    await asyncio.sleep(0)
    watch.changed(TASK, final=False)  # progress: evidence, but the task goes on
    assert watch.evented
    await asyncio.sleep(0.01)
    assert not waiting.done()
    watch.changed(None, final=False)  # progress of a task it does not name: wakes nobody either
    await asyncio.sleep(0.01)
    assert not waiting.done()
    watch.stream_changed()  # the stream dropped or reconnected: no longer known, everyone reads
    assert not watch.evented
    await asyncio.wait_for(waiting, 5)
    watch.unfollow([TASK, MONITOR])
    watch.changed(TASK, final=False)  # a task nobody follows any more is no evidence
    assert not watch.evented
