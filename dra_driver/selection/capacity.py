"""Consumable capacity (KEP-5075, ``DRAConsumableCapacity``): how much of a device's capacity one
share takes, and whether it still fits.

A port of ``staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/
consumable_capacity.go`` as Kubernetes 1.36 ships it, where ranges are integer arithmetic on
``Quantity.Value()`` (rounded up away from zero); the milli-value ranges and the fatal
"not representable" errors came later (1.37). Function names follow upstream's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from dra_driver.errors import InputError
from dra_driver.selection.model import CapacityRequestPolicy, CapacityRequestPolicyRange, Device
from dra_driver.selection.pools import DeviceID
from dra_driver.selection.quantity import Quantity, format_quantity

__all__ = [
    "CapacityShares",
    "CapacityUndefined",
    "calculate_consumed_capacity",
    "cmp_request_over_capacity",
    "consumed_capacity_from_request",
    "go_value",
    "violates_policy",
]


class CapacityUndefined(InputError):
    """A request names a capacity the device does not publish: ``CmpRequestOverCapacity`` errors and
    the allocator skips the device (``"some requested capacity has not been defined"``)."""


def go_value(quantity: Fraction) -> int:
    """``Quantity.Value()``: the value as an integer, rounded up away from zero."""
    return math.ceil(quantity) if quantity >= 0 else math.floor(quantity)


def _round_up_range(requested: Quantity, valid_range: CapacityRequestPolicyRange) -> Quantity:
    """``roundUpRange``: at least min; with a step, min plus whole steps covering the request."""
    minimum = valid_range.min
    if minimum is None:
        return requested
    if requested.value < minimum.value:
        return minimum
    if valid_range.step is None:
        return requested
    step, start = go_value(valid_range.step.value), go_value(minimum.value)
    added = go_value(requested.value) - start
    steps = added // step + (1 if added % step else 0) if step else 0
    # resource.NewQuantity(val, resource.BinarySI)
    return Quantity(Fraction(start + step * steps), format_quantity(start + step * steps, binary=True))


def _round_up_valid_values(requested: Quantity, valid_values: list[Quantity]) -> Quantity:
    """``roundUpValidValues``: the first valid value not below the request, else the request (which
    then violates the policy). Validation keeps the list ascending."""
    for value in valid_values:
        if requested.value <= value.value:
            return value
    return requested


def calculate_consumed_capacity(
    requested: Quantity | None, value: Quantity, policy: CapacityRequestPolicy | None
) -> Quantity:
    """``calculateConsumedCapacity``: no request takes the policy's default, or — without one — the
    whole capacity; a request is rounded up by the policy's range or valid values."""
    if requested is None:
        if policy is not None and policy.default is not None:
            return policy.default
        return value
    if policy is None:
        return requested
    if policy.valid_range is not None and policy.valid_range.min is not None:
        return _round_up_range(requested, policy.valid_range)
    if policy.valid_values is not None:
        return _round_up_valid_values(requested, policy.valid_values)
    return requested


def violates_policy(amount: Quantity, policy: CapacityRequestPolicy | None) -> bool:
    """``violatesPolicy``: above the range's max or off its step grid, or not a valid value.

    Upstream's "equals the default" shortcut compares the Go structs; validation keeps the default
    inside the policy, so comparing values gives the same answer."""
    if policy is None:
        return False
    if policy.default is not None and amount.value == policy.default.value:
        return False
    if policy.valid_range is not None:
        valid_range = policy.valid_range
        if valid_range.max is not None and amount.value > valid_range.max.value:
            return True
        if valid_range.step is not None:
            step = go_value(valid_range.step.value)
            start = go_value(valid_range.min.value) if valid_range.min is not None else 0
            if step and (go_value(amount.value) - start) % step != 0:
                return True
        return False
    if policy.valid_values:
        return all(amount.value != value.value for value in policy.valid_values)
    return False


def _requested(requests: Mapping[str, Quantity] | None, device: Device) -> Mapping[str, Quantity]:
    """The request's entries, all of which the device must publish (names compared as written,
    as ``requestsContainNonExistCapacity`` does in 1.36)."""
    requests = requests or {}
    missing = sorted(set(requests) - set(device.capacity))
    if missing:
        raise CapacityUndefined(f"some requested capacity has not been defined: {', '.join(missing)}")
    return requests


def consumed_capacity_from_request(
    requests: Mapping[str, Quantity] | None, device: Device
) -> dict[str, Quantity]:
    """``GetConsumedCapacityFromRequest``: the share of every capacity of the device, requested or not."""
    requests = requests or {}
    return {
        name: calculate_consumed_capacity(requests.get(name), value, device.request_policies.get(name))
        for name, value in device.capacity.items()
    }


def cmp_request_over_capacity(
    current: Mapping[str, Fraction] | None,
    requests: Mapping[str, Quantity] | None,
    device: Device,
    allocating: Mapping[str, Fraction] | None,
) -> bool:
    """``CmpRequestOverCapacity``: whether one more share fits beside those allocated before
    (``current``) and those taken in this search (``allocating``), each capacity rounded by its
    policy and not violating it. A request for a capacity the device lacks raises
    :class:`CapacityUndefined`. For a device without ``allowMultipleAllocations`` both are empty,
    so a request just has to fit the capacity."""
    requests = _requested(requests, device)
    for name, value in device.capacity.items():
        policy = device.request_policies.get(name)
        consumed = calculate_consumed_capacity(requests.get(name), value, policy)
        if violates_policy(consumed, policy):
            return False
        total = consumed.value + (current or {}).get(name, Fraction(0)) + (allocating or {}).get(name, 0)
        if total > value.value:
            return False
    return True


@dataclass
class CapacityShares:
    """Capacity taken by shares picked in one search (``allocatingCapacity``), per device.

    A device counts as having capacity in use while any share of it is picked, also a share that
    consumed nothing: one counter consumption covers all shares of a device. Counting shares keeps
    that true when one of two shares is given back (kubernetes/kubernetes#140431, in 1.36 through
    #140663: the empty-capacity marker survives while another share relies on it)."""

    sums: dict[DeviceID, dict[str, Fraction]] = field(default_factory=dict)
    count: dict[DeviceID, int] = field(default_factory=dict)

    def taking(self, device_id: DeviceID) -> Mapping[str, Fraction]:
        return self.sums.get(device_id, {})

    def in_use(self, device_id: DeviceID) -> bool:
        return self.count.get(device_id, 0) > 0

    def add(self, device_id: DeviceID, consumed: Mapping[str, Quantity]) -> None:
        sums = self.sums.setdefault(device_id, {})
        for name, quantity in consumed.items():
            sums[name] = sums.get(name, Fraction(0)) + quantity.value
        self.count[device_id] = self.count.get(device_id, 0) + 1

    def remove(self, device_id: DeviceID, consumed: Mapping[str, Quantity]) -> None:
        sums = self.sums.get(device_id, {})
        for name, quantity in consumed.items():
            sums[name] = sums.get(name, Fraction(0)) - quantity.value
        self.count[device_id] -= 1
        if not self.count[device_id]:
            del self.count[device_id]
            self.sums.pop(device_id, None)
