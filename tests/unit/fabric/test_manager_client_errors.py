"""What the manager client says when the manager cannot be reached: the cause in words, on real
sockets (a port nothing listens on, a name that does not resolve)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from manager_api.client import ManagerClient, ManagerUnreachable
from manager_api.errors import FabricUnavailable


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _inventory(url: str) -> None:
    client = ManagerClient(url, token="t")
    try:
        await client.inventory()
    finally:
        await client.aclose()


def test_a_port_nothing_listens_on_is_connection_refused() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(FabricUnavailable) as caught:
        asyncio.run(_inventory(url))
    assert (
        caught.value.message
        == f"fabric manager unreachable at {url}: nothing listens there (connection refused)"
    )


def test_a_name_that_does_not_resolve_says_so() -> None:
    with pytest.raises(
        FabricUnavailable,
        match=r"unreachable at http://fabric-manager\.invalid: the host name does not resolve",
    ):
        asyncio.run(_inventory("http://fabric-manager.invalid"))


def test_an_unreachable_manager_is_its_own_error_type() -> None:
    """Callers tell "the manager did not answer" from "the manager says the fabric is down" by
    type, not by the wording of the message."""
    with pytest.raises(ManagerUnreachable) as caught:
        asyncio.run(_inventory(f"http://127.0.0.1:{_closed_port()}"))
    assert isinstance(caught.value, FabricUnavailable)
    assert not caught.value.certificate_refused
