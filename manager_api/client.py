"""An asyncio client for the fabric manager's REST API, used by the plugin, the controller and
``fabric-dra status``. Errors come back as the :mod:`manager_api.errors` classes the manager raised.

It speaks HTTP/1.1 over asyncio streams (:mod:`plumbing.http1`, the Redfish transport's wire), not
httpx: a kubelet plugin's CPU per claim was half httpx (2 to 3 ms a request on a loaded machine,
the same exchange over asyncio streams about 0.2 ms; docs/performance.md, issue 37)."""

from __future__ import annotations

import http
import json
import socket
import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

from pydantic import TypeAdapter, ValidationError

from manager_api.errors import AuthError, FabricError, FabricUnavailable, error_class
from manager_api.models import (
    API_PREFIX,
    Attachment,
    AttachRequest,
    BudgetList,
    Device,
    DrainAnswer,
    DrainList,
    DrainRequest,
    DrainTarget,
    ErrorBody,
    FabricNode,
    Inventory,
    InventoryChanges,
    NodeClaims,
    Operation,
    OrphanedTreeClaims,
    PreparedClaim,
    ResetOutcome,
    ResetReport,
    UsageGrouping,
    UsageReport,
)
from plumbing.http1 import TransportError, Wire, proxy_for
from plumbing.httplimits import CLIENT_KEEPALIVE_EXPIRY
from plumbing.tokens import TokenError, bearer_token, read_token_file

__all__ = ["BadToken", "ManagerClient", "ManagerUnreachable"]

#: Seconds an idle connection is kept for reuse (through a slow network, a QEMU guest's user
#: networking, the race it avoids is met in practice): :data:`plumbing.httplimits.CLIENT_KEEPALIVE_EXPIRY`.
KEEPALIVE_EXPIRY = CLIENT_KEEPALIVE_EXPIRY

#: Most bytes of one answer. The largest the manager sends is the inventory: a device is at most
#: ~3.7 KB of JSON with its names at the manager's caps (docs/manager.md: 18 devices, 65,742
#: bytes), so 10,000 devices are under 40 MB; 256 MiB leaves six times that (and room for a usage
#: report over many months) while a stranger at the manager's URL cannot make the plugin hold more.
MAX_ANSWER_BYTES = 256 << 20
#: Connecting (TCP and the TLS handshake), as httpx's connect timeout was.
CONNECT_TIMEOUT = 5.0
#: Requests in flight at once on one client (httpx's default pool); more wait for a free one.
MAX_CONNECTIONS = 100

_DEVICES = TypeAdapter(list[Device])
_NODES = TypeAdapter(list[FabricNode])
_OPERATIONS = TypeAdapter(list[Operation])


class ManagerUnreachable(FabricUnavailable):
    """The fabric manager itself did not answer (down, unreachable, or its TLS certificate was
    refused) — as opposed to a manager that answered that the fabric is unavailable."""

    def __init__(self, message: str, *, certificate_refused: bool = False) -> None:
        super().__init__(message)
        #: the TLS handshake failed: the manager's certificate, not its availability, is the problem
        self.certificate_refused = certificate_refused


class BadToken(AuthError):
    """The token this client was given, or its token file, holds no bearer token (or cannot be
    read): nothing was sent. The message names the file and what is wrong, never its content."""

    code = "BadToken"


