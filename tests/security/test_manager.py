"""Hostile clients against the real fabric manager on loopback (issue 14, items 2, 6, 7, 9, 11).

One stack for the module (API test server, emulator with authentication, the manager with TokenReview
and static tokens: ``tests/integration/reliability/stack.py``). Each attack comes from a loopback
address of its own, so the per-client limits of one do not touch another. Every attack is bounded:
a few connections, at most a few hundred MiB offered, each test well under a minute.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fabric.api.request_guard import MAX_REQUEST_BODY, largest_claim_report
from manager_api.client import ManagerClient
from manager_api.errors import PermissionDenied
from manager_api.models import DeviceType
from plumbing.httpserve import ConnectionLimits
from tests.integration.reliability.stack import (
    CONTROLLER_TOKEN,
    NAMESPACE,
    NODE,
    PLUGIN_TOKEN,
    Stack,
    running_stack,
)
from tests.security.raw import MiB, connect, head, read_answer, send_body, vm_hwm_mib, wait_closed

pytestmark = pytest.mark.timeout(240)

LIMITS = ConnectionLimits()
#: the manager's Deployment has a 512Mi limit; the issue's bound leaves headroom under it
RSS_LIMIT_MIB = 400


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack() as running:
        yield running


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}", "content-type": "application/json"}


# -- item 2: bodies and heads ---------------------------------------------------------------------


def test_body_floods_are_refused_before_the_body_is_read(stack: Stack) -> None:
    url, claims = stack.manager_url, f"/api/v1/nodes/{NODE}/claims"

    # Three unauthenticated 100 MB bodies at once: each refused from the head (401), long before
    # its body is sent; the peak RSS stays far under the Deployment's limit.
    def unauthenticated(n: int) -> tuple[int | None, int]:
        answer, sent = send_body(
            url, "PUT", claims, {"content-type": "application/json"}, 100 * MiB, source=f"127.0.2.{n}"
        )
        return answer.status, sent

    with ThreadPoolExecutor(3) as pool:
        floods = list(pool.map(unauthenticated, (1, 2, 3)))
    for status, sent in floods:
        assert status == 401, floods
        assert sent < 50 * MiB, f"the manager read {sent} bytes of an unauthenticated body"

    # Authenticated, a body larger than the cap: 413 from its Content-Length, nothing read...
    answer, sent = send_body(url, "PUT", claims, _bearer(PLUGIN_TOKEN), 1024 * MiB, source="127.0.2.4")
    assert answer.status == 413, answer
    assert answer.json()["code"] == "PayloadTooLarge"
    assert sent < 50 * MiB
    # ... and a chunked one as soon as it passes the cap.
    answer, sent = send_body(
        url, "PUT", claims, _bearer(PLUGIN_TOKEN), 64 * MiB, chunked=True, source="127.0.2.5"
    )
    assert answer.status == 413, answer
    assert sent < 32 * MiB

    # The largest legitimate request, a claim report of a node full of devices, still passes.
    report = largest_claim_report()
    assert len(report) <= MAX_REQUEST_BODY < 512 * 1024  # a few hundred KiB at most
    put = httpx.put(url + claims, content=report, headers=_bearer(PLUGIN_TOKEN), timeout=30)
    assert put.status_code == 204, put.text

    # A head that never ends (one 1 MiB header): 431, the connection closed.
    sock = connect(url, "127.0.2.6")
    try:
        sock.sendall(head("GET", "/api/v1/devices", {"x-pad": "a" * MiB}))
        assert read_answer(sock).status == 431
    finally:
        sock.close()

    peak = vm_hwm_mib(stack.manager.pid)
    assert peak < RSS_LIMIT_MIB, f"the manager's peak RSS reached {peak:.0f} MiB"


# -- item 7: slow and idle clients, too many connections -------------------------------------------


def _trickle(sock_bytes: bytes, sock: object, stop: threading.Event) -> None:
    import socket as _socket

    assert isinstance(sock, _socket.socket)
    for byte in sock_bytes:
        if stop.wait(1.0):
            return
        try:
            sock.send(bytes([byte]))
        except OSError:
            return


def test_slow_and_idle_connections_are_closed(stack: Stack) -> None:
    url = stack.manager_url
    within = LIMITS.header_timeout + 5.0
    silent = connect(url, "127.0.3.1")
    trickling_head = connect(url, "127.0.3.2")
    trickling_body = connect(url, "127.0.3.3")
    keep_alive = connect(url, "127.0.3.4")
    stop = threading.Event()
    try:
        # A byte every second of a head that would take a minute.
        head_bytes = b"GET /healthz HTTP/1.1\r\nhost: x\r\n" + b"x-slow: " + b"a" * 60
        threading.Thread(target=_trickle, args=(head_bytes, trickling_head, stop), daemon=True).start()
        # A complete head, then a byte of the body every second.
        trickling_body.sendall(
            head("PUT", f"/api/v1/nodes/{NODE}/claims", {**_bearer(PLUGIN_TOKEN), "content-length": "100"})
        )
        threading.Thread(target=_trickle, args=(b"{" * 100, trickling_body, stop), daemon=True).start()
        # One request answered, then nothing: the keep-alive timeout ends it.
        keep_alive.sendall(head("GET", "/healthz"))
        assert read_answer(keep_alive).status == 200

        with ThreadPoolExecutor(4) as pool:
            silent_end, head_end, body_end, idle_end = pool.map(
                lambda s: wait_closed(s, within), (silent, trickling_head, trickling_body, keep_alive)
            )
    finally:
        stop.set()
        for sock in (silent, trickling_head, trickling_body, keep_alive):
            sock.close()
    assert silent_end[1] < within, "a silent connection stayed open"
    assert silent_end[0].status in (408, None)
    assert head_end[1] < within, "a connection trickling its head stayed open"
    assert head_end[0].status in (408, None)
    assert body_end[1] < LIMITS.body_timeout + 5.0, "a connection trickling its body stayed open"
    assert idle_end[1] < LIMITS.keep_alive_timeout + 3.0, "an idle keep-alive connection stayed open"


def test_connections_beyond_the_limit_get_a_clear_503(stack: Stack, tmp_path: Path) -> None:
    limited = stack.builder.manager(
        stack.emulator_url,
        name="manager-limited",
        state_dir=tmp_path / "limited",
        static_tokens={PLUGIN_TOKEN: ("plugin", NODE)},
        redfish_args=["--redfish-credentials-file", str(stack.emu_state / "credentials.json")],
        args=["--max-connections", "4"],
    )
    url = limited.url
    try:
        version = httpx.get(f"{url}/api/v1/inventory", headers=_bearer(PLUGIN_TOKEN), timeout=10).json()[
            "version"
        ]
        # Four long polls hold the four connections the manager allows.
        polls = [connect(url, f"127.0.4.{n}") for n in range(1, 5)]
        for sock in polls:
            sock.sendall(
                head("GET", f"/api/v1/inventory?after={version}&timeoutSeconds=30", _bearer(PLUGIN_TOKEN))
            )
        time.sleep(0.5)
        refused = httpx.get(f"{url}/api/v1/devices", headers=_bearer(PLUGIN_TOKEN), timeout=10)
        assert refused.status_code == 503, refused.text
        assert refused.json()["code"] == "FabricUnavailable"
        assert "connections open" in refused.json()["message"]
        assert int(refused.headers["retry-after"]) >= 1
        for sock in polls:
            sock.close()
        time.sleep(0.5)
        served = httpx.get(f"{url}/api/v1/devices", headers=_bearer(PLUGIN_TOKEN), timeout=10)
        assert served.status_code == 200, served.text
    finally:
        limited.stop()


# -- item 6: attach only what a claim allocates ----------------------------------------------------


def test_an_attach_needs_a_claim_allocating_the_device_on_the_node(stack: Stack) -> None:
    device, other = stack.free_devices(DeviceType.GPU)[:2]
    on_another_node = stack.create_claim(device, node="kind-worker2")
    for_another_device = stack.create_claim(other)

    async def refused(client: ManagerClient, claim_uid: str) -> str:
        with pytest.raises(PermissionDenied) as err:
            await client.attach(device.name, NODE, claim_uid, wait_seconds=5)
        return err.value.message

    async def scenario() -> None:
        async with ManagerClient(stack.manager_url, token=PLUGIN_TOKEN) as plugin:
            made_up, elsewhere, wrong_device = await asyncio.gather(
                refused(plugin, str(uuid.uuid4())),
                refused(plugin, on_another_node["metadata"]["uid"]),
                refused(plugin, for_another_device["metadata"]["uid"]),
            )
            assert "does not exist" in made_up
            assert "allocated on node kind-worker2" in elsewhere
            assert f"does not allocate device {device.name}" in wrong_device
            assert stack.bound_hosts() == {}  # nothing was bound for any of them
            real = stack.create_claim(device)["metadata"]["uid"]
            assert (await plugin.attach(device.name, NODE, real, wait_seconds=30)).state.value == "attached"
            await plugin.detach(device.name, NODE, real, wait_seconds=30)

    asyncio.run(scenario())
    assert stack.bound_hosts() == {}


# -- item 9: TokenReviews --------------------------------------------------------------------------


def test_token_reviews_are_rate_limited_per_client_and_refusals_cached(stack: Stack) -> None:
    assert stack.apiserver is not None
    url = f"{stack.manager_url}/api/v1/devices"

    async def storm(source: str, tokens: list[str]) -> tuple[list[httpx.Response], float]:
        transport = httpx.AsyncHTTPTransport(local_address=source)
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            start = time.monotonic()
            answers = await asyncio.gather(
                *(client.get(url, headers={"authorization": f"Bearer {t}"}) for t in tokens)
            )
            return list(answers), time.monotonic() - start

    # 100 different made-up tokens from one address: beyond its burst of reviews, 429 + Retry-After.
    answers, elapsed = asyncio.run(
        storm("127.0.5.1", [f"made-up-token-{n:04d}-{uuid.uuid4()}" for n in range(100)])
    )
    statuses = [a.status_code for a in answers]
    assert set(statuses) <= {401, 429}, statuses
    reviewed = statuses.count(401)
    assert reviewed <= 20 + 5 * elapsed + 1, f"{reviewed} TokenReviews in {elapsed:.1f}s"
    limited = next(a for a in answers if a.status_code == 429)
    assert limited.json()["code"] == "TooManyRequests"
    assert int(limited.headers["retry-after"]) >= 1

    # One bad token asked 100 times from another address: one review, the refusal cached (no 429).
    answers, _ = asyncio.run(storm("127.0.5.2", ["the-same-made-up-token-0000"] * 100))
    assert {a.status_code for a in answers} == {401}

    # A third client is not held up by the first: its valid service-account token works.
    token = stack.apiserver.service_account_token(NAMESPACE, "fabric-dra-controller")
    answers, _ = asyncio.run(storm("127.0.5.3", [token]))
    assert answers[0].status_code == 200, answers[0].text


# -- item 11: control characters in logs -----------------------------------------------------------


def test_control_characters_from_a_client_never_reach_the_log_raw(stack: Stack) -> None:
    """A claim UID carrying CR/LF, escapes, NUL, C1 and a bidi override is refused as no Kubernetes
    UID (422, one line) and nothing of it is written raw to the manager's log. How logfmt escapes
    such characters wherever a value does reach a line: tests/unit/plumbing/test_logs.py."""
    device = stack.free_devices(DeviceType.GPU)[0]
    hostile = "c1\r\nts=2026 level=error msg=forged\x1b[2J\x00\x9b\u202e"
    answer = httpx.post(
        f"{stack.manager_url}/api/v1/attachments",
        json={"device": device.name, "node": NODE, "claimUid": hostile},
        headers=_bearer(CONTROLLER_TOKEN),
        timeout=30,
    )
    assert answer.status_code == 422, answer.text
    assert "body.claimUid" in answer.json()["message"] and "\n" not in answer.json()["message"]
    log = stack.manager.log_file.read_bytes().decode("utf-8")
    assert not any(line.startswith("ts=2026 level=error msg=forged") for line in log.splitlines()), log
    for raw in ("\r", "\x1b", "\x00", "\x9b", "\u202e"):
        assert raw not in log, f"{raw!r} written raw to the manager's log"
    assert stack.bound_hosts() == {}
