"""`fabric-dra plugin` as a real process beside the API test server, called over its unix socket.

These use the no-op device backend, so they run without the fabric; tests/integration/plugin/
test_fabric_flow.py runs the same calls against the emulator and the fabric manager.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from dra_driver.plugin import cdi
from tests.support.plugin import DRIVER, PluginStack


@pytest.fixture(scope="module")
def stack() -> Iterator[PluginStack]:
    with PluginStack() as running:
        yield running


def test_prepare_and_unprepare_through_the_process(stack: PluginStack) -> None:
    async def scenario() -> None:
        ref = await stack.create_claim("proc-c1", [("gpu", "gpu-0")])
        response = await stack.prepare([ref])
        result = response.claims[ref.uid]
        assert result.error == ""
        (device,) = result.devices
        assert (device.device_name, device.pool_name, list(device.request_names)) == (
            "gpu-0",
            "fabric-pcie",
            ["gpu"],
        )
        (spec_path,) = cdi.spec_files_of_claim(stack.cdi_root, DRIVER, ref.uid)
        spec = cdi.CdiSpec.model_validate_json(spec_path.read_text())
        cdi.validate_spec(spec)
        assert f"{spec.kind}={spec.devices[0].name}" == device.cdi_device_ids[0]
        checkpoint = json.loads((stack.plugin_dir / "checkpoint.json").read_text())
        assert checkpoint["data"]["claims"][ref.uid]["state"] == "PrepareCompleted"

        assert (await stack.unprepare([ref])).claims[ref.uid].error == ""
        assert cdi.spec_files_of_claim(stack.cdi_root, DRIVER, ref.uid) == []

    asyncio.run(scenario())


def test_claim_of_another_driver_is_ignored(stack: PluginStack) -> None:
    async def scenario() -> None:
        ref = await stack.create_claim("proc-other", [("gpu", "gpu-9")], driver="gpu.example.com")
        result = (await stack.prepare([ref])).claims[ref.uid]
        assert result.error == "" and list(result.devices) == []
        assert cdi.spec_files_of_claim(stack.cdi_root, DRIVER, ref.uid) == []

    asyncio.run(scenario())


def test_claim_deleted_before_unprepare(stack: PluginStack) -> None:
    async def scenario() -> None:
        ref = await stack.create_claim("proc-deleted", [("gpu", "gpu-1")])
        assert (await stack.prepare([ref])).claims[ref.uid].error == ""
        await stack.delete_claim(ref)
        assert (await stack.unprepare([ref])).claims[ref.uid].error == ""
        assert cdi.spec_files_of_claim(stack.cdi_root, DRIVER, ref.uid) == []
        # and a prepare of the deleted claim says so
        error = (await stack.prepare([ref])).claims[ref.uid].error
        assert "not found" in error

    asyncio.run(scenario())


def test_restart_between_prepare_and_unprepare(stack: PluginStack) -> None:
    async def prepare_one() -> str:
        ref = await stack.create_claim("proc-restart", [("gpu", "gpu-2")])
        assert (await stack.prepare([ref])).claims[ref.uid].error == ""
        return ref.uid

    uid = asyncio.run(prepare_one())
    assert stack.stop_plugin() == 0  # SIGTERM: a clean exit removes both sockets
    assert not (stack.registry_dir / f"{DRIVER}-reg.sock").exists()
    assert not (stack.plugin_dir / "dra.sock").exists()
    stack.start_plugin()

    async def unprepare_it() -> None:
        from tests.support.plugin import ClaimRef

        ref = ClaimRef(uid, "default", "proc-restart")
        again = (await stack.prepare([ref])).claims[uid]  # answered from the checkpoint
        assert again.error == "" and again.devices[0].device_name == "gpu-2"
        assert (await stack.unprepare([ref])).claims[uid].error == ""
        assert cdi.spec_files_of_claim(stack.cdi_root, DRIVER, uid) == []

    asyncio.run(unprepare_it())


def test_sigkill_leaves_state_the_next_instance_uses(stack: PluginStack) -> None:
    async def prepare_one() -> str:
        ref = await stack.create_claim("proc-kill", [("gpu", "gpu-3")])
        assert (await stack.prepare([ref])).claims[ref.uid].error == ""
        return ref.uid

    uid = asyncio.run(prepare_one())
    stack.kill_plugin()  # no cleanup runs: stale sockets stay behind
    assert (stack.plugin_dir / "dra.sock").exists()
    stack.start_plugin()  # cleans them and serves again

    async def unprepare_it() -> None:
        from tests.support.plugin import ClaimRef

        assert (await stack.unprepare([ClaimRef(uid, "default", "proc-kill")])).claims[uid].error == ""

    asyncio.run(unprepare_it())
