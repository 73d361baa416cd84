from __future__ import annotations

import pytest

from dra_driver.controller.devices import ATTRIBUTE_NAMES, CAPACITY_NAMES
from dra_driver.controller.resourcenames import (
    DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX,
    BindingConditionNames,
    fit_value,
    is_attribute_id,
    is_driver_name,
    is_pool_name,
    legacy_node_label_key,
    pool_label_key,
    reach_label_key,
    slice_name,
    warm_label_key,
)
from dra_driver.selection.quantity import format_bytes, parse_quantity
from kube_standin.apiserver.admission import forbidden_node_labels
from plumbing.names import is_dns1123_label as is_dns_label
from plumbing.names import is_dns1123_subdomain as is_dns_subdomain
from plumbing.names import is_qualified_name


def test_attribute_names_obey_the_api_identifier_rules() -> None:
    assert all(is_attribute_id(name) for name in (*ATTRIBUTE_NAMES, *CAPACITY_NAMES))
    assert len(ATTRIBUTE_NAMES) + len(CAPACITY_NAMES) <= DEVICE_ATTRIBUTES_AND_CAPACITIES_MAX
    assert not is_attribute_id("pcie-gen")
    assert not is_attribute_id("x" * 33)


@pytest.mark.parametrize(
    ("value", "ok"),
    [("gpu-0", True), ("0gpu", True), ("GPU", False), ("-gpu", False), ("gpu-", False), ("a" * 64, False)],
)
def test_dns_label(value: str, ok: bool) -> None:
    assert is_dns_label(value) is ok


def test_dns_subdomain_and_pool_names() -> None:
    assert is_dns_subdomain("fabric-dra.io")
    assert not is_dns_subdomain("fabric_dra.io")
    assert is_pool_name("fabric-pcie")
    assert is_pool_name("rack-1.example/fabric-pcie")
    assert not is_pool_name("Fabric")
    assert not is_pool_name("")


def test_fit_value_keeps_short_values_and_distinguishes_cut_ones() -> None:
    assert fit_value("H100") == "H100"
    a, b = "x" * 70 + "a", "x" * 70 + "b"
    assert len(fit_value(a).encode()) == 64
    assert fit_value(a) != fit_value(b)
    assert fit_value(a) == fit_value(a)
    # Multi-byte text is cut on a character boundary and still fits in 64 bytes.
    cut = fit_value("é" * 40)
    assert len(cut.encode()) <= 64
    cut.encode().decode()


def test_pool_label_keys_are_valid_and_distinct() -> None:
    key = pool_label_key("fabric-dra.io", "fabric-pcie")
    assert key == "pool.fabric-dra.io.node-restriction.kubernetes.io/fabric-pcie"
    long_a = pool_label_key("fabric-dra.io", "a" * 100)
    long_b = pool_label_key("fabric-dra.io", "a" * 99 + "b")
    slashed = pool_label_key("fabric-dra.io", "rack-1/fabric-pcie")
    for k in (key, long_a, long_b, slashed):
        assert is_qualified_name(k), k
    assert long_a != long_b
    assert slashed != pool_label_key("fabric-dra.io", "rack-1-fabric-pcie")


#: the longest driver name there is (63), of several DNS labels, and a short one
DRIVERS = ("fabric-dra.io", "d" * 30 + "." + "e" * 29 + ".io")


@pytest.mark.parametrize("driver", DRIVERS)
def test_node_label_keys_are_ones_no_kubelet_may_set(driver: str) -> None:
    """Every key the controller puts on nodes is a valid label key under a subdomain of
    NodeRestriction's namespace, so the plugin refuses it to a kubelet on its own Node — whatever
    the driver, pool, group or publisher name (long ones are cut and hashed into the name part)."""
    assert is_driver_name(driver) and len(driver) in (13, 63)
    keys = [
        pool_label_key(driver, "fabric-pcie"),
        pool_label_key(driver, "rack-1/" + "p" * 240),
        reach_label_key(driver, "fabric-pcie", "r1"),
        reach_label_key(driver, "p" * 200, "Switch Group 7" * 9),
        warm_label_key(driver, "gpu"),
        warm_label_key(driver, "cxl-memory", "A Very Long Publisher Name " * 4),
    ]
    for key in keys:
        assert is_qualified_name(key), key
        prefix, name = key.split("/")
        assert len(prefix) <= 253 and len(name) <= 63
        assert prefix.endswith(".node-restriction.kubernetes.io"), key
    assert forbidden_node_labels(keys) == sorted(keys)


