"""The composable-DRA article's scenario, verified step by step on one machine.

The article ("Beyond Fixed Node Allocation") deploys a ResourceClaimTemplate that asks for one
``cohdi-pcie-device`` and a Deployment that uses it, then verifies four things. Each
:class:`Step` here does what the article's step does and checks, from the system's own
records, what the article asks the reader to look at:

1. *Deploy the manifest* — ``kubectl apply -f agent-infrastructure.yaml``.
2. *Verify claim creation* — the generated ResourceClaim is allocated once the pod is scheduled.
3. *Check host device attachment* — the pod runs; its events and the driver's log show the
   prepare; the fabric (manager and the emulator's own state) binds the device to the pod's
   node; that node's sysfs shows it; the CDI spec the container gets names it.
4. *Test dynamic detachment* — after scaling to zero the claim is released, the device is
   detached from the host and back in the free pool.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dra_driver.plugin.cdi import spec_files_of_claim
from fabric_dra_testbed.stack import DemoStack
from kube_standin.cluster import NodeSpec, StandInCluster
from manager_api.client import ManagerClient
from manager_api.models import BindingState, Device
from plumbing.backoff import Backoff
from plumbing.kube import AlreadyExists, KubeClient, NotFound, load_config
from plumbing.kube.dra import DeviceRequestAllocationResult, ResourceClaim
from plumbing.kube.resources import (
    DEPLOYMENTS,
    EVENTS,
    NAMESPACES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    resource_api,
)

__all__ = ["DemoFailure", "Scenario", "Step", "load_manifest"]

T = TypeVar("T")
NAMESPACE = "agent-platform"
APP_LABEL = "app=agent-inference-worker"
DEPLOYMENT = "agent-inference-worker"


class DemoFailure(Exception):
    """A verification did not hold; the message says what was expected and what was seen."""


@dataclass
class Step:
    title: str
    observed: list[str] = field(default_factory=list)
    ok: bool = False


def load_manifest(path: Path) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except (OSError, yaml.YAMLError) as err:
        raise DemoFailure(f"cannot read manifest {path}: {err}") from err
    if not docs:
        raise DemoFailure(f"manifest {path} holds no objects")
    return docs


async def wait_for(what: str, probe: Callable[[], Awaitable[T | None]], within: float) -> T:
    """Poll ``probe`` until it returns a value; fail with ``what`` after ``within`` seconds."""
    deadline = time.monotonic() + within
    # A local poll for the demo's own output: no jitter.
    backoff = Backoff(initial=0.05, maximum=0.5, factor=1.5, jitter=0)
    while True:
        value = await probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise DemoFailure(f"timed out after {within:.0f}s waiting for {what}")
        await backoff.sleep()


class Scenario:
    """Runs the four steps against a started :class:`DemoStack`."""

    def __init__(self, stack: DemoStack, say: Callable[[str], None], *, step_timeout: float = 40.0) -> None:
        self.stack = stack
        self.say = say
        self.step_timeout = step_timeout
        self.kube = KubeClient(load_config(str(stack.admin_kubeconfig)))
        self.manager = ManagerClient(stack.manager_url, token=stack.operator_token)
        self.cluster: StandInCluster | None = None
        self._cluster_task: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        if self._cluster_task is not None:
            self._cluster_task.cancel()
            await asyncio.gather(self._cluster_task, return_exceptions=True)
        await self.manager.aclose()
        await self.kube.aclose()

    # -- control plane ----------------------------------------------------------------------------

    async def apply(self, objects: list[dict[str, Any]]) -> list[str]:
        """Create or replace each object, as ``kubectl apply`` would; returns kubectl-style lines."""
        lines = []
        for obj in objects:
            res = resource_api(obj["apiVersion"], obj["kind"])
            meta = obj.get("metadata") or {}
            namespace = meta.get("namespace") if res.namespaced else None
            try:
                current = await self.kube.get(res, meta["name"], namespace)
            except NotFound:
                await self.kube.create(res, obj, namespace)
                verb = "created"
            else:
                merged = {
                    **obj,
                    "metadata": {**meta, "resourceVersion": current["metadata"]["resourceVersion"]},
                }
                await self.kube.replace(res, merged)
                verb = "configured"
            group = f".{res.group}" if res.group else ""
            lines.append(f"{res.kind.lower()}{group}/{meta['name']} {verb}")
        return lines

    async def start_cluster(self, device_classes: list[dict[str, Any]]) -> None:
        await self.apply(device_classes)
        nodes = [NodeSpec(node.name, registry_dir=node.registry_dir) for node in self.stack.nodes]
        self.cluster = StandInCluster(self.kube, nodes)
        self._cluster_task = asyncio.create_task(self.cluster.run(), name="stand-in-cluster")

    async def wait_pool_published(self, *, binding_conditions: bool) -> int:
        """Until the controller's slices hold the fabric's devices (with binding conditions if asked)."""

        async def probe() -> int | None:
            if self._cluster_task is not None and self._cluster_task.done():
                self._cluster_task.result()  # surfaces the stand-in's failure
            items, _ = await self.kube.list_all(RESOURCE_SLICES)
            devices = [
                d
                for s in items
                if s["spec"].get("driver") == self.stack.options.driver_name
                for d in s["spec"].get("devices") or []
            ]
            if not devices:
                return None
            if binding_conditions != all(bool(d.get("bindingConditions")) for d in devices):
                return None
            return len(devices)

        return await wait_for("the controller to publish the pool as ResourceSlices", probe, 30.0)

    async def wait_plugins_registered(self) -> None:
        """Every node's plugin has a registration socket the stand-in kubelet can dial."""

        async def probe() -> bool | None:
            for node in self.stack.nodes:
                if not any(node.registry_dir.glob("*-reg.sock")):
                    return None
            return True

        await wait_for("every node's plugin to register", probe, 30.0)

    # -- the four steps -----------------------------------------------------------------------------

    async def step_deploy(self, manifest: list[dict[str, Any]], manifest_name: str) -> Step:
        step = Step(f"Deploy the manifest: kubectl apply -f {manifest_name}")
        try:
            await self.kube.create(NAMESPACES, {"metadata": {"name": NAMESPACE}})
            step.observed.append(f"namespace/{NAMESPACE} created")
        except AlreadyExists:  # from an earlier pass
            step.observed.append(f"namespace/{NAMESPACE} unchanged")
        step.observed.extend(await self.apply(manifest))
        step.ok = True
        return step

    async def step_claim(self) -> tuple[Step, ResourceClaim]:
        step = Step(f"Verify claim creation: kubectl get resourceclaims -n {NAMESPACE}")

        async def allocated() -> ResourceClaim | None:
            items, _ = await self.kube.list_all(RESOURCE_CLAIMS, NAMESPACE)
            for obj in items:
                claim = ResourceClaim.read(obj)
                if claim is not None and claim.allocated and claim.status.reserved_for:
                    return claim
            return None

        claim = await wait_for("the generated ResourceClaim to be allocated", allocated, self.step_timeout)
        name = claim.metadata.name
        width = max(len(name), 4) + 2
        step.observed.append(f"{'NAME':<{width}}{'STATE':<20}DEVICE")
        for result in claim.results:
            step.observed.append(
                f"{name:<{width}}{'allocated,reserved':<20}{result.driver}/{result.pool}/{result.device}"
            )
        if not claim.results_for(self.stack.options.driver_name):
            raise DemoFailure(f"claim {name} has no device of {self.stack.options.driver_name}")
        step.ok = True
        return step, claim

    async def step_attach(self, claim: ResourceClaim) -> tuple[Step, Device, str]:
        step = Step(f"Check host device attachment: kubectl describe pod -l {APP_LABEL} -n {NAMESPACE}")
        uid = claim.metadata.uid
        result = claim.results_for(self.stack.options.driver_name)[0]

        async def running() -> dict[str, Any] | None:
            items, _ = await self.kube.list_all(PODS, NAMESPACE, label_selector=APP_LABEL)
            for pod in items:
                if (pod.get("status") or {}).get("phase") == "Running":
                    return pod
            return None

        pod = await wait_for("the pod to run", running, self.step_timeout)
        node = pod["spec"]["nodeName"]
        step.observed.append(f"Name: {pod['metadata']['name']}   Node: {node}   Status: Running")
        events, _ = await self.kube.list_all(EVENTS, NAMESPACE)
        for event in sorted(events, key=lambda e: e.get("eventTime") or ""):
            if (event.get("regarding") or {}).get("name") == pod["metadata"]["name"]:
                step.observed.append(f"  Event  {event.get('reason', ''):<24} {event.get('note', '')}")

        device = await self.manager.device(result.device)
        if device.state != BindingState.BOUND or device.node != node or device.claim_uid != uid:
            raise DemoFailure(
                f"fabric manager shows {device.name} as {device.state} on {device.node} for claim "
                f"{device.claim_uid}; expected bound to {node} for {uid}"
            )
        step.observed.append(
            f"fabric manager: {device.name} ({device.type} {device.model}) bound to {node} for claim {uid}"
        )
        step.observed.extend(await self.binding_conditions_held(claim, result, device.name))
        binding = self.emulator_binding(device)
        if binding is None or binding.get("Host") != node:
            raise DemoFailure(f"the emulated fabric does not bind {device.redfish_uri} to {node}: {binding}")
        step.observed.append(
            f"Redfish fabric: {binding['Style']} binding of {binding['Target']} to host {binding['Host']}"
        )
        visible = self.host_view(node, device)
        if visible is None:
            raise DemoFailure(f"{device.name} is bound but not visible in {node}'s sysfs")
        step.observed.append(f"{node} sees it: {visible}")
        env = self.cdi_env(node, uid)
        if not any(device.name in value for value in env.values()):
            raise DemoFailure(f"the CDI spec of claim {uid} on {node} does not name {device.name}")
        shown = {k: v for k, v in env.items() if k.endswith(("_DEVICE", "_MODEL", "_PCI_ADDRESS", "_SERIAL"))}
        step.observed.append(
            "the container gets (CDI): " + " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
        )
        log_line = self.log_line(f"plugin-{node}", uid, "prepare")
        if log_line:
            step.observed.append(f"driver log: {log_line}")
        step.ok = True
        return step, device, node

    async def step_detach(self, claim: ResourceClaim, device: Device, node: str) -> Step:
        step = Step(
            f"Test dynamic detachment: kubectl scale deployment {DEPLOYMENT} --replicas=0 -n {NAMESPACE}"
        )
        await self.kube.patch(
            DEPLOYMENTS, DEPLOYMENT, {"spec": {"replicas": 0}}, NAMESPACE, subresource="scale"
        )
        step.observed.append(f"deployment.apps/{DEPLOYMENT} scaled")
        uid = claim.metadata.uid

        async def released() -> bool | None:
            try:
                current = await self.kube.get(RESOURCE_CLAIMS, claim.metadata.name, NAMESPACE)
            except NotFound:
                return True  # a claim generated from a template goes with its pod
            view = ResourceClaim.read(current)
            return True if view is None or not view.status.reserved_for else None

        await wait_for("the claim to be released", released, self.step_timeout)
        step.observed.append(f"resourceclaim {claim.metadata.name}: released and deleted with its pod")

        async def free() -> Device | None:
            current = await self.manager.device(device.name)
            return current if current.state == BindingState.FREE else None

        freed = await wait_for(f"{device.name} to be back in the free pool", free, self.step_timeout)
        step.observed.append(f"fabric manager: {freed.name} is {freed.state}, no node, no claim")
        if self.emulator_binding(device) is not None:
            raise DemoFailure(f"the emulated fabric still binds {device.redfish_uri}")
        step.observed.append("Redfish fabric: no binding left for it")
        if self.host_view(node, device) is not None:
            raise DemoFailure(f"{device.name} is still visible in {node}'s sysfs")
        if self.cdi_files(node, uid):
            raise DemoFailure(f"CDI spec of claim {uid} is still on {node}")
        step.observed.append(f"{node}: device gone from sysfs, CDI spec removed")
        log_line = self.log_line("manager", uid, "detach")
        if log_line:
            step.observed.append(f"fabric manager log: {log_line}")
        step.ok = True
        return step

    # -- what the system records ----------------------------------------------------------------

    async def binding_conditions_held(
        self, claim: ResourceClaim, result: DeviceRequestAllocationResult, label: str
    ) -> list[str]:
        """A line per binding condition of ``result``, each True in the claim's status (none in the
        plain flow)."""
        if not result.binding_conditions:
            return []
        # The scheduler binds the pod only once every binding condition is True (KEP-5007), so
        # a True condition here means the controller attached the device before the pod was bound.
        current = ResourceClaim.model_validate(
            await self.kube.get(RESOURCE_CLAIMS, claim.metadata.name, NAMESPACE)
        )
        entry = current.status.device_status(result)
        lines = []
        for wanted in result.binding_conditions:
            condition = entry.condition(wanted) if entry is not None else None
            if condition is None or condition.status != "True":
                raise DemoFailure(f"binding condition {wanted} of {label} is not True: {condition}")
            lines.append(
                f"claim status.devices[{label}]: {wanted}=True ({condition.reason}), "
                "set by the controller before the pod was bound"
            )
        return lines

    def emulator_binding(self, device: Device) -> dict[str, Any] | None:
        target = device.redfish_uri.rstrip("/").rsplit("/", 1)[-1]
        bindings = self.stack.redfish_get("/redfish/v1/Oem/FabricDRA/Bindings").get("Bindings", [])
        return next((b for b in bindings if b.get("Target") == target), None)

    def host_pci_dir(self, node: str, device: Device) -> Path | None:
        """``device``'s PCI directory in ``node``'s sysfs (found by its serial), if the node sees it."""
        pci = self.stack.sysfs_root(node) / "bus" / "pci" / "devices"
        for entry in sorted(pci.glob("*")):
            serial = entry / "serial"
            if serial.exists() and device.serial and serial.read_text().strip() == device.serial:
                return entry
        return None

    def host_view(self, node: str, device: Device) -> str | None:
        entry = self.host_pci_dir(node, device)
        if entry is None:
            return None
        return (
            f"PCI {entry.name} vendor={(entry / 'vendor').read_text().strip()} "
            f"device={(entry / 'device').read_text().strip()} serial={device.serial}"
        )

    def cdi_files(self, node: str, claim_uid: str) -> list[Path]:
        root = next(n.cdi_root for n in self.stack.nodes if n.name == node)
        return spec_files_of_claim(root, self.stack.options.driver_name, claim_uid)

    def cdi_env(self, node: str, claim_uid: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for path in self.cdi_files(node, claim_uid):
            spec = json.loads(path.read_text())
            for dev in spec.get("devices", []):
                for entry in (dev.get("containerEdits") or {}).get("env", []):
                    key, _, value = entry.partition("=")
                    env[key] = value
        return env

    def log_line(self, role: str, needle: str, word: str) -> str | None:
        try:
            lines = self.stack.log_file(role).read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return None
        for line in lines:
            if needle in line and word in line.lower():
                return line[:240]
        return None
