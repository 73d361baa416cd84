"""Hostile clients against the real Redfish emulator on loopback (issue 14, item 12).

DSP0266 §13.3 "Authentication": every resource but ``/redfish``, the service root, ``$metadata``,
the OData service document and the login POST needs authentication, so a client without credentials
gets 401 whether or not the resource exists (a 404 would map the service for it). Repeated wrong
credentials are slowed down per client address (the AccountService's lockout properties are the
model), without locking out the administrator who logs in from elsewhere.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from fabric_dra_testbed.stack import Emulator
from tests.support.emulator import run_emulator

pytestmark = pytest.mark.timeout(120)

SESSIONS = "/redfish/v1/SessionService/Sessions"


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    with run_emulator(tmp_path_factory.mktemp("emulator-auth")) as running:
        yield running


def test_everything_that_needs_authentication_answers_401_found_or_not(emulator: Emulator) -> None:
    creds = emulator.auth
    with httpx.Client(base_url=emulator.url, timeout=10, verify=emulator.verify) as client:
        for method, path in (
            ("GET", "/redfish/v1/Systems"),  # exists
            ("GET", "/redfish/v1/NoSuchCollection"),
            ("GET", "/redfish/v1/Fabrics/NoSuchFabric/Zones/z1"),
            ("PATCH", "/redfish/v1/NoSuchThing"),
            ("DELETE", f"{SESSIONS}/no-such-session"),
            ("POST", "/redfish/v1/Fabrics/NoSuchFabric/Actions/Fabric.Nothing"),
            ("GET", "/redfish/v1/Oem/NoSuch"),
            ("POST", "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0/MemoryChunks"),
            ("DELETE", "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0/MemoryChunks/1"),
        ):
            answer = client.request(method, path, json={} if method in ("PATCH", "POST") else None)
            assert answer.status_code == 401, (method, path, answer.status_code)
            assert "NoValidSession" in answer.text
            assert answer.headers["www-authenticate"].startswith("Basic")
        # With credentials a missing resource is a 404; what is open stays open.
        assert client.get("/redfish/v1/NoSuchCollection", auth=creds).status_code == 404
        for path in (
            "/redfish",
            "/redfish/v1/",
            "/redfish/v1/$metadata",
            "/redfish/v1/odata",
            "/redfish/v1/Schemas/FabricDRA_v1.xml",
        ):
            assert client.get(path).status_code == 200, path


def test_repeated_login_failures_are_slowed_down(emulator: Emulator) -> None:
    url = emulator.url
    username, password = emulator.username, emulator.password

    async def attempts(
        source: str, logins: list[tuple[str, str]], *, basic: bool = False
    ) -> tuple[list[int], float]:
        transport = httpx.AsyncHTTPTransport(local_address=source, verify=emulator.verify)
        async with httpx.AsyncClient(base_url=url, transport=transport, timeout=60) as client:
            start = time.monotonic()
            if basic:
                calls = [client.get("/redfish/v1/Systems", auth=login) for login in logins]
            else:
                calls = [client.post(SESSIONS, json={"UserName": u, "Password": p}) for u, p in logins]
            answers = await asyncio.gather(*calls)
            return [a.status_code for a in answers], time.monotonic() - start

    # Eight wrong passwords at once from one address: three free, then 0.25 s, 0.5 s, 1 s, 2 s, 4 s.
    statuses, elapsed = asyncio.run(attempts("127.0.6.1", [(username, f"guess-{n}") for n in range(8)]))
    assert statuses == [401] * 8
    assert elapsed >= 5.0, f"8 wrong passwords answered in {elapsed:.2f}s"
    # Wrong HTTP Basic credentials count the same.
    statuses, elapsed = asyncio.run(
        attempts("127.0.6.2", [(username, f"guess-{n}") for n in range(6)], basic=True)
    )
    assert statuses == [401] * 6
    assert elapsed >= 1.5, f"6 wrong Basic logins answered in {elapsed:.2f}s"
    # The administrator at another address is not held up.
    statuses, elapsed = asyncio.run(attempts("127.0.6.3", [(username, password)]))
    assert statuses == [201]
    assert elapsed < 2.0


def test_hostile_chunk_requests_are_refused_in_one_line_and_carve_nothing(emulator: Emulator) -> None:
    """Bodies no parser should choke on: a number of 5,000 digits, arrays nested 100,000 deep,
    sizes of every wrong sign and type. Each is a 400 naming the problem; the pool stays whole."""
    chunks = "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0/MemoryChunks"
    with httpx.Client(
        base_url=emulator.url, timeout=30, verify=emulator.verify, auth=emulator.auth
    ) as client:
        for raw in (
            b'{"MemoryChunkSizeMiB": 1' + b"0" * 5000 + b"}",
            b'{"MemoryChunkSizeMiB": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        ):
            answer = client.post(chunks, content=raw, headers={"Content-Type": "application/json"})
            assert answer.status_code == 400, answer.text[:300]
            assert answer.json()["error"]["code"] == "Base.1.22.MalformedJSON"
        for size in (0, -1024, 1 << 62, 1.5e3, True, None, "1024", [1024]):
            answer = client.post(chunks, json={"MemoryChunkSizeMiB": size})
            assert answer.status_code == 400, (size, answer.text)
            assert "\n" not in answer.json()["error"]["message"]
        members = client.get(chunks).json()["Members"]
        assert members == []
