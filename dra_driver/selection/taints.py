"""Device taints and request tolerations (KEP-5055, ``resourceclaim.ToleratesTaint``)."""

from __future__ import annotations

from collections.abc import Sequence

from dra_driver.selection.model import DeviceTaint, DeviceToleration

__all__ = ["BLOCKING_EFFECTS", "tolerates", "untolerated_taints"]

#: Only these effects keep a device from being allocated; others (``None``) are informational
#: (structured/allocator.go, ``taintPreventsAllocation``).
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})


def tolerates(toleration: DeviceToleration, taint: DeviceTaint) -> bool:
    if toleration.effect and toleration.effect != taint.effect:
        return False
    if toleration.key and toleration.key != taint.key:
        return False
    if toleration.operator == "Exists":
        return True
    # "Equal" (the default) with an empty key only makes sense with Exists; it never matches.
    return bool(toleration.key) and toleration.value == taint.value


def untolerated_taints(
    taints: Sequence[DeviceTaint], tolerations: Sequence[DeviceToleration]
) -> list[DeviceTaint]:
    return [
        taint
        for taint in taints
        if taint.effect in BLOCKING_EFFECTS and not any(tolerates(t, taint) for t in tolerations)
    ]
