"""Label and field selectors: apimachinery's syntax and matching."""

from __future__ import annotations

import pytest

from kube_standin.apiserver.registry import find_resource
from kube_standin.apiserver.selectors import SelectorError, parse_field_selector, parse_label_selector

LABELS = {"app": "worker", "tier": "gpu", "gen": "5"}


@pytest.mark.parametrize(
    ("selector", "matches"),
    [
        ("", True),
        ("app=worker", True),
        ("app==worker", True),
        ("app!=worker", False),
        ("app!=other", True),
        ("missing!=x", True),
        ("tier in (gpu, nvme)", True),
        ("tier notin (gpu)", False),
        ("missing notin (x)", True),
        ("app", True),
        ("!app", False),
        ("!missing", True),
        ("gen>4", True),
        ("gen<5", False),
        ("app=worker,tier in (nvme)", False),
        ("app=worker, tier=gpu", True),
        ("example.com/role=x", False),
    ],
)
def test_label_selector_matching(selector: str, matches: bool) -> None:
    assert parse_label_selector(selector).matches(LABELS) is matches


@pytest.mark.parametrize("selector", ["app in gpu", "=x", "app=worker,", "Bad Key=1", "a=b=c d", "gen>x"])
def test_label_selector_syntax_errors(selector: str) -> None:
    with pytest.raises(SelectorError):
        parse_label_selector(selector)


def test_field_selectors_are_per_resource() -> None:
    pods = find_resource("", "v1", "pods")
    slices = find_resource("resource.k8s.io", "v1", "resourceslices")
    assert pods is not None and slices is not None
    pod = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"nodeName": "node-a"},
        "status": {"phase": "Running"},
    }
    assert parse_field_selector(
        "spec.nodeName=node-a,status.phase!=Pending", pods.selectable_fields()
    ).matches(pod)
    assert not parse_field_selector("metadata.namespace=other", pods.selectable_fields()).matches(pod)
    piece = {"metadata": {"name": "s"}, "spec": {"driver": "fabric-dra.io", "pool": {"name": "fabric-pcie"}}}
    fields = slices.selectable_fields()
    assert parse_field_selector("spec.driver=fabric-dra.io,spec.pool.name=fabric-pcie", fields).matches(piece)
    assert parse_field_selector("spec.nodeName=", fields).matches(piece)
    assert parse_field_selector(r"metadata.name=a\,b", fields).requirements[0].value == "a,b"
    with pytest.raises(SelectorError, match=r"field label not supported: spec\.nodeName"):
        parse_field_selector("spec.nodeName=x", find_resource("", "v1", "configmaps").selectable_fields())  # type: ignore[union-attr]
    with pytest.raises(SelectorError, match=r"field label not supported: metadata\.namespace"):
        parse_field_selector("metadata.namespace=x", fields)
