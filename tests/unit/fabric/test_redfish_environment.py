"""The Redfish client reads proxy settings from the environment once, at start, not per request."""

from __future__ import annotations

import pytest

from fabric.redfish.client import RedfishClient, RedfishSettings


@pytest.mark.parametrize(
    ("no_proxy", "expected"),
    [("", {"https": "http://proxy.example:3128"}), ("fabric.example", {})],
)
def test_proxies_taken_once_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, no_proxy: str, expected: dict[str, str]
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    client = RedfishClient(RedfishSettings(base_url="https://fabric.example:8443", auth="none"))
    session = client.transport._rf._session
    assert session.trust_env is False  # no per-request look at the environment
    assert {k: v for k, v in session.proxies.items() if k == "https"} == expected
