"""DMTF's Redfish Service Validator over the whole resource tree of a running emulator.

The emulator is put in a state where every kind of resource exists — bindings of all three
styles, a zone a client created, a CXL connection, chunks carved from a memory pool (one
connected, one being released), partitionable GPUs with their OEM partition table, a finished
and a running task, a session — then ``rf_service_validator`` (PyPI redfish-service-validator)
crawls it from the service root, offline, against DMTF's CSDL and the service's own OEM schema
(``--schema_directory`` with both, ``--skipschema``). Its
debug log is parsed: no result may be FAIL; any WARN is listed (docs/emulator.md says why each
remains, and today there are none).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from emulator.redfish.model.oem import OEM_SCHEMA_FILE, OEM_SCHEMA_URI
from tests.support.emulator import (
    CONNECTIONS,
    ENDPOINTS,
    ZONES,
    block_action,
    connection_body,
    run_emulator,
    zone_add,
)

pytestmark = pytest.mark.slow(seconds=45)

_RESULT = re.compile(r" - (?:ERROR|WARNING) - (FAIL|WARN) - (.*)$")
_SUMMARY = re.compile(r"\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|")


def _validator() -> list[str]:
    script = Path(sys.executable).with_name("rf_service_validator")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "from redfish_service_validator.console_scripts import main; main()"]


def test_validator_reports_no_failures(tmp_path: Path, redfish_dir: Path) -> None:
    with run_emulator(tmp_path) as emu:
        client = emu.client()
        # one binding per style, a client-created zone, and a task that ran asynchronously
        uri, body = zone_add("kind-worker", "gpu0")
        assert client.post(uri, json=body).status_code == 204
        uri, body = block_action("kind-worker2", "nvme0")
        assert client.post(uri, json=body).status_code == 204
        uri, body = block_action("kind-worker2", "nic0")
        assert client.post(uri, json=body).status_code == 204
        uri, body = block_action("kind-worker3", "fpga0")
        assert client.post(uri, json=body).status_code == 204
        zone = client.post(
            ZONES,
            json={
                "Name": "fabric-dra gpu4 on kind-worker3",
                "Links": {
                    "Endpoints": [
                        {"@odata.id": f"{ENDPOINTS}/kind-worker3"},
                        {"@odata.id": f"{ENDPOINTS}/gpu4"},
                    ]
                },
            },
        )
        assert zone.status_code == 201, zone.text
        connection = client.post(
            CONNECTIONS,
            json=connection_body("kind-worker4", "cxlmem1", 0, 3),
            headers={"Prefer": "respond-async"},
        )
        assert connection.status_code == 202, connection.text
        done = client.get(connection.headers["Location"])
        while done.status_code == 202:
            done = client.get(connection.headers["Location"])
        assert done.status_code == 201, done.text
        # chunks carved from the pool: one connected to a host, one being released (sanitized)
        pool = "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0/MemoryChunks"
        carved = client.post(pool, json={"MemoryChunkSizeMiB": 4096})
        assert carved.status_code == 201, carved.text
        memory = client.post(
            CONNECTIONS,
            json={
                "ConnectionType": "Memory",
                "MemoryChunkInfo": [{"MemoryChunk": {"@odata.id": carved.headers["Location"]}}],
                "Links": {
                    "InitiatorEndpoints": [{"@odata.id": "/redfish/v1/Fabrics/CXL/Endpoints/kind-worker3"}]
                },
            },
        )
        assert memory.status_code == 201, memory.text
        releasing = client.post(pool, json={"MemoryChunkSizeMiB": 2048})
        assert releasing.status_code == 201, releasing.text
        emu.inject({"Kind": "HangTasks", "Target": f"cxlpool0-chunk{releasing.json()['Id']}"})
        assert client.delete(releasing.headers["Location"]).status_code == 202
        # PCIe errors on a device's port (PortMetrics.PCIeErrors with counts)
        emu.inject({"Kind": "PCIeErrors", "Device": "gpu1", "CorrectableErrorCount": 7, "FatalErrorCount": 1})
        # a task that is still running while the validator reads it
        emu.inject({"Kind": "HangTasks", "Target": "gpu5"})
        uri, body = zone_add("kind-worker4", "gpu5")
        running = client.post(uri, json=body)
        assert running.status_code == 202
        # a second session, so the Sessions collection lists more than the validator's own
        login = httpx.post(
            f"{emu.url}/redfish/v1/SessionService/Sessions",
            json={"UserName": emu.username, "Password": emu.password},
        )
        assert login.status_code == 201

        # DMTF's schemas and the service's own OEM schema (Oem.FabricDRA), side by side
        schemas = tmp_path / "schemas"
        schemas.mkdir()
        for csdl in (redfish_dir / "csdl").iterdir():
            (schemas / csdl.name).symlink_to(csdl)
        oem = client.get(OEM_SCHEMA_URI)
        assert oem.status_code == 200 and oem.headers["content-type"].startswith("application/xml")
        (schemas / OEM_SCHEMA_FILE).write_bytes(oem.content)

        logdir = tmp_path / "validator"
        result = subprocess.run(
            [
                *_validator(),
                "--rhost",
                emu.url,
                # one argument each: a generated password may begin with "-" (argparse)
                f"--user={emu.username}",
                f"--password={emu.password}",
                "--authtype",
                "Session",
                "--schema_directory",
                str(schemas),
                "--skipschema",
                "--logdir",
                str(logdir),
                "--timeout",
                "30",
            ],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
            cwd=tmp_path,
        )
        emu.reset_faults()

    output = result.stdout + result.stderr
    logs = sorted(logdir.glob("*/RedfishServiceValidatorDebug_*.log"))
    assert logs, f"the validator wrote no debug log:\n{output[-3000:]}"
    failures: list[str] = []
    warnings: list[str] = []
    for line in logs[-1].read_text(errors="replace").splitlines():
        match = _RESULT.search(line)
        if match:
            (failures if match.group(1) == "FAIL" else warnings).append(match.group(2))
    summary = _SUMMARY.findall(output)
    assert summary, f"no summary table in the validator's output:\n{output[-3000:]}"
    passed, warned, failed, _untested = (int(n) for n in summary[-1])

    validated = set(re.findall(r"^Validating (\S+)\.\.\.$", output, re.MULTILINE))
    # the crawl reached every part of the tree, including what the bindings created
    for uri in (
        "/redfish/v1/Fabrics/PCIe/Zones/kind-worker",
        f"/redfish/v1/Fabrics/PCIe/Zones/{zone.json()['Id']}",
        f"/redfish/v1/Fabrics/CXL/Connections/{done.json()['Id']}",
        "/redfish/v1/Systems/kind-worker/Processors/gpu0",
        "/redfish/v1/Systems/kind-worker4/MemoryDomains/CXL/MemoryChunks/cxlmem1-chunk3",
        "/redfish/v1/CompositionService/ResourceBlocks/nic0/NetworkInterfaces/nic0",
        "/redfish/v1/Chassis/cxlmem1/PCIeDevices/cxlmem1/CXLLogicalDevices/0",
        "/redfish/v1/TaskService/Tasks",
        "/redfish/v1/Registries/Base.1.22.1",
        "/redfish/v1/Chassis/switch0/PCIeDevices/gpu0",
        "/redfish/v1/Chassis/cxlpool0/MemoryDomains/0",
        carved.headers["Location"],
        releasing.headers["Location"],
        f"/redfish/v1/Fabrics/CXL/Connections/{memory.json()['Id']}",
        "/redfish/v1/Systems/kind-worker3/MemoryDomains/CXL/MemoryChunks/"
        f"cxlpool0-chunk{carved.json()['Id']}",
    ):
        assert uri in validated, f"the validator never reached {uri}"
    assert len(validated) >= 200, f"only {len(validated)} resources were validated"

    assert failed == 0 and not failures, "validator failures:\n" + "\n".join(failures[:50])
    assert warned == len(warnings)
    assert passed > 3000
    assert not warnings, "validator warnings (list each in docs/emulator.md with its reason):\n" + "\n".join(
        warnings
    )
    assert result.returncode == 0, output[-2000:]