@dataclass(frozen=True, slots=True)
class _Reply:
    """One answer of the manager, read whole."""

    method: str
    target: str
    status: int
    #: field names in lower case
    headers: dict[str, str]
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def _causes(err: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = err
    for _ in range(8):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _transport_reason(err: BaseException) -> str:
    """Why a request got no answer, in words: a refused TLS certificate says so and why."""
    for seen in _causes(err):
        if isinstance(seen, ssl.SSLCertVerificationError):
            return f"its TLS certificate was not accepted ({seen.verify_message or seen.reason})"
        if isinstance(seen, ssl.SSLError):
            return f"TLS failed ({seen.reason or seen})"
        if isinstance(seen, ConnectionRefusedError):
            return "nothing listens there (connection refused)"
        if isinstance(seen, socket.gaierror):
            return f"the host name does not resolve ({seen.strerror or seen})"
    text = str(err).strip() or "no answer"
    if isinstance(err, TransportError):
        return text  # the wire's own words: "connection timed out", "connection lost before an answer"
    return f"{type(err).__name__}: {text}"


class ManagerClient:
    """Talks to one fabric manager URL. The bearer token is a string or a file re-read every minute
    (projected service-account tokens rotate); either must hold one RFC 6750 bearer token
    (:mod:`plumbing.tokens`), else a request raises :class:`BadToken` and sends nothing."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        token_file: str | Path | None = None,
        given_as: str = "the bearer token given",
        ca_file: str | None = None,
        insecure: bool = False,
        timeout: float = 10.0,
    ) -> None:
        """``given_as`` names where ``token`` came from (an environment variable) in errors."""
        self._token = token
        self._token_file = Path(token_file) if token_file else None
        self._token_read_at = 0.0
        #: why the token given as a string is none: raised at the first request, as a file's would be
        self._token_problem: str | None = None
        if token and self._token_file is None:
            try:
                self._token = bearer_token(token, given_as)
            except TokenError as err:
                self._token, self._token_problem = None, str(err)
        tls: ssl.SSLContext | None = None
        if base_url.startswith("https"):
            tls = ssl.create_default_context(cafile=ca_file)
            if insecure:
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
        self._timeout = timeout
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        #: the path the manager is served under (none, or a proxy's prefix), before each request's
        self._prefix = parts.path.rstrip("/")
        self._origin = f"{parts.scheme}://{parts.netloc}"
        # One read may take the request timeout (plus a long poll's wait), as httpx's read timeout
        # did; the whole answer gets four times that (the Redfish transport's default deadline), so
        # a large inventory on a slow link still arrives while a trickling one is cut.
        self._wire = Wire(
            self.base_url,
            tls=tls,
            proxy=proxy_for(self.base_url),
            connect_timeout=CONNECT_TIMEOUT,
            read_timeout=timeout,
            deadline=4 * timeout,
            max_connections=MAX_CONNECTIONS,
            keepalive_expiry=KEEPALIVE_EXPIRY,
        )

    async def aclose(self) -> None:
        self._wire.abort()

    async def __aenter__(self) -> ManagerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _auth(self) -> dict[str, str]:
        try:
            if self._token_file and time.monotonic() - self._token_read_at > 60.0:
                self._token = read_token_file(self._token_file)
                self._token_read_at = time.monotonic()
        except TokenError as err:
            raise BadToken(str(err)) from None
        if self._token_problem is not None:
            raise BadToken(self._token_problem)
        return {"Authorization": f"Bearer {self._token}"} if self._token else {}

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        wait_seconds: float = 0.0,
    ) -> _Reply:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        target = f"{self._prefix}{API_PREFIX}{path}" + (f"?{urlencode(clean)}" if clean else "")
        fields = {"Accept": "application/json", **self._auth()}
        body = None
        if json_body is not None:
            fields["Content-Type"] = "application/json"
            body = json.dumps(json_body, separators=(",", ":")).encode()
        read = self._timeout + wait_seconds
        try:
            reply = await self._exchange(method, target, fields, body, read)
        except TransportError as err:
            raise ManagerUnreachable(
                f"fabric manager unreachable at {self.base_url}: {_transport_reason(err)}",
                certificate_refused=err.tls or any(isinstance(e, ssl.SSLError) for e in _causes(err)),
            ) from err
        if reply.status >= 400:
            raise self._error(reply)
        return reply

    async def _exchange(
        self, method: str, target: str, fields: dict[str, str], body: bytes | None, read: float
    ) -> _Reply:
        answer = await self._wire.open(
            method, target, fields, body, http_timeout=(CONNECT_TIMEOUT, read), deadline=4 * read
        )
        try:
            # None was asked for (no Accept-Encoding): a body in another coding is no answer.
            content = await answer.whole(MAX_ANSWER_BYTES)
        finally:
            answer.close()
        return _Reply(method, target, answer.status, answer.headers, content)

    def _error(self, response: _Reply) -> FabricError:
        try:
            body = ErrorBody.model_validate(json.loads(response.content))
        except (ValueError, ValidationError):
            # Not one of the manager's answers: say what the URL points at instead of quoting a
            # stranger's body (a Redfish 404, a proxy's HTML page).
            head = response.text[:2000]
            redfish = (
                "odata-version" in response.headers
                or "@Message.ExtendedInfo" in head
                or "redfish" in head.lower()
            )
            what = "a Redfish service: the fabric itself, not its manager" if redfish else "something else"
            try:
                phrase = http.HTTPStatus(response.status).phrase
            except ValueError:
                phrase = ""
            return FabricError(
                f"{self._origin} is not a fabric-dra manager: it answered {response.method} "
                f"{response.target.partition('?')[0]} with HTTP {response.status} {phrase} and no "
                f"fabric-dra error body (it looks like {what})"
            )
        retry_after = body.retry_after_seconds
        if retry_after is None and response.headers.get("retry-after", "").isdigit():
            retry_after = float(response.headers["retry-after"])
        return error_class(body.code)(
            body.message,
            device=body.device,
            node=body.node,
            held_by=body.held_by,
            retry_after=retry_after,
            message_id=body.message_id,
        )

    async def inventory(self, *, after: int | None = None, timeout_seconds: float = 30.0) -> Inventory:
        """The whole inventory; with ``after``, waits until its version is newer (long poll)."""
        params = {"after": after, "timeoutSeconds": timeout_seconds if after is not None else None}
        wait = timeout_seconds if after is not None else 0.0
        response = await self._request("GET", "/inventory", params=params, wait_seconds=wait)
        return Inventory.model_validate_json(response.content)

    async def inventory_changes(
        self, *, epoch: int, since: int, timeout_seconds: float = 30.0, node: str | None = None
    ) -> InventoryChanges:
        """The devices changed, added and removed after version ``since`` of ``epoch`` (from an
        :class:`Inventory` or an earlier answer), waiting up to ``timeout_seconds`` for some (with
        ``node``: only those concerning that node; the answer's ``node`` says whether the manager
        filtered); raises :class:`~manager_api.errors.ResyncRequired` when the manager no longer
        knows them."""
        params = {"epoch": epoch, "since": since, "timeoutSeconds": timeout_seconds, "node": node}
        response = await self._request(
            "GET", "/inventory/changes", params=params, wait_seconds=timeout_seconds
        )
        return InventoryChanges.model_validate_json(response.content)

    async def devices(self) -> list[Device]:
        return _DEVICES.validate_json((await self._request("GET", "/devices")).content)

    async def device(self, name: str) -> Device:
        return Device.model_validate_json((await self._request("GET", f"/devices/{name}")).content)

    async def nodes(self) -> list[FabricNode]:
        return _NODES.validate_json((await self._request("GET", "/nodes")).content)

    async def attach(
        self,
        device: str,
        node: str,
        claim_uid: str,
        *,
        wait_seconds: float = 0.0,
        pool: str | None = None,
        namespace: str | None = None,
        share_id: str | None = None,
        memory_bytes: int | None = None,
    ) -> Attachment:
        """Bind ``device`` to ``node`` for ``claim_uid``; idempotent. State ``attaching`` means: ask again.
        With ``pool``, a device that is not in that pool is refused (404) rather than bound. A share
        of a memory pool names the allocation's ``share_id`` and its ``memory_bytes``."""
        body = AttachRequest(
            device=device,
            node=node,
            claim_uid=claim_uid,
            pool=pool,
            namespace=namespace,
            share_id=share_id,
            memory_bytes=memory_bytes,
        ).model_dump(by_alias=True, exclude_none=True)
        response = await self._request(
            "POST",
            "/attachments",
            params={"waitSeconds": wait_seconds},
            json_body=body,
            wait_seconds=wait_seconds,
        )
        return Attachment.model_validate_json(response.content)

    async def report_reset(
        self,
        device: str,
        node: str,
        claim_uid: str,
        *,
        ok: bool,
        message: str = "",
        wait_seconds: float = 0.0,
    ) -> Attachment:
        """Tell the manager whether ``node`` reset ``device`` (answered ``resetRequired``) for
        ``claim_uid``. After a failed one the manager power-cycles the device for the claim: state
        ``attaching`` means ask again with :meth:`attach`."""
        body = ResetReport(
            node=node,
            claim_uid=claim_uid,
            outcome=ResetOutcome.OK if ok else ResetOutcome.FAILED,
            message=message[:1024],
        ).model_dump(mode="json", by_alias=True)
        response = await self._request(
            "POST",
            f"/devices/{device}/reset",
            params={"waitSeconds": wait_seconds},
            json_body=body,
            wait_seconds=wait_seconds,
        )
        return Attachment.model_validate_json(response.content)

    async def detach(
        self,
        device: str,
        node: str,
        claim_uid: str,
        *,
        wait_seconds: float = 0.0,
        share_id: str | None = None,
    ) -> Attachment:
        """Unbind ``device`` if ``claim_uid`` holds it on ``node``; a no-op success otherwise. A
        share of a memory pool is named by its ``share_id`` (a claim may hold several of one pool)."""
        response = await self._request(
            "DELETE",
            f"/attachments/{device}",
            params={"claimUid": claim_uid, "node": node, "waitSeconds": wait_seconds, "shareId": share_id},
            wait_seconds=wait_seconds,
        )
        return Attachment.model_validate_json(response.content)

    async def report_claims(self, node: str, claims: dict[str, list[str]]) -> None:
        """Tell the manager which claims (UID → devices) ``node`` has prepared; the orphan
        reconciler never detaches what a plugin reports."""
        body = NodeClaims(
            claims=[PreparedClaim(claim_uid=uid, devices=devices) for uid, devices in sorted(claims.items())]
        )
        await self._request("PUT", f"/nodes/{node}/claims", json_body=body.model_dump(by_alias=True))

    async def operation(self, operation_id: str) -> Operation:
        return Operation.model_validate_json(
            (await self._request("GET", f"/operations/{operation_id}")).content
        )

    async def operations(self) -> list[Operation]:
        return _OPERATIONS.validate_json((await self._request("GET", "/operations")).content)

    async def usage(self, since: datetime, by: UsageGrouping, label: str | None = None) -> UsageReport:
        """Device-seconds since ``since`` (from the start of its hour), grouped ``by`` (the values of
        the attribution label key ``label`` when ``by`` is label)."""
        params = {"since": since.isoformat(), "by": str(by), "label": label}
        response = await self._request("GET", "/usage", params=params)
        return UsageReport.model_validate_json(response.content)

    async def usage_focus(self, since: datetime, until: datetime | None = None) -> str:
        """The usage from ``since`` (to ``until``) as a FOCUS CSV document."""
        params = {"since": since.isoformat(), "until": until.isoformat() if until else None}
        return (await self._request("GET", "/usage/focus", params=params)).text

    async def orphaned_trees(self) -> OrphanedTreeClaims:
        """Claims holding devices whose agent tree's root is gone and that no pod uses."""
        return OrphanedTreeClaims.model_validate_json((await self._request("GET", "/trees/orphaned")).content)

    async def budgets(self, namespace: str | None = None) -> BudgetList:
        """Every DeviceBudget (of ``namespace``) with each tree's use against each limit."""
        response = await self._request("GET", "/budgets", params={"namespace": namespace})
        return BudgetList.model_validate_json(response.content)

    async def drains(self) -> DrainList:
        """Every drain, with the devices each covers now."""
        return DrainList.model_validate_json((await self._request("GET", "/drains")).content)

    async def drain(self, request: DrainRequest) -> DrainAnswer:
        """Drain a device, a switch or a node's devices (operators only); idempotent."""
        body = request.model_dump(mode="json", by_alias=True)
        return DrainAnswer.model_validate_json(
            (await self._request("POST", "/drains", json_body=body)).content
        )

    async def undrain(self, target: DrainTarget, name: str) -> DrainAnswer:
        """End the drain of ``target`` ``name``; ``changed`` is false when there was none."""
        params = {"target": str(target), "name": name}
        return DrainAnswer.model_validate_json(
            (await self._request("DELETE", "/drains", params=params)).content
        )
