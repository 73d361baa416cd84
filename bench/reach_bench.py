"""What reachability costs a discovery pass at the restart bench's size, flat and cascaded
(``fabric/backends/reach.py``).

The fabric is the restart bench's: 100 hosts, 10,100 devices, 632 switches. *Flat*: 16 devices a
switch and every host cabled to every switch (each initiator names 632 upstream ports), as
``topology generate`` makes it. *Cascaded*: the same hosts and devices on 632 switches in three
tiers — 2 spines, 20 aggregation switches each cabled to both spines, 10 leaves of 10 hosts and 600
leaves of 16 to 17 devices, each leaf cabled to one aggregation switch — so every host reaches every
device over three or four links and no host shares a switch with a device. The resources are held
in the pass (``Walk``) as a pass holds what it read: what is timed is the computation, not the
requests (the cascaded pass also reads each switch's ``Ports`` collection and the switches, one
expanded read per round of links, about 640 requests a full pass, answered 304 while nothing
changed).

Timed, median of ``--rounds``: ``narrow_reach`` over a new pass with the graph of the last
(unchanged links: no recomputation; the switches' and ports' views given back as a 304-revalidated
pass gets them), over a pass with a new graph and new views (the links changed: read, made into
views, reach computed), and ``reaching_hosts`` alone; with ``--baseline REF`` the same flat pass
through ``reach.py`` of a commit (the reach before cascades were followed), loaded from ``git
show``. The time is the process's CPU time (``time.process_time``): on two cores shared with
other work, wall time says more about the machine's load than about the code.

``python -m bench --only reach``; ``python -m bench.reach_bench [--baseline REF]`` prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from bench.common import BenchContext, check
from fabric.backends.reach import SwitchGraph, narrow_reach, reaching_hosts, read_links, switch_uri
from fabric.backends.views import Endpoint, Port, Switch
from fabric.backends.walk import Walk
from fabric.redfish import RedfishClient, RedfishSettings
from fabric.state.model import DeviceRecord, DiscoveredAttributes, HostRecord
from manager_api.devices import BindingStyle, DeviceType

__all__ = ["run"]

F = "/redfish/v1/Fabrics/PCIe"
ROOT = Path(__file__).resolve().parents[1]

Resources = dict[str, dict[str, Any]]


def _ref(uri: str) -> dict[str, str]:
    return {"@odata.id": uri}


def _port(switch: str, port: str) -> str:
    return f"{F}/Switches/{switch}/Ports/{port}"


def _switch(resources: Resources, switch: str, ports: dict[str, dict[str, Any]]) -> None:
    resources[f"{F}/Switches/{switch}"] = {"Id": switch, "Ports": _ref(f"{F}/Switches/{switch}/Ports")}
    resources[f"{F}/Switches/{switch}/Ports"] = {"Members": [_ref(_port(switch, p)) for p in ports]}
    for port, body in ports.items():
        resources[_port(switch, port)] = {"Id": port, **body}


def fabric(devices: int, hosts: int, switches: int, cascaded: bool) -> tuple[Resources, list[str], list[str]]:
    """(resources, host Ids, device endpoint Ids) of a flat or cascaded fabric of that size."""
    host_ids = [f"host{h}" for h in range(hosts)]
    device_ids = [f"gpu{d}" for d in range(devices)]
    resources: Resources = {}
    if not cascaded:
        per = -(-devices // switches)
        leaf_of = {d: f"switch{i // per}" for i, d in enumerate(device_ids)}
        host_ports = {
            h: [_port(f"switch{s}", f"UP{n}") for s in range(switches)] for n, h in enumerate(host_ids)
        }
        for s in range(switches):
            _switch(resources, f"switch{s}", {f"UP{n}": {"PortType": "UpstreamPort"} for n in range(hosts)})
    else:
        spines, aggs, host_leaves = 2, 20, 10
        device_leaves = switches - spines - aggs - host_leaves
        per_leaf = hosts // host_leaves
        host_ports = {
            h: [_port(f"hleaf{n // per_leaf}", f"UP{n % per_leaf}")] for n, h in enumerate(host_ids)
        }
        leaf_of = {d: f"dleaf{i % device_leaves}" for i, d in enumerate(device_ids)}
        links: dict[str, dict[str, str]] = {}  # switch → its link port → the peer switch

        def cable(a: str, b: str) -> None:
            links.setdefault(a, {})[f"ISL{len(links.get(a, {}))}"] = b
            links.setdefault(b, {})[f"ISL{len(links.get(b, {}))}"] = a

        for agg in range(aggs):
            for spine in range(spines):
                cable(f"agg{agg}", f"spine{spine}")
        leaves = [f"hleaf{n}" for n in range(host_leaves)] + [f"dleaf{n}" for n in range(device_leaves)]
        for n, leaf in enumerate(leaves):
            cable(leaf, f"agg{n % aggs}")
        for switch, link_ports in links.items():
            bodies = {
                p: {
                    "PortType": "InterswitchPort",
                    "Links": {"ConnectedSwitches": [_ref(f"{F}/Switches/{peer}")]},
                }
                for p, peer in link_ports.items()
            }
            _switch(resources, switch, bodies)
    for h, ports in host_ports.items():
        resources[f"{F}/Endpoints/I{h}"] = {
            "Id": f"I{h}",
            "Links": {"ConnectedPorts": [_ref(p) for p in ports]},
        }
    for n, d in enumerate(device_ids):
        port = _port(leaf_of[d], f"DP{n}")
        resources[f"{F}/Endpoints/{d}"] = {"Id": d, "Links": {"ConnectedPorts": [_ref(port)]}}
    return resources, host_ids, device_ids


def records(host_ids: list[str], device_ids: list[str]) -> tuple[list[DeviceRecord], dict[str, HostRecord]]:
    hosts = {
        h: HostRecord(id=h, uri=f"/redfish/v1/Systems/{h}", initiators={"PCIe": (f"{F}/Endpoints/I{h}",)})
        for h in host_ids
    }
    offered = tuple(sorted(host_ids))
    devices = [
        DeviceRecord(
            key=f"{F}/Endpoints/{d}",
            resource_id=d,
            fabric="PCIe",
            style=BindingStyle.ZONE,
            attributes=DiscoveredAttributes(type=DeviceType.GPU),
            reachable_hosts=offered,
            endpoint=f"{F}/Endpoints/{d}",
        )
        for d in device_ids
    ]
    return devices, hosts


async def _walk(client: RedfishClient, resources: Resources, *, revalidated: bool = False) -> Walk:
    """A pass holding ``resources``, the endpoints already read as views (as the backends leave
    them before reachability is narrowed); ``revalidated``: the switches and ports too, as a pass
    whose reads were answered 304 gets back the views of the last (``Revalidation``)."""
    walk = Walk(client)
    for uri, body in resources.items():
        walk.seed({"@odata.id": uri, **body})
    await walk.read_all((u for u in resources if "/Endpoints/" in u), Endpoint)
    if revalidated:
        await walk.read_all((u for u in resources if u.count("/") == 6 and "/Switches/" in u), Switch)
        await walk.read_all((u for u in resources if "/Ports/" in u), Port)
    return walk


async def _median_ms(fn: Callable[[], Awaitable[object]], rounds: int) -> float:
    """The median CPU time of ``fn`` in this process, in milliseconds."""
    times = []
    for _ in range(rounds):
        started = time.process_time()
        await fn()
        times.append(time.process_time() - started)
    return round(statistics.median(times) * 1000, 1)


def _baseline_reach(ref: str) -> ModuleType:
    """``fabric/backends/reach.py`` as it was at ``ref``, loaded as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{ref}:fabric/backends/reach.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="reach-baseline-")) / "reach_baseline.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("reach_baseline", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _shape(
    client: RedfishClient, resources: Resources, host_ids: list[str], device_ids: list[str], rounds: int
) -> dict[str, Any]:
    found, by_id = records(host_ids, device_ids)
    graph = SwitchGraph()
    narrowed = await narrow_reach(await _walk(client, resources), found, by_id, graph)
    computed_first = graph.computations
    walks = [await _walk(client, resources, revalidated=True) for _ in range(rounds)]
    first = [await _walk(client, resources) for _ in range(rounds)]
    unchanged = await _median_ms(lambda: narrow_reach(walks.pop(), found, by_id, graph), rounds)
    computed = await _median_ms(lambda: narrow_reach(first.pop(), found, by_id, SwitchGraph()), rounds)
    every = [u for u in resources if u.count("/") == 6 and "/Switches/" in u]
    edges = await read_links(await _walk(client, resources), every)
    host_switches = {
        (h, "PCIe"): frozenset(
            switch_uri(p["@odata.id"]) or ""
            for p in resources[f"{F}/Endpoints/I{h}"]["Links"]["ConnectedPorts"]
        )
        for h in host_ids
    }

    async def alone() -> object:
        return reaching_hosts(edges, host_switches)

    return {
        "reach_pairs": sum(len(d.reachable_hosts) for d in narrowed),
        "interswitch_links": len(edges),
        "computations_first_pass": computed_first,
        "recomputations_over_unchanged_passes": graph.computations - computed_first,
        "pass_unchanged_links_ms": unchanged,
        "pass_links_changed_ms": computed,
        "reaching_hosts_alone_ms": await _median_ms(alone, rounds) if edges else None,
    }


