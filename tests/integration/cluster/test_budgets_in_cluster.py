"""A DeviceBudget through the whole binding-condition flow (docs/budgets.md, "Enforcement"): the
API test server serving the DeviceBudget CRD, the emulator, the fabric manager reading claims and
budgets, the controller (binding conditions) and the stand-in scheduler and kubelet on the
emulator's host ``kind-worker``. A budget of two ``fabric-gpu`` devices for a label tree; three pods
of that tree, each with a one-GPU claim: two run, the third stays Pending — its binding fails at
once with reason ``BudgetExceeded`` and its claim gets the manager's Event — and runs once one of
the first two is deleted."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from dra_driver.plugin.prepare_errors import attach_failure
from dra_driver.proto.dra_v1 import api_pb2 as dra_v1
from fabric_dra_testbed.stack import Stack, short_dir
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from manager_api.client import ManagerClient
from manager_api.errors import FabricError
from plumbing.kube import KubeClient
from plumbing.kube.resources import DEVICE_BUDGETS, DEVICE_CLASSES, EVENTS, PODS, RESOURCE_CLAIMS, Resource
from tests.integration.cluster.conftest import DRIVER, FakePlugin
from tests.integration.cluster.test_stand_in_cluster import World, running
from tests.support.waiting import eventually

REPO = Path(__file__).resolve().parents[3]
CRD_FILE = REPO / "deploy" / "base" / "devicebudget-crd.yaml"
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
CONTROLLER_TOKEN = "controller-token-for-budget-tests-01"
PLUGIN_TOKEN = "plugin-token-for-budget-tests-0001"
NODE = "kind-worker"
TREE_KEY = "agents.example.com/tree"
CLASS = "fabric-gpu"


@dataclass
class Fabric:
    manager_url: str
    #: the controller's base URL (its ``/metrics``)
    controller_url: str


@contextlib.contextmanager
def fabric_and_controller(apiserver_url: str, *, binding_conditions: bool = True) -> Iterator[Fabric]:
    """The emulator, a manager with API access (a controller token, and a plugin token for
    ``kind-worker``), the controller with or without binding conditions."""
    root = short_dir("fdbu-")
    kubeconfig = root / "kubeconfig"
    write_kubeconfig(kubeconfig, apiserver_url)
    token_file = root / "controller.token"
    token_file.write_text(CONTROLLER_TOKEN + "\n")
    with contextlib.ExitStack() as cleanup, Stack(root, logs_dir=root) as stack:
        cleanup.callback(shutil.rmtree, root, ignore_errors=True)
        emulator = stack.emulator(state_dir=root / "emu", auth=False)
        manager = stack.manager(
            emulator,
            kube=kubeconfig,
            namespace="default",
            state_dir=root / "manager",
            static_tokens={CONTROLLER_TOKEN: ("controller", None), PLUGIN_TOKEN: ("plugin", NODE)},
        )
        controller = stack.controller(
            manager,
            kubeconfig,
            token_file=token_file,
            binding_conditions=binding_conditions,
            args=["--driver-name", DRIVER],
        )
        yield Fabric(manager.url, f"http://127.0.0.1:{controller.port}")


async def _crd(kube: KubeClient) -> None:
    try:
        await kube.create(CRDS, yaml.safe_load(CRD_FILE.read_text()))
    except Exception as err:
        status = getattr(err, "status", None)
        if status == 404:
            pytest.skip("this API test server serves no apiextensions.k8s.io/v1 CustomResourceDefinitions")
        if status != 409:  # created by an earlier test of the session
            raise


async def _claims_and_pods(world: World, count: int) -> None:
    for i in range(count):
        await world.kube.create(
            RESOURCE_CLAIMS,
            {
                "metadata": {
                    "name": f"agent-{i}-gpu",
                    "namespace": world.ns,
                    "labels": {TREE_KEY: "task-847"},
                },
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}},
            },
            world.ns,
        )
    for i in range(count):
        await world.kube.create(
            PODS,
            {
                "metadata": {"name": f"agent-{i}", "namespace": world.ns},
                "spec": {
                    "resourceClaims": [{"name": "gpu", "resourceClaimName": f"agent-{i}-gpu"}],
                    "containers": [
                        {"name": "agent", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
                    ],
                },
            },
            world.ns,
        )


async def _phases(world: World) -> dict[str, str]:
    items, _ = await world.kube.list_all(PODS, world.ns)
    return {p["metadata"]["name"]: (p.get("status") or {}).get("phase", "") for p in items}


@contextlib.asynccontextmanager
async def tree_world(kube: KubeClient, plugin: FakePlugin) -> AsyncIterator[World]:
    """The stand-in control plane on NODE, the class ``fabric-gpu`` and a DeviceBudget of two of
    its devices for the tree ``task-847``."""
    await _crd(kube)
    async with running(kube, plugin, node_names=[NODE]) as world:
        expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'
        await kube.create(
            DEVICE_CLASSES,
            {"metadata": {"name": CLASS}, "spec": {"selectors": [{"cel": {"expression": expression}}]}},
        )
        budget = {
            "apiVersion": "fabric-dra.io/v1alpha1",
            "kind": "DeviceBudget",
            "metadata": {"name": "research"},
            "spec": {
                "tree": {"label": {"key": TREE_KEY, "value": "task-847"}},
                "limits": {"devices": [{"deviceClassName": CLASS, "max": 2}]},
            },
        }
        await kube.create(DEVICE_BUDGETS, budget, world.ns)
        try:
            yield world
        finally:
            await kube.delete_ignore_missing(DEVICE_CLASSES, CLASS)


async def two_running_one_waiting(world: World, reason: str) -> tuple[dict[str, str], str]:
    """Once two pods run and an Event ``reason`` is recorded: the phases and the waiting pod."""

    async def seen() -> dict[str, str] | None:
        phases = await _phases(world)
        events, _ = await world.kube.list_all(EVENTS, world.ns)
        refused = [e for e in events if e.get("reason") == reason]
        return phases if sorted(phases.values()).count("Running") == 2 and refused else None

    phases = await eventually(seen, what=f"two pods Running, one waiting with {reason}", within=60)
    (waiting,) = [n for n, p in phases.items() if p != "Running"]
    return phases, waiting


async def budget_events(world: World) -> list[dict[str, Any]]:
    events, _ = await world.kube.list_all(EVENTS, world.ns)
    return [e for e in events if e.get("reason") == "BudgetExceeded"]


async def test_the_third_pod_of_a_tree_stays_pending_until_one_of_the_first_two_ends(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str
) -> None:
    async with tree_world(kube, fake_plugin) as world:
        with fabric_and_controller(apiserver_url) as fabric:
            started = time.monotonic()
            await _claims_and_pods(world, 3)
            phases, waiting = await two_running_one_waiting(world, "BudgetExceeded")
            refused = await budget_events(world)
            assert {e["regarding"]["name"] for e in refused} == {f"{waiting}-gpu"}
            assert "holds 2 of 2 fabric-gpu devices" in refused[0]["note"]
            print(f"budget: 2 Running, {waiting} Pending {time.monotonic() - started:.1f}s after creation")
            # The controller failed the binding at once with the manager's reason, never by its
            # deadline (Timeout): the scheduler tried again and the pod stayed Pending.
            failed = await _binding_failures(fabric.controller_url)
            assert failed.get("BudgetExceeded", 0) >= 1 and "Timeout" not in failed, failed

            async def counted() -> dict[str, Any] | None:
                status = (await kube.get(DEVICE_BUDGETS, "research", world.ns)).get("status") or {}
                trees = status.get("trees") or []
                return status if trees and trees[0]["used"]["devices"][0]["used"] == 2 else None

            status = await eventually(counted, what="the budget's status at 2 of 2", within=20)
            assert status["conditions"][0]["status"] == "True"

            # One of the first two ends: the third runs.
            first = next(n for n, p in phases.items() if p == "Running")
            await kube.delete(PODS, first, world.ns)
            await kube.delete(RESOURCE_CLAIMS, f"{first}-gpu", world.ns)
            ended = time.monotonic()

            async def third_running() -> bool:
                return (await _phases(world)).get(waiting) == "Running"

            await eventually(third_running, what=f"{waiting} Running once {first} ended", within=90)
            print(f"budget: {waiting} Running {time.monotonic() - ended:.1f}s after {first} was deleted")


async def test_without_binding_conditions_the_third_prepare_is_refused_until_one_ends(
    kube: KubeClient, fake_plugin: FakePlugin, apiserver_url: str
) -> None:
    """The plain flow: the plugin attaches at prepare (here the fake plugin does what the real one
    does: attach through the manager, answer the kubelet with prepare_errors' line); the kubelet
    retries the refused prepare until the tree has room."""
    async with tree_world(kube, fake_plugin) as world:
        with fabric_and_controller(apiserver_url, binding_conditions=False) as fabric:
            attached: dict[str, tuple[str, str]] = {}

            async def attach(claim: dra_v1.Claim, node: str) -> str:
                obj = await kube.get(RESOURCE_CLAIMS, claim.name, claim.namespace)
                (result,) = obj["status"]["allocation"]["devices"]["results"]
                async with ManagerClient(fabric.manager_url, token=PLUGIN_TOKEN, timeout=30) as client:
                    try:
                        await client.attach(
                            result["device"], node, claim.uid, pool=result["pool"], wait_seconds=20
                        )
                    except FabricError as err:
                        return attach_failure(err, result["device"], node, claim.uid)
                attached[claim.name] = (result["device"], claim.uid)
                return ""

            fake_plugin.attach = attach
            await _claims_and_pods(world, 3)
            phases, waiting = await two_running_one_waiting(world, "FailedPrepareDynamicResources")
            events, _ = await kube.list_all(EVENTS, world.ns)
            prepare = [e for e in events if e.get("reason") == "FailedPrepareDynamicResources"]
            assert all(e["regarding"]["name"] == waiting for e in prepare), prepare
            assert "holds 2 of 2 fabric-gpu devices" in prepare[0]["note"]
            assert "the kubelet retries the prepare" in prepare[0]["note"]
            assert {e["regarding"]["name"] for e in await budget_events(world)} == {f"{waiting}-gpu"}

            # One of the first two ends (its plugin would detach at unprepare): the third runs.
            first = next(n for n, p in phases.items() if p == "Running")
            await kube.delete(PODS, first, world.ns)
            device, uid = attached[f"{first}-gpu"]
            async with ManagerClient(fabric.manager_url, token=PLUGIN_TOKEN, timeout=30) as client:
                await client.detach(device, NODE, uid, wait_seconds=20)

            async def third_running() -> bool:
                return (await _phases(world)).get(waiting) == "Running"

            await eventually(third_running, what=f"{waiting} Running once {first} ended", within=90)


async def _binding_failures(controller_url: str) -> dict[str, float]:
    """The controller's failed bindings by reason (``fabric_dra_controller_binding_results``)."""
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"{controller_url}/metrics")).text
    return {
        sample.labels["reason"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "fabric_dra_controller_binding_results_total"
        and sample.labels.get("result") == "failed"
    }
