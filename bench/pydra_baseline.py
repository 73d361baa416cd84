"""The baseline of section 3: a DRA plugin built on PyPI's ``kubernetes-pydra`` (``pydra``), with a
no-op device backend.

``pydra.core.server.DraNodeServer`` serves the kubelet's registration and ``v1.DRAPlugin`` services
on unix sockets with ``grpc.aio``; its NodePrepareResources calls ``prepare_hardware`` once per
claim and answers the CDI device IDs it returns. This subclass returns one CDI ID per claim and
does nothing else: no claim read, no file, no checkpoint — the framework's own cost. pydra
publishes a ResourceSlice at start through the Kubernetes client; that is off here (the
benchmark has no slices to compare).

``python -m bench.pydra_baseline --socket DRA.sock --registration-socket REG.sock``
(``pip install -e .[bench]`` installs kubernetes-pydra).
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from pydra.core.server import DraNodeServer  # type: ignore[import-not-found,unused-ignore]

DRIVER = "noop.pydra.example.com"


class NoopPlugin(DraNodeServer):  # type: ignore[misc,unused-ignore]
    def get_devices(self) -> list[str]:
        return []

    async def prepare_hardware(self, claim_uid: str, namespace: str, name: str) -> list[str]:
        return [f"{DRIVER}/device=noop"]

    async def unprepare_hardware(self, claim_uid: str, namespace: str, name: str) -> None:
        return None

    def publish_resource_slice(self) -> None:
        """No ResourceSlice: nothing to publish for a no-op driver."""

    def delete_resource_slice(self) -> None:
        """Nothing was published."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--socket", required=True, help="the DRA service socket")
    parser.add_argument("--registration-socket", required=True, help="the kubelet registration socket")
    args = parser.parse_args(argv)
    plugin: Any = NoopPlugin(DRIVER, args.socket, registration_socket_path=args.registration_socket)
    asyncio.run(plugin.serve())


if __name__ == "__main__":
    main()
