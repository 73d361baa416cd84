"""Whether one device may serve one request, whatever else the search has picked: DeviceClass and
request CEL selectors, per-device node selection, taints, the binding-conditions gate
(``isSelectable`` and ``taintPreventsAllocation`` in the allocator).

Selector outcomes depend on nothing but the device's content and the expression, so they are kept
per (content, expression) and may be shared between allocators of successive snapshots.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from dra_driver.selection.celenv import CelCompileError, SelectorCache, SelectorOutcome
from dra_driver.selection.errors import AllocationError
from dra_driver.selection.features import Features
from dra_driver.selection.model import DeviceClass, Node
from dra_driver.selection.nodes import node_matches
from dra_driver.selection.pools import DeviceRef, PoolView
from dra_driver.selection.requests import ClaimToAllocate, RequestSlot
from dra_driver.selection.taints import untolerated_taints

__all__ = ["Eligibility", "SelectorCheck"]


@dataclass(frozen=True)
class SelectorCheck:
    """Why a device does or does not match a request's selectors."""

    matched: bool
    source: str = ""  # "class fabric-gpu" or "request gpus"
    index: int = -1
    expression: str = ""
    error: str | None = None

    def describe(self) -> str:
        where = f"{self.source} selector #{self.index}"
        if self.error is not None:
            return f"{where} failed with a CEL runtime error: {self.error} (expression: {self.expression})"
        return f"{where} is false: {self.expression}"


class Eligibility:
    """The per-device checks of one snapshot; ``outcomes`` is the shared selector-outcome cache."""

    def __init__(
        self,
        classes: Mapping[str, DeviceClass],
        features: Features,
        cache: SelectorCache,
        outcomes: dict[tuple[str, str], SelectorOutcome],
    ) -> None:
        self.classes = classes
        self.features = features
        self.cache = cache
        self.outcomes = outcomes

    def check_selectors(self, ref: DeviceRef, slot: RequestSlot) -> SelectorCheck:
        """Class selectors, then request selectors; the first that is false or fails decides."""
        groups = (
            (f"class {slot.device_class.name}", slot.device_class.spec.selectors),
            (f"request {slot.name}", slot.selectors),
        )
        for source, selectors in groups:
            for index, selector in enumerate(selectors):
                if selector.cel is None:
                    raise ValueError(f"{source}: selector {index} has no CEL expression")
                expression = selector.cel.expression
                key = (ref.content, expression)
                outcome = self.outcomes.get(key)
                if outcome is None:
                    outcome = self._evaluate(ref, expression)
                    self.outcomes[key] = outcome
                if outcome.matched is not True:
                    return SelectorCheck(False, source, index, expression, outcome.error)
        return SelectorCheck(True)

    def _evaluate(self, ref: DeviceRef, expression: str) -> SelectorOutcome:
        try:
            program = self.cache.get(expression)
        except CelCompileError as err:
            return SelectorOutcome(None, f"compilation failed: {err}")
        try:
            activation = ref.activation()
        except ValueError as err:
            return SelectorOutcome(None, str(err))
        return program.evaluate(activation)

    @staticmethod
    def device_serves_node(ref: DeviceRef, node: Node) -> bool:
        if not ref.slice.spec.per_device_node_selection:
            return True
        device = ref.device
        return node_matches(node, device.node_name, device.all_nodes, device.node_selector)

    def untolerated(self, ref: DeviceRef, slot: RequestSlot) -> list[str]:
        if not self.features.device_taints:
            return []
        return [t.display() for t in untolerated_taints(ref.device.taints, slot.tolerations)]

    def shareable(self, ref: DeviceRef) -> bool:
        return self.features.consumable_capacity and bool(ref.device.allow_multiple_allocations)

    def selectable(self, slot: RequestSlot, ref: DeviceRef, node: Node, claim: ClaimToAllocate) -> bool:
        """``isSelectable``; a CEL runtime error stops allocation, as ``selectorsMatch`` returns it."""
        if ref.device.binding_conditions and not self.features.binding_conditions:
            return False
        check = self.check_selectors(ref, slot)
        if check.error is not None:
            raise AllocationError(
                f"claim {claim.key}: {check.source} selector #{check.index} on device "
                f"{ref.label}: CEL runtime error: {check.error}"
            )
        if not check.matched:
            return False
        return self.device_serves_node(ref, node)

    def all_devices(
        self,
        slot: RequestSlot,
        view: PoolView,
        claim: ClaimToAllocate,
        fits: Callable[[RequestSlot, DeviceRef], bool],
    ) -> list[DeviceRef]:
        """The devices of ``allocationMode: All`` (``validateDeviceRequest``): every selectable one
        whose capacity can take the request (``fits``); an incomplete or invalid pool stops
        allocation."""
        devices: list[DeviceRef] = []
        for pool in view.pools:
            if pool.incomplete:
                raise AllocationError(
                    f"claim {claim.key}, request {slot.name}: asks for all devices, but resource pool "
                    f"{pool.driver}/{pool.name} is currently being updated"
                )
            if pool.invalid_reason:
                raise AllocationError(
                    f"claim {claim.key}, request {slot.name}: asks for all devices, but resource pool "
                    f"{pool.driver}/{pool.name} is invalid: {pool.invalid_reason}"
                )
            for ref in pool.refs:
                if self.selectable(slot, ref, view.node, claim) and fits(slot, ref):
                    devices.append(ref)
        return devices
