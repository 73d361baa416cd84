"""Why a device's shared counters or consumable capacity cannot take one more allocation, in words
an operator can act on, naming the claims that hold what is missing.

- counters: ``gpu-3: memory-slice-2 in use by claim team-a/trainer`` — the counter set, the
  counter, and the claims holding devices that consume it (``… 60 GiB of 80 GiB in use by
  claims …; 40 GiB needed`` when part of it is free);
- capacity: ``cxl-pool-1: 180 GiB of 256 GiB in use; 96 GiB asked (held by claims team-a/db
  64 GiB, team-b/cache 116 GiB)`` — the share asked for is the request as the capacity's
  ``requestPolicy`` rounds it, which the text says when it differs from the request.

The judgement is the allocator's own (:mod:`.counters`, :mod:`.capacity`) over the existing
allocations alone: what one search picks for a pod's other requests is not in it.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from dra_driver.selection.allocated import AllocatedState
from dra_driver.selection.capacity import calculate_consumed_capacity, violates_policy
from dra_driver.selection.counters import CounterShortfall
from dra_driver.selection.model import CapacityRequestPolicy
from dra_driver.selection.pools import DeviceRef
from dra_driver.selection.quantity import Quantity, format_quantity

__all__ = ["capacity_misfit", "counter_misfit", "describe_amount"]

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def describe_amount(value: Fraction, *, bytes_like: bool = True) -> str:
    """``180 GiB`` for whole multiples of a binary unit, else the quantity as Kubernetes writes it."""
    if bytes_like and value.denominator == 1 and value > 0:
        for unit, factor in _UNITS:
            if value >= factor and value.numerator % factor == 0:
                return f"{value.numerator // factor} {unit}"
    return format_quantity(value, binary=False)


def _claims(holders: tuple[str, ...] | list[str]) -> str:
    if not holders:
        return ""
    return f" by claim {holders[0]}" if len(holders) == 1 else f" by claims {', '.join(holders)}"


def counter_misfit(shortfall: CounterShortfall) -> str:
    """``gpu-3: memory-slice-2 in use by claim ns/name``, or with amounts when part is free."""
    free = shortfall.total - shortfall.used
    where = f"{shortfall.counter_set}: {shortfall.counter}"
    holders = _claims(shortfall.holders)
    if free <= 0 and shortfall.needed >= shortfall.total:
        return f"{where} in use{holders}"
    used = describe_amount(shortfall.used)
    total = describe_amount(shortfall.total)
    return f"{where} {used} of {total} in use{holders}; {describe_amount(shortfall.needed)} needed"


def _policy_words(policy: CapacityRequestPolicy) -> str:
    if policy.valid_values:
        return "valid values " + ", ".join(describe_amount(v.value) for v in policy.valid_values)
    parts = []
    valid_range = policy.valid_range
    if valid_range is not None:
        if valid_range.min is not None:
            parts.append(f"min {describe_amount(valid_range.min.value)}")
        if valid_range.max is not None:
            parts.append(f"max {describe_amount(valid_range.max.value)}")
        if valid_range.step is not None:
            parts.append(f"step {describe_amount(valid_range.step.value)}")
    return ", ".join(parts) or "its request policy"


def _share_holders(allocated: AllocatedState, ref: DeviceRef, name: str) -> str:
    by_claim: dict[str, Fraction] = {}
    for share in allocated.shares.get(ref.id, ()):
        if share.consumed is not None and name in share.consumed:
            by_claim[share.claim] = by_claim.get(share.claim, Fraction(0)) + share.consumed[name].value
    if not by_claim:
        return ""
    listed = ", ".join(f"{claim} {describe_amount(amount)}" for claim, amount in by_claim.items())
    return f" (held by claim{'s' if len(by_claim) > 1 else ''} {listed})"


def capacity_misfit(
    ref: DeviceRef, requests: Mapping[str, Quantity] | None, allocated: AllocatedState
) -> str | None:
    """Why one more share of ``ref`` does not fit beside the existing allocations, None if it does."""
    device = ref.device
    requests = requests or {}
    missing = sorted(set(requests) - set(device.capacity))
    if missing:
        return f"{device.name}: requests capacity {', '.join(missing)}, which the device does not publish"
    used = allocated.aggregated(ref.id) or {}
    several = len(device.capacity) > 1
    for name, value in device.capacity.items():
        label = f"{device.name}: {name + ' ' if several else ''}"
        policy = device.request_policies.get(name)
        asked = calculate_consumed_capacity(requests.get(name), value, policy)
        if policy is not None and violates_policy(asked, policy):
            amount = describe_amount(asked.value)
            return f"{label}{amount} asked, outside the requestPolicy ({_policy_words(policy)})"
        in_use = used.get(name, Fraction(0))
        if asked.value + in_use <= value.value:
            continue
        requested = requests.get(name)
        rounded = ""
        if requested is not None and requested.value != asked.value:
            rounded = f" ({describe_amount(requested.value)} requested, rounded up by the requestPolicy)"
        elif requested is None:
            rounded = (
                " (no request: the policy's default)"
                if policy and policy.default
                else " (no request: all of it)"
            )
        return (
            f"{label}{describe_amount(in_use)} of {describe_amount(value.value)} in use; "
            f"{describe_amount(asked.value)} asked{rounded}{_share_holders(allocated, ref, name)}"
        )
    return None
