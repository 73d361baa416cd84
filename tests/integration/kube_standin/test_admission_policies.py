"""The ValidatingAdmissionPolicies of deploy/base/admission-policy.yaml, created in the API test
server and evaluated by it on every write, as a real server does: a kubelet plugin writes the
status only of claims allocated to its own node (and only status.devices), and ResourceSlices
only of its own node — with the identity of a pod-bound service-account token, whose
``authentication.kubernetes.io/node-name`` names the node.

The last test runs the plugin itself: a ``fabric-dra plugin`` of node-a asked (over its DRA
socket) to prepare a claim allocated to node-b prepares it, and its status write is refused.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from fabric_dra_testbed.stack import ApiServer, Stack, short_dir
from kube_standin.apiserver.kubeconfig import write_kubeconfig
from plumbing.kube import ApiError, Forbidden, KubeClient
from plumbing.kube.resources import RESOURCE_CLAIMS, RESOURCE_SLICES, Resource
from tests.support.deploy import REPO_ROOT
from tests.support.plugin import DRIVER, ClaimRef, DraCaller

POLICIES = Resource(
    "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies", "ValidatingAdmissionPolicy", False
)
BINDINGS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    False,
)
STATUS_POLICY = "fabric-dra-plugin-claim-status"
SLICE_POLICY = "fabric-dra-plugin-resourceslices"
PLUGIN_SA = ("fabric-dra", "fabric-dra-plugin")


class Cluster:
    def __init__(self, stack: Stack, api: ApiServer) -> None:
        self.stack = stack
        self.api = api
        self.tokens: dict[str | None, str] = {}

    def plugin_token(self, node: str | None) -> str:
        if node not in self.tokens:
            self.tokens[node] = self.api.service_account_token(*PLUGIN_SA, node=node, pod=f"plugin-{node}")
        return self.tokens[node]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    root = short_dir("fdv-")
    with Stack(root, logs_dir=root) as stack:
        api = stack.apiserver(root=root / "api")

        async def install() -> None:
            async with api.client() as admin:
                for doc in yaml.safe_load_all((REPO_ROOT / "deploy/base/admission-policy.yaml").read_text()):
                    await admin.create(
                        POLICIES if doc["kind"] == "ValidatingAdmissionPolicy" else BINDINGS, doc
                    )

        asyncio.run(install())
        yield Cluster(stack, api)


@pytest_asyncio.fixture
async def admin(cluster: Cluster) -> AsyncIterator[KubeClient]:
    async with cluster.api.client() as client:
        yield client


def _pinned(node: str) -> dict[str, Any]:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"nodeSelectorTerms": [term]}


UNPINNED = {
    "nodeSelectorTerms": [{"matchExpressions": [{"key": "fabric-dra.io/pool-pcie", "operator": "Exists"}]}]
}


async def _claim(admin: KubeClient, node_selector: dict[str, Any], device: str = "gpu0") -> dict[str, Any]:
    """A claim allocated (by the admin, as the scheduler) to ``device`` and reserved for a pod."""
    name = f"c-{uuid.uuid4().hex[:8]}"
    created = await admin.create(
        RESOURCE_CLAIMS,
        {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}},
        },
        "default",
    )
    result = {"request": "gpu", "driver": DRIVER, "pool": "fabric-pcie", "device": device}
    created["status"] = {
        "allocation": {"devices": {"results": [result]}, "nodeSelector": node_selector},
        "reservedFor": [{"resource": "pods", "name": f"{name}-pod", "uid": str(uuid.uuid4())}],
    }
    return await admin.replace(RESOURCE_CLAIMS, created, subresource="status")


def _entry(node: str, device: str = "gpu0", **extra: Any) -> dict[str, Any]:
    return {
        "driver": DRIVER,
        "pool": "fabric-pcie",
        "device": device,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Prepared",
                "message": f"{device} is attached to node {node}",
                "lastTransitionTime": "2026-12-06T06:19:48Z",
            }
        ],
        "data": {"node": node},
        **extra,
    }


async def _write_status(
    cluster: Cluster, node: str | None, claim: dict[str, Any], status: dict[str, Any]
) -> Any:
    """The plugin's merge patch of ``/status``, with the token of the plugin of ``node``."""
    meta = claim["metadata"]
    patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
    async with cluster.api.client(cluster.plugin_token(node)) as plugin:
        return await plugin.patch(RESOURCE_CLAIMS, meta["name"], patch, "default", subresource="status")


