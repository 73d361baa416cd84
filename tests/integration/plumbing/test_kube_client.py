"""The Kubernetes client (plumbing.kube.client) on real sockets: against the API test server over
HTTPS as a pod finds it (the service account's CA, token and namespace), and against small raw
servers for what the API test server never does (an answer too large, coded, or stalled).

What it must keep of the httpx client it replaced: the cluster CA checked, the token file re-read
when its period has passed, the error Status bodies mapped to their classes (409, 404, 422), and
timeouts that cut a stalled answer; and what the wire adds: a cap on an answer's size and no
answer in a coding that was not asked for.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from plumbing.kube import (
    AlreadyExists,
    ApiUnavailable,
    Conflict,
    Invalid,
    KubeClient,
    KubeConfig,
    NotFound,
    Unauthorized,
    load_config,
)
from plumbing.kube import client as kube_client
from plumbing.kube.resources import CONFIGMAPS
from tests.support.apiserver import ApiServerProcess, start_apiserver

NS = "default"


@pytest.fixture(scope="module")
def tls_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServerProcess]:
    with start_apiserver(tmp_path_factory.mktemp("tls-apiserver"), tls=True) as server:
        yield server


def _name() -> str:
    return f"cm-{secrets.token_hex(4)}"


def _configmap(name: str, **data: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": NS}, "data": data}


async def test_in_cluster_over_tls_with_the_service_accounts_ca_and_token(
    tls_apiserver: ApiServerProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert tls_apiserver.url.startswith("https://") and tls_apiserver.ca_file is not None
    account = tmp_path / "serviceaccount"
    account.mkdir()
    (account / "ca.crt").write_bytes(tls_apiserver.ca_file.read_bytes())
    (account / "token").write_text(tls_apiserver.admin_token + "\n")
    (account / "namespace").write_text(NS)
    host, _, port = tls_apiserver.url.removeprefix("https://").rpartition(":")
    monkeypatch.setattr(kube_client, "SERVICE_ACCOUNT_DIR", account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    config = load_config()
    assert config.server == tls_apiserver.url and config.namespace == NS
    name = _name()
    async with KubeClient(config) as kube:
        made = await kube.create(CONFIGMAPS, _configmap(name, a="1"), NS)
        assert (await kube.get(CONFIGMAPS, name, NS))["data"] == {"a": "1"}
        patched = await kube.patch(CONFIGMAPS, name, {"data": {"b": "2"}}, NS)
        assert patched["data"] == {"a": "1", "b": "2"}
        assert patched["metadata"]["resourceVersion"] != made["metadata"]["resourceVersion"]
        await kube.delete(CONFIGMAPS, name, NS)
        assert not await kube.delete_ignore_missing(CONFIGMAPS, name, NS)


async def test_a_server_signed_by_another_ca_is_refused(tls_apiserver: ApiServerProcess) -> None:
    # Any other CA: the system's trust store (which never signed the throw-away CA's certificate).
    config = KubeConfig(server=tls_apiserver.url, token=tls_apiserver.admin_token)
    async with KubeClient(config) as kube:
        with pytest.raises(ApiUnavailable, match="TLS handshake with the API server failed"):
            await kube.get(CONFIGMAPS, "anything", NS)


async def test_a_watch_over_tls_delivers_events(tls_apiserver: ApiServerProcess) -> None:
    name = _name()
    async with tls_apiserver.client() as kube:
        listing = await kube.list(CONFIGMAPS, NS)
        stream = kube.watch(CONFIGMAPS, NS, resource_version=listing["metadata"]["resourceVersion"])
        try:
            await kube.create(CONFIGMAPS, _configmap(name), NS)
            async for event in stream:
                if event.type == "ADDED" and event.object["metadata"]["name"] == name:
                    break
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        await kube.delete(CONFIGMAPS, name, NS)


async def test_the_token_file_is_read_again_once_its_period_has_passed(
    tls_apiserver: ApiServerProcess, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("not-a-known-token\n")

    def config(refresh: float) -> KubeConfig:
        return KubeConfig(
            server=tls_apiserver.url,
            ca_file=str(tls_apiserver.ca_file),
            token_file=str(token_file),
            token_refresh_seconds=refresh,
        )

    fresh, cached = config(0), config(3600)
    async with KubeClient(fresh) as rereads, KubeClient(cached) as keeps:
        for kube in (rereads, keeps):
            with pytest.raises(Unauthorized):
                await kube.list(CONFIGMAPS, NS)
        token_file.write_text(tls_apiserver.admin_token + "\n")  # the kubelet rotated it
        assert "items" in await rereads.list(CONFIGMAPS, NS)
        with pytest.raises(Unauthorized):  # within its period the old token is still sent
            await keeps.list(CONFIGMAPS, NS)


async def test_error_statuses_keep_their_classes(tls_apiserver: ApiServerProcess) -> None:
    name = _name()
    async with tls_apiserver.client() as kube:
        made = await kube.create(CONFIGMAPS, _configmap(name), NS)
        with pytest.raises(AlreadyExists) as exists:
            await kube.create(CONFIGMAPS, _configmap(name), NS)
        assert exists.value.status == 409 and exists.value.body.get("kind") == "Status"
        await kube.replace(CONFIGMAPS, {**made, "data": {"x": "1"}})
        with pytest.raises(Conflict) as stale:  # the resourceVersion it was read at has passed
            await kube.replace(CONFIGMAPS, {**made, "data": {"x": "2"}})
        assert stale.value.status == 409 and stale.value.reason == "Conflict"
        with pytest.raises(NotFound) as missing:
            await kube.get(CONFIGMAPS, name + "-gone", NS)
        assert missing.value.status == 404 and missing.value.reason == "NotFound"
        with pytest.raises(Invalid) as invalid:
            await kube.create(CONFIGMAPS, _configmap("Not_A_DNS_Name"), NS)
        assert invalid.value.status == 422 and invalid.value.body.get("details")
        await kube.delete(CONFIGMAPS, name, NS)


async def test_an_answer_larger_than_the_cap_is_refused(tls_apiserver: ApiServerProcess) -> None:
    name = _name()
    async with tls_apiserver.client() as kube:
        await kube.create(CONFIGMAPS, _configmap(name, blob="x" * (200 << 10)), NS)
        config = tls_apiserver.config()
        async with KubeClient(config, max_answer_bytes=64 << 10) as small:
            with pytest.raises(ApiUnavailable, match="larger than 64 KiB"):
                await small.get(CONFIGMAPS, name, NS)
            # The connection it was cut from is not reused half read: the next request is answered.
            with pytest.raises(NotFound):
                await small.get(CONFIGMAPS, name + "-small", NS)
        assert len((await kube.get(CONFIGMAPS, name, NS))["data"]["blob"]) == 200 << 10
        await kube.delete(CONFIGMAPS, name, NS)


# -- raw servers -----------------------------------------------------------------------------------

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _raw(handler: Handler) -> AsyncIterator[str]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def _get_from(handler: Handler, **client: float) -> None:
    async for url in _raw(handler):
        async with KubeClient(KubeConfig(server=url), **client) as kube:  # type: ignore[arg-type]
            await kube.get(CONFIGMAPS, "x", NS)


async def test_an_answer_that_stalls_mid_body_is_cut_by_the_read_timeout() -> None:
    async def stall(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        await asyncio.sleep(60)

    with pytest.raises(ApiUnavailable, match="no answer within the read timeout"):
        await _get_from(stall, timeout=0.3)


async def test_an_answer_that_trickles_is_cut_by_the_deadline() -> None:
    async def trickle(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):  # a byte every 50 ms: always within the read timeout, never whole
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    with pytest.raises(ApiUnavailable, match="did not arrive within"):
        await _get_from(trickle, timeout=0.3)


async def test_a_request_timeout_bounds_the_request_whole() -> None:
    async def silent(_reader: asyncio.StreamReader, _writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(60)

    async for url in _raw(silent):
        async with KubeClient(KubeConfig(server=url)) as kube:
            with pytest.raises(ApiUnavailable):
                await kube.get(CONFIGMAPS, "x", NS, request_timeout=0.3)


async def test_a_coded_answer_is_refused() -> None:
    async def gzipped(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: 2\r\n\r\n{}"
        )
        await writer.drain()

    with pytest.raises(ApiUnavailable, match="Content-Encoding 'gzip'"):
        await _get_from(gzipped)


async def test_an_error_answer_that_is_no_status_keeps_its_words() -> None:
    async def proxy_page(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        page = b"<html>upstream gone</html>"
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(page), page))
        await writer.drain()

    with pytest.raises(ApiUnavailable) as unavailable:
        await _get_from(proxy_page)
    assert unavailable.value.status == 503 and "upstream gone" in unavailable.value.message


async def test_a_watch_that_outlives_its_timeout_is_cut() -> None:
    async def endless(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        await asyncio.sleep(60)  # never an event, never the end the server promised

    async for url in _raw(endless):
        async with KubeClient(KubeConfig(server=url)) as kube:
            kube.watch_slack = 0.5
            with pytest.raises(ApiUnavailable, match="watch configmaps"):
                async for _event in kube.watch(CONFIGMAPS, NS, timeout_seconds=1):
                    pass


async def test_a_server_url_with_a_path_keeps_it_before_every_request() -> None:
    targets: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):  # kept alive
                targets.append(head.split(b" ")[1])
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/k8s/clusters/c-1/"
        async with KubeClient(KubeConfig(server=url)) as kube:
            await kube.get(CONFIGMAPS, "x", NS)
            await kube.list(CONFIGMAPS, NS, limit=5)
    finally:
        server.close()
        await server.wait_closed()
    assert targets == [
        b"/k8s/clusters/c-1/api/v1/namespaces/default/configmaps/x",
        b"/k8s/clusters/c-1/api/v1/namespaces/default/configmaps?limit=5",
    ]
