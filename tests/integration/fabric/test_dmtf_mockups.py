"""The manager reads DMTF's own mockups correctly — not only our emulator.

Each test serves a mockup directory read-only over real HTTPS (a test CA), runs the real
``fabric-dra manager serve`` process against it and checks the inventory it reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

import pytest
import trustme

from fabric_dra_testbed.stack import Role
from manager_api.client import ManagerClient
from manager_api.errors import BindFailed, PermissionDenied
from manager_api.models import AttachmentState, BindingState, Device, DeviceType, Inventory
from tests.support.fabric_http import MockupServer
from tests.support.fabric_manager import running_manager, static_tokens_file
from tests.support.uids import claim_uid

OPERATOR_TOKEN = "operator-token-0123456789"
PLUGIN_TOKEN = "plugin-token-cxl-system-0123"
CONTROLLER_TOKEN = "controller-token-0123456789"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def serve_manager(tmp: Path, url: str, ca_file: Path) -> contextlib.AbstractContextManager[Role]:
    tokens = static_tokens_file(
        tmp / "tokens.json",
        {
            OPERATOR_TOKEN: ("operator", None),
            PLUGIN_TOKEN: ("plugin", "cxl-system"),
            CONTROLLER_TOKEN: ("controller", None),
        },
    )
    return running_manager(
        tmp,
        url,
        args=[
            *("--redfish-auth", "none", "--redfish-ca-file", str(ca_file)),
            *("--state-dir", str(tmp / "state"), "--static-tokens", str(tokens)),
        ],
    )


def tls_context(ca: trustme.CA, tmp: Path) -> tuple[ssl.SSLContext, Path]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca_file = tmp / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return context, ca_file


async def inventory_of(tmp: Path, mockup: Path, ca: trustme.CA) -> Inventory:
    context, ca_file = tls_context(ca, tmp)
    with MockupServer(mockup, ssl_context=context) as server, serve_manager(tmp, server.url, ca_file) as proc:
        async with ManagerClient(proc.address, token=OPERATOR_TOKEN) as client:
            return await client.inventory()


def by_name(inventory: Inventory) -> dict[str, Device]:
    return {d.name: d for d in inventory.devices}


async def test_public_cxl_inventory(tmp_path: Path, redfish_dir: Path, ca: trustme.CA) -> None:
    inventory = await inventory_of(tmp_path, redfish_dir / "mockups" / "public-cxl", ca)
    devices = by_name(inventory)
    assert set(devices) == {"t1", "t2", "t3", "t4", "t5", "t3-pool", "t4-pool", "t5-pool"}
    assert [p.pool for p in inventory.pools] == ["fabric-cxl"]
    assert inventory.pools[0].nodes == ["cxl-system"]
    [node] = inventory.nodes
    assert (node.name, node.host, node.system_uuid) == (
        "cxl-system",
        "CXL-System",
        "68d5e212-165b-4ca0-909b-c86b9cee0112",
    )

    # Type-3 memory chunks bind through CXL Connections, with the chunk as the device.
    t3 = devices["t3"]
    assert (t3.type, t3.binding_style, t3.memory_bytes) == (DeviceType.CXL_MEMORY, "connection", 16 * 2**30)
    assert t3.redfish_uri == "/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/1/MemoryChunks/1"
    assert (t3.vendor_id, t3.device_id, t3.pcie_generation, t3.pcie_width) == ("0xabcd", "0xabcd", 5, 8)
    # The endpoint names the device-side fabric adapter port; its ConnectedSwitchPorts is D4.
    assert (t3.switch, t3.port) == ("CXL", "D4")
    # Connection 13 binds T3 to the CXL-System; fabric-dra did not make it: reported, never touched.
    assert (t3.state, t3.node, t3.host, t3.managed) == (BindingState.BOUND, "cxl-system", "CXL-System", False)
    # Connection 14 is listed only from endpoint T4 (not by the Connections collection), and its
    # initiator I4 only from that connection (not by the Endpoints collection): still found.
    assert (devices["t4"].state, devices["t4"].memory_bytes) == (BindingState.BOUND, 4 * 2**30)
    assert devices["t4"].serial == "4C-1D-96-FF-FE-DD-D8-35:0006"
    # T5 shares zone 3 with the host but no Connection carries its chunk: free.
    assert (devices["t5"].state, devices["t5"].node, devices["t5"].managed) == (BindingState.FREE, None, True)

    # The Type-2 device is a GPU with 16 GiB of HBM; its memory chunk binds it (Connection 12).
    t2 = devices["t2"]
    assert (t2.type, t2.memory_bytes, t2.binding_style, t2.state) == (
        DeviceType.GPU,
        16 * 2**30,
        "connection",
        BindingState.BOUND,
    )
    # The Type-1 FPGA has no memory chunk: it binds through zones (zone 1 with initiator I1).
    t1 = devices["t1"]
    assert (t1.type, t1.binding_style, t1.state, t1.port) == (
        DeviceType.FPGA,
        "zone",
        BindingState.BOUND,
        "D1",
    )

    # Every Type-3 memory domain allows chunk creation (MemoryDomain v1_5_1, 64 MiB grid): each is a
    # memory pool besides its pre-made chunks, which are carved outside fabric-dra. The Type-2 GPU's
    # HBM domain allows it too, but is the accelerator's own memory: no pool.
    pools = {
        name: (
            d.redfish_uri,
            d.type,
            p.size_bytes >> 20,
            p.outside_bytes >> 20,
            p.min_chunk_bytes >> 20,
            p.increment_bytes >> 20,
        )
        for name, d in devices.items()
        if (p := d.memory_pool) is not None
    }
    cxl = DeviceType.CXL_MEMORY
    assert pools == {
        "t3-pool": ("/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/1", cxl, 16384, 16384, 64, 64),
        "t4-pool": ("/redfish/v1/Chassis/PooledCXLType3/MemoryDomains/6", cxl, 262144, 4096, 64, 64),
        "t5-pool": ("/redfish/v1/Chassis/CXLType3/MemoryDomains/1", cxl, 16384, 16384, 64, 64),
    }


async def test_public_composability_inventory(tmp_path: Path, redfish_dir: Path, ca: trustme.CA) -> None:
    inventory = await inventory_of(tmp_path, redfish_dir / "mockups" / "public-composability", ca)
    devices = by_name(inventory)
    # Compute and whole-system blocks are not pooled devices.
    assert "computeblock1" not in devices and "systemblock11" not in devices
    assert {d.binding_style for d in devices.values()} == {"composition"}
    gpu = devices["offloadblock9"]
    assert (gpu.type, gpu.vendor, gpu.model, gpu.state) == (
        DeviceType.GPU,
        "Contoso Graphics",
        "Contoso Workstation VID2000",
        BindingState.FREE,
    )
    drive = devices["driveblock5"]
    assert (drive.type, drive.capacity_bytes, drive.memory_bytes, drive.state) == (
        DeviceType.NVME,
        274877906944,
        None,
        BindingState.FREE,
    )
    # DriveBlock7 is a SAS tray known only by its SimpleStorage: four 1 TiB drives of one model.
    sas = devices["driveblock7"]
    assert (sas.type, sas.vendor, sas.model, sas.capacity_bytes, sas.memory_bytes) == (
        DeviceType.STORAGE,
        "Contoso",
        "SASGB1024",
        4 * 2**40,
        None,
    )
    # DriveBlock3 is composed into ComposedSystem (and shared with ComposedSystem2): bound, not ours.
    assert (devices["driveblock3"].state, devices["driveblock3"].managed) == (BindingState.BOUND, False)
    assert devices["driveblock3"].holders == ["ComposedSystem", "ComposedSystem2"]
    assert devices["networkblock8"].type == DeviceType.NIC
    # Only systems that offer ComputerSystem.AddResourceBlock (or Links.ResourceBlocks to PATCH)
    # can receive devices; the one that offers neither is named, not silently left out.
    assert "systempreresourceblock" not in inventory.pools[0].nodes
    [notice] = inventory.notices
    assert notice.startswith("system(s) SystemPreResourceBlock cannot be composed")


async def test_read_only_token_cannot_attach(tmp_path: Path, redfish_dir: Path, ca: trustme.CA) -> None:
    context, ca_file = tls_context(ca, tmp_path)
    mockup = redfish_dir / "mockups" / "public-cxl"
    with (
        MockupServer(mockup, ssl_context=context) as server,
        serve_manager(tmp_path, server.url, ca_file) as proc,
    ):
        async with ManagerClient(proc.address, token=OPERATOR_TOKEN) as operator:
            with pytest.raises(PermissionDenied, match="read access only"):
                await operator.attach("t5", "cxl-system", claim_uid("claim-1"))
    log = (tmp_path / "manager.log").read_text()
    assert OPERATOR_TOKEN not in log and PLUGIN_TOKEN not in log


async def test_public_cxl_attach_and_detach_are_confirmed(
    tmp_path: Path, redfish_dir: Path, ca: trustme.CA
) -> None:
    """Served as DMTF's mockup server serves it (POST adds a member, DELETE removes it): the
    attach POSTs a Connection, the detach DELETEs it, and each is confirmed by the collection."""
    context, ca_file = tls_context(ca, tmp_path)
    mockup = redfish_dir / "mockups" / "public-cxl"
    connections = "/redfish/v1/Fabrics/CXL/Connections"
    with (
        MockupServer(mockup, ssl_context=context, writable=True) as server,
        serve_manager(tmp_path, server.url, ca_file) as proc,
    ):
        async with ManagerClient(proc.address, token=PLUGIN_TOKEN) as plugin:
            attached = await plugin.attach("t5", "cxl-system", claim_uid("claim-1"), wait_seconds=20)
            assert attached.state == AttachmentState.ATTACHED
            [made] = [
                u
                for u, body in server.resources.items()
                if u.startswith(connections + "/") and body
                if "fabric-dra" in str(body.get("Name"))
            ]
            body = server.resources[made]
            assert body["MemoryChunkInfo"][0]["MemoryChunk"]["@odata.id"].endswith("/MemoryChunks/1")
            assert body["Links"]["InitiatorEndpoints"] == [
                {"@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/I3"}
            ]
            assert (await plugin.device("t5")).state == BindingState.BOUND

            detached = await plugin.detach("t5", "cxl-system", claim_uid("claim-1"), wait_seconds=20)
            assert detached.state == AttachmentState.DETACHED
            assert server.resources[made] is None
            assert server.count("DELETE", made) == 1
            members = server.resources[connections]["Members"]
            assert {"@odata.id": made} not in members
            assert (await plugin.device("t5")).state == BindingState.FREE


async def test_public_composability_action_accepted_but_not_applied(
    tmp_path: Path, redfish_dir: Path, ca: trustme.CA
) -> None:
    """DMTF's mockup server answers 204 to AddResourceBlock and changes nothing: the attach must
    fail saying so — never "attached" — and leave the block free."""
    context, ca_file = tls_context(ca, tmp_path)
    mockup = redfish_dir / "mockups" / "public-composability"
    with (
        MockupServer(mockup, ssl_context=context, writable=True) as server,
        serve_manager(tmp_path, server.url, ca_file) as proc,
    ):
        async with ManagerClient(proc.address, token=CONTROLLER_TOKEN) as controller:
            inventory = await controller.inventory()
            node = next(n.name for n in inventory.nodes if n.host == "ComposedSystem")
            with pytest.raises(
                BindFailed, match=r"accepted the bind of offloadblock9 .* but did not apply it"
            ):
                await controller.attach("offloadblock9", node, claim_uid("claim-1"), wait_seconds=20)
            actions = "/redfish/v1/Systems/ComposedSystem/Actions/ComputerSystem.AddResourceBlock"
            assert server.count("POST", actions) == 1  # never resent
            for _ in range(100):  # the failed attach is rolled back right after its answer
                device = await controller.device("offloadblock9")
                if device.state == BindingState.FREE:
                    break
                await asyncio.sleep(0.05)
            assert (device.state, device.node) == (BindingState.FREE, None)
            assert server.count("POST", actions) == 1