def _denial(claim: dict[str, Any], policy: str, why: str) -> str:
    return (
        f'resourceclaims.resource.k8s.io "{claim["metadata"]["name"]}" is forbidden: '
        f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: {why}"
    )


async def test_the_plugin_of_the_claims_node_writes_its_status(cluster: Cluster, admin: KubeClient) -> None:
    claim = await _claim(admin, _pinned("node-a"))
    written = await _write_status(cluster, "node-a", claim, {"devices": [_entry("node-a")]})
    assert written["status"]["devices"][0]["data"] == {"node": "node-a"}


async def test_a_plugin_of_another_node_is_refused(cluster: Cluster, admin: KubeClient) -> None:
    claim = await _claim(admin, _pinned("node-b"))
    with pytest.raises(Forbidden) as refused:
        await _write_status(cluster, "node-a", claim, {"devices": [_entry("node-a")]})
    name = claim["metadata"]["name"]
    why = (
        f"the fabric-dra plugin on node node-a may not write the status of ResourceClaim default/{name}: "
        "it is allocated to another node"
    )
    assert refused.value.message == _denial(claim, STATUS_POLICY, why)
    assert refused.value.body["details"]["causes"] == [
        {"message": _denial(claim, STATUS_POLICY, why).split(": ", 1)[1]}
    ]
    stored = await admin.get(RESOURCE_CLAIMS, name, "default")
    assert "devices" not in stored["status"]


async def test_a_token_without_a_node_is_refused(cluster: Cluster, admin: KubeClient) -> None:
    claim = await _claim(admin, _pinned("node-a"))
    with pytest.raises(Forbidden) as refused:
        await _write_status(cluster, None, claim, {"devices": [_entry("node-a")]})
    assert "this fabric-dra plugin token names no node" in refused.value.message


async def test_the_plugin_may_change_nothing_but_status_devices(cluster: Cluster, admin: KubeClient) -> None:
    """Not reservedFor, not the allocation (whose removal would deallocate the claim)."""
    claim = await _claim(admin, _pinned("node-a"))
    with pytest.raises(Forbidden) as refused:
        await _write_status(cluster, "node-a", claim, {"reservedFor": None})
    assert "may change only status.devices" in refused.value.message
    with pytest.raises(Forbidden):
        await _write_status(cluster, "node-a", claim, {"allocation": None, "reservedFor": None})


async def test_an_unpinned_allocation_holds_each_plugin_to_its_own_entries(
    cluster: Cluster, admin: KubeClient
) -> None:
    """A pool's label selector names no node: node-a writes entries naming node-a; node-b may
    neither take them over nor remove them, nor write an entry without its node."""
    claim = await _claim(admin, UNPINNED)
    claim = await _write_status(cluster, "node-a", claim, {"devices": [_entry("node-a")]})
    why = "may write only status.devices entries of fabric-dra.io that name its own node"
    for devices in ([_entry("node-b")], [], [{**_entry("node-b"), "data": {"switch": "s0"}}]):
        with pytest.raises(Forbidden) as refused:
            await _write_status(cluster, "node-b", claim, {"devices": devices or None})
        assert why in refused.value.message
    # node-a withdraws its own entry
    claim = await _write_status(cluster, "node-a", claim, {"devices": None})
    assert "devices" not in claim["status"]


async def test_others_are_not_held_by_the_plugins_policy(cluster: Cluster, admin: KubeClient) -> None:
    """The policy matches the plugin's service account only: the controller (another account)
    and an admin write status as before."""
    claim = await _claim(admin, _pinned("node-b"))
    controller = cluster.api.service_account_token("fabric-dra", "fabric-dra-controller")
    meta = claim["metadata"]
    patch = {"status": {"devices": [_entry("node-b")]}}
    async with cluster.api.client(controller) as client:
        written = await client.patch(RESOURCE_CLAIMS, meta["name"], patch, "default", subresource="status")
    assert written["status"]["devices"][0]["device"] == "gpu0"


