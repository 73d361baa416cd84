"""A small asyncio client of the QEMU Machine Protocol (docs/interop/qmp-spec.rst in QEMU).

One connection per monitor socket: the greeting, ``qmp_capabilities``, then commands tagged with
an ``id`` so answers and asynchronous events (``DEVICE_DELETED``, ``RESET``, ...) can interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emulator.errors import GuestError
from plumbing.logs import get_logger

__all__ = ["QmpClient", "QmpError"]

log = get_logger(__name__)


class QmpError(GuestError):
    """QEMU answered a command with an error (``class`` and ``desc`` of the QMP error)."""

    def __init__(self, command: str, error_class: str, desc: str) -> None:
        super().__init__(f"QMP {command}: {error_class}: {desc}")
        self.error_class = error_class
        self.desc = desc


class QmpClient:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pending: dict[str, asyncio.Future[Any]] = {}
        self._next = 0
        self._pump: asyncio.Task[None] | None = None
        #: callbacks for every event: (event name, data, QEMU's timestamp as a float)
        self._listeners: list[Callable[[str, dict[str, Any], float], None]] = []

    async def connect(self, within: float = 30.0) -> None:
        deadline = time.monotonic() + within
        while True:
            try:
                self._reader, self._writer = await asyncio.open_unix_connection(str(self.path))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
        greeting = json.loads(await self._reader.readline())
        if "QMP" not in greeting:
            raise QmpError("greeting", "ProtocolError", f"not a QMP greeting: {greeting}")
        self._pump = asyncio.get_running_loop().create_task(self._read())
        await self.execute("qmp_capabilities")

    def listen(self, callback: Callable[[str, dict[str, Any], float], None]) -> Callable[[], None]:
        """Call ``callback`` for every event until the returned function is called."""
        self._listeners.append(callback)
        return lambda: self._listeners.remove(callback) if callback in self._listeners else None

    async def _read(self) -> None:
        reader = self._reader
        if reader is None:  # started by connect(), after the reader exists
            raise RuntimeError("QMP: read before connect")
        try:
            while line := await reader.readline():
                message = json.loads(line)
                if "event" in message:
                    stamp = message.get("timestamp", {})
                    when = stamp.get("seconds", 0) + stamp.get("microseconds", 0) / 1e6
                    for listener in list(self._listeners):
                        listener(message["event"], message.get("data", {}), when)
                    continue
                future = self._pending.pop(str(message.get("id")), None)
                if future is not None and not future.done():
                    future.set_result(message)
        except (OSError, ValueError) as err:
            log.warning("QMP connection lost", socket=str(self.path), error=str(err))
        finally:
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ConnectionError(f"QMP connection {self.path} closed"))
            self._pending.clear()

    async def execute(self, command: str, **arguments: Any) -> Any:
        """Run ``command``; its ``return`` value, or :class:`QmpError`."""
        if self._writer is None or (self._pump is not None and self._pump.done()):
            raise ConnectionError(f"QMP connection {self.path} is not open")
        self._next += 1
        ident = str(self._next)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[ident] = future
        request: dict[str, Any] = {"execute": command, "id": ident}
        if arguments:
            request["arguments"] = arguments
        self._writer.write(json.dumps(request).encode() + b"\n")
        await self._writer.drain()
        answer = await future
        if "error" in answer:
            raise QmpError(command, answer["error"].get("class", "?"), answer["error"].get("desc", ""))
        return answer.get("return")

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
