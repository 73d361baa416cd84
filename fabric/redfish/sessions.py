"""Authentication to a Redfish service: a session on first use, a new one after a 401, Basic as fallback.

DSP0266 "Authentication": a client creates a session with ``POST`` to the service's Sessions
collection (``Links.Sessions`` of the service root) and sends the ``X-Auth-Token`` it gets back;
a 401 means the session expired and the service did not act on the request, so one new login and
one resend are safe. A service without a session service (404/405/501 on the login) gets HTTP
Basic authentication instead. Credentials never appear in a log line or an error.

:class:`Sessions` is the :class:`fabric.redfish.transport.Authentication` of a
:class:`~fabric.redfish.transport.Transport`: one login at a time, the requests that need it wait.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from fabric.redfish.error_mapping import error_for_response
from fabric.redfish.links import same_service
from fabric.redfish.settings import RedfishSettings
from fabric.redfish.transport import SERVICE_ROOT, RedfishResponse, Transport, TransportError
from manager_api.errors import FabricError, FabricUnavailable
from plumbing.logs import get_logger

__all__ = ["Sessions"]

log = get_logger(__name__)

T = TypeVar("T")

#: (connect, read) seconds for a session's DELETE: a logout must not hold a shutdown
_LOGOUT_TIMEOUT = (2.0, 2.0)
#: sessions whose DELETE failed, kept to be deleted again; more than this many undeletable
#: sessions means the service refuses DELETEs, and the oldest is left to its timeout
_UNDELETED_MAX = 8


async def _unabandoned(work: Coroutine[Any, Any, T]) -> T:
    """``work`` (a login) in a task of its own: a request that stops waiting for it (its deadline
    passed, it was cancelled) leaves it to finish. Cut off, a login whose POST reached the service
    leaves a session nobody knows the token of, holding one of a BMC's few slots until it times
    out."""
    task = asyncio.ensure_future(work)
    # a failure nobody waits for any more is not "never retrieved": the next request logs in again
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
    return await asyncio.shield(task)


class Sessions:
    """The credentials a :class:`Transport` sends, and the login that gets them."""

    def __init__(self, settings: RedfishSettings, transport: Transport) -> None:
        self.settings = settings
        self.transport = transport
        #: the event loop :attr:`_lock` belongs to (a client may serve one loop after another)
        self._lock_loop: asyncio.AbstractEventLoop | None = None
        self._login_lock = asyncio.Lock()
        #: how many logins have happened; a request that got 401 names the one it used
        self._generation = 0
        self._mode = settings.auth if settings.username else "none"
        self._session_uri: str | None = None
        self._session_token: str | None = None
        #: logged out for good: a request still in flight must not open a new session
        self._closed = False
        #: sessions of ours whose DELETE got no answer or a transient error: a BMC that answered
        #: slowly may not have acted, and each such session holds one of its few slots until
        #: it times out, so the DELETE is sent again after the next login and at logout
        self._undeleted: list[str] = []

    @property
    def base_url(self) -> str:
        return self.settings.base_url

    @property
    def _lock(self) -> asyncio.Lock:
        """One login at a time; a lock of an event loop that has ended is of no use in the next."""
        loop = asyncio.get_running_loop()
        if self._lock_loop is not loop:
            self._lock_loop, self._login_lock = loop, asyncio.Lock()
        return self._login_lock

    # -- Authentication --------------------------------------------------------------------------

    async def ensure(self) -> int:
        if self._generation and not self._closed:  # logged in: no lock on every request's path
            return self._generation
        return await _unabandoned(self._ensure())

    async def _ensure(self) -> int:
        async with self._lock:
            if self._closed:
                raise FabricUnavailable("the Redfish client is closed")
            if self._generation == 0:
                await self._login_locked()
            return self._generation

    async def rejected(self, generation: int) -> bool:
        if self._mode == "none":
            return False
        await self._relogin(generation)
        return True

    async def _relogin(self, failed_generation: int) -> None:
        await _unabandoned(self._relogin_now(failed_generation))

    async def _relogin_now(self, failed_generation: int) -> None:
        async with self._lock:
            if self._closed:
                raise FabricUnavailable("the Redfish client is closed")
            if failed_generation == self._generation:  # nobody logged in again meanwhile
                log.info("Redfish session rejected, logging in again", url=self.base_url)
                await self._login_locked()

    async def _login_locked(self) -> None:
        if self._mode == "none":
            self._generation += 1
            return
        password = self.settings.password.get_secret_value() if self.settings.password else ""
        if self._mode == "session":
            self.transport.use_credentials()
            try:
                sessions_uri = await self._sessions_uri()
                answer = await self._send(
                    "POST", sessions_uri, body={"UserName": self.settings.username, "Password": password}
                )
            except BaseException:
                # The session in use may be alive still (only refused once): keep its token, or
                # neither a resend nor the logout could delete it.
                self.transport.use_credentials(session_key=self._session_token)
                raise
            token = answer.headers.get("x-auth-token")
            if token and not (token.isprintable() and token.isascii() and len(token) <= 4096):
                # sent back on every request, it must be a field value; nor is it ever logged
                raise FabricUnavailable(
                    f"Redfish login at {self.base_url} answered an X-Auth-Token that is no header value"
                )
            if 200 <= answer.status < 300 and token:  # any 2xx, as DMTF's library (some answer 204)
                replaced = self._session_uri
                location = answer.location or answer.body.get("@odata.id")
                session_uri = same_service(self.base_url, location, link="Location of the new session")
                self.transport.use_credentials(session_key=token)
                self._session_uri, self._session_token = session_uri, token
                self._generation += 1
                log.info("Redfish session created", url=self.base_url)
                if replaced and replaced != self._session_uri:
                    # A BMC has few session slots: the one this login replaces must not wait for
                    # its timeout (it may be alive still, only refused once).
                    self._undeleted.insert(0, replaced)
                await self._delete_undeleted()
                return
            if answer.status in (404, 405, 501):
                log.warning(
                    "Redfish service has no session service, using HTTP Basic authentication",
                    url=self.base_url,
                    status=answer.status,
                )
                self._mode = "basic"
            elif answer.status in (401, 403):
                raise FabricUnavailable(
                    f"Redfish login at {self.base_url} was refused (HTTP {answer.status}): "
                    "check the credentials file given with --redfish-credentials-file"
                )
            else:
                error = error_for_response(answer.status, answer.body, method="POST", uri=sessions_uri)
                raise FabricUnavailable(f"Redfish login at {self.base_url} failed: {error.message}")
        token = base64.b64encode(f"{self.settings.username}:{password}".encode()).decode()
        self.transport.use_credentials(authorization=f"Basic {token}")
        self._generation += 1

    async def _send(
        self, method: str, uri: str, *, body: dict[str, str | None] | None = None
    ) -> RedfishResponse:
        """A request of the login itself: unauthenticated, never resent."""
        try:
            return await self.transport.send(method, uri, body=body)
        except TransportError as err:
            raise FabricUnavailable(f"Redfish service at {self.base_url} unreachable: {err}") from None

    async def _sessions_uri(self) -> str:
        answer = await self._send("GET", SERVICE_ROOT)
        root = answer.body if answer.status == 200 else {}
        links = root.get("Links") if isinstance(root.get("Links"), dict) else {}
        sessions = (links or {}).get("Sessions")
        if isinstance(sessions, dict):
            # The credentials go there: a link to another origin fails the login (ForeignLink).
            uri = same_service(self.base_url, sessions.get("@odata.id"), link="Links.Sessions")
            if uri is not None:
                return uri
        return "/redfish/v1/SessionService/Sessions"  # fixed by DSP0266 1.6 when Links is missing

    async def _delete_undeleted(self) -> None:
        """Send the DELETE of every remembered session, newest first, until one fails again (a
        service that is slow now would make each of the rest wait its full timeout too)."""
        while self._undeleted:
            if not await self._delete(self._undeleted[0]):
                del self._undeleted[_UNDELETED_MAX:]
                return
            self._undeleted.pop(0)

    async def _delete(self, session_uri: str) -> bool:
        """Delete a session of ours with the credentials in use; bounded, never a new login (a 401
        here must not open yet another session). False: try again later — no answer, or an
        answer that says the service may act if asked again (DSP0266 "Retry-After": 503, and
        429/408/5xx in general); a 4xx other than those is final (404: already gone)."""
        try:
            answer = await self.transport.send("DELETE", session_uri, http_timeout=_LOGOUT_TIMEOUT)
        except (TransportError, FabricError) as err:
            log.info("could not delete a Redfish session, will try again", error=str(err)[:200])
            return False
        if answer.status in (408, 429) or answer.status >= 500:
            log.info("Redfish session not deleted, will try again", status=answer.status)
            return False
        if answer.status >= 300 and answer.status != 404:
            log.info("Redfish session not deleted", status=answer.status)
        return True

    # -- for requests that are no single exchange (the event stream) ----------------------------

    async def reauthenticate(self) -> None:
        """Log in again (e.g. after the event stream got 401)."""
        await self._relogin(self._generation)

    async def settle(self, within: float) -> None:
        """Let a login in flight finish, for at most ``within`` seconds, and allow no new one: run
        before shutdown cuts the connections, because a login whose answer is cut leaves a session
        on the service that nobody knows the token of (it holds a slot until it times out)."""
        self._closed = True
        # asyncio.timeout, not wait_for: Python 3.11's wait_for may take the lock and still time
        # out (python/cpython#86296), which would leave it held for ever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within), self._lock:
                pass

    async def logout(self) -> None:
        """Delete our session on the service, for good (requests still in flight get no new
        one); best effort, bounded."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._logout(), 5.0)

    async def _logout(self) -> None:
        async with self._lock:  # after a login in progress, before any other
            self._closed = True
            session_uri, self._session_uri = self._session_uri, None
            if session_uri and self._mode == "session":
                # the others first: deleting our own session ends the credentials they need
                await self._delete_undeleted()
                await self._delete(session_uri)
