"""What the demo shows after the article's scenario: devices shared, not bound whole.

* **One GPU, two pods** (``gpu-partitions.yaml``, with binding conditions only): two claims, each
  for a partition (MIG-style profile placement) of the same fabric GPU, and a pod for each. The
  fabric binds the GPU once, to one node; both pods run there, each container gets its own
  partition (CDI), and the GPU's placements are offered on that node only. After both pods end
  the GPU is free and published whole again.
* **64 GiB of CXL memory** (``cxl-memory.yaml``, both flows): a claim for 64 GiB of a memory pool
  (consumable capacity) and a pod. The fabric carves a chunk of exactly 65536 MiB and connects it
  to the pod's node, which sees a dax device of that size; the container gets it through CDI.
  After the pod ends the chunk is gone and the pool as free as before.

Every check reads the system's own records: the claims, the fabric manager, the emulator's
Redfish state, the node's emulated sysfs, the CDI specs the plugin wrote.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver.selection.quantity import QuantityError, parse_quantity
from fabric_dra_testbed.demo.scenario import NAMESPACE, DemoFailure, Scenario, Step, wait_for
from manager_api.devices import MEMORY_CAPACITY
from manager_api.models import BindingState, Device
from manager_api.partitions import PartitionTable, parse_partition
from plumbing.kube import NotFound
from plumbing.kube.dra import DeviceRequestAllocationResult, ResourceClaim
from plumbing.kube.resources import EVENTS, PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

__all__ = ["PARTITIONS_ONLY_WITH_BINDING_CONDITIONS", "Held", "SharingSteps"]

#: why the plain pass shows no partitions (docs/controller.md, "One GPU, one node")
PARTITIONS_ONLY_WITH_BINDING_CONDITIONS = (
    "GPU partitions skipped: without binding conditions only GPUs already on a node offer them "
    '(docs/controller.md, "One GPU, one node"); pass 2 shows them'
)
_MIB = 1 << 20
_GIB = 1 << 30


@dataclass
class Held:
    """What a sharing step found in use, for the step that gives it back."""

    node: str
    #: the demo's pods and the claims they use, by name
    pods: list[str]
    claims: list[ResourceClaim]
    #: the fabric device: the GPU of the partitions, or the memory pool
    device: Device
    #: GPU: the partitions' emulated sysfs directories; memory: the dax device's
    host_paths: list[Path]
    #: memory: the chunk the fabric carved (emulator target Id), and the pool's used MiB before
    chunk: str | None = None
    used_mib_before: int = 0


def _pods(manifest: list[dict[str, Any]]) -> dict[str, str]:
    """The manifest's pods → the one claim each uses (by name)."""
    out = {}
    for obj in manifest:
        if obj.get("kind") != "Pod":
            continue
        claims = [c.get("resourceClaimName") for c in obj["spec"].get("resourceClaims") or []]
        if len(claims) != 1 or not claims[0]:
            raise DemoFailure(f"pod {obj['metadata']['name']} must use exactly one ResourceClaim by name")
        out[obj["metadata"]["name"]] = claims[0]
    if not out:
        raise DemoFailure("the manifest holds no pod")
    return out


def _gpu_of(device: str, tables: dict[str, PartitionTable]) -> str | None:
    placement = parse_partition(device, tables)
    return placement.gpu if placement is not None else None


def _size(value: int) -> str:
    return f"{value // _GIB} GiB" if value % _GIB == 0 else f"{value // _MIB} MiB"


