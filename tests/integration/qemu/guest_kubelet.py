"""The kubelet's side of the DRA protocol, run inside a QEMU host's guest for the qemu tests.

``python guest_kubelet.py --registry-dir D --port P`` registers every plugin that appears in D
(as the kubelet does) and answers one JSON request per line on P (forwarded by QEMU):
``{"op": "prepare"|"unprepare", "claims": [{"namespace", "name", "uid"}]}`` → per-claim results,
or ``{"_error": ...}`` when the call itself failed (a kubelet calls again then);
``{"op": "ping"}`` → whether the plugin is registered and how many registrations succeeded.
One long-lived process, because a Python start under TCG costs seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from kube_standin.kubelet_client import ClaimRef, PluginManager

DRIVER = "fabric-dra.io"


#: what a call answers when the plugin registered again while it ran (see :func:`_answer_call`)
REPLACED = "the plugin registered again while the call ran; its connection was closed"


async def _answer_call(manager: PluginManager, request: dict[str, Any]) -> dict[str, Any]:
    """One DRA call, answered even when the plugin registers again meanwhile: the plugin manager
    then closes the old connection, which cancels the call on it (a kubelet sees the call fail
    with "the client connection is closing" and retries), and must not leave the caller waiting."""
    call = asyncio.ensure_future(_answer(manager, request))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        if not call.cancelled():
            raise  # this server is stopping
        return {"_error": REPLACED}


async def _answer(manager: PluginManager, request: dict[str, Any]) -> dict[str, Any]:
    if request.get("op") == "ping":
        registrations = sum(1 for a in manager.attempts if a.driver == DRIVER and a.registered)
        return {"plugin": manager.plugin(DRIVER) is not None, "registrations": registrations}
    plugin = await manager.wait_for_plugin(DRIVER, within=float(request.get("within", 120)))
    claims = [ClaimRef(c["namespace"], c["name"], c["uid"]) for c in request["claims"]]
    if request["op"] == "prepare":
        results = await plugin.node_prepare_resources(claims)
        return {
            uid: {"error": r.error, "cdi": [i for d in r.devices for i in d.cdi_device_ids]}
            for uid, r in results.items()
        }
    errors = await plugin.node_unprepare_resources(claims)
    return {uid: {"error": e} for uid, e in errors.items()}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--registry-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    manager = PluginManager(
        args.registry_dir,
        reconcile_period=0.2,
        backoff_initial=0.2,
        backoff_max=1.0,
        watch_health=False,
        call_timeout=45.0,
    )
    runner = asyncio.create_task(manager.run())

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while line := await reader.readline():
            try:
                answer = await _answer_call(manager, json.loads(line))
            except Exception as err:  # the caller sees every failure (a kubelet would retry)
                answer = {"_error": f"{type(err).__name__}: {err}"}
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "0.0.0.0", args.port)  # reached only through QEMU
    print(f"guest kubelet serving on {args.port}", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), runner)


if __name__ == "__main__":
    asyncio.run(main())
