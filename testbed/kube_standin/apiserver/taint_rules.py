"""``ValidateDeviceTaintRule``, ``ValidateDeviceTaintRuleUpdate`` and
``ValidateDeviceTaintRuleStatusUpdate`` of ``k8s.io/kubernetes/pkg/apis/resource/validation/validation.go``
(Kubernetes 1.36), on the storage version.

A DeviceTaintRule (KEP-5055, gate ``DRADeviceTaintRules``) adds one taint to every device its
selector matches: the selector's ``driver`` must be a driver name, ``pool`` a pool name, ``device``
a device name (each only where given: an empty selector matches every device); the taint is
checked as a slice's taint is (``validateDeviceTaint``: key a label name, value a label value,
effect one of the release's, checked on update only where it changed). The status holds at most
``DeviceTaintRuleStatusMaxConditions`` (8) conditions, each a valid ``metav1.Condition``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kube_standin.apiserver.claim_rules import validate_conditions
from kube_standin.apiserver.features import FeatureGates
from kube_standin.apiserver.fielderrors import FieldErrors, dns_label, driver_name, pool_name
from kube_standin.apiserver.slice_rules import device_taint

__all__ = ["RULE_STATUS_MAX_CONDITIONS", "validate_device_taint_rule", "validate_device_taint_rule_status"]

Obj = Mapping[str, Any]

#: ``DeviceTaintRuleStatusMaxConditions`` (k8s.io/api/resource/v1beta2/types.go)
RULE_STATUS_MAX_CONDITIONS = 8


def validate_device_taint_rule(
    errs: FieldErrors, rule: Obj, gates: FeatureGates, old: Obj | None = None
) -> None:
    """``validateDeviceTaintRuleSpec``: the selector's fields and the taint (against ``old``'s)."""
    spec = rule.get("spec") or {}
    selector = spec.get("deviceSelector")
    if isinstance(selector, Mapping):
        path = "spec.deviceSelector"
        if selector.get("driver") is not None:
            driver_name(errs, f"{path}.driver", selector["driver"])
        if selector.get("pool") is not None:
            pool_name(errs, f"{path}.pool", selector["pool"])
        if selector.get("device") is not None:
            dns_label(errs, f"{path}.device", selector["device"])
    taint = spec.get("taint")
    old_taint = ((old or {}).get("spec") or {}).get("taint") if old is not None else None
    if isinstance(taint, Mapping):
        device_taint(errs, "spec.taint", taint, gates, old_taint if isinstance(old_taint, Mapping) else None)
    else:
        errs.required("spec.taint")


def validate_device_taint_rule_status(errs: FieldErrors, rule: Obj) -> None:
    """``ValidateDeviceTaintRuleStatusUpdate``: valid conditions, at most eight."""
    conditions = (rule.get("status") or {}).get("conditions")
    if not isinstance(conditions, list):
        return
    validate_conditions(errs, "status.conditions", conditions)
    if len(conditions) > RULE_STATUS_MAX_CONDITIONS:
        errs.too_many("status.conditions", len(conditions), RULE_STATUS_MAX_CONDITIONS)
