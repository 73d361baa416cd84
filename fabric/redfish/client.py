"""The Redfish client of the fabric manager: one object over the transport, sessions and task monitors.

Built like sushy's ``connector`` / ``auth`` / ``taskmonitor``, each job in its module:

* :mod:`fabric.redfish.transport` — HTTP on the event loop (:mod:`plumbing.http1`): verified
  TLS, timeouts, bounded answers, GETs retried with backoff, mutations sent exactly once
  (:class:`OutcomeUnknown` when the answer is lost), ``If-Match``, no redirects, errors mapped by
  :mod:`fabric.redfish.error_mapping`. Every request leaves through :meth:`Transport.send` (the
  event stream through :meth:`Transport.stream`).
* :mod:`fabric.redfish.sessions` — login on first use, a new login and one resend after a 401,
  HTTP Basic when the service has no session service.
* :mod:`fabric.redfish.tasks` — 202 responses followed through their task monitor, woken by the
  service's task events.

:class:`RedfishClient` only puts them together; it is safe to share between any number of tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fabric.redfish.error_mapping import OutcomeUnknown
from fabric.redfish.sessions import Sessions
from fabric.redfish.settings import RedfishSettings
from fabric.redfish.tasks import TaskMonitor, TaskWatch
from fabric.redfish.transport import (
    SERVICE_ROOT,
    RedfishResponse,
    RequestObserver,
    Transport,
    resource_kind,
)
from plumbing.http1 import Answer

__all__ = [
    "SERVICE_ROOT",
    "OutcomeUnknown",
    "RedfishClient",
    "RedfishResponse",
    "RedfishSettings",
    "RequestObserver",
    "resource_kind",
]

#: how long shutdown lets a login in flight finish before it cuts the connections (a login's
#: answer cut off leaves a session on the service that nobody can delete)
_LOGIN_SETTLE_SECONDS = 2.0


class RedfishClient:
    """Shared by every task of the manager. See the module docstring for what it guarantees."""

    def __init__(self, settings: RedfishSettings, *, observer: RequestObserver | None = None) -> None:
        self.settings = settings
        self.transport = Transport(settings, observer=observer)
        self.sessions = Sessions(settings, self.transport)
        self.transport.auth = self.sessions
        #: task followers wait here; the event stream wakes them (see :attr:`follow`)
        self.tasks = TaskWatch()
        self.monitor = TaskMonitor(self.transport, self.tasks)
        #: one request; GETs are retried, mutations are not; raises on HTTP ≥ 300
        #: (:meth:`Transport.request`)
        self.request = self.transport.request
        #: wait for the operation behind a 202 to end (:meth:`TaskMonitor.follow`)
        self.follow = self.monitor.follow

    @property
    def base_url(self) -> str:
        return self.settings.base_url

    # -- requests --------------------------------------------------------------------------------

    async def get(self, uri: str, *, if_none_match: str | None = None) -> RedfishResponse:
        """The resource at ``uri``; with ``if_none_match`` (its ETag as last read) a 304 answer
        without a body when it has not changed since (:meth:`Transport.request`)."""
        return await self.request("GET", uri, if_none_match=if_none_match)

    async def get_json(self, uri: str) -> dict[str, Any]:
        return (await self.request("GET", uri)).body

    async def post(self, uri: str, body: Mapping[str, Any]) -> RedfishResponse:
        return await self.request("POST", uri, body=body)

    async def patch(self, uri: str, body: Mapping[str, Any], *, etag: str | None) -> RedfishResponse:
        return await self.request("PATCH", uri, body=body, etag=etag)

    async def delete(self, uri: str, *, etag: str | None = None) -> RedfishResponse:
        return await self.request("DELETE", uri, etag=etag)

    # -- tasks recorded before (fabric.redfish.tasks) -------------------------------------------

    async def task_running(self, monitor: str) -> bool:
        """Whether the task behind ``monitor`` still runs; False once it ended or is gone."""
        return await self.monitor.running(monitor)

    async def cancel_task(self, monitor: str) -> None:
        """Ask the service to stop a task; best effort."""
        await self.monitor.cancel(monitor)

    # -- the event stream (fabric.redfish.events) ------------------------------------------------

    async def stream(self, uri: str, headers: Mapping[str, str]) -> Answer:
        """Open the event stream at ``uri`` with the session (logging in first if need be); the
        caller reads it raw and closes it (:meth:`Transport.stream`)."""
        await self.sessions.ensure()
        return await self.transport.stream(uri, headers)

    async def reauthenticate(self) -> None:
        """Log in again (the event stream got 401)."""
        await self.sessions.reauthenticate()

    # -- lifecycle -------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Let a login in flight finish (bounded), cut the reads still in flight, delete our
        session on the service and close every connection. Bounded (a few seconds) whatever the
        service does: it runs on SIGTERM."""
        if self.transport.closed:
            return
        await self.sessions.settle(_LOGIN_SETTLE_SECONDS)
        self.transport.abort()
        await self.sessions.logout()
        self.transport.close()
