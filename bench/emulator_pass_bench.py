"""The emulator's CPU for a manager's discovery pass at fleet scale: expanded answers, full and revalidated.

A real ``fabric-dra emulator serve`` (``instant``, no authentication) on a generated fabric of
100 hosts and 10,100 devices (10,000 GPUs, 100 NVMe drives, 632 switches) with ``--bindings``
devices bound. For ``--switches`` switches, the answers a manager's pass reads of each
(``Fabrics/PCIe/Switches/{s}/Ports?$expand=.($levels=2)``, the same with the ``$select`` a manager
asks where the service serves it, ``Chassis/{s}/PCIeDevices?$expand=.($levels=3)``,
``Chassis/{s}/Processors?$expand=.($levels=1)``) and, once, the expanded ``Endpoints`` and the
zones' ETag listing — three times: without ``If-None-Match`` (200), with the ETags just given
(304), and with them again after one more device was bound elsewhere. Each figure is the
emulator's CPU (user + system, from ``/proc``, 10 ms ticks) per answer.

``python -m bench.emulator_pass_bench [--switches N] [--bindings N]`` prints JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import httpx

from bench.common import cpu_seconds, generate_topology, host_name, work_dir
from fabric.backends.describe import PORT_SELECT
from fabric_dra_testbed.stack import ENDPOINTS, ZONES, Stack, zone_add

__all__ = ["measure"]

_HOSTS = 100
_ROUNDS = ("200", "304", "304 after a bind elsewhere")


def _reads(http: httpx.Client, switches: int) -> dict[str, list[str]]:
    members = http.get("/redfish/v1/Fabrics/PCIe/Switches").json()["Members"]
    names = [m["@odata.id"].rsplit("/", 1)[1] for m in members][:switches]
    switch, chassis = "/redfish/v1/Fabrics/PCIe/Switches", "/redfish/v1/Chassis"
    return {
        # the selected read first: the full one after it finds the ports rendered already (what a
        # manager's start asks, the selected one alone, is measured cold)
        f"Ports $levels=2 $select={PORT_SELECT}": [
            f"{switch}/{s}/Ports?$expand=.($levels=2)&$select={PORT_SELECT}" for s in names
        ],
        "Ports $levels=2": [f"{switch}/{s}/Ports?$expand=.($levels=2)" for s in names],
        "PCIeDevices $levels=3": [f"{chassis}/{s}/PCIeDevices?$expand=.($levels=3)" for s in names],
        "Processors $levels=1": [f"{chassis}/{s}/Processors?$expand=.($levels=1)" for s in names],
        "Endpoints $levels=1": [f"{ENDPOINTS}?$expand=.($levels=1)"],
        "Zones $levels=1 $select=Id": [f"{ZONES}?$expand=.($levels=1)&$select=Id"],
    }


def _bind(http: httpx.Client, index: int) -> None:
    uri, body = zone_add(host_name(index % _HOSTS), f"gpu{index + 1}")
    http.post(uri, json=body).raise_for_status()


def measure(switches: int = 30, bindings: int = 300) -> dict[str, Any]:
    out: dict[str, Any] = {"switches": switches, "bindings": bindings}
    with work_dir("emu-pass-") as root, Stack(root) as stack:
        topology = generate_topology(Path(root) / "topology.yaml", hosts=_HOSTS, gpus=10_000, nvme=100)
        emulator = stack.emulator(latency="instant", topology=topology, auth=False)
        pid = emulator.role.pid
        with httpx.Client(base_url=emulator.url, timeout=600) as http:
            for i in range(bindings):
                _bind(http, i)
            bound = bindings
            for name, uris in _reads(http, switches).items():
                etags: dict[str, str] = {}
                for kind in _ROUNDS:
                    if kind == _ROUNDS[2]:
                        _bind(http, bound)
                        bound += 1
                    statuses: dict[int, int] = {}
                    before = cpu_seconds(pid)
                    for uri in uris:
                        headers = {"If-None-Match": etags[uri]} if kind != "200" else {}
                        answer = http.get(uri, headers=headers)
                        statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
                        etags[uri] = answer.headers["ETag"]
                    spent = (cpu_seconds(pid) - before) * 1000 / len(uris)
                    out[f"{name}, {kind}"] = {"cpu_ms": round(spent, 2), "statuses": statuses}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--switches", type=int, default=30, help="switches whose answers are read (of 632)")
    parser.add_argument("--bindings", type=int, default=300, help="devices bound before the reads")
    args = parser.parse_args()
    if not 1 <= args.switches <= 632 or not 0 <= args.bindings <= 9_000:
        parser.error("--switches must be 1-632 and --bindings 0-9000")
    print(json.dumps(measure(args.switches, args.bindings), indent=2))


if __name__ == "__main__":
    main()
