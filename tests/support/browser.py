"""A headless Chromium driven over the Chrome DevTools Protocol, for the fabric map's tests.

Debian's ``chromium`` package is the browser (``.ci/run`` installs it); :func:`chromium_binary`
finds it or says why not, so a test can skip with that reason. The protocol is spoken with the
``websockets`` client the manager already depends on (through uvicorn): no driver, no download.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from tests.support.tools import find_tool

__all__ = ["Browser", "artifacts_dir", "chromium_binary"]

_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium_binary() -> tuple[str | None, str]:
    """(path, "") of a Chromium on PATH or in ``$CHROMIUM``, else (None, why not)."""
    explicit = os.environ.get("CHROMIUM")
    if explicit:
        return (explicit, "") if shutil.which(explicit) else (None, f"$CHROMIUM={explicit} is not executable")
    return find_tool(_CANDIDATES, "Chromium", "chromium")


def artifacts_dir() -> Path:
    """Where tests leave files for people to look at: ``$FABRIC_DRA_ARTIFACTS``, else
    ``build/artifacts`` in the repository (CI keeps that directory)."""
    explicit = os.environ.get("FABRIC_DRA_ARTIFACTS")
    root = Path(explicit) if explicit else Path(__file__).resolve().parents[2] / "build" / "artifacts"
    root.mkdir(parents=True, exist_ok=True)
    return root


class Browser:
    """One headless Chromium with one page; :meth:`close` ends the process it started."""

    def __init__(self, binary: str, profile: Path, *, width: int = 1400, height: int = 900) -> None:
        self.profile = profile
        self._ids = itertools.count(1)
        self._closing = contextlib.ExitStack()
        self._log = (profile / "chromium.log").open("wb")
        # --remote-debugging-port=0: Chromium picks a free port and names it in DevToolsActivePort.
        self.process = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # CI runs as root, where Chromium's sandbox refuses to start
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        try:
            self._ws = self._attach(time.monotonic() + 30)
            self.call("Page.enable")
            self.call("Runtime.enable")
        except BaseException:
            self.close()
            raise

    def _attach(self, deadline: float) -> ClientConnection:
        port_file = self.profile / "DevToolsActivePort"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.process.returncode}: see {self._log.name}")
            if port_file.exists() and port_file.read_text().strip():
                port = int(port_file.read_text().split()[0])
                targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    return self._closing.enter_context(
                        connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=10)
                    )
            time.sleep(0.05)
        raise TimeoutError(f"chromium did not open its DevTools port within 30 s: see {self._log.name}")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; events that arrive meanwhile are dropped (the tests poll)."""
        ident = next(self._ids)
        self._ws.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(self._ws.recv(timeout=30))
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                result: dict[str, Any] = message.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        answer = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in answer:
            raise RuntimeError(f"{expression!r} threw: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    def navigate(self, url: str, timeout: float = 20.0) -> None:
        """Open ``url`` and wait until that document has loaded (its fragment may change)."""
        self.call("Page.navigate", url=url)
        target = json.dumps(url.split("#")[0])
        self.wait_for(
            f"location.href.split('#')[0] === {target} && document.readyState === 'complete'", timeout
        )

    def wait_for(self, expression: str, timeout: float = 20.0, interval: float = 0.05) -> Any:
        """Poll ``expression`` until it is truthy; its value, or TimeoutError naming it."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except RuntimeError as err:  # e.g. the element is not drawn yet
                value = err
            if value and not isinstance(value, RuntimeError):
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} stayed {value!r} for {timeout} s")
            time.sleep(interval)

    def screenshot(self, path: Path) -> Path:
        """A PNG of the whole page (not just the window) at ``path``."""
        metrics = self.call("Page.getLayoutMetrics")
        size = metrics.get("cssContentSize") or metrics["contentSize"]
        shot = self.call(
            "Page.captureScreenshot",
            format="png",
            captureBeyondViewport=True,
            clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        )
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    def close(self) -> None:
        self._closing.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