async def measure(
    devices: int, hosts: int, switches: int, rounds: int, baseline: str | None
) -> dict[str, Any]:
    client = RedfishClient(RedfishSettings(base_url="http://127.0.0.1:9", auth="none"))
    figures: dict[str, Any] = {"devices": devices, "hosts": hosts, "switches": switches, "rounds": rounds}
    try:
        for shape in ("flat", "cascaded"):
            resources, host_ids, device_ids = fabric(devices, hosts, switches, shape == "cascaded")
            figures[shape] = await _shape(client, resources, host_ids, device_ids, rounds)
        if baseline:
            old = _baseline_reach(baseline)
            resources, host_ids, device_ids = fabric(devices, hosts, switches, False)
            found, by_id = records(host_ids, device_ids)
            walks = [await _walk(client, resources) for _ in range(rounds)]
            figures["baseline"] = {
                "ref": baseline,
                "flat_pass_ms": await _median_ms(lambda: old.narrow_reach(walks.pop(), found, by_id), rounds),
            }
    finally:
        await client.aclose()
    return figures


def run(ctx: BenchContext) -> dict[str, Any]:
    figures = asyncio.run(measure(10_100, 100, 632, 3 if ctx.quick else 7, None))
    return {
        "figures": figures,
        "checks": [
            check(
                "cascaded reach, pass over unchanged links",
                figures["cascaded"]["pass_unchanged_links_ms"],
                max(1.0, 2 * figures["flat"]["pass_unchanged_links_ms"]),
                "ms",
            ),
            check(
                "recomputations over unchanged passes",
                figures["cascaded"]["recomputations_over_unchanged_passes"],
                0,
                "",
            ),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--devices", type=int, default=10_100)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--switches", type=int, default=632)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", metavar="REF", help="also time the flat pass through REF's reach.py")
    args = parser.parse_args()
    if args.switches < 40 or args.hosts % 10:
        parser.error("--switches must be at least 40 and --hosts a multiple of 10 (10 host leaves)")
    print(
        json.dumps(
            asyncio.run(measure(args.devices, args.hosts, args.switches, args.rounds, args.baseline)),
            indent=2,
        )
    )
    sys.exit(0)


if __name__ == "__main__":
    main()
