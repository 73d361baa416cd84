"""Shared counters of partitionable devices (KEP-4815, ``DRAPartitionableDevices``).

A pool's counter sets (``spec.sharedCounters`` of its counter slices) bound what its devices may
take together: a device consumes counters (``consumesCounters``) while it is allocated. As in
``checkAvailableCounters`` / ``deallocateCountersForDevice`` of ``internal/incubating/
allocator_incubating.go``:

- what is *available* in a pool is each counter's value less the consumption of every allocated
  device of the pool — the devices of slices for this node and of slices for other nodes alike —
  computed once per pool and snapshot; it may be negative (an over-allocated pool);
- a search *consumes* counters for each device it picks; a device fits only when, after adding
  its consumption, no counter of any set of the pool is consumed beyond what is available — so an
  over-allocated pool admits no counter-consuming device at all;
- a shared (``allowMultipleAllocations``) device consumes its counters once, for its first share;
- whatever a search consumed is given back when it drops the device (upstream's rollback fix,
  kubernetes/kubernetes#140431, backported to 1.36 by #140663).

Admin-access results hold nothing, so they consume no counters in the snapshot; in a search an
admin-access pick still has to fit the counters, as upstream (kubernetes/kubernetes#140729, open).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from dra_driver.selection.allocated import AllocatedState
from dra_driver.selection.pools import DeviceRef, Pool, PoolID

__all__ = ["CounterShortfall", "CounterUse", "Counters"]

#: counter set → counter → amount
CounterSets = dict[str, dict[str, Fraction]]


@dataclass(frozen=True)
class CounterShortfall:
    """Why a device does not fit its pool's counters: the first counter it would over-commit."""

    counter_set: str
    counter: str
    total: Fraction
    used: Fraction
    needed: Fraction
    #: claims holding devices that consume this counter, in slice order
    holders: tuple[str, ...]


def _add(into: CounterSets, ref: DeviceRef, sign: int) -> None:
    for consumption in ref.device.consumes_counters:
        counters = into.setdefault(consumption.counter_set, {})
        for name, quantity in consumption.counters.items():
            counters[name] = counters.get(name, Fraction(0)) + sign * quantity.value


@dataclass
class Counters:
    """Available counters per pool for one snapshot of slices and allocations (``availableCounters``)."""

    allocated: AllocatedState
    _available: dict[PoolID, CounterSets] = field(default_factory=dict)

    def available(self, pool: Pool) -> CounterSets:
        found = self._available.get(pool.id)
        if found is None:
            found = {name: dict(counters) for name, counters in pool.counter_sets.items()}
            for ref in self.allocated_refs(pool):
                for consumption in ref.device.consumes_counters:
                    counters = found.get(consumption.counter_set, {})
                    for name, quantity in consumption.counters.items():
                        if name in counters:
                            counters[name] -= quantity.value
            self._available[pool.id] = found
        return found

    def allocated_refs(self, pool: Pool) -> Iterable[DeviceRef]:
        """Allocated devices of the pool, for this node's slices and other nodes' alike."""
        return (ref for ref in (*pool.refs, *pool.other_refs) if self.allocated.is_allocated(ref.id))

    def shortfall(self, pool: Pool, ref: DeviceRef) -> CounterShortfall | None:
        """The first counter ``ref`` alone would over-commit given the allocations, else None."""
        if not ref.device.consumes_counters:
            return None
        available = self.available(pool)
        wanted: CounterSets = {}
        _add(wanted, ref, 1)
        for set_name, total_counters in sorted(pool.counter_sets.items()):
            for name, total in sorted(total_counters.items()):
                need = wanted.get(set_name, {}).get(name, Fraction(0))
                free = available.get(set_name, {}).get(name, total)
                if free < need:
                    holders = tuple(
                        claim
                        for other in self.allocated_refs(pool)
                        if any(
                            c.counter_set == set_name and name in c.counters
                            for c in other.device.consumes_counters
                        )
                        for claim in self.allocated.holders(other.id)
                    )
                    return CounterShortfall(
                        set_name, name, total, total - free, need, tuple(dict.fromkeys(holders))
                    )
        return None


@dataclass
class CounterUse:
    """Counters consumed by the devices one search has picked (``consumedCounters``)."""

    counters: Counters
    consumed: dict[PoolID, CounterSets] = field(default_factory=dict)

    def take(self, pool: Pool, ref: DeviceRef) -> bool:
        """Add ``ref``'s consumption; when any counter of the pool would go below zero, give it
        back and say no."""
        available = self.counters.available(pool)
        consumed = self.consumed.setdefault(pool.id, {})
        _add(consumed, ref, 1)
        for set_name, counters in available.items():
            used = consumed.get(set_name, {})
            if any(free < used.get(name, 0) for name, free in counters.items()):
                _add(consumed, ref, -1)
                return False
        return True

    def give_back(self, pool: Pool, ref: DeviceRef) -> None:
        _add(self.consumed.setdefault(pool.id, {}), ref, -1)
