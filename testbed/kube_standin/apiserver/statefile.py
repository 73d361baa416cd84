"""The ``--state-file``: the store's objects and resourceVersion counter, loaded at start and
written back (atomically) shortly after changes and at exit, so a restarted server goes on
where it stopped."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kube_standin.apiserver.storage import Storage, StoreState
from kube_standin.errors import ConfigError
from plumbing.fsutil import atomic_write
from plumbing.logs import get_logger

__all__ = ["StateFile", "StateFileError"]

log = get_logger(__name__)

#: writes within this many seconds of each other go to the file together.
_BATCH_SECONDS = 0.2


class StateFileError(ConfigError, RuntimeError):
    """The --state-file exists but is not a state this server wrote."""


class StateFile:
    """The state file of ``store``: :meth:`load` it once, then :meth:`run` while serving
    (call :meth:`changed` on every commit) and :meth:`flush` at the end."""

    def __init__(self, path: Path, store: Storage) -> None:
        self.path = path
        self.store = store
        self._dirty = asyncio.Event()

    def load(self) -> None:
        """Fill the store from the file, if there is one."""
        if not self.path.exists():
            return
        try:
            state = StoreState.model_validate_json(self.path.read_bytes())
        except (OSError, ValueError) as err:
            raise StateFileError(
                f"state file {self.path} cannot be loaded ({str(err).splitlines()[0]}); "
                "move it away to start with an empty server"
            ) from err
        self.store.load(state)
        log.info("state loaded", path=str(self.path), resourceVersion=self.store.rv)

    def changed(self) -> None:
        self._dirty.set()

    async def run(self) -> None:
        """Write the file after changes, until cancelled."""
        while True:
            await self._dirty.wait()
            await asyncio.sleep(_BATCH_SECONDS)  # batch bursts of writes into one file write
            self._dirty.clear()
            self.flush()

    def flush(self) -> None:
        atomic_write(self.path, self.store.dump().model_dump_json())
