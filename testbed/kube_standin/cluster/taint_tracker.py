"""DeviceTaintRules merged into the devices they select, as the scheduler and the eviction
controller see them.

kube-scheduler does not read DeviceTaintRules itself: its DRA plugin reads slices through the
device taint tracker (``k8s.io/dynamic-resource-allocation/resourceslice/tracker``), which reacts
to ResourceSlice and DeviceTaintRule events and hands out slices whose devices carry, after their
own taints, the taint of every rule whose selector matches them ("the same effect as if the taint
was specified directly in the ResourceSlice by the DRA driver", ``DeviceTaintRule`` in
``k8s.io/api/resource/v1beta2/types.go``). A selector matches a device when each of its set fields
(``driver``, ``pool``, ``device``) equals the device's; an empty selector matches every device, a
rule without one none. The rule's taint keeps its ``timeAdded`` (which the API server sets on write).

kube-controller-manager's device taint eviction controller (``pkg/controller/devicetainteviction``)
tracks the rules itself and applies them to allocated devices even where no slice lists the device
any more (since 1.35); :func:`rule_taints` serves it per device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["merged_slices", "rule_taints", "rules_digest"]

Obj = Mapping[str, Any]


def _selects(rule: Obj, driver: str, pool: str, device: str) -> bool:
    selector = (rule.get("spec") or {}).get("deviceSelector")
    if not isinstance(selector, Mapping):
        return False  # "Without a selector, no devices are matched."
    return all(
        selector.get(field) in (None, value)
        for field, value in (("driver", driver), ("pool", pool), ("device", device))
    )


def rule_taints(rules: Iterable[Obj], driver: str, pool: str, device: str) -> list[dict[str, Any]]:
    """The taints the ``rules`` give one device, in the rules' name order."""
    out: list[dict[str, Any]] = []
    for rule in sorted(rules, key=lambda r: str((r.get("metadata") or {}).get("name"))):
        taint = (rule.get("spec") or {}).get("taint")
        if isinstance(taint, Mapping) and _selects(rule, driver, pool, device):
            out.append(dict(taint))
    return out


def rules_digest(rules: Iterable[Obj]) -> str:
    """A short digest of the rules' names and resourceVersions: what a cached view depends on."""
    keys = sorted(
        f"{(r.get('metadata') or {}).get('name')}@{(r.get('metadata') or {}).get('resourceVersion')}"
        for r in rules
    )
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:12] if keys else ""


def merged_slices(slices: Iterable[Obj], rules: Iterable[Obj]) -> list[dict[str, Any]]:
    """``slices`` as the tracker hands them out: a slice with a device a rule selects is a copy
    with the rules' taints appended to that device and its resourceVersion marked with the rules'
    digest (so a cache keyed on it sees the change); every other slice is itself."""
    rules = list(rules)
    if not rules:
        return [dict(s) for s in slices]
    digest = rules_digest(rules)
    out: list[dict[str, Any]] = []
    for item in slices:
        spec = item.get("spec") or {}
        driver, pool = str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or "")
        devices = []
        changed = False
        for device in spec.get("devices") or []:
            extra = rule_taints(rules, driver, pool, str(device.get("name") or ""))
            if extra:
                device = {**device, "taints": [*(device.get("taints") or []), *extra]}
                changed = True
            devices.append(device)
        if not changed:
            out.append(dict(item))
            continue
        meta = dict(item.get("metadata") or {})
        meta["resourceVersion"] = f"{meta.get('resourceVersion')}+{digest}"
        out.append({**item, "metadata": meta, "spec": {**spec, "devices": devices}})
    return out