class SharingSteps:
    """The sharing steps, run by the demo after the article's four (see the module's docstring)."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.driver = scenario.stack.options.driver_name

    # -- GPU partitions ---------------------------------------------------------------------------

    async def step_partitions(self, manifest: list[dict[str, Any]], manifest_name: str) -> tuple[Step, Held]:
        step = Step(f"Two pods share one fabric GPU through partitions: kubectl apply -f {manifest_name}")
        pods = _pods(manifest)
        step.observed.extend(await self.s.apply(manifest))
        node, claims = await self._running(pods, step)
        inventory = await self.s.manager.inventory()
        tables: dict[str, PartitionTable] = {
            d.name: d.partition_table for d in inventory.devices if d.partition_table is not None
        }
        results = {c.metadata.name: self._result(c) for c in claims}
        placements = {name: parse_partition(r.device, tables) for name, r in results.items()}
        gpus = {p.gpu for p in placements.values() if p is not None}
        if None in placements.values() or len(gpus) != 1:
            got = ", ".join(r.device for r in results.values())
            raise DemoFailure(f"the claims were not given partitions of one GPU: {got}")
        (gpu_name,) = gpus
        gpu = await self.s.manager.device(gpu_name)
        held = {(h.partition, h.claim_uid, h.node) for h in gpu.partitions}
        wanted = {(results[c.metadata.name].device, c.metadata.uid, node) for c in claims}
        if gpu.state != BindingState.BOUND or gpu.node != node or held != wanted:
            raise DemoFailure(
                f"fabric manager shows {gpu.name} {gpu.state} on {gpu.node} holding {sorted(held)}; "
                f"expected bound to {node} holding {sorted(wanted)}"
            )
        step.observed.append(
            f"fabric manager: {gpu.name} ({gpu.model}) bound once, to {node}, for "
            + " and ".join(f"{p} (claim {uid})" for p, uid, _ in sorted(held))
        )
        for claim in claims:
            result = results[claim.metadata.name]
            step.observed.extend(await self.s.binding_conditions_held(claim, result, result.device))
        binding = self.s.emulator_binding(gpu)
        bindings = [binding] if binding is not None else []
        if [b.get("Host") for b in bindings] != [node]:
            raise DemoFailure(f"the emulated fabric binds {gpu.name} as {bindings}; expected once, to {node}")
        step.observed.append(
            f"Redfish fabric: one {bindings[0]['Style']} binding of {gpu.name} to host {node}, for both pods"
        )
        offered = await wait_for(
            f"{gpu.name}'s placements to be offered on {node} only",
            functools.partial(self._offered_only_on, gpu.name, tables, node),
            self.s.step_timeout,
        )
        step.observed.append(
            f"ResourceSlices: {gpu.name} and its {offered - 1} placements now offered on {node} only "
            "(its node-local slice): one GPU, one node"
        )
        paths = self._partitions_seen(node, gpu, step)
        unused = {(p / "uuid").read_text().strip() for p in paths}
        for pod, claim in zip(pods, claims, strict=True):
            env = self.s.cdi_env(node, claim.metadata.uid)
            uuid = next((v for k, v in env.items() if k.endswith("_PARTITION_UUID")), None)
            if uuid is None or uuid not in unused:
                raise DemoFailure(
                    f"the CDI spec of {pod}'s claim names no partition of {node} not another pod's: {env}"
                )
            unused.discard(uuid)
            shown = {k: v for k, v in env.items() if k.endswith(("_PARTITION_PROFILE", "_PARTITION_UUID"))}
            if "NVIDIA_VISIBLE_DEVICES" in env:
                shown["NVIDIA_VISIBLE_DEVICES"] = env["NVIDIA_VISIBLE_DEVICES"]
            step.observed.append(
                f"{pod}'s container gets (CDI) only its partition: "
                + " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
            )
        step.ok = True
        return step, Held(node, list(pods), claims, gpu, paths)

    async def step_partitions_end(self, held: Held) -> Step:
        step = Step(f"Both pods end, the GPU goes back to the pool: kubectl delete pod {' '.join(held.pods)}")
        await self._end(held, step)
        gpu = held.device

        async def free() -> Device | None:
            current = await self.s.manager.device(gpu.name)
            return current if current.state == BindingState.FREE and not current.partitions else None

        await wait_for(f"{gpu.name} to be back in the free pool", free, self.s.step_timeout)
        step.observed.append(f"fabric manager: {gpu.name} is free, no partition held, no node")
        if self.s.emulator_binding(gpu) is not None:
            raise DemoFailure(f"the emulated fabric still binds {gpu.name}")
        step.observed.append("Redfish fabric: no binding left for it")
        await wait_for(
            f"{gpu.name} to be published whole for every node again",
            functools.partial(self._offered_to_all, gpu.name),
            self.s.step_timeout,
        )
        step.observed.append(f"ResourceSlices: {gpu.name} published whole again, for every node of its pool")
        if self.s.host_pci_dir(held.node, gpu) is not None or any(p.exists() for p in held.host_paths):
            raise DemoFailure(f"{gpu.name} or a partition of it is still visible in {held.node}'s sysfs")
        self._no_cdi_left(held)
        step.observed.append(f"{held.node}: GPU and partitions gone from sysfs, CDI specs removed")
        step.observed.extend(await self._delete_claims(held))
        step.ok = True
        return step

    def _partitions_seen(self, node: str, gpu: Device, step: Step) -> list[Path]:
        """The partitions ``node`` shows under ``gpu``'s PCI directory (the emulated MIG devices)."""
        pci = self.s.host_pci_dir(node, gpu)
        if pci is None:
            raise DemoFailure(f"{gpu.name} is bound but not visible in {node}'s sysfs")
        paths = sorted(p for p in (pci / "mig").glob("*") if (p / "uuid").is_file())
        if len(paths) != len(gpu.partitions):
            raise DemoFailure(
                f"{node} shows {len(paths)} partitions of {gpu.name}; expected {len(gpu.partitions)}"
            )
        seen = [
            f"{(p / 'profile').read_text().strip()} at slice {(p / 'start').read_text().strip()} "
            f"{(p / 'uuid').read_text().strip()}"
            for p in paths
        ]
        step.observed.append(
            f"{node} sees it: PCI {pci.name} serial={gpu.serial}, partitions " + ", ".join(seen)
        )
        return paths

    async def _offered_only_on(self, gpu: str, tables: dict[str, PartitionTable], node: str) -> int | None:
        """How many devices of ``gpu`` (itself and its placements) are published, once all are in
        ``node``'s slice only; else None."""
        where = await self._slice_nodes()
        mine = {d: n for d, n in where.items() if d == gpu or _gpu_of(d, tables) == gpu}
        return len(mine) if mine and set(mine.values()) == {node} else None

    async def _offered_to_all(self, device: str) -> bool | None:
        """True once ``device`` is published in a slice of many nodes (not one node's)."""
        where = await self._slice_nodes()
        return True if device in where and where[device] is None else None

    async def _slice_nodes(self) -> dict[str, str | None]:
        """Every published device of this driver → the node of its slice (None: a slice of many nodes)."""
        items, _ = await self.s.kube.list_all(RESOURCE_SLICES)
        return {
            d["name"]: s["spec"].get("nodeName")
            for s in items
            if s["spec"].get("driver") == self.driver
            for d in s["spec"].get("devices") or []
        }

    # -- CXL memory -------------------------------------------------------------------------------

    async def step_memory(self, manifest: list[dict[str, Any]], manifest_name: str) -> tuple[Step, Held]:
        step = Step(f"A pod gets 64 GiB of CXL memory from a memory pool: kubectl apply -f {manifest_name}")
        pods = _pods(manifest)
        step.observed.extend(await self.s.apply(manifest))
        node, claims = await self._running(pods, step)
        (claim,) = claims
        result = self._result(claim)
        asked = (result.consumed_capacity or {}).get(f"{self.driver}/{MEMORY_CAPACITY}")
        if result.share_id is None or asked is None:
            raise DemoFailure(
                f"claim {claim.metadata.name} got {result.device} without a share of its memory"
            )
        pool = await self.s.manager.device(result.device)
        shares = [
            s for s in (pool.memory_pool.shares if pool.memory_pool else []) if s.share_id == result.share_id
        ]
        if len(shares) != 1 or shares[0].node != node or shares[0].state != BindingState.BOUND:
            raise DemoFailure(f"fabric manager shows share {result.share_id} of {pool.name} as {shares}")
        share = shares[0]
        try:
            consumed = parse_quantity(asked).value
        except QuantityError as err:
            raise DemoFailure(f"claim {claim.metadata.name} consumes memory {asked!r}: {err}") from err
        if share.memory_bytes != consumed:
            raise DemoFailure(f"the fabric carved {share.memory_bytes} bytes; the allocation has {asked}")
        step.observed.append(
            f"fabric manager: {pool.name} share {share.share_id} of {_size(share.memory_bytes)} carved and "
            f"connected to {node} for claim {claim.metadata.uid}"
        )
        step.observed.extend(await self.s.binding_conditions_held(claim, result, result.device))
        fabric_pool = self._emulator_pool(pool)
        chunk = self._emulator_chunk(fabric_pool, node, share.memory_bytes)
        used_before = fabric_pool["UsedMiB"] - chunk["SizeMiB"]
        step.observed.append(
            f"Redfish fabric: chunk {chunk['Target']} of {chunk['SizeMiB']} MiB made in "
            f"{fabric_pool['MemoryDomain']} and connected to host {node}; the pool has "
            f"{fabric_pool['FreeMiB']} of {fabric_pool['SizeMiB']} MiB free"
        )
        env = self.s.cdi_env(node, claim.metadata.uid)
        dax = next((v for k, v in env.items() if k.endswith("_DAX")), None)
        path = self.s.stack.sysfs_root(node) / "bus" / "dax" / "devices" / (dax or "-")
        if dax is None or not path.exists():
            raise DemoFailure(
                f"the CDI spec of claim {claim.metadata.uid} names no dax device {node} has: {env}"
            )
        size = int((path / "size").read_text())
        if size != share.memory_bytes:
            raise DemoFailure(f"{node}'s {dax} holds {size} bytes; the share is {share.memory_bytes}")
        step.observed.append(
            f"{node} sees it: {dax}, {_size(size)} ({size} bytes) of CXL memory in ram mode, "
            f"on CPU-less NUMA node {(path / 'target_node').read_text().strip()}"
        )
        # the share's variables carry its device and share ID: the prefix once, then each name's end
        prefix = next(k for k in env if k.endswith("_DAX"))[: -len("DAX")]
        shown = {
            k[len(prefix) :]: v
            for k, v in env.items()
            if k.startswith(prefix)
            and k.endswith(("DAX", "MEMORY_BYTES", "MEMORY_MODE", "CXL_REGION", "DEVICE_NODES"))
        }
        step.observed.append(
            f"the container gets (CDI): {prefix}{{"
            + " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
            + "}"
        )
        step.ok = True
        return step, Held(node, list(pods), claims, pool, [path], chunk["Target"], used_before)

    async def step_memory_end(self, held: Held) -> Step:
        step = Step(f"The pod ends, the memory goes back: kubectl delete pod {' '.join(held.pods)}")
        await self._end(held, step)
        pool = held.device

        async def free() -> Device | None:
            current = await self.s.manager.device(pool.name)
            return current if current.memory_pool is not None and not current.memory_pool.shares else None

        await wait_for(f"{pool.name}'s share to be given back", free, self.s.step_timeout)
        step.observed.append(f"fabric manager: {pool.name} holds no share")
        fabric_pool = self._emulator_pool(pool)
        if any(c["Target"] == held.chunk for c in fabric_pool["Chunks"]) or self._emulator_bindings(
            fabric_pool["Device"], target=held.chunk
        ):
            raise DemoFailure(f"the emulated fabric still holds chunk {held.chunk} or its connection")
        if fabric_pool["UsedMiB"] != held.used_mib_before:
            raise DemoFailure(
                f"{pool.name} has {fabric_pool['UsedMiB']} MiB in use; "
                f"{held.used_mib_before} MiB before the pod"
            )
        step.observed.append(
            f"Redfish fabric: chunk {held.chunk} and its connection deleted; the pool has "
            f"{fabric_pool['FreeMiB']} of {fabric_pool['SizeMiB']} MiB free again"
        )
        if any(p.exists() for p in held.host_paths):
            raise DemoFailure(f"{held.host_paths[0].name} is still visible in {held.node}'s sysfs")
        self._no_cdi_left(held)
        step.observed.append(f"{held.node}: dax device gone from sysfs, CDI spec removed")
        step.observed.extend(await self._delete_claims(held))
        step.ok = True
        return step

    def _emulator_pool(self, device: Device) -> dict[str, Any]:
        """The emulator's record of the memory pool ``device`` is (its MemoryDomain)."""
        pools = self.s.stack.redfish_get("/redfish/v1/Oem/FabricDRA/Bindings").get("Pools", [])
        found = next((p for p in pools if p.get("MemoryDomain") == device.redfish_uri), None)
        if found is None:
            raise DemoFailure(f"the emulated fabric has no memory pool at {device.redfish_uri}")
        return dict(found)

    def _emulator_chunk(self, pool: dict[str, Any], node: str, size_bytes: int) -> dict[str, Any]:
        """The chunk of ``pool`` connected to ``node`` with ``size_bytes``, as the emulator holds it."""
        connected = {b["Target"] for b in self._emulator_bindings(pool["Device"]) if b.get("Host") == node}
        chunks = [c for c in pool["Chunks"] if c["Target"] in connected and c["SizeMiB"] * _MIB == size_bytes]
        if len(chunks) != 1:
            raise DemoFailure(
                f"the emulated fabric holds {len(chunks)} chunks of {_size(size_bytes)} on {node}"
            )
        return dict(chunks[0])

    # -- both -------------------------------------------------------------------------------------

    def _emulator_bindings(self, device: str, *, target: str | None = None) -> list[dict[str, Any]]:
        bindings = self.s.stack.redfish_get("/redfish/v1/Oem/FabricDRA/Bindings").get("Bindings", [])
        return [b for b in bindings if b.get("Device") == device and target in (None, b.get("Target"))]

    def _result(self, claim: ResourceClaim) -> DeviceRequestAllocationResult:
        results = claim.results_for(self.driver)
        if len(results) != 1:
            raise DemoFailure(
                f"claim {claim.metadata.name} has {len(results)} devices of {self.driver}; expected 1"
            )
        return results[0]

    async def _running(self, pods: dict[str, str], step: Step) -> tuple[str, list[ResourceClaim]]:
        """Until every pod runs; the one node they run on and their claims (in the pods' order)."""

        async def running() -> dict[str, str] | None:
            nodes = {}
            for name in pods:
                try:
                    pod = await self.s.kube.get(PODS, name, NAMESPACE)
                except NotFound:
                    return None
                if (pod.get("status") or {}).get("phase") != "Running":
                    return None
                nodes[name] = pod["spec"]["nodeName"]
            return nodes

        try:
            nodes = await wait_for(f"pods {', '.join(pods)} to run", running, self.s.step_timeout)
        except DemoFailure as failure:
            raise DemoFailure(f"{failure}{await self._last_events(pods)}") from failure
        if len(set(nodes.values())) != 1:
            raise DemoFailure(f"the pods run on different nodes: {nodes}")
        claims = []
        width = max(len(c) for c in pods.values()) + 2
        step.observed.append(f"{'POD':<14}{'NODE':<14}{'CLAIM':<{width}}DEVICE")
        for name, claim_name in pods.items():
            claim = ResourceClaim.model_validate(
                await self.s.kube.get(RESOURCE_CLAIMS, claim_name, NAMESPACE)
            )
            result = self._result(claim)
            share = ""
            if result.share_id:
                memory = (result.consumed_capacity or {}).get(f"{self.driver}/{MEMORY_CAPACITY}")
                share = f"  share {result.share_id}: {memory}"
            step.observed.append(
                f"{name:<14}{nodes[name]:<14}{claim_name:<{width}}"
                f"{result.driver}/{result.pool}/{result.device}{share}"
            )
            claims.append(claim)
        return next(iter(nodes.values())), claims

    async def _last_events(self, pods: dict[str, str]) -> str:
        """Each pod's latest Event (e.g. why it cannot be scheduled), as "; pod: reason: note"."""
        events, _ = await self.s.kube.list_all(EVENTS, NAMESPACE)
        out = ""
        for pod in pods:
            mine = [e for e in events if (e.get("regarding") or {}).get("name") == pod]
            if mine:
                last = max(mine, key=lambda e: e.get("eventTime") or "")
                out += f"; {pod}: {last.get('reason', '')}: {last.get('note', '')}"
        return out

    async def _end(self, held: Held, step: Step) -> None:
        """Delete the pods; until their claims are released (no longer reserved, nor allocated)."""
        for pod in held.pods:
            await self.s.kube.delete(PODS, pod, NAMESPACE)
            step.observed.append(f'pod "{pod}" deleted')

        async def released() -> bool | None:
            for claim in held.claims:
                current = ResourceClaim.model_validate(
                    await self.s.kube.get(RESOURCE_CLAIMS, claim.metadata.name, NAMESPACE)
                )
                if current.status.reserved_for or current.allocated:
                    return None
            return True

        await wait_for("the claims to be released", released, self.s.step_timeout)
        names = ", ".join(c.metadata.name for c in held.claims)
        step.observed.append(f"resourceclaim {names}: released (reserved by no pod, deallocated)")

    def _no_cdi_left(self, held: Held) -> None:
        for claim in held.claims:
            if self.s.cdi_files(held.node, claim.metadata.uid):
                raise DemoFailure(f"CDI spec of claim {claim.metadata.uid} is still on {held.node}")

    async def _delete_claims(self, held: Held) -> list[str]:
        """The claims deleted, so that the next pass applies the manifest afresh."""
        lines = []
        for claim in held.claims:
            await self.s.kube.delete(RESOURCE_CLAIMS, claim.metadata.name, NAMESPACE)
            lines.append(f'resourceclaim.resource.k8s.io "{claim.metadata.name}" deleted')
        return lines
