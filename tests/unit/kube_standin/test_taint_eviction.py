"""When the stand-in's device-taint eviction controller gives a device up: the rules of
``claimEvictionTime`` in Kubernetes' pkg/controller/devicetainteviction."""

from __future__ import annotations

from kube_standin.cluster.taint_eviction import eviction_time

NOW = 1_800_000_000.0
TAINT = {"key": "fabric-dra.io/attach-failed", "value": "BindFailed", "effect": "NoExecute"}


def test_an_untolerated_NoExecute_taint_evicts_at_once_and_NoSchedule_never() -> None:
    assert eviction_time([TAINT], [], NOW) == NOW
    assert eviction_time([{**TAINT, "effect": "NoSchedule"}], [], NOW) is None
    added = {**TAINT, "timeAdded": "2027-01-15T07:46:40Z"}
    assert eviction_time([added], [], NOW) == 1_799_999_200.0  # since the taint was added


def test_a_toleration_keeps_the_device_for_ever_or_for_its_seconds() -> None:
    forever = {"key": TAINT["key"], "operator": "Exists", "effect": "NoExecute"}
    assert eviction_time([TAINT], [forever], NOW) is None
    for_a_while = {**forever, "tolerationSeconds": 30}
    assert eviction_time([TAINT], [for_a_while], NOW) == NOW + 30
    other_effect = {**forever, "effect": "NoSchedule"}  # tolerates NoSchedule only: no help here
    assert eviction_time([TAINT], [other_effect], NOW) == NOW
    other_value = {"key": TAINT["key"], "operator": "Equal", "value": "Timeout", "effect": "NoExecute"}
    assert eviction_time([TAINT], [other_value], NOW) == NOW
