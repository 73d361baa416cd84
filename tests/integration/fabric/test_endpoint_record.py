"""Every endpoint the emulator serves reads the same as a slotted record as through the pydantic
view it replaced (tests/unit/fabric/test_endpoint_record.py), in each of the emulator's quirk
profiles: a fabric with CXL memory pools, a cascade, and a service whose endpoint links are stale
or omitted, whose initiators only zones link, without ``$expand`` and ETags. Some devices are
bound, so that endpoints link their zones."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.common import generate_topology, host_name
from fabric.backends.views import odata_id
from fabric.redfish.client import RedfishClient, RedfishSettings
from tests.support.emulator import run_emulator, with_behaviour, zone_add
from tests.unit.fabric.test_endpoint_record import read_alike

TOPOLOGIES = Path(__file__).resolve().parents[3] / "emulator" / "topology"


async def _endpoints(url: str, bind: list[tuple[str, str]]) -> list[dict[str, object]]:
    """Every endpoint the service links from its fabrics' Endpoints and Zones, as served."""
    client = RedfishClient(RedfishSettings(base_url=url, auth="none"))
    try:
        for device, host in bind:
            uri, body = zone_add(host, device)
            await client.post(uri, body)
        found: dict[str, dict[str, object]] = {}
        fabrics = (await client.get("/redfish/v1/Fabrics")).body["Members"]
        for link in fabrics:
            fabric = (await client.get(str(odata_id(link)))).body
            uris: list[str | None] = []
            for name in ("Endpoints", "Zones"):
                collection = odata_id(fabric.get(name))
                if collection:
                    uris += [odata_id(m) for m in (await client.get(collection)).body["Members"]]
            for member_uri in uris:
                body = (await client.get(str(member_uri))).body
                if "/Endpoints/" in str(member_uri):
                    found[str(member_uri)] = body
                for member in (body.get("Links") or {}).get("Endpoints", []):
                    target = str(odata_id(member))
                    if target not in found:
                        found[target] = (await client.get(target)).body
        return list(found.values())
    finally:
        await client.aclose()


@pytest.mark.parametrize(
    "profile",
    ["generated-cxl", "cascade-2tier", "stale-links-no-expand", "omitted-links-initiators-by-links"],
)
def test_every_endpoint_of_the_emulator_reads_the_same(tmp_path: Path, profile: str) -> None:
    generated = generate_topology(tmp_path / "generated.yaml", hosts=3, gpus=12, nvme=2, cxl_pools=1)
    topology = {
        "generated-cxl": generated,
        "cascade-2tier": TOPOLOGIES / "cascade-2tier.yaml",
        "stale-links-no-expand": with_behaviour(
            generated, tmp_path / "t.yaml", endpoint_links="stale", expand="unsupported", etags="omitted"
        ),
        "omitted-links-initiators-by-links": with_behaviour(
            generated, tmp_path / "t.yaml", endpoint_links="omitted", initiators="links-only"
        ),
    }[profile]
    bind = [(f"gpu{i}", host_name(i % 3)) for i in range(1, 4)] if profile != "cascade-2tier" else []
    with run_emulator(tmp_path, topology=topology, extra_args=["--insecure-no-auth"]) as emu:
        endpoints = asyncio.run(_endpoints(emu.url, bind))
    assert len(endpoints) > 3
    for endpoint in endpoints:
        read_alike(endpoint)
