"""All three binding styles against the real emulator, over TLS with a test CA and a Redfish session.

For each style a manager is started with ``--binding-style``; a node's plugin attaches a device,
the emulator's own binding table must show exactly that binding made in that style, another
claim gets 409 with the holder, another node's plugin gets 403 for both attach and detach, and
the detach empties the table again. Redfish credentials and bearer tokens must not appear in any
log line.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest

from emulator.topology import default_topology_path, load_topology
from manager_api.client import ManagerClient
from manager_api.errors import DeviceBusy, FabricUnavailable, PermissionDenied
from manager_api.models import AttachmentState, BindingState
from plumbing import procs
from tests.integration.fabric.conftest import (
    CONTROLLER_TOKEN,
    NODES,
    OPERATOR_TOKEN,
    FabricAdmin,
    assert_no_secrets,
    manager_for,
    plugin_token,
)
from tests.support.uids import claim_uid

STYLES = [
    # (style, device name in the inventory, target in the emulator's table, pool)
    ("zone", "gpu0", "gpu0", "fabric-pcie"),
    ("composition", "nvme1", "nvme1", "fabric-pcie"),
    ("connection", "cxlmem1-chunk2", "cxlmem1-chunk2", "fabric-cxl"),
]


@pytest.mark.parametrize(("style", "device", "target", "pool"), STYLES, ids=[s[0] for s in STYLES])
async def test_attach_and_detach(
    fabric: FabricAdmin, tmp_path: Path, style: str, device: str, target: str, pool: str
) -> None:
    node, other = NODES[0], NODES[1]
    with manager_for(fabric, tmp_path, "--binding-style", style) as manager:
        async with (
            ManagerClient(manager.address, token=plugin_token(node)) as plugin,
            ManagerClient(manager.address, token=plugin_token(other)) as other_plugin,
            ManagerClient(manager.address, token=CONTROLLER_TOKEN) as controller,
        ):
            inventory = await plugin.inventory()
            found = {d.name: d for d in inventory.devices}
            assert found[device].binding_style == style and found[device].pool == pool
            assert {d.binding_style for d in inventory.devices} == {style}
            assert found[device].state == BindingState.FREE

            # a long poll on the current version wakes up when the binding changes
            poll = asyncio.create_task(plugin.inventory(after=inventory.version, timeout_seconds=30))
            await asyncio.sleep(0.2)
            assert not poll.done()
            attachment = await plugin.attach(device, node, claim_uid("claim-1"), wait_seconds=20)
            changed = await asyncio.wait_for(poll, 10)
            assert changed.version > inventory.version
            assert {d.name: d for d in changed.devices}[device].state in (
                BindingState.ATTACHING,
                BindingState.BOUND,
            )
            assert attachment.state == AttachmentState.ATTACHED
            assert (attachment.device.node, attachment.device.claim_uid) == (node, claim_uid("claim-1"))
            binding = fabric.binding(target)
            assert binding is not None and (binding["Host"], binding["Style"]) == (node, style)
            assert fabric.bound_hosts() == {target: node}

            # idempotent: asking again changes nothing on the fabric
            again = await plugin.attach(device, node, claim_uid("claim-1"), wait_seconds=20)
            assert again.state == AttachmentState.ATTACHED and fabric.bound_hosts() == {target: node}

            # a plugin acts for its own node only — attach or detach
            with pytest.raises(PermissionDenied, match=f"not for node {node}"):
                await other_plugin.attach(device, node, claim_uid("claim-2"))
            with pytest.raises(PermissionDenied):
                await other_plugin.detach(device, node, claim_uid("claim-1"))
            # another claim (here through the controller, which may act for any node) is told who holds it
            with pytest.raises(DeviceBusy) as busy:
                await controller.attach(device, other, claim_uid("claim-2"))
            assert busy.value.held_by == f"{node}/{claim_uid('claim-1')}"
            assert fabric.bound_hosts() == {target: node}

            # a detach by a non-holder is a no-op success
            noop = await controller.detach(device, other, claim_uid("claim-2"))
            assert noop.state == AttachmentState.DETACHED and fabric.bound_hosts() == {target: node}

            detached = await plugin.detach(device, node, claim_uid("claim-1"), wait_seconds=20)
            assert detached.state == AttachmentState.DETACHED
            assert fabric.bound_hosts() == {}
            assert (await plugin.device(device)).state == BindingState.FREE

            if style == "zone":
                await check_status_metrics_and_openapi(manager.address, device)

        # The manager logged in with a Redfish session (and logs out when stopped).
        sessions = fabric.get("/redfish/v1/SessionService/Sessions")
        assert sessions["Members@odata.count"] >= 1
    assert_no_secrets(
        [tmp_path / "manager.log", fabric.emulator.log_file],
        fabric.emulator.password,
        plugin_token(node),
        CONTROLLER_TOKEN,
    )


async def check_status_metrics_and_openapi(url: str, device: str) -> None:
    async with httpx.AsyncClient(base_url=url) as http:
        metrics = (await http.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"})).text
        assert 'fabric_dra_attach_duration_seconds_count{outcome="success",type="gpu"} 1.0' in metrics
        assert 'fabric_dra_detach_duration_seconds_count{outcome="success",type="gpu"} 1.0' in metrics
        assert (
            'fabric_dra_pool_devices{model="NVIDIA H100 PCIe",pool="fabric-pcie",state="free",type="gpu"} 4.0'
            in metrics
        )
        assert "fabric_dra_redfish_request_duration_seconds_bucket" in metrics
        assert 'fabric_dra_operations_in_flight{operation="attach"} 0.0' in metrics
        openapi = (await http.get("/openapi.json")).json()
        assert {"/api/v1/attachments", "/api/v1/attachments/{device}", "/api/v1/inventory"} <= set(
            openapi["paths"]
        )
        unauthenticated = await http.get("/api/v1/devices")
        assert unauthenticated.status_code == 401 and unauthenticated.json()["code"] == "Unauthenticated"
        malformed = await http.post(
            "/api/v1/attachments",
            json={"device": device},
            headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
        )
        assert malformed.status_code == 422
        assert "body.node" in malformed.json()["message"] and "body.claimUid" in malformed.json()["message"]


def test_status_command(fabric: FabricAdmin, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(OPERATOR_TOKEN + "\n")
    with manager_for(fabric, tmp_path) as manager:
        with httpx.Client(base_url=manager.address) as http:
            response = http.post(
                "/api/v1/attachments",
                params={"waitSeconds": 20},
                json={"device": "gpu4", "node": "kind-worker3", "claimUid": claim_uid("claim-status")},
                headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
            )
            assert response.status_code == 200, response.text
        command = ["status", "--manager-url", manager.address]
        table = procs.run([*command, "--token-file", str(token_file)])
        assert table.returncode == 0, table.stderr
        assert "fabric-pcie  PCIe    gpu         NVIDIA L40S" in table.stdout
        assert "kind-worker3  gpu4" in table.stdout and claim_uid("claim-status") in table.stdout
        as_json = procs.run([*command, "--token-file", str(token_file), "-o", "json"])
        status = json.loads(as_json.stdout)
        assert {"name": "gpu4", "node": "kind-worker3"}.items() <= status["bindings"][0].items()
        l40s = next(p for p in status["pools"] if p["model"] == "NVIDIA L40S")
        assert (l40s["free"], l40s["bound"]) == (1, 1)
        denied = procs.run(command)
        assert denied.returncode == 1
        assert denied.stderr.strip().startswith("fabric-dra: error: cannot read the fabric manager's pool")
        assert "Traceback" not in denied.stderr
        with httpx.Client(base_url=manager.address) as http:
            http.delete(
                "/api/v1/attachments/gpu4",
                params={"claimUid": claim_uid("claim-status"), "node": "kind-worker3", "waitSeconds": 20},
                headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"},
            ).raise_for_status()
    assert fabric.bound_hosts() == {}


async def test_manager_listener_over_tls(fabric: FabricAdmin, tmp_path: Path) -> None:
    """The manager's own listener over HTTPS (the same test CA), as plugins would reach it."""
    tls = fabric.tls
    with manager_for(fabric, tmp_path, "--tls-cert", str(tls.cert), "--tls-key", str(tls.key)) as manager:
        assert manager.address.startswith("https://")
        async with ManagerClient(manager.address, token=OPERATOR_TOKEN, ca_file=str(tls.ca)) as client:
            # every target of the default topology: whole PCIe devices and pre-made CXL chunks,
            # and one device per memory pool (its domain holds no chunk until one is carved)
            topology = load_topology(default_topology_path())
            pools = [d for s in topology.topology.cxl.switches for d in s.devices if d.pool is not None]
            assert pools
            assert len((await client.inventory()).devices) == len(topology.targets) + len(pools)
        async with ManagerClient(manager.address, token=OPERATOR_TOKEN) as untrusting:
            with pytest.raises(FabricUnavailable, match="its TLS certificate was not accepted"):
                await untrusting.devices()
