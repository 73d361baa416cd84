"""Every write is validated against the official schemas of each configured Kubernetes
release, strictly, and by the server's own rules; a rejection names the field."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from kube_standin.apiserver.schemas import DEFAULT_VERSIONS
from plumbing.kube import Invalid, KubeClient
from plumbing.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIMS, RESOURCE_SLICES
from tests.support.apiserver import ApiServerProcess, start_apiserver
from tests.unit.kube_standin.objects import resource_claim, resource_slice


@pytest.fixture(scope="module")
def versioned_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ApiServerProcess]]:
    """One server per release, each validating against that release alone (started side by side)."""
    roots = {version: tmp_path_factory.mktemp(f"v{version}") for version in DEFAULT_VERSIONS}
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(DEFAULT_VERSIONS)) as pool:
        starts = {
            version: pool.submit(stack.enter_context, start_apiserver(root, validate_versions=version))
            for version, root in roots.items()
        }
        yield {version: future.result() for version, future in starts.items()}


@pytest.mark.parametrize("version", DEFAULT_VERSIONS)
async def test_each_release_accepts_a_good_slice_and_rejects_a_bad_one_naming_the_field(
    versioned_servers: dict[str, ApiServerProcess], version: str
) -> None:
    async with versioned_servers[version].client() as kube:
        good = await kube.create(RESOURCE_SLICES, resource_slice("good", devices=128))
        assert len(good["spec"]["devices"]) == 128
        bad = resource_slice("bad", devices=4)
        bad["spec"]["devices"][3]["attributes"]["fabric-dra.io/model"] = {"strng": "H100"}
        with pytest.raises(Invalid) as rejected:
            await kube.create(RESOURCE_SLICES, bad)
        assert rejected.value.status == 422
        assert 'ResourceSlice.resource.k8s.io "bad" is invalid' in rejected.value.message
        assert (
            "spec.devices[3].attributes[fabric-dra.io/model].strng: unknown field" in rejected.value.message
        )
        causes = rejected.value.body["details"]["causes"]
        assert causes[0]["field"] == "spec.devices[3].attributes[fabric-dra.io/model].strng"
        # The same checks hold on update and patch.
        with pytest.raises(Invalid, match=r"spec\.pool\.generation"):
            await kube.patch(RESOURCE_SLICES, "good", {"spec": {"pool": {"generation": "two"}}})


async def test_a_field_of_newer_releases_is_rejected_naming_the_releases(mkube: KubeClient) -> None:
    newer = resource_slice("list-attrs", devices=2)
    newer["spec"]["devices"][0]["attributes"]["fabric-dra.io/ports"] = {"ints": [1, 2]}
    with pytest.raises(Invalid) as rejected:
        await mkube.create(RESOURCE_SLICES, newer)
    assert "spec.devices[0].attributes[fabric-dra.io/ports].ints: unknown field (Kubernetes 1.34, 1.35)" in (
        rejected.value.message
    )


async def test_server_rules_beyond_the_schemas(mkube: KubeClient, ns: str) -> None:
    with pytest.raises(Invalid, match=r"spec\.devices: Too many: 129: must have at most 128 items"):
        await mkube.create(RESOURCE_SLICES, resource_slice("too-big", devices=129))
    both = resource_slice("both", devices=1)
    both["spec"]["allNodes"] = True
    with pytest.raises(Invalid, match="exactly one of `nodeName`, `nodeSelector`, `allNodes`"):
        await mkube.create(RESOURCE_SLICES, both)
    created = await mkube.create(RESOURCE_SLICES, resource_slice("immutable", devices=1))
    moved = copy.deepcopy(created)
    moved["spec"]["driver"] = "other.example.com"
    with pytest.raises(
        Invalid, match=r"spec\.driver: Invalid value: \"other.example.com\": field is immutable"
    ):
        await mkube.replace(RESOURCE_SLICES, moved)
    claim = await mkube.create(RESOURCE_CLAIMS, resource_claim("c", ns))
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    with pytest.raises(Invalid, match="spec: Invalid value: null: field is immutable"):
        await mkube.replace(RESOURCE_CLAIMS, claim)
    with pytest.raises(Invalid, match=r"metadata\.name"):
        await mkube.create(DEVICE_CLASSES, {"metadata": {"name": "Fabric_GPU"}, "spec": {}})
    bad_cel = {
        "metadata": {"name": "fabric-gpu"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver =="}}]},
    }
    with pytest.raises(Invalid, match=r"spec\.selectors\[0\]\.cel\.expression"):
        await mkube.create(DEVICE_CLASSES, bad_cel)
