"""fabric.redfish.links.resolve: service-provided URIs resolved against the service root (RFC 3986
§5), and refused when they name another origin."""

from __future__ import annotations

import pytest

from fabric.redfish.links import ForeignLink, resolve

BASE = "https://bmc.example:8443"


@pytest.mark.parametrize(
    ("reference", "path"),
    [
        ("/redfish/v1/Systems/1", "/redfish/v1/Systems/1"),
        ("/redfish/v1/Systems?$skip=50", "/redfish/v1/Systems?$skip=50"),
        ("Systems/1", "/redfish/v1/Systems/1"),
        ("../v1/Chassis", "/redfish/v1/Chassis"),
        ("@127.0.0.1:9/x", "/redfish/v1/@127.0.0.1:9/x"),  # a path segment here, not a host
        ("https://bmc.example:8443/redfish/v1/x", "/redfish/v1/x"),
        ("HTTPS://BMC.example:8443/y", "/y"),
        ("//bmc.example:8443/z", "/z"),
    ],
)
def test_references_on_the_service_resolve_to_their_path(reference: str, path: str) -> None:
    assert resolve(BASE, reference) == path


@pytest.mark.parametrize(
    "reference",
    [
        "http://bmc.example:8443/x",  # another scheme
        "https://bmc.example/x",  # another port (443)
        "https://evil.example:8443/x",
        "//127.0.0.1:9/x",
        "https://user@bmc.example:8443/x",
        "https://bmc.example:notaport/x",
        "/x\r\nX-Injected: 1",
        "/a b",
        "",
    ],
)
def test_other_origins_and_non_uris_are_refused_naming_the_link(reference: str) -> None:
    with pytest.raises(ForeignLink, match=r"Links\.Sessions"):
        resolve(BASE, reference, link="Links.Sessions")


def test_default_ports_are_the_same_origin() -> None:
    assert resolve("http://bmc", "http://bmc:80/x") == "/x"
    assert resolve("https://bmc:443", "https://bmc/x") == "/x"
