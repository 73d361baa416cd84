"""The test processes' httpx clients share one TLS context per trust source (tests/conftest.py)."""

from __future__ import annotations

import shutil
import ssl
from pathlib import Path
from typing import Any

import certifi
import httpx
import pytest


def test_clients_with_the_default_verify_build_one_context_from_ssl_cert_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``SSL_CERT_FILE`` set (as on machines whose image sets it), httpx reads that file for
    ``verify=True``: the shared context must come from it too, and be built once, not per client."""
    bundle = tmp_path / "bundle.pem"
    shutil.copy(certifi.where(), bundle)
    built: list[dict[str, Any]] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    monkeypatch.setenv("SSL_CERT_FILE", str(bundle))
    for _ in range(5):
        httpx.Client().close()
    assert [b.get("cafile") for b in built] == [str(bundle)]
