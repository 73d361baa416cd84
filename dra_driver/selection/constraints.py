"""A claim's constraints across its devices: ``matchAttribute`` and ``distinctAttribute``
(``matchAttributeConstraint`` / ``distinctAttributeConstraint`` in the allocator).

Each constraint tracks the devices added for the requests it names; ``add`` says whether one
more device keeps it satisfied, ``remove`` undoes the matching ``add`` when the search backtracks.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.selection.errors import AllocationError
from dra_driver.selection.model import DeviceAttribute
from dra_driver.selection.pools import DeviceRef
from dra_driver.selection.requests import ClaimToAllocate, RequestSlot

__all__ = [
    "Constraint",
    "DistinctAttribute",
    "MatchAttribute",
    "build_constraints",
    "lookup_attribute",
    "same_value",
]


def lookup_attribute(ref: DeviceRef, qualified: str) -> DeviceAttribute | None:
    """``lookupAttribute``: the fully-qualified name, or the bare id when the domain is the driver's."""
    attributes = ref.device.attributes
    if qualified in attributes:
        return attributes[qualified]
    domain, sep, ident = qualified.partition("/")
    if sep and domain == ref.slice.spec.driver:
        return attributes.get(ident)
    return None


def same_value(a: DeviceAttribute, b: DeviceAttribute) -> bool:
    return a.kind() == b.kind() and a.kind() != "unknown" and a.value() == b.value()


class Constraint:
    def __init__(self, requests: Sequence[str], attribute: str) -> None:
        self.requests = set(requests)
        self.attribute = attribute

    def applies(self, slot: RequestSlot) -> bool:
        return not self.requests or slot.base_name in self.requests or slot.name in self.requests

    def add(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        raise NotImplementedError

    def remove(self, slot: RequestSlot, ref: DeviceRef) -> None:
        raise NotImplementedError


class MatchAttribute(Constraint):
    def __init__(self, requests: Sequence[str], attribute: str) -> None:
        super().__init__(requests, attribute)
        self.value: DeviceAttribute | None = None
        self.count = 0

    def add(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        if not self.applies(slot):
            return True
        attr = lookup_attribute(ref, self.attribute)
        if attr is None:
            return False
        if self.count == 0:
            self.value, self.count = attr, 1
            return True
        if self.value is None or not same_value(attr, self.value):
            return False
        self.count += 1
        return True

    def remove(self, slot: RequestSlot, ref: DeviceRef) -> None:
        if self.applies(slot):
            self.count -= 1


class DistinctAttribute(Constraint):
    def __init__(self, requests: Sequence[str], attribute: str) -> None:
        super().__init__(requests, attribute)
        self.values: list[DeviceAttribute] = []

    def add(self, slot: RequestSlot, ref: DeviceRef) -> bool:
        if not self.applies(slot):
            return True
        attr = lookup_attribute(ref, self.attribute)
        if attr is None or attr.kind() == "unknown":
            return False
        if any(same_value(attr, seen) for seen in self.values):
            return False
        self.values.append(attr)
        return True

    def remove(self, slot: RequestSlot, ref: DeviceRef) -> None:
        if self.applies(slot):
            self.values.pop()


def build_constraints(claim: ClaimToAllocate) -> list[Constraint]:
    """The claim's constraints, fresh for one search; an empty one stops allocation, as upstream."""
    built: list[Constraint] = []
    for index, constraint in enumerate(claim.spec.devices.constraints):
        if constraint.match_attribute:
            built.append(MatchAttribute(constraint.requests, constraint.match_attribute))
        elif constraint.distinct_attribute:
            built.append(DistinctAttribute(constraint.requests, constraint.distinct_attribute))
        else:
            raise AllocationError(f"claim {claim.key}, constraint #{index}: empty constraint")
    return built
