"""Accounts, sessions and the credentials file of an emulator.

Redfish authentication (DSP0266 "Security details"): ``X-Auth-Token`` from a session created by
POSTing ``UserName``/``Password`` to the Sessions collection, or HTTP Basic. The service has
one account. Wrong credentials slow the client down (:class:`LoginThrottle`), as a BMC's account
lockout policy does (the AccountService's ``AccountLockoutThreshold`` and
``AccountLockoutCounterResetAfter``), without locking the administrator out.

Unless ``--username``/``--password`` are given, its password is random, created once and kept
0600 in ``<state-dir>/credentials.json`` (``{"username", "password"}``) so it survives restarts
and local tools can read it. Passwords and tokens are never logged.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from emulator.errors import ConfigError
from emulator.redfish.model.state import utcnow
from plumbing.fsutil import atomic_write

__all__ = [
    "CREDENTIALS_FILE",
    "Account",
    "Credentials",
    "LoginThrottle",
    "SessionInfo",
    "Sessions",
    "load_or_create_credentials",
    "read_credentials",
]

CREDENTIALS_FILE = "credentials.json"
DEFAULT_USERNAME = "admin"


class Credentials(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    username: str
    password: str


def read_credentials(path: Path) -> Credentials:
    """Read a credentials file; raises ConfigError saying what is wrong with it."""
    try:
        return Credentials.model_validate_json(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror}") from None
    except ValidationError:
        raise ConfigError(
            f'{path} is not a credentials file ({{"username": ..., "password": ...}})'
        ) from None


def load_or_create_credentials(state_dir: Path, username: str | None) -> tuple[Credentials, bool]:
    """The stored credentials, or new random ones written 0600; the flag says if they were created."""
    path = state_dir / CREDENTIALS_FILE
    if path.exists():
        stored = read_credentials(path)
        if username is None or username == stored.username:
            return stored, False
    creds = Credentials(username=username or DEFAULT_USERNAME, password=secrets.token_urlsafe(24))
    atomic_write(path, json.dumps(creds.model_dump(), indent=1) + "\n", mode=0o600)
    return creds, True


@dataclass(frozen=True)
class Account:
    username: str
    password: str
    role: str = "Administrator"

    def check(self, username: str, password: str) -> bool:
        # compare both in constant time so neither leaks through timing
        user_ok = hmac.compare_digest(username.encode(), self.username.encode())
        pass_ok = hmac.compare_digest(password.encode(), self.password.encode())
        return user_ok and pass_ok

    def check_basic(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        username, sep, password = decoded.partition(":")
        return bool(sep) and self.check(username, password)


@dataclass
class _Failures:
    count: int = 0
    last: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class LoginThrottle:
    """Slows down guessing: per client address, after ``free`` wrong credentials in a row every
    further attempt waits ``base · 2^(n - free)`` seconds (at most ``maximum``) after the last
    failure, and the attempts of one address are checked one at a time, so parallel guesses queue
    instead of running at once. A success, or ``reset_after`` seconds without a failure, clears the
    count (the AccountService's ``AccountLockoutCounterResetAfter``)."""

    def __init__(
        self,
        *,
        free: int = 3,
        base: float = 0.25,
        maximum: float = 8.0,
        reset_after: float = 60.0,
        max_clients: int = 10_000,
    ) -> None:
        self.free = free
        self.base = base
        self.maximum = maximum
        self.reset_after = reset_after
        self.max_clients = max_clients
        self._clients: dict[str, _Failures] = {}

    def delay(self, failures: int) -> float:
        """Seconds an attempt waits after ``failures`` failures in a row."""
        if failures < self.free:
            return 0.0
        return float(min(self.maximum, self.base * 2 ** (failures - self.free)))

    async def check(self, client: str | None, verify: Callable[[], bool]) -> bool:
        """``verify()`` (constant-time credential comparison) once this client's wait is over."""
        key = client or "unknown"
        failures = self._clients.get(key)
        if failures is None:
            if len(self._clients) >= self.max_clients:
                self._forget_stale()
            failures = self._clients[key] = _Failures()
        async with failures.lock:
            since = time.monotonic() - failures.last
            if since > self.reset_after:
                failures.count = 0
            wait = self.delay(failures.count) - since
            if wait > 0:
                await asyncio.sleep(wait)
            if verify():
                failures.count = 0
                return True
            failures.count += 1
            failures.last = time.monotonic()
            return False

    def _forget_stale(self) -> None:
        cutoff = time.monotonic() - self.reset_after
        self._clients = {k: v for k, v in self._clients.items() if v.last > cutoff or v.lock.locked()}


@dataclass
class SessionInfo:
    id: str
    token: str
    username: str
    created: str
    origin: str | None
    last_used: float = field(default_factory=time.monotonic)


class Sessions:
    """Open sessions, in memory: a restart ends them, as a BMC reboot does."""

    def __init__(
        self, timeout_seconds: int = 1800, limit: int = 256, on_change: Callable[[], None] | None = None
    ) -> None:
        self.timeout_seconds = timeout_seconds
        self.limit = limit
        #: called whenever the set of sessions changes (rendered collections are cached)
        self.on_change = on_change or (lambda: None)
        self._by_token: dict[str, SessionInfo] = {}
        self._by_id: dict[str, SessionInfo] = {}
        #: every check of a user name and password (login, HTTP Basic) goes through it
        self.throttle = LoginThrottle()

    def _expire_idle(self) -> None:
        cutoff = time.monotonic() - self.timeout_seconds
        for info in [s for s in self._by_id.values() if s.last_used < cutoff]:
            self.delete(info.id)

    def create(self, username: str, origin: str | None) -> SessionInfo | None:
        """A new session, or None when the session limit is reached."""
        self._expire_idle()
        if len(self._by_id) >= self.limit:
            return None
        info = SessionInfo(
            id=secrets.token_hex(8),
            token=secrets.token_urlsafe(32),
            username=username,
            created=utcnow().isoformat(timespec="seconds").replace("+00:00", "Z"),
            origin=origin,
        )
        self._by_token[info.token] = info
        self._by_id[info.id] = info
        self.on_change()
        return info

    def authenticate(self, token: str) -> SessionInfo | None:
        info = self._by_token.get(token)
        if info is None:
            return None
        now = time.monotonic()
        if now - info.last_used > self.timeout_seconds:
            self.delete(info.id)
            return None
        info.last_used = now
        return info

    def get(self, session_id: str) -> SessionInfo | None:
        self._expire_idle()
        return self._by_id.get(session_id)

    def ids(self) -> list[str]:
        self._expire_idle()
        return sorted(self._by_id)

    def delete(self, session_id: str) -> bool:
        info = self._by_id.pop(session_id, None)
        if info is None:
            return False
        self._by_token.pop(info.token, None)
        self.on_change()
        return True

    def expire_all(self) -> int:
        count = len(self._by_id)
        self._by_id.clear()
        self._by_token.clear()
        self.on_change()
        return count
