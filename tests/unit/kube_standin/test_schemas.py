"""Strict schema validation from kubernetes-validate's JSON schemas, compiled once per version."""

from __future__ import annotations

import time

import pytest

from kube_standin.apiserver.schemas import DEFAULT_VERSIONS, SchemaCatalog, SchemasUnavailable
from tests.unit.kube_standin.objects import resource_slice


@pytest.fixture(scope="module")
def catalog() -> SchemaCatalog:
    return SchemaCatalog(DEFAULT_VERSIONS)


@pytest.mark.parametrize("version", DEFAULT_VERSIONS)
def test_a_publisher_slice_is_valid_and_a_broken_one_names_the_field(version: str) -> None:
    one = SchemaCatalog([version])
    assert one.validate(resource_slice()) == []
    broken = resource_slice()
    broken["spec"]["devices"][7]["attributes"]["fabric-dra.io/model"] = {"strin": "H100"}
    broken["spec"]["pool"]["generation"] = "2"
    found = {(error.path, error.detail) for _, error in one.validate(broken)}
    assert ("spec.devices[7].attributes[fabric-dra.io/model].strin", "unknown field") in found
    assert ("spec.pool.generation", "Invalid value: string: must be integer") in found


def test_required_enum_int_ranges_and_base64(catalog: SchemaCatalog) -> None:
    missing = resource_slice()
    del missing["spec"]["driver"]
    assert [e.path for _, e in catalog.validate(missing)] == ["spec.driver"]
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "l"},
        "spec": {"leaseDurationSeconds": 2**40},
    }
    assert [e.detail for _, e in catalog.validate(lease)] == [f"Invalid value: {2**40}: not an int32"]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"k": "not base64!"}}
    assert [e.path for _, e in catalog.validate(secret)] == ["data[k]"]
    wrong_kind = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": 1}}
    assert [e.detail for _, e in catalog.validate(wrong_kind)] == ["Invalid value: integer: must be string"]
    assert catalog.plan("v2", "ConfigMap") == []  # not served: the server answers that itself


def test_a_field_only_newer_releases_know_is_rejected_for_the_older_ones(catalog: SchemaCatalog) -> None:
    newer = resource_slice(devices=2)
    # List-valued attributes arrived in Kubernetes 1.36.
    newer["spec"]["devices"][0]["attributes"]["fabric-dra.io/ports"] = {"strings": ["a", "b"]}
    problems = catalog.validate(newer)
    assert len(problems) == 1
    versions, error = problems[0]
    assert error.path == "spec.devices[0].attributes[fabric-dra.io/ports].strings"
    assert sorted(versions) == ["1.34", "1.35"]
    assert catalog.served_by("resource.k8s.io/v1", "ResourceSlice") == list(DEFAULT_VERSIONS)


def test_identical_schemas_are_validated_once(catalog: SchemaCatalog) -> None:
    plan = catalog.plan("resource.k8s.io/v1", "ResourceSlice")
    assert sorted(v for versions, _ in plan for v in versions) == list(DEFAULT_VERSIONS)
    assert len(plan) < len(DEFAULT_VERSIONS)
    assert catalog.plan("v1", "NoSuchKind") == []


def test_unknown_version_is_a_clear_error() -> None:
    with pytest.raises(SchemasUnavailable, match=r"no strict schemas for Kubernetes 1\.99"):
        SchemaCatalog(["1.99"])


def test_validation_cost_of_a_full_slice_is_reported(
    catalog: SchemaCatalog, capsys: pytest.CaptureFixture[str]
) -> None:
    # Not a timed assertion: the number is printed for the report; correctness is asserted.
    full = resource_slice(devices=128)
    catalog.warm([("resource.k8s.io/v1", "ResourceSlice")])
    rounds = 20
    start = time.process_time()  # CPU time: other processes on the machine do not count
    for _ in range(rounds):
        assert catalog.validate(full) == []
    per_object_ms = (time.process_time() - start) / rounds * 1000
    with capsys.disabled():
        print(
            f"\n128-device ResourceSlice, {len(DEFAULT_VERSIONS)} versions: "
            f"{per_object_ms:.2f} ms CPU per object"
        )


def test_a_preloaded_catalog_is_what_every_api_server_of_the_process_validates_with() -> None:
    """A fork server runs ``preload`` once; the API servers forked from it then compile nothing."""
    from kube_standin.apiserver.app import ApiServer, ApiServerConfig, preload
    from kube_standin.apiserver.schemas import shared_catalog

    preload()
    catalog = shared_catalog(DEFAULT_VERSIONS)
    compiled = dict(catalog._plans)
    assert compiled, "preload compiled nothing"
    server = ApiServer(ApiServerConfig())
    assert server.catalog is catalog
    server.warm()
    assert catalog._plans == compiled  # nothing left to compile
    assert ApiServer(ApiServerConfig(validate_versions=("1.34",))).catalog is not catalog
