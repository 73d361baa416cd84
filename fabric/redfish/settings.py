"""How to reach and authenticate to one Redfish service: the one declaration of the client's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

__all__ = ["RedfishSettings"]


class RedfishSettings(BaseModel):
    """How to reach and authenticate to one Redfish service."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str = Field(description="scheme://host[:port] of the Redfish service")
    username: str | None = None
    password: SecretStr | None = None
    auth: Literal["session", "basic", "none"] = "session"
    ca_file: Path | None = Field(default=None, description="PEM bundle that signs the service certificate")
    insecure: bool = Field(default=False, description="skip TLS verification (development only)")
    connect_timeout: float = Field(default=5.0, gt=0)
    read_timeout: float = Field(default=30.0, gt=0)
    get_attempts: int = Field(default=4, ge=1, description="tries per GET, counting the first")
    backoff_initial: float = Field(default=0.2, gt=0)
    backoff_max: float = Field(default=5.0, gt=0)
    max_workers: int = Field(default=32, ge=1, description="concurrent Redfish requests")
    # 32 MiB: an answer is parsed into Python objects several times its size (measured: a 60 MB
    # answer took the manager to 416-427 MiB, past the 400 MiB it must stay under); the largest
    # legitimate answer, an expanded Zones collection of 10,000 zones, is about 15 MB.
    max_response_bytes: int = Field(default=32 << 20, ge=1024, description="largest answer accepted")
    max_inflight_bytes: int = Field(
        default=32 << 20,
        ge=1024,
        description="bytes of answers read at once, all concurrent reads together (at least "
        "max_response_bytes)",
    )
    response_deadline: float | None = Field(
        default=None,
        gt=0,
        description="longest a whole answer may take to arrive (default: 4 times read_timeout)",
    )

    @field_validator("base_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{value!r} is not an http(s)://host[:port] URL")
        if parts.username or parts.password:
            raise ValueError("put Redfish credentials in the credentials file, not in the URL")
        return f"{parts.scheme}://{parts.netloc}"
