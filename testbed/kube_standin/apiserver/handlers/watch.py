"""Watch: what a client sees after ``?watch=true`` (or under the legacy ``/watch/`` prefix),
as the API server's watch cache delivers it.

As ``k8s.io/apiserver/pkg/endpoints/handlers``: ``ListResource`` in get.go turns a list with
``watch=true`` into a watch ending after ``timeoutSeconds`` (or a random 1-2x
``--min-request-timeout``), and ``serveWatch``/``WatchServer`` in watch.go stream one JSON
event per line; the events themselves are what ``k8s.io/apiserver/pkg/storage/cacher``
delivers (initial events, bookmarks, resuming from a resourceVersion).

The state read (initial objects or the history since a resourceVersion) and the subscription
to new changes happen in one synchronous step, so a stream neither misses nor repeats a
change. Selectors see the old and the new object: an object entering the selection is an
ADDED event, one leaving it a DELETED. Bookmarks carry the server's current resourceVersion,
sent only when the stream has delivered every change up to it.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kube_standin.apiserver.convert import from_storage
from kube_standin.apiserver.handlers.scope import RequestScope
from kube_standin.apiserver.jsonobj import Obj
from kube_standin.apiserver.negotiation import table_include
from kube_standin.apiserver.registry import ResourceType
from kube_standin.apiserver.requestinfo import RequestInfo
from kube_standin.apiserver.responses import json_line
from kube_standin.apiserver.selectors import selection
from kube_standin.apiserver.status import Cause, StatusError, bad_request, invalid
from kube_standin.apiserver.storage import Change, Storage, Watcher
from kube_standin.apiserver.tables import table

__all__ = ["WatchOptions", "open_watch", "translate", "watch_resource"]


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
    store: Storage,
    info: RequestInfo,
    *,
    present: Callable[[Obj], Obj],
    match: Callable[[Obj], bool],
    options: WatchOptions,
) -> AsyncIterator[bytes]:
    """Subscribe now and return the stream of JSON lines (``present`` shapes each object)."""
    res, namespace = info.res, info.namespace
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
    return _stream(store, res, info.api_version, present, match, options, watcher, initial, backlog, error)


def _event(present: Callable[[Obj], Obj], event_type: str, obj: Obj) -> bytes:
    return json_line({"type": event_type, "object": present(obj)})


def _bookmark(store: Storage, res: ResourceType, api_version: str, *, initial_end: bool = False) -> bytes:
    meta: Obj = {"resourceVersion": str(store.rv), "creationTimestamp": None}
    if initial_end:
        meta["annotations"] = {"k8s.io/initial-events-end": "true"}
    return json_line(
        {"type": "BOOKMARK", "object": {"kind": res.kind, "apiVersion": api_version, "metadata": meta}}
    )


async def _stream(
    store: Storage,
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
            items: list[Change | None] = []
            if watcher.queue.empty():
                wait = min(deadline, next_bookmark if options.bookmarks else deadline) - now
                try:
                    items.append(await asyncio.wait_for(watcher.queue.get(), timeout=max(wait, 0.0)))
                except TimeoutError:
                    # An empty queue means every change up to store.rv has been delivered. A change
                    # queued while the timed-out read was being cancelled stays in the queue: the
                    # next turn takes it without waiting. (Waiting for it instead, with the bookmark
                    # overdue, meant a zero timeout that cancels every read before it runs: the
                    # stream went silent until its deadline.)
                    if options.bookmarks and watcher.queue.empty() and time.monotonic() >= next_bookmark:
                        yield _bookmark(store, res, api_version)
                        next_bookmark = time.monotonic() + options.bookmark_interval
                    continue
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


def _watch_options(scope: RequestScope, request: Request, info: RequestInfo) -> WatchOptions:
    params = request.query_params
    bookmarks = params.get("allowWatchBookmarks") in ("true", "1")
    send_initial_text = params.get("sendInitialEvents")
    rv_text = params.get("resourceVersion") or ""
    timeout_text = params.get("timeoutSeconds")
    try:
        if timeout_text:
            timeout = float(timeout_text)
        else:
            timeout = scope.min_request_timeout * (1 + random.random())  # noqa: S311 - not a secret
    except ValueError as err:
        raise bad_request(f"timeoutSeconds {timeout_text!r} is not a number") from err
    if send_initial_text is not None:
        send_initial = send_initial_text in ("true", "1")
        if send_initial and params.get("resourceVersionMatch") != "NotOlderThan":
            raise invalid(
                info.res,
                "",
                [
                    Cause(
                        "resourceVersionMatch",
                        "FieldValueForbidden",
                        "Forbidden: sendInitialEvents requires resourceVersionMatch=NotOlderThan",
                    )
                ],
            )
    else:
        send_initial = rv_text in ("", "0")
    return WatchOptions(
        resource_version=rv_text,
        send_initial=send_initial,
        mark_initial_end=send_initial and send_initial_text is not None,
        bookmarks=bookmarks,
        duration=timeout,
        bookmark_interval=scope.bookmark_interval,
    )


async def watch_resource(scope: RequestScope, request: Request, info: RequestInfo) -> Response:
    match = selection(request.query_params, info.res)
    options = _watch_options(scope, request, info)
    include = table_include(request)

    def shown(obj: Obj) -> Obj:
        presented = from_storage(info.res, info.version, obj)
        if include is None:
            return presented
        rv = str(obj["metadata"].get("resourceVersion", ""))
        return table(info.res, [presented], resource_version=rv, include=include)

    stream = open_watch(scope.store, info, present=shown, match=match, options=options)
    return StreamingResponse(stream, media_type="application/json")
