"""``status.allocation`` from a finished search: the device results, the configuration copied from
classes and claim, and the node selector (the tail of ``Allocate`` and ``createNodeSelector``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.selection.features import Features
from dra_driver.selection.model import DeviceClass
from dra_driver.selection.requests import ClaimToAllocate, RequestSlot
from dra_driver.selection.search import Chosen, Search

__all__ = ["AllocationResult", "build_result"]


@dataclass
class AllocationResult:
    """``status.allocation`` for one claim, as JSON for the API server."""

    claim: ClaimToAllocate
    body: dict[str, Any]

    @property
    def binding_conditions(self) -> bool:
        return any(r.get("bindingConditions") for r in self.body["devices"]["results"])


def _result_entry(chosen: Chosen, features: Features) -> dict[str, Any]:
    slot, ref = chosen.slot, chosen.ref
    entry: dict[str, Any] = {
        "request": slot.name,
        "driver": ref.slice.spec.driver,
        "pool": ref.slice.spec.pool.name,
        "device": ref.device.name,
    }
    if slot.admin_access:
        entry["adminAccess"] = True
    if slot.tolerations:
        entry["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in slot.tolerations]
    if features.binding_conditions and ref.device.binding_conditions:
        entry["bindingConditions"] = list(ref.device.binding_conditions)
        entry["bindingFailureConditions"] = list(ref.device.binding_failure_conditions)
    if chosen.share_id:
        entry["shareID"] = chosen.share_id
    if chosen.consumed:
        entry["consumedCapacity"] = {
            name: chosen.consumed[name].canonical() for name in sorted(chosen.consumed)
        }
    return entry


def build_result(
    search: Search,
    claim_index: int,
    claim: ClaimToAllocate,
    classes: Mapping[str, DeviceClass],
    features: Features,
) -> AllocationResult:
    results = [_result_entry(chosen, features) for chosen in search.chosen[claim_index]]
    body: dict[str, Any] = {"devices": {"results": results}}
    config = _config(search, claim_index, claim, classes)
    if config:
        body["devices"]["config"] = config
    node_selector = _node_selector(search, claim_index)
    if node_selector is not None:
        body["nodeSelector"] = node_selector
    return AllocationResult(claim, body)


def _config(
    search: Search, claim_index: int, claim: ClaimToAllocate, classes: Mapping[str, DeviceClass]
) -> list[dict[str, Any]]:
    config: list[dict[str, Any]] = []
    used_slots: list[RequestSlot] = []
    for request_index, _ in enumerate(claim.spec.devices.requests):
        sub = search.selected_sub.get((claim_index, request_index), 0)
        used_slots.append(search.slots[(claim_index, request_index, sub)])
    by_class: dict[str, list[str]] = {}
    for slot in used_slots:
        by_class.setdefault(slot.device_class.name, []).append(slot.name)
    for class_name, names in by_class.items():
        for entry in classes[class_name].spec.config:
            config.append({"source": "FromClass", "requests": list(names), **entry})
    selected_names = {s.name for s in used_slots}
    for entry in claim.spec.devices.config:
        wanted = entry.get("requests") or []
        if not wanted or any(
            name in selected_names or name in {s.base_name for s in used_slots} for name in wanted
        ):
            config.append({"source": "FromClaim", **entry})
    for entry in config:
        if len(entry.get("requests") or []) == len(claim.spec.devices.requests):
            entry.pop("requests", None)
    return config


def _node_selector(search: Search, claim_index: int) -> dict[str, Any] | None:
    """``createNodeSelector``: pin to the node for node-local or bindsToNode devices."""
    expressions: list[dict[str, Any]] = []
    fields: list[dict[str, Any]] = []
    for chosen in search.chosen[claim_index]:
        ref = chosen.ref
        spec = ref.slice.spec
        if spec.per_device_node_selection:
            node_name, selector = ref.device.node_name, ref.device.node_selector
        else:
            node_name, selector = spec.node_name, spec.node_selector
        if node_name or ref.device.binds_to_node:
            return {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": [search.node.name]}
                        ]
                    }
                ]
            }
        if selector is not None and len(selector.node_selector_terms) == 1:
            term = selector.node_selector_terms[0]
            for requirement, target in (
                *((r, expressions) for r in term.match_expressions),
                *((r, fields) for r in term.match_fields),
            ):
                dumped = requirement.model_dump(by_alias=True, exclude_defaults=False)
                if not dumped.get("values"):
                    dumped.pop("values", None)
                if dumped not in target:
                    target.append(dumped)
    if not expressions and not fields:
        return None
    term_out: dict[str, Any] = {}
    if expressions:
        term_out["matchExpressions"] = expressions
    if fields:
        term_out["matchFields"] = fields
    return {"nodeSelectorTerms": [term_out]}
