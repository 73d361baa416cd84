"""One run of the manager's Redfish client against a running emulator, in a process of its own:
``python bench/redfish_client_child.py URL CREDENTIALS GETS PAIRS`` prints its CPU figures as JSON.

Run by path, not as part of the ``bench`` package, and importing nothing of fabric-dra but
:mod:`fabric.redfish.client` (whose API has not changed): with ``PYTHONPATH`` at a checkout of
another commit it measures that commit's client, side by side with this tree's
(:mod:`bench.redfish_bench`). The CPU is the whole process's (``time.process_time``), worker
threads included, over the measured part only (the login and the first connections are warmed).

* GETs: ``GETS`` reads of one endpoint, 8 at a time (as discovery reads).
* pairs: a bind and an unbind as the zone backend makes them (``fabric/backends/zones.py``): read
  the device's endpoint and the host's zone, ``#Zone.AddEndpoint`` with both ETags; read both
  again, ``#Zone.RemoveEndpoint``. Four hosts at once, each binding its own GPU, ``PAIRS`` each.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from fabric.redfish.client import RedfishClient, RedfishSettings

GET_CONCURRENCY = 8
HOSTS = ["kind-worker", "kind-worker2", "kind-worker3", "kind-worker4"]
FABRIC = "/redfish/v1/Fabrics/PCIe"


async def _gets(client: RedfishClient, count: int) -> None:
    uri = f"{FABRIC}/Endpoints/gpu0"
    left = iter(range(count))

    async def worker() -> None:
        for _ in left:
            await client.get(uri)

    await asyncio.gather(*(worker() for _ in range(GET_CONCURRENCY)))


async def _pairs(client: RedfishClient, count: int) -> None:
    async def host_worker(host: str, gpu: str) -> None:
        zone_uri, endpoint_uri = f"{FABRIC}/Zones/{host}", f"{FABRIC}/Endpoints/{gpu}"
        for _ in range(count):
            for action in ("AddEndpoint", "RemoveEndpoint"):
                endpoint, zone = await asyncio.gather(client.get(endpoint_uri), client.get(zone_uri))
                body = {
                    "Endpoint": {"@odata.id": endpoint_uri},
                    "EndpointETag": endpoint.etag,
                    "ZoneETag": zone.etag,
                }
                await client.post(f"{zone_uri}/Actions/Zone.{action}", body)

    await asyncio.gather(*(host_worker(host, f"gpu{i}") for i, host in enumerate(HOSTS)))


async def measure(url: str, account: dict[str, str], gets: int, pairs: int) -> dict[str, Any]:
    client = RedfishClient(
        RedfishSettings(base_url=url, username=account["username"], password=account["password"])
    )
    try:
        await _gets(client, 64)  # login, connections, imports
        await _pairs(client, 2)
        cpu, wall = time.process_time(), time.perf_counter()
        await _gets(client, gets)
        get_cpu, get_wall = time.process_time() - cpu, time.perf_counter() - wall
        cpu, wall = time.process_time(), time.perf_counter()
        await _pairs(client, pairs)
        pair_cpu, pair_wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await client.aclose()
    pair_count = pairs * len(HOSTS)
    return {
        "gets": gets,
        "cpu_ms_per_get": round(1000 * get_cpu / gets, 4),
        "gets_per_s": round(gets / get_wall, 1),
        "pairs": pair_count,
        "cpu_ms_per_pair": round(1000 * pair_cpu / pair_count, 4),
        "pairs_per_s": round(pair_count / pair_wall, 1),
    }


def main() -> None:
    url, gets, pairs = sys.argv[1], int(sys.argv[3]), int(sys.argv[4])
    account = json.loads(Path(sys.argv[2]).read_text())
    print(json.dumps(asyncio.run(measure(url, account, gets, pairs))))


if __name__ == "__main__":
    main()
