"""What a real API server of a given release serves by default: its feature gates and the API
versions it turns on, and how ``--feature-gates`` / ``--runtime-config`` change them.

Feature gate defaults per release are those of ``pkg/features/kube_features.go``
(``defaultVersionedKubernetesFeatureGates``): the first release each (stage, default) pair holds
from. Only the gates that decide what happens to fields fabric-dra writes or reads are listed;
a gate the server drops fields for is modelled in :mod:`.strategy`.

API versions: beta APIs are off by default since Kubernetes 1.24 (KEP-3136), so a 1.34+ server
serves ``resource.k8s.io/v1`` only; ``v1beta1`` and ``v1beta2`` need
``--runtime-config resource.k8s.io/v1beta1=true`` (the kind cluster of ``deploy/kind`` turns
``v1beta1`` on that way).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from kube_standin.errors import ConfigError

__all__ = [
    "BETA_OFF_BY_DEFAULT",
    "GATE_DEFAULTS",
    "FeatureGateError",
    "FeatureGates",
    "ServedVersions",
    "parse_feature_gates",
    "parse_runtime_config",
    "release_of",
]

#: gate -> ((first release, default), ...), oldest first (kube_features.go, v1.34 to v1.37).
GATE_DEFAULTS: Mapping[str, tuple[tuple[str, bool], ...]] = {
    # alpha 1.32, beta (on) 1.34, GA 1.36
    "DRAAdminAccess": (("1.34", True),),
    # alpha 1.34, beta (on) 1.36
    "DRAConsumableCapacity": (("1.34", False), ("1.36", True)),
    # alpha 1.34, beta (on) 1.36; needs DRAResourceClaimDeviceStatus
    "DRADeviceBindingConditions": (("1.34", False), ("1.36", True)),
    # alpha 1.35, beta 1.36 (off: "depends on an off-by-default beta API"), GA 1.37
    "DRADeviceTaintRules": (("1.34", False), ("1.37", True)),
    # alpha 1.33, beta (on) 1.36, GA 1.37
    "DRADeviceTaints": (("1.34", False), ("1.36", True)),
    # alpha 1.33, beta (on) 1.36
    "DRAPartitionableDevices": (("1.34", False), ("1.36", True)),
    # beta (on) 1.34, GA 1.36
    "DRAPrioritizedList": (("1.34", True),),
    # beta (on) since 1.33, GA 1.37
    "DRAResourceClaimDeviceStatus": (("1.34", True),),
    # alpha 1.36
    "DRANodeAllocatableResources": (("1.34", False),),
}

#: group/versions a default server does not serve (beta APIs are off by default).
BETA_OFF_BY_DEFAULT: frozenset[str] = frozenset({"resource.k8s.io/v1beta1", "resource.k8s.io/v1beta2"})


class FeatureGateError(ConfigError, ValueError):
    """A ``--feature-gates`` or ``--runtime-config`` value the real server would refuse too."""


def release_of(version: str) -> tuple[int, int]:
    """``1.36.2`` / ``v1.36`` -> (1, 36)."""
    parts = version.lstrip("v").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError) as err:
        raise FeatureGateError(f"not a Kubernetes version: {version!r}") from err


def _default(gate: str, release: tuple[int, int]) -> bool:
    value = False
    for since, default in GATE_DEFAULTS[gate]:
        if release >= release_of(since):
            value = default
    return value


def parse_feature_gates(text: str | None) -> dict[str, bool]:
    """``A=true,B=false`` as the API server's ``--feature-gates`` reads it."""
    gates: dict[str, bool] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.strip().partition("=")
        if not sep or value.lower() not in ("true", "false"):
            problem = f"missing bool value for {name}" if not sep else f"invalid value of {item}"
            raise FeatureGateError(problem)
        if name not in GATE_DEFAULTS:
            raise FeatureGateError(f"unrecognized feature gate: {name}")
        gates[name] = value.lower() == "true"
    return gates


def parse_runtime_config(text: str | None) -> dict[str, bool]:
    """``resource.k8s.io/v1beta1=true,...`` (``group/version[=true|false]``)."""
    config: dict[str, bool] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.strip().partition("=")
        if sep and value.lower() not in ("true", "false"):
            raise FeatureGateError(f"invalid value {value!r} for runtime config {key}")
        if "/" not in key:
            raise FeatureGateError(f"runtime config {key!r} must be group/version")
        config[key] = not sep or value.lower() == "true"
    return config


@dataclass(frozen=True)
class FeatureGates:
    """The gates of one server: the release's defaults, changed by ``--feature-gates``."""

    release: tuple[int, int]
    overrides: Mapping[str, bool]

    @classmethod
    def of(cls, server_version: str, overrides: Mapping[str, bool] | None = None) -> FeatureGates:
        return cls(release_of(server_version), dict(overrides or {}))

    def enabled(self, gate: str) -> bool:
        if gate in self.overrides:
            return self.overrides[gate]
        return _default(gate, self.release)

    def bindings_on(self) -> bool:
        """Whether ``bindsToNode`` and binding conditions are kept: both gates are needed."""
        return self.enabled("DRADeviceBindingConditions") and self.enabled("DRAResourceClaimDeviceStatus")

    def all(self) -> dict[str, bool]:
        return {gate: self.enabled(gate) for gate in GATE_DEFAULTS}


@dataclass(frozen=True)
class ServedVersions:
    """Which group/versions the server serves: all it knows, less the betas not turned on."""

    runtime_config: Mapping[str, bool]

    def allows(self, group: str, version: str) -> bool:
        key = f"{group}/{version}" if group else version
        if key in self.runtime_config:
            return self.runtime_config[key]
        return key not in BETA_OFF_BY_DEFAULT

    def filter(self, group: str, versions: Iterable[str]) -> tuple[str, ...]:
        return tuple(v for v in versions if self.allows(group, v))


#: the newest release's defaults, where nothing else is configured
NEWEST_DEFAULTS = FeatureGates((1, 37), {})
ALL_SERVED = ServedVersions(dict.fromkeys(BETA_OFF_BY_DEFAULT, True))
