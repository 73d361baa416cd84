"""The claim status writer against a scripted API server: a conflict is read again and retried, a
refusal is dropped (and counted), an API server that is away is retried; the entries' data stays
under the API server's 10 KiB."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.claims import ClaimRef
from dra_driver.plugin.claimstatus import (
    DATA_MAX_BYTES,
    STATUS_WRITES,
    ClaimStatusWriter,
    DeviceReadiness,
    device_data,
)
from dra_driver.plugin.hostdev import HostDevice
from plumbing.kube import ApiUnavailable, Conflict, Forbidden

DRIVER = "fabric-dra.io"
REF = ClaimRef("3b1c7a54-0d7e-4b0e-9a4a-2b1d6f6c9e01", "default", "gpu-claim")


class ScriptedApi:
    """GET answers the stored claim; each PATCH takes the next scripted error, else applies."""

    def __init__(self, *errors: Exception) -> None:
        self.claim: dict[str, Any] = {
            "metadata": {
                "name": REF.name,
                "namespace": REF.namespace,
                "uid": REF.uid,
                "resourceVersion": "7",
            },
            "status": {
                "allocation": {
                    "devices": {
                        "results": [{"request": "gpu", "driver": DRIVER, "pool": "p", "device": "gpu0"}]
                    }
                }
            },
        }
        self.errors = list(errors)
        self.patches: list[dict[str, Any]] = []
        self.gets = 0

    async def get(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        self.gets += 1
        return copy.deepcopy(self.claim)

    async def patch(self, res: Any, name: str, patch: Any, namespace: str | None = None, **kw: Any) -> Any:
        assert kw == {"subresource": "status"}
        self.patches.append(copy.deepcopy(patch))
        if self.errors:
            raise self.errors.pop(0)
        if patch["metadata"]["resourceVersion"] != self.claim["metadata"]["resourceVersion"]:
            raise Conflict(409, "Conflict", "the object has been modified")  # as the API server does
        self.claim["status"]["devices"] = patch["status"]["devices"]
        self.claim["metadata"]["resourceVersion"] = str(int(self.claim["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.claim)


READY = DeviceReadiness("p", "gpu0", None, True, "Prepared", "gpu0 is attached", {"node": "node-a"})


def _written(api: ScriptedApi) -> list[dict[str, Any]]:
    return list(api.claim["status"].get("devices") or [])


def _count(outcome: str) -> float:
    return float(STATUS_WRITES.labels(outcome)._value.get())


def test_a_conflict_is_read_again_and_retried() -> None:
    async def scenario() -> None:
        api = ScriptedApi(Conflict(409, "Conflict", "the object has been modified"))
        writer = ClaimStatusWriter(api, driver=DRIVER, node="node-a")  # type: ignore[arg-type]
        writer.publish(REF, [READY])
        await writer.flush()
        assert len(api.patches) == 2
        (entry,) = _written(api)
        assert entry["conditions"][0]["type"] == "Ready" and entry["data"] == {"node": "node-a"}
        writer.withdraw(REF, [READY.key])
        await writer.flush()
        assert _written(api) == []
        assert api.patches[-1]["status"] == {"devices": None}

    asyncio.run(scenario())


def test_a_claim_seen_is_written_without_reading_it_again_and_a_stale_copy_costs_one_read() -> None:
    """Issue 37: the prepare's claim read, then each write's answer, is what the next write merges
    onto: a prepare and an unprepare cost one PATCH each and no GET. Someone else's change in
    between makes the compare-and-swap fail once, and the claim is read again."""

    async def scenario() -> None:
        api = ScriptedApi()
        writer = ClaimStatusWriter(api, driver=DRIVER, node="node-a")  # type: ignore[arg-type]
        writer.seen(copy.deepcopy(api.claim))  # the prepare's read
        writer.publish(REF, [READY])
        await writer.flush()
        writer.withdraw(REF, [READY.key])
        await writer.flush()
        assert (api.gets, len(api.patches), _written(api)) == (0, 2, [])
        # a withdrawal keeps nothing of the claim: the next write reads it, whatever it says
        writer.withdraw(REF, [READY.key])  # nothing left to take back: read, not written
        await writer.flush()
        writer.publish(REF, [READY])
        await writer.flush()
        assert (api.gets, len(api.patches)) == (2, 3)

        writer.seen(copy.deepcopy(api.claim))
        api.claim["metadata"]["resourceVersion"] = "99"  # another writer changed the claim since
        writer.withdraw(REF, [READY.key])
        await writer.flush()
        assert (api.gets, len(api.patches), _written(api)) == (3, 5, [])

    asyncio.run(scenario())


def test_a_refusal_is_dropped_and_an_absent_api_server_retried() -> None:
    async def scenario() -> None:
        refused_before = _count("refused")
        api = ScriptedApi(Forbidden(403, "Forbidden", "it is allocated to another node"))
        writer = ClaimStatusWriter(api, driver=DRIVER, node="node-a")  # type: ignore[arg-type]
        writer.publish(REF, [READY])
        await writer.flush()
        assert len(api.patches) == 1 and _written(api) == []
        assert _count("refused") == refused_before + 1

        api = ScriptedApi(ApiUnavailable(503, "ServiceUnavailable", "etcd is away"))
        writer = ClaimStatusWriter(api, driver=DRIVER, node="node-a")  # type: ignore[arg-type]
        writer.publish(REF, [READY])
        await asyncio.wait_for(writer.flush(), 10)
        assert len(api.patches) == 2 and _written(api)[0]["device"] == "gpu0"

    asyncio.run(scenario())


def test_the_data_stays_under_10KiB() -> None:
    huge = PreparedDevice(
        device="gpu0",
        pool="p",
        type="gpu",
        model="M" * (20 * 1024),
        host=HostDevice(sysfs_path="/x", pci_address="0000:41:00.0"),
    )
    data = device_data("node-a", huge, None, 1.5)
    assert len(json.dumps(data, separators=(",", ":")).encode()) <= DATA_MAX_BYTES
    assert data == {"node": "node-a", "pciAddress": "0000:41:00.0"}
