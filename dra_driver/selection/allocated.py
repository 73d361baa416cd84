"""What existing allocations hold, as the scheduler hands it to the allocator (``AllocatedState``).

Kubernetes builds it from every allocated claim (``foreachAllocatedDevice`` in the scheduler's DRA
plugin, ``internal/allocatedstate.go``): a result with a ``shareID`` is one share of an
``allowMultipleAllocations`` device (``AllocatedSharedDeviceIDs``), and its ``consumedCapacity``,
when set, adds to the device's ``AggregatedCapacity``; any other result holds its device
exclusively (``AllocatedDevices``); admin-access results hold nothing. Here each entry also keeps
the claim holding it (``namespace/name``), so explanations can name it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from dra_driver.selection.pools import DeviceID
from dra_driver.selection.quantity import Quantity, QuantityError, parse_quantity
from plumbing.kube.dra import ResourceClaim

__all__ = ["AllocatedState", "Share"]


@dataclass(frozen=True)
class Share:
    """One allocation of a shared device: its claim, share ID and consumed capacity (None: unset)."""

    claim: str
    share_id: str
    consumed: Mapping[str, Quantity] | None = None


@dataclass
class AllocatedState:
    #: devices held exclusively → the claim holding each
    devices: dict[DeviceID, str] = field(default_factory=dict)
    #: shared devices → their shares
    shares: dict[DeviceID, list[Share]] = field(default_factory=dict)

    @classmethod
    def of(cls, allocated: AllocatedState | Mapping[DeviceID, str] | None) -> AllocatedState:
        """A state as given, or one of exclusively held devices (``device → claim``)."""
        if isinstance(allocated, AllocatedState):
            return allocated
        return cls(devices=dict(allocated or {}))

    @classmethod
    def from_claims(
        cls,
        claims: Iterable[Mapping[str, object]],
        exclude: set[str] | None = None,
        *,
        consumable_capacity: bool = True,
    ) -> AllocatedState:
        """The state of claims given as JSON objects; ``exclude`` names claims (``namespace/name``)
        whose own allocation does not count, e.g. the claim being explained. With
        ``consumable_capacity`` off a share ID is ignored and the result holds its device, as the
        scheduler does with the feature gate off."""
        state = cls()
        for obj in claims:
            claim = ResourceClaim.read(obj)
            if claim is None:
                continue
            key = f"{claim.metadata.namespace or ''}/{claim.metadata.name}"
            if not exclude or key not in exclude:
                state.add_claim(key, claim, consumable_capacity=consumable_capacity)
        return state

    def add_claim(self, key: str, claim: ResourceClaim, *, consumable_capacity: bool = True) -> None:
        for result in claim.results:
            if result.admin_access:
                continue
            device_id = (result.driver, result.pool, result.device)
            if consumable_capacity and result.share_id:
                self.shares.setdefault(device_id, []).append(
                    Share(key, result.share_id, _quantities(result.consumed_capacity))
                )
            else:
                self.devices[device_id] = key

    def merge(self, other: AllocatedState) -> None:
        self.devices.update(other.devices)
        for device_id, shares in other.shares.items():
            self.shares.setdefault(device_id, []).extend(shares)

    def is_allocated(self, device_id: DeviceID) -> bool:
        """``IsDeviceAllocated``: held exclusively, or by at least one share."""
        return device_id in self.devices or bool(self.shares.get(device_id))

    def aggregated(self, device_id: DeviceID) -> dict[str, Fraction] | None:
        """``AggregatedCapacity`` of a device: the sum of its shares' consumed capacity, None when
        no share recorded any (a share without ``consumedCapacity`` adds no entry)."""
        total: dict[str, Fraction] | None = None
        for share in self.shares.get(device_id, ()):
            if share.consumed is None:
                continue
            total = {} if total is None else total
            for name, quantity in share.consumed.items():
                total[name] = total.get(name, Fraction(0)) + quantity.value
        return total

    def holders(self, device_id: DeviceID) -> list[str]:
        """The claims holding a device, exclusively or by shares, each once."""
        found = [self.devices[device_id]] if device_id in self.devices else []
        for share in self.shares.get(device_id, ()):
            if share.claim not in found:
                found.append(share.claim)
        return found


def _quantities(consumed: Mapping[str, str] | None) -> dict[str, Quantity] | None:
    # Go reads an empty map of an omitempty field back as nil: no entry either way.
    if not consumed:
        return None
    parsed: dict[str, Quantity] = {}
    for name, text in consumed.items():
        try:
            parsed[name] = parse_quantity(str(text))
        except QuantityError:
            continue
    return parsed
