"""The Redfish client goes through the proxy the environment names, read once at start, through a
real proxy (:mod:`tests.support.http_proxy`) to real servers."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme

from fabric.redfish import OutcomeUnknown
from fabric.redfish.client import RedfishClient, RedfishSettings
from manager_api.errors import FabricUnavailable
from plumbing.http1 import _bypassed
from tests.support.fabric_http import Reply, Request, ScriptedServer
from tests.support.http_proxy import HttpProxy

ROOT = {"@odata.id": "/redfish/v1/"}


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)


def _root(request: Request) -> Reply:
    return Reply(
        200, {**ROOT, "Seen": request.path, "ProxyAuthorization": "proxy-authorization" in request.headers}
    )


async def test_https_goes_through_a_connect_tunnel_with_the_proxy_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    ca = trustme.CA()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    _clear(monkeypatch)
    with ScriptedServer(_root, ssl_context=context) as server, HttpProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url.replace("http://", "http://squid:p%40ss@"))
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none", ca_file=ca_file))
        try:
            first = await client.get_json("/redfish/v1/")
            await client.get_json("/redfish/v1/")
        finally:
            await client.aclose()
    assert first["Seen"] == "/redfish/v1/"
    assert first["ProxyAuthorization"] is False  # for the proxy only, never inside the tunnel
    port = server.url.rsplit(":", 1)[1]
    # one tunnel, kept alive for the second request; Basic squid:p@ss
    assert [(r.method, r.target) for r in proxy.requests] == [("CONNECT", f"127.0.0.1:{port}")]
    assert proxy.requests[0].authorization == "Basic c3F1aWQ6cEBzcw=="
    assert client.transport.proxy == proxy.url  # shown without its credentials


async def test_plain_http_goes_to_the_proxy_in_absolute_form(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    with ScriptedServer(_root) as server, HttpProxy() as proxy:
        monkeypatch.setenv("http_proxy", proxy.url)
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        try:
            answer = await client.get_json("/redfish/v1/Systems?$top=1")
        finally:
            await client.aclose()
    assert answer["Seen"] == "/redfish/v1/Systems?$top=1"
    assert [(r.method, r.target) for r in proxy.requests] == [
        ("GET", f"{server.url}/redfish/v1/Systems?$top=1")
    ]


@pytest.mark.parametrize("no_proxy", ["127.0.0.1", "*", "127.0.0.0/8", "localhost,127.0.0.1:{port}"])
async def test_no_proxy_goes_direct(monkeypatch: pytest.MonkeyPatch, no_proxy: str) -> None:
    _clear(monkeypatch)
    with ScriptedServer(_root) as server, HttpProxy() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", no_proxy.format(port=server.url.rsplit(":", 1)[1]))
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        try:
            await client.get_json("/redfish/v1/")
        finally:
            await client.aclose()
    assert proxy.requests == []
    assert client.transport.proxy is None


async def test_the_environment_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    with ScriptedServer(_root) as server, HttpProxy() as proxy:
        client = RedfishClient(RedfishSettings(base_url=server.url, auth="none"))
        monkeypatch.setenv("HTTP_PROXY", proxy.url)  # after the client was made: not looked at
        try:
            await client.get_json("/redfish/v1/")
        finally:
            await client.aclose()
    assert proxy.requests == []


async def test_a_refused_tunnel_is_one_clear_error_and_nothing_was_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The request never left: a mutation is not reported as sent (no OutcomeUnknown)."""
    _clear(monkeypatch)
    with HttpProxy(refuse=407) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        client = RedfishClient(
            RedfishSettings(base_url="https://fabric.example:8443", auth="none", get_attempts=1)
        )
        try:
            with pytest.raises(
                FabricUnavailable, match=r"refused the tunnel to fabric.example:8443 \(HTTP 407\)"
            ):
                await client.get("/redfish/v1/")
            with pytest.raises(FabricUnavailable) as caught:
                await client.post("/redfish/v1/Fabrics/PCIe/Zones", {})
            assert not isinstance(caught.value, OutcomeUnknown)
        finally:
            await client.aclose()


async def test_a_proxy_that_is_no_http_proxy_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    client = RedfishClient(
        RedfishSettings(base_url="https://fabric.example:8443", auth="none", get_attempts=1)
    )
    try:
        with pytest.raises(FabricUnavailable, match=r"socks5://127.0.0.1:1080 .* no http:// proxy.*NO_PROXY"):
            await client.get("/redfish/v1/")
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypassed"),
    [
        ("bmc.example.com", 443, "example.com", True),
        ("bmc.example.com", 443, ".example.com", True),
        ("bmc.example.com", 443, "ample.com", False),
        ("bmc.example.com", 443, "bmc.example.com:8443", False),
        ("bmc.example.com", 8443, "bmc.example.com:8443", True),
        ("10.1.2.3", 443, "10.0.0.0/8", True),
        ("10.1.2.3", 443, "192.168.0.0/16, 10.1.2.3", True),
        ("::1", 443, "::1", True),
        ("fd00::5", 443, "fd00::/64", True),
        ("bmc", 443, "", False),
        ("bmc", 443, " , ,", False),
    ],
)
def test_no_proxy_entries(host: str, port: int, no_proxy: str, bypassed: bool) -> None:
    assert _bypassed(host, port, no_proxy) is bypassed
