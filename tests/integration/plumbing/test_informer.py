"""The one informer (plumbing.kube.informer) against the real API test server: list then watch,
relist at once on 410 Gone, resume from a bookmark without listing, back off on API errors."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

from plumbing.backoff import Backoff
from plumbing.kube import KubeClient
from plumbing.kube.informer import Change, Informer, Origin
from plumbing.kube.resources import CONFIGMAPS, NAMESPACES
from tests.support.apiserver import ApiServerProcess, apiserver, kube, shared_apiserver, start_apiserver

__all__ = ["apiserver", "kube", "shared_apiserver"]

NS = "default"


class Recorder:
    """Every batch an informer delivered, in order."""

    def __init__(self) -> None:
        self.batches: list[tuple[Origin, list[tuple[str, str]]]] = []
        self.changed = asyncio.Event()

    def __call__(self, changes: Sequence[Change], origin: Origin) -> None:
        self.batches.append((origin, [(c.type, c.object["metadata"]["name"]) for c in changes]))
        self.changed.set()

    def origins(self) -> list[Origin]:
        return [origin for origin, _ in self.batches]

    async def wait_for(self, what: str, done: Callable[[], bool], within: float = 10.0) -> None:
        deadline = time.monotonic() + within
        while not done():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}; saw {self.batches}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)


def cm(name: str, ns: str = NS, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"v": "1"}}


def lists(server: ApiServerProcess) -> int:
    return int(server.hooks.requests()["requests"].get("configmaps", {}).get("list", 0))


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[Informer]:
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 10)
        yield informer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_lists_then_watches_and_reports_each_change_with_its_old_state(
    shared_apiserver: ApiServerProcess,
) -> None:
    async with shared_apiserver.client() as kube:
        ns = f"informer-{secrets.token_hex(4)}"  # the shared server: a namespace of our own
        await kube.create(NAMESPACES, {"metadata": {"name": ns}})
        await _lists_then_watches(kube, ns)


async def _lists_then_watches(kube: KubeClient, ns: str) -> None:
    await kube.create(CONFIGMAPS, cm("before", ns=ns))
    seen = Recorder()
    olds: list[str | None] = []

    def record(changes: Sequence[Change], origin: Origin) -> None:
        olds.extend((c.old or {}).get("data", {}).get("v") for c in changes)
        seen(changes, origin)

    async with running(Informer(kube, CONFIGMAPS, namespace=ns, on_changes=record)) as informer:
        assert seen.batches == [("list", [("ADDED", "before")])]
        wake = informer.listen()
        assert wake.is_set()  # a new listener starts awake: the cache is there to read
        wake.clear()
        await kube.create(CONFIGMAPS, cm("after", ns=ns))
        await asyncio.wait_for(wake.wait(), 10)
        await kube.patch(CONFIGMAPS, "before", {"data": {"v": "2"}}, ns)
        await kube.delete(CONFIGMAPS, "after", ns)
        await seen.wait_for("three watch events", lambda: len(seen.batches) == 4)
        assert seen.batches[1:] == [
            ("watch", [("ADDED", "after")]),
            ("watch", [("MODIFIED", "before")]),
            ("watch", [("DELETED", "after")]),
        ]
        assert olds == [None, None, "1", "1"]  # the patch's old state is the listed object
        assert set(informer.items) == {f"{ns}/before"}
        assert (informer.get(ns, "before") or {})["data"] == {"v": "2"}


async def test_gone_relists_at_once_and_reports_what_the_gap_hid(
    apiserver: ApiServerProcess, kube: KubeClient
) -> None:
    for name in ("kept", "edited", "removed", "recreated"):
        await kube.create(CONFIGMAPS, cm(name))
    seen = Recorder()
    # A backoff far longer than the test: only the Gone path (no pause) can relist in time.
    slow = Backoff(initial=60.0, maximum=60.0, jitter=0)
    async with running(Informer(kube, CONFIGMAPS, namespace=NS, on_changes=seen, backoff=slow)) as informer:
        # The next watch is answered 410 after a second; meanwhile the objects change unseen.
        apiserver.hooks.fail("configmaps", verbs=["watch"], code=410, reason="Expired", delay_seconds=1.0)
        assert apiserver.hooks.close_watches() >= 1
        await kube.patch(CONFIGMAPS, "edited", {"data": {"v": "2"}}, NS)
        await kube.delete(CONFIGMAPS, "removed", NS)
        await kube.delete(CONFIGMAPS, "recreated", NS)
        recreated = await kube.create(CONFIGMAPS, cm("recreated"))
        await kube.create(CONFIGMAPS, cm("added"))
        await seen.wait_for("the relist", lambda: "relist" in seen.origins())
        origin, changes = seen.batches[-1]
        assert origin == "relist"
        assert sorted(changes) == [
            ("ADDED", "added"),
            ("ADDED", "recreated"),  # a new UID under the old name: deleted, then added
            ("DELETED", "recreated"),
            ("DELETED", "removed"),
            ("MODIFIED", "edited"),
            ("MODIFIED", "kept"),  # a list reports everything it holds, as client-go's Replace
        ]
        assert (informer.get(NS, "recreated") or {})["metadata"]["uid"] == recreated["metadata"]["uid"]
        assert lists(apiserver) == 2
        # And it watches again from the new list.
        await kube.create(CONFIGMAPS, cm("later"))
        await seen.wait_for("a watch event after the relist", lambda: seen.batches[-1][0] == "watch")
        assert seen.batches[-1] == ("watch", [("ADDED", "later")])


async def test_a_compacted_resource_version_relists(apiserver: ApiServerProcess, kube: KubeClient) -> None:
    seen = Recorder()
    selected = Informer(kube, CONFIGMAPS, namespace=NS, label_selector="pool=a", on_changes=seen)
    async with running(selected):
        # Changes the selector hides move the server's resourceVersion past the informer's;
        # compaction then makes the informer's version too old to resume from.
        await kube.create(CONFIGMAPS, cm("other", pool="b"))
        apiserver.hooks.compact()
        apiserver.hooks.close_watches()
        await seen.wait_for("the relist", lambda: seen.origins() == ["list", "relist"])
        assert lists(apiserver) == 2
        await kube.create(CONFIGMAPS, cm("mine", pool="a"))
        await seen.wait_for("mine", lambda: seen.batches[-1] == ("watch", [("ADDED", "mine")]))


async def test_a_watch_resumes_from_a_bookmark_without_listing(tmp_path: Path) -> None:
    with start_apiserver(tmp_path / "api", extra_args=["--bookmark-interval", "0.2"]) as server:
        async with server.client() as client:
            seen = Recorder()
            selected = Informer(client, CONFIGMAPS, namespace=NS, label_selector="pool=a", on_changes=seen)
            async with running(selected) as informer:
                hidden = await client.create(CONFIGMAPS, cm("other", pool="b"))
                hidden_rv = int(hidden["metadata"]["resourceVersion"])
                deadline = time.monotonic() + 10
                while int(informer.resource_version or 0) < hidden_rv:
                    assert time.monotonic() < deadline, "no bookmark carried the informer forward"
                    await asyncio.sleep(0.05)
                # History up to the bookmark is gone: only a watch resumed from it can go on.
                server.hooks.compact()
                server.hooks.close_watches()
                await client.create(CONFIGMAPS, cm("mine", pool="a"))
                await seen.wait_for("mine", lambda: len(seen.batches) == 2)
                assert seen.batches == [("list", []), ("watch", [("ADDED", "mine")])]
                assert lists(server) == 1


async def test_api_errors_back_off_then_recover(apiserver: ApiServerProcess, kube: KubeClient) -> None:
    await kube.create(CONFIGMAPS, cm("first"))
    apiserver.hooks.fail("configmaps", verbs=["list"], code=500, count=3)
    seen = Recorder()
    backoff = Backoff(initial=0.2, maximum=1.0, jitter=0)
    started = time.monotonic()
    async with running(Informer(kube, CONFIGMAPS, namespace=NS, on_changes=seen, backoff=backoff)):
        assert time.monotonic() - started >= 0.2 + 0.4 + 0.8  # three failed lists, growing pauses
        assert lists(apiserver) == 4
        assert seen.batches == [("list", [("ADDED", "first")])]
        assert backoff.peek() == 0.2  # a good list resets it

        # A failing watch: pause, then list again (the changes meanwhile come with that list).
        apiserver.hooks.fail("configmaps", verbs=["watch"], code=503, count=2)
        apiserver.hooks.close_watches()
        await kube.create(CONFIGMAPS, cm("second"))
        await seen.wait_for("the relists", lambda: seen.origins().count("relist") == 2)
        assert ("ADDED", "second") in seen.batches[1][1]
        assert lists(apiserver) == 6
        await kube.create(CONFIGMAPS, cm("third"))
        await seen.wait_for("watching again", lambda: seen.batches[-1] == ("watch", [("ADDED", "third")]))