def test_the_keys_of_earlier_releases_map_from_the_new_ones() -> None:
    """What the controller removes after an upgrade: the same name under ``pool.<driver>/`` or
    ``warm.<driver>/`` — keys a kubelet may set, so they must not stay on nodes."""
    assert (
        legacy_node_label_key(pool_label_key("fabric-dra.io", "fabric-pcie"))
        == "pool.fabric-dra.io/fabric-pcie"
    )
    assert legacy_node_label_key(reach_label_key("fabric-dra.io", "p", "r1")) == "pool.fabric-dra.io/p.r1"
    assert (
        legacy_node_label_key(warm_label_key("fabric-dra.io", "gpu", "rack-2"))
        == "warm.fabric-dra.io/rack-2.gpu"
    )
    assert forbidden_node_labels(["pool.fabric-dra.io/fabric-pcie", "warm.fabric-dra.io/gpu"]) == []
    # keys of another shape are no one's earlier key
    for key in (
        "pool.fabric-dra.io/x",
        "node-restriction.kubernetes.io/x",
        "other.d.node-restriction.kubernetes.io/x",
    ):
        assert legacy_node_label_key(key) is None


def test_slice_names_are_stable_dns_subdomains() -> None:
    assert slice_name("fabric-dra.io", "fabric-pcie", 0) == "fabric-dra.io-fabric-pcie-0"
    assert slice_name("fabric-dra.io", "fabric-pcie", 3) == slice_name("fabric-dra.io", "fabric-pcie", 3)
    long = slice_name("fabric-dra.io", "p" * 250, 12)
    assert is_dns_subdomain(long) and long.endswith("-12")
    assert is_dns_subdomain(slice_name("fabric-dra.io", "rack.example/fabric-pcie", 1))


def test_slice_names_sort_as_their_indices() -> None:
    """The allocator takes a pool's slices in name order: the index is padded to the last one's width."""
    names = [slice_name("fabric-dra.io", "fabric-pcie", i, 11) for i in range(11)]
    assert names == sorted(names)
    assert names[2] == "fabric-dra.io-fabric-pcie-02" and names[10] == "fabric-dra.io-fabric-pcie-10"
    hashed = [slice_name("fabric-dra.io", "p" * 250, i, 101) for i in (9, 10, 100)]
    assert hashed == sorted(hashed) and hashed[0].endswith("-009")
    # up to ten slices the names are as they always were
    assert slice_name("fabric-dra.io", "fabric-pcie", 9, 10) == "fabric-dra.io-fabric-pcie-9"


def test_condition_types_are_qualified_names() -> None:
    names = BindingConditionNames("fabric-dra.io")
    assert names.attached == "fabric-dra.io/Attached"
    assert is_qualified_name(names.attached) and is_qualified_name(names.failed)
    assert names.attached != names.failed


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("1G", 10**9),
        ("1000000000", 10**9),
        ("1.5Gi", 3 * 2**29),
        ("12e3", 12000),
        ("0", 0),
    ],
)
def test_parse_quantity(text: str, value: int) -> None:
    assert parse_quantity(text).value == value


def test_parse_quantity_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity("12 GB")


@pytest.mark.parametrize("count", [0, 1, 1000, 80 * 2**30, 3 * 2**29, 3840 * 10**9, 2**60 * 3])
def test_format_bytes_round_trips(count: int) -> None:
    text = format_bytes(count)
    assert parse_quantity(text).value == count
    assert parse_quantity(text).canonical() == text  # the API server gives back what was written


def test_format_bytes_uses_the_largest_whole_binary_unit() -> None:
    assert format_bytes(80 * 2**30) == "80Gi"
    assert format_bytes(1536 * 2**20) == "1536Mi"
    # no binary unit keeps it whole: the decimal form the API server stores (Quantity.String())
    assert format_bytes(1000) == "1k"
    assert format_bytes(10**9) == "1G"
    assert format_bytes(123) == "123"
