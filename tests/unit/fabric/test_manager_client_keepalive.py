"""The manager client and the Kubernetes client let an idle connection go before the server closes it.

A server closes a keep-alive connection after ``ConnectionLimits.keep_alive_timeout`` idle
seconds without telling the client first; a client that still reuses it at that moment sends its
request into a closed socket ("Server disconnected"), and an attach or detach (POST) cannot be
resent blindly. Checked on a real socket: a small HTTP/1.1 server records the connection each
request came on.
"""

from __future__ import annotations

import asyncio

from manager_api.client import KEEPALIVE_EXPIRY, ManagerClient
from plumbing.httpserve import CLIENT_KEEPALIVE_EXPIRY, ConnectionLimits
from plumbing.kube.client import KubeClient, KubeConfig

_BODY = b"[]"  # GET /v1/devices: no devices


async def _serve(peers: list[int]) -> tuple[asyncio.Server, str]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = writer.get_extra_info("peername")[1]
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    break
                peers.append(port)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(_BODY), _BODY)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


async def _two_requests(pause: float) -> list[int]:
    peers: list[int] = []
    server, url = await _serve(peers)
    try:
        async with ManagerClient(url, token="t") as client:
            for _ in range(2):
                assert await client.devices() == []
                await asyncio.sleep(pause)
    finally:
        server.close()
        await server.wait_closed()
    return peers


def test_idle_connections_expire_well_before_the_servers_keep_alive() -> None:
    assert ConnectionLimits().keep_alive_timeout / 2 >= KEEPALIVE_EXPIRY
    peers = asyncio.run(_two_requests(pause=KEEPALIVE_EXPIRY + 0.5))
    assert len(peers) == 2 and peers[0] != peers[1], peers


def test_a_connection_is_still_reused_within_the_expiry() -> None:
    peers = asyncio.run(_two_requests(pause=0.2))
    assert len(peers) == 2 and peers[0] == peers[1], peers


async def _two_kube_requests(pause: float) -> list[int]:
    """The same with the Kubernetes client, whose API test server closes idle connections as the
    manager does (a ledger ConfigMap PUT sent into a closing connection fails with a ReadError)."""
    peers: list[int] = []
    server, url = await _serve(peers)
    try:
        async with KubeClient(KubeConfig(server=url, verify=False)) as client:
            for _ in range(2):
                assert await client.request("GET", "/api/v1/namespaces") == {"items": []}
                await asyncio.sleep(pause)
    finally:
        server.close()
        await server.wait_closed()
    return peers


def test_the_kubernetes_client_lets_idle_connections_go_too() -> None:
    assert ConnectionLimits().keep_alive_timeout / 2 >= CLIENT_KEEPALIVE_EXPIRY
    peers = asyncio.run(_two_kube_requests(pause=CLIENT_KEEPALIVE_EXPIRY + 0.5))
    assert len(peers) == 2 and peers[0] != peers[1], peers
    peers = asyncio.run(_two_kube_requests(pause=0.2))
    assert len(peers) == 2 and peers[0] == peers[1], peers
