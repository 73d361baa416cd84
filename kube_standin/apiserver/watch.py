"""Watch streams: what a client sees after ``?watch=true``, as the API server's watch cache
delivers it.

The state read (initial objects or the history since a resourceVersion) and the subscription
to new changes happen in one synchronous step, so a stream neither misses nor repeats a
change. Selectors see the old and the new object: an object entering the selection is an
ADDED event, one leaving it a DELETED. Bookmarks carry the server's current resourceVersion,
sent only when the stream has delivered every change up to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.responses import json_line
from kube_standin.apiserver.status import StatusError, bad_request
from kube_standin.apiserver.store import Change, Store, Watcher

__all__ = ["WatchOptions", "open_watch", "translate"]

Obj = dict[str, Any]


@dataclass(frozen=True)
class WatchOptions:
    resource_version: str  # "" or "0": start with the current state; N: changes after N
    send_initial: bool  # synthetic ADDED events for the current state first
    mark_initial_end: bool  # end those with a BOOKMARK annotated k8s.io/initial-events-end
    bookmarks: bool  # allowWatchBookmarks
    duration: float  # timeoutSeconds
    bookmark_interval: float


def translate(change: Change, match: Callable[[Obj], bool]) -> str | None:
    """The event a filtered watch sees for ``change`` (None: nothing)."""
    now = match(change.obj)
    if change.type == "ADDED":
        return "ADDED" if now else None
    before = change.prev is not None and match(change.prev)
    if change.type == "DELETED":
        return "DELETED" if before else None
    if before and now:
        return "MODIFIED"
    if now:
        return "ADDED"
    if before:
        return "DELETED"
    return None


def open_watch(
    store: Store,
    res: ResourceType,
    namespace: str | None,
    *,
    api_version: str,
    present: Callable[[Obj], Obj],
    match: Callable[[Obj], bool],
    options: WatchOptions,
) -> AsyncIterator[bytes]:
    """Subscribe now and return the stream of JSON lines (``present`` shapes each object)."""
    initial: list[Obj] = []
    backlog: list[Change] = []
    error: StatusError | None = None
    if options.send_initial:
        initial = sorted(
            store.objects(res, namespace),
            key=lambda o: ((o["metadata"].get("namespace") or ""), o["metadata"]["name"]),
        )
    elif options.resource_version not in ("", "0"):
        try:
            since = int(options.resource_version)
        except ValueError as err:
            raise bad_request(f"resourceVersion {options.resource_version!r} is not valid") from err
        try:
            backlog = store.changes_since(res.storage_key, since)
        except StatusError as err:
            error = err  # a too-old resourceVersion is an ERROR event in a 200 stream
        if namespace is not None:
            backlog = [c for c in backlog if c.key[0] == namespace]
    watcher = store.subscribe(res, namespace) if error is None else None
    return _stream(store, res, api_version, present, match, options, watcher, initial, backlog, error)


def _event(present: Callable[[Obj], Obj], event_type: str, obj: Obj) -> bytes:
    return json_line({"type": event_type, "object": present(obj)})


def _bookmark(store: Store, res: ResourceType, api_version: str, *, initial_end: bool = False) -> bytes:
    meta: Obj = {"resourceVersion": str(store.rv), "creationTimestamp": None}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return json_line(
        {"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": api_version, "metadata": meta}}
    )


async def _stream(
    store: Store,
    res: ResourceType,
    api_version: str,
    present: Callable[[Obj], Obj],
    match: Callable[[Obj], bool],
    options: WatchOptions,
    watcher: Watcher | None,
    initial: list[Obj],
    backlog: list[Change],
    error: StatusError | None,
) -> AsyncIterator[bytes]:
    try:
        if watcher is None:
            yield json_line(
                {"type": "ERROR", "object": (error or StatusError(500, "InternalError", "")).to_status()}
            )
            return
        mark_initial_end = options.mark_initial_end
        chunk = b"".join(_event(present, "ADDED", obj) for obj in initial if match(obj))
        for change in backlog:
            kind = translate(change, match)
            if kind:
                chunk += _event(present, kind, change.obj)
        if mark_initial_end and options.bookmarks and watcher.queue.empty():
            chunk += _bookmark(store, res, api_version, initial_end=True)
            mark_initial_end = False
        if chunk:
            yield chunk
        deadline = time.monotonic() + options.duration
        next_bookmark = time.monotonic() + options.bookmark_interval
        while True:
            now = time.monotonic()
            if now >= deadline:
                if options.bookmarks and watcher.queue.empty():
                    yield _bookmark(store, res, api_version)
                return
            wait = min(deadline, next_bookmark if options.bookmarks else deadline) - now
            try:
                item = await asyncio.wait_for(watcher.queue.get(), timeout=max(wait, 0.0))
            except TimeoutError:
                # An empty queue means every change up to store.rv has been delivered.
                if options.bookmarks and watcher.queue.empty() and time.monotonic() >= next_bookmark:
                    yield _bookmark(store, res, api_version)
                    next_bookmark = time.monotonic() + options.bookmark_interval
                continue
            items = [item]
            while not watcher.queue.empty():
                items.append(watcher.queue.get_nowait())
            out = b""
            closed = False
            for queued in items:
                if queued is None:  # the store dropped this watch (closed, or too far behind)
                    closed = True
                    break
                kind = translate(queued, match)
                if kind:
                    out += _event(present, kind, queued.obj)
            if mark_initial_end and options.bookmarks and watcher.queue.empty() and not closed:
                out += _bookmark(store, res, api_version, initial_end=True)
                mark_initial_end = False
            if out:
                yield out
            if closed:
                return
    finally:
        if watcher is not None:
            store.unsubscribe(watcher)