async def test_the_slice_policy_holds_a_plugin_to_its_nodes_slices(cluster: Cluster) -> None:
    def slice_of(node: str) -> dict[str, Any]:
        return {
            "metadata": {"name": f"{node}-{uuid.uuid4().hex[:6]}"},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                "devices": [{"name": "nic0"}],
            },
        }

    async with cluster.api.client(cluster.plugin_token("node-a")) as plugin:
        own = await plugin.create(RESOURCE_SLICES, slice_of("node-a"))
        assert own["spec"]["nodeName"] == "node-a"
        with pytest.raises(Forbidden) as refused:
            await plugin.create(RESOURCE_SLICES, slice_of("node-b"))
        assert "the fabric-dra plugin on node node-a may not modify ResourceSlices of node node-b" in (
            refused.value.message
        )
        other = copy.deepcopy(slice_of("node-a"))
        other["spec"]["driver"] = "gpu.example.com"
        with pytest.raises(Forbidden):
            await plugin.create(RESOURCE_SLICES, other)


async def _until(check: Any, within: float = 15.0) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail("the plugin's status write never showed")
        await asyncio.sleep(0.05)


async def test_the_plugin_of_node_a_cannot_write_a_claim_of_node_b(
    cluster: Cluster, admin: KubeClient
) -> None:
    """The plugin process with node-a's token: its claim gets Ready; a claim allocated to node-b,
    prepared on node-a all the same, is prepared but its status write is refused."""
    root = Path(short_dir("fdn-"))
    kubeconfig = write_kubeconfig(
        root / "kubeconfig",
        cluster.api.url,
        token=cluster.plugin_token("node-a"),
        ca_file=cluster.api.ca_file,
    )
    plugin = cluster.stack.plugin(
        "node-a", None, kubeconfig, name="plugin-node-a", sysfs_root=root / "sys", backend="noop"
    )
    try:
        mine = await _claim(admin, _pinned("node-a"))
        theirs = await _claim(admin, _pinned("node-b"), device="gpu1")
        refs = [ClaimRef(c["metadata"]["uid"], "default", c["metadata"]["name"]) for c in (mine, theirs)]
        async with DraCaller(Path(plugin.role.address)) as kubelet:
            response = await kubelet.prepare(refs)
        assert all(response.claims[r.uid].error == "" for r in refs)

        async def status_of(claim: dict[str, Any]) -> list[dict[str, Any]]:
            got = await admin.get(RESOURCE_CLAIMS, claim["metadata"]["name"], "default")
            return list(got["status"].get("devices") or [])

        (entry,) = await _until(lambda: status_of(mine))
        assert entry["data"]["node"] == "node-a"
        refusal = f"may not write the status of ResourceClaim default/{theirs['metadata']['name']}"
        await _until(lambda: _logged(plugin.role.tail(200), refusal))
        assert await status_of(theirs) == []
    finally:
        plugin.role.stop()


async def _logged(tail: str, text: str) -> bool:
    return text in tail


def test_a_policy_the_server_cannot_compile_denies(cluster: Cluster) -> None:
    """failurePolicy Fail: an expression this server's CEL does not compile (optional types) refuses
    the write it matches, never lets it through unjudged."""

    async def scenario() -> None:
        async with cluster.api.client() as admin:
            policy = {
                "metadata": {"name": "optional-types"},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["configmaps"],
                            }
                        ]
                    },
                    "validations": [{"expression": "object.data.?x.orValue('') == ''"}],
                },
            }
            await admin.create(POLICIES, policy)
            await admin.create(
                BINDINGS,
                {
                    "metadata": {"name": "optional-types"},
                    "spec": {"policyName": "optional-types", "validationActions": ["Deny"]},
                },
            )
            try:
                configmaps = Resource("", "v1", "configmaps", "ConfigMap", True)
                with pytest.raises(ApiError) as refused:
                    await admin.create(configmaps, {"metadata": {"name": "cm"}, "data": {}}, "default")
                assert refused.value.status == 422
                assert "resulted in error" in refused.value.message
            finally:
                await admin.delete(BINDINGS, "optional-types")
                await admin.delete(POLICIES, "optional-types")

    asyncio.run(scenario())
