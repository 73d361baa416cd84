"""Watch over real HTTP: resume from a resourceVersion, 410 Gone, selector transitions,
bookmarks, initial events, versions, and streams closed by the server."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from plumbing.kube import Gone, KubeClient, WatchEvent
from plumbing.kube.resources import CONFIGMAPS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.unit.kube_standin.objects import ARTICLE_TEMPLATE_V1BETA1, resource_claim


async def collect(stream: Any, count: int, within: float = 10.0) -> list[WatchEvent]:
    events: list[WatchEvent] = []

    async def take() -> None:
        async for event in stream:
            events.append(event)
            if len(events) >= count:
                return

    await asyncio.wait_for(take(), within)
    return events


def cm(name: str, ns: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"v": "1"}}


async def test_resume_from_a_resource_version_sees_each_later_change_once(mkube: KubeClient, ns: str) -> None:
    first = await mkube.create(CONFIGMAPS, cm("a", ns))
    resume_at = first["metadata"]["resourceVersion"]
    second = await mkube.create(CONFIGMAPS, cm("b", ns))
    patched = await mkube.patch(CONFIGMAPS, "a", {"data": {"v": "2"}}, ns)
    deleted = await mkube.delete(CONFIGMAPS, "b", ns)
    events = await collect(mkube.watch(CONFIGMAPS, ns, resource_version=resume_at, timeout_seconds=5), 3)
    seen = [(e.type, e.object["metadata"]["name"], e.object["metadata"]["resourceVersion"]) for e in events]
    assert seen == [
        ("ADDED", "b", second["metadata"]["resourceVersion"]),
        ("MODIFIED", "a", patched["metadata"]["resourceVersion"]),
        ("DELETED", "b", deleted["metadata"]["resourceVersion"]),
    ]
    assert all(e.object["kind"] == "ConfigMap" and e.object["apiVersion"] == "v1" for e in events)


async def test_live_changes_arrive_and_rv_0_starts_with_the_current_state(mkube: KubeClient, ns: str) -> None:
    await mkube.create(CONFIGMAPS, cm("existing", ns))
    stream = mkube.watch(CONFIGMAPS, ns, resource_version="0", timeout_seconds=5)

    async def later() -> None:
        await asyncio.sleep(0.2)
        await mkube.create(CONFIGMAPS, cm("new", ns))

    writer = asyncio.create_task(later())
    events = await collect(stream, 2)
    await writer
    assert [(e.type, e.object["metadata"]["name"]) for e in events] == [
        ("ADDED", "existing"),
        ("ADDED", "new"),
    ]


async def test_a_compacted_resource_version_is_gone(apiserver: ApiServerProcess, kube: KubeClient) -> None:
    created = await kube.create(CONFIGMAPS, cm("x", "default"))
    await kube.patch(CONFIGMAPS, "x", {"data": {"v": "2"}}, "default")
    apiserver.hooks.compact()
    with pytest.raises(Gone, match="too old resource version"):
        await collect(
            kube.watch(CONFIGMAPS, "default", resource_version=created["metadata"]["resourceVersion"]), 1
        )
    await kube.create(CONFIGMAPS, cm("x2", "default"))
    page = await kube.list(CONFIGMAPS, "default", limit=1)
    assert page["metadata"]["continue"]
    # The next page of a list whose snapshot is compacted away is gone too.
    await kube.create(CONFIGMAPS, cm("y", "default"))
    apiserver.hooks.compact()
    with pytest.raises(Gone, match="continue parameter is too old"):
        await kube.list(CONFIGMAPS, "default", limit=1, continue_token=page["metadata"]["continue"])


async def test_label_selected_watch_sees_objects_enter_and_leave(mkube: KubeClient, ns: str) -> None:
    start = (await mkube.list(CONFIGMAPS, ns))["metadata"]["resourceVersion"]
    await mkube.create(CONFIGMAPS, cm("w", ns, pool="a"))
    await mkube.patch(CONFIGMAPS, "w", {"metadata": {"labels": {"pool": "b"}}}, ns)
    await mkube.patch(CONFIGMAPS, "w", {"metadata": {"labels": {"pool": "a"}}}, ns)
    await mkube.patch(CONFIGMAPS, "w", {"data": {"v": "9"}}, ns)
    await mkube.delete(CONFIGMAPS, "w", ns)
    stream = mkube.watch(CONFIGMAPS, ns, resource_version=start, label_selector="pool=a", timeout_seconds=5)
    events = await collect(stream, 5)
    assert [e.type for e in events] == ["ADDED", "DELETED", "ADDED", "MODIFIED", "DELETED"]
    assert events[1].object["metadata"]["labels"] == {"pool": "b"}  # left the selection


async def test_a_v1beta1_watch_gets_v1beta1_objects(bkube: KubeClient, bns: str) -> None:
    start = (await bkube.list(RESOURCE_CLAIM_TEMPLATES, bns))["metadata"]["resourceVersion"]
    template = json.loads(json.dumps(ARTICLE_TEMPLATE_V1BETA1))
    template["metadata"]["namespace"] = bns
    await bkube.create(RESOURCE_CLAIM_TEMPLATES.with_version("v1beta1"), template)
    beta = await collect(
        bkube.watch(
            RESOURCE_CLAIM_TEMPLATES.with_version("v1beta1"), bns, resource_version=start, timeout_seconds=5
        ),
        1,
    )
    assert beta[0].object["apiVersion"] == "resource.k8s.io/v1beta1"
    assert beta[0].object["spec"]["spec"]["devices"]["requests"][0]["deviceClassName"] == "cohdi-pcie-device"
    v1 = await collect(
        bkube.watch(RESOURCE_CLAIM_TEMPLATES, bns, resource_version=start, timeout_seconds=5), 1
    )
    assert (
        v1[0].object["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        == "cohdi-pcie-device"
    )


@pytest.fixture(scope="module")
def bookmarking_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    with start_apiserver(
        tmp_path_factory.mktemp("bookmarks"), extra_args=["--bookmark-interval", "0.2"]
    ) as server:
        yield server


async def test_bookmarks_carry_the_current_resource_version(bookmarking_server: ApiServerProcess) -> None:
    async with bookmarking_server.client() as kube:
        start = (await kube.list(CONFIGMAPS, "default"))["metadata"]["resourceVersion"]
        await kube.create(CONFIGMAPS, cm("elsewhere", "kube-system"))  # a change this watch does not see
        events = await collect(
            kube.watch(CONFIGMAPS, "default", resource_version=start, timeout_seconds=5), 1
        )
        assert events[0].type == "BOOKMARK"
        assert int(events[0].object["metadata"]["resourceVersion"]) > int(start)
        assert events[0].object["kind"] == "ConfigMap"


async def test_send_initial_events_ends_with_a_marked_bookmark(bookmarking_server: ApiServerProcess) -> None:
    auth = {"Authorization": f"Bearer {bookmarking_server.admin_token}"}
    async with bookmarking_server.client() as kube:
        await kube.create(RESOURCE_CLAIMS, resource_claim("initial", "default"))
    params = {
        "watch": "true",
        "sendInitialEvents": "true",
        "resourceVersionMatch": "NotOlderThan",
        "allowWatchBookmarks": "true",
        "timeoutSeconds": "2",
    }
    lines: list[dict[str, Any]] = []
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    async with (
        httpx.AsyncClient(base_url=bookmarking_server.url, headers=auth, timeout=10) as http,
        http.stream("GET", path, params=params) as response,
    ):
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.strip():
                lines.append(json.loads(line))
            if len(lines) == 2:
                break
    assert lines[0]["type"] == "ADDED" and lines[0]["object"]["metadata"]["name"] == "initial"
    assert lines[1]["type"] == "BOOKMARK"
    assert lines[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


async def test_the_server_can_end_every_watch(
    shared_apiserver: ApiServerProcess, mkube: KubeClient, ns: str
) -> None:
    stream = mkube.watch(CONFIGMAPS, ns, timeout_seconds=30)

    async def drain() -> int:
        count = 0
        async for _ in stream:
            count += 1
        return count

    task = asyncio.create_task(drain())
    await asyncio.sleep(0.3)
    assert shared_apiserver.hooks.close_watches() >= 1
    assert await asyncio.wait_for(task, 5) == 0  # ended cleanly, as a dropped connection would


async def test_a_watch_keeps_delivering_while_writes_meet_its_bookmark_ticks(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """A bookmark tick that finds a change just queued must not stop the stream: a real API server
    keeps delivering. (The stream used to wait for its queue with a zero timeout from then on,
    which cancelled each read before it ran: the watch went silent until its timeout.)"""
    with start_apiserver(
        tmp_path_factory.mktemp("busy-bookmarks"), extra_args=["--bookmark-interval", "0.02"]
    ) as server:
        async with server.client() as kube:
            for i in range(4):
                await kube.create(CONFIGMAPS, cm(f"busy-{i}", "default"))
            start = (await kube.list(CONFIGMAPS, "default"))["metadata"]["resourceVersion"]
            seen: list[int] = []

            async def watch() -> None:
                async for event in kube.watch(
                    CONFIGMAPS, "default", resource_version=start, timeout_seconds=60
                ):
                    if event.type != "BOOKMARK":
                        seen.append(int(event.object["metadata"]["resourceVersion"]))

            async def write(i: int, until: float) -> int:
                last = 0
                while asyncio.get_running_loop().time() < until:
                    done = await kube.patch(CONFIGMAPS, f"busy-{i}", {"data": {"v": str(last)}}, "default")
                    last = int(done["metadata"]["resourceVersion"])
                return last

            watching = asyncio.create_task(watch())
            try:
                until = asyncio.get_running_loop().time() + 4.0
                lasts = await asyncio.gather(*(write(i, until) for i in range(4)))
                latest = max(lasts)
                for _ in range(60):  # 3 s for the last change to arrive
                    if seen and seen[-1] >= latest:
                        break
                    await asyncio.sleep(0.05)
                assert seen and seen[-1] >= latest, (
                    f"the watch stopped at resourceVersion {seen[-1] if seen else start}, "
                    f"the writes reached {latest}"
                )
            finally:
                watching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watching
