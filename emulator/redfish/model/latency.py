"""Latency profiles: how long the emulated fabric takes, and whether mutations become tasks.

``instant`` (CI): every mutation completes within its request (200/201/204), reads are
immediate. ``realistic``: binds and unbinds answer ``202 Accepted`` with a task monitor and
take seconds (a GPU hot-add about 3 s), with jitter; reads take a few milliseconds. A profile
file (YAML or JSON) has the shape of :class:`LatencyProfile`.
"""

from __future__ import annotations

import random
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from emulator.errors import ConfigError
from manager_api.devices import DeviceType

__all__ = ["INSTANT", "REALISTIC", "Delay", "LatencyProfile", "load_latency_profile"]


class Delay(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    seconds: float = Field(default=0.0, ge=0, le=3600)
    jitter: float = Field(default=0.0, ge=0, le=3600, description="uniform ± seconds around ``seconds``")

    def sample(self, rng: random.Random) -> float:
        if not self.jitter:
            return self.seconds
        return max(0.0, self.seconds + rng.uniform(-self.jitter, self.jitter))


class LatencyProfile(BaseModel):
    # camelCase in files, like topology files (snake_case is accepted too)
    model_config = ConfigDict(extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True)

    name: str = "custom"
    tasks: bool = Field(default=False, description="answer binds/unbinds with 202 and a task monitor")
    bind: dict[DeviceType, Delay] = Field(default_factory=dict)
    unbind: dict[DeviceType, Delay] = Field(default_factory=dict)
    sanitize: Delay = Field(
        default_factory=Delay,
        description="the DELETE of a memory chunk carved from a pool: its memory is sanitized before "
        "it is free again (MemoryRegion.SanitizeOnRelease); a task when the profile has tasks",
    )
    read: Delay = Field(default_factory=Delay)
    retry_after_seconds: int = Field(default=1, ge=1, le=60, description="Retry-After of task monitors")

    def operation_seconds(self, bind: bool, types: list[DeviceType], rng: random.Random) -> float:
        """An operation on several targets takes as long as its slowest one."""
        table = self.bind if bind else self.unbind
        return max((table.get(t, Delay()).sample(rng) for t in types), default=0.0)

    def sanitize_seconds(self, rng: random.Random) -> float:
        return self.sanitize.sample(rng)


INSTANT = LatencyProfile(name="instant")

#: a hot-add and a hot-remove of each device type: (seconds, jitter) of the bind, of the unbind
_REALISTIC_SECONDS = {
    DeviceType.GPU: ((3.0, 1.0), (1.5, 0.5)),
    DeviceType.FPGA: ((2.0, 0.5), (1.0, 0.3)),
    DeviceType.NVME: ((1.0, 0.3), (0.5, 0.2)),
    DeviceType.NIC: ((1.0, 0.3), (0.5, 0.2)),
    DeviceType.CXL_MEMORY: ((0.5, 0.2), (0.3, 0.1)),
}

REALISTIC = LatencyProfile(
    name="realistic",
    tasks=True,
    bind={t: Delay(seconds=s, jitter=j) for t, ((s, j), _) in _REALISTIC_SECONDS.items()},
    unbind={t: Delay(seconds=s, jitter=j) for t, (_, (s, j)) in _REALISTIC_SECONDS.items()},
    # a CXL device overwrites a released range before another host may have it (the realistic
    # profile's stand-in for a sanitize of a few GiB; real devices take longer for more)
    sanitize=Delay(seconds=1.0, jitter=0.3),
    read=Delay(seconds=0.005, jitter=0.003),
)

_BUILTIN = {"instant": INSTANT, "realistic": REALISTIC}


def load_latency_profile(spec: str) -> LatencyProfile:
    """``instant``, ``realistic`` or the path of a profile file; raises ConfigError with the reason."""
    if spec in _BUILTIN:
        return _BUILTIN[spec]
    path = Path(spec)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(
            f"latency profile {spec!r} is neither instant, realistic nor a readable file ({err.strerror})"
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"latency profile {spec}: not valid YAML/JSON: {err}") from None
    try:
        profile = LatencyProfile.model_validate(data)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"latency profile {spec}: {loc}: {first['msg']}") from None
    return profile if profile.name != "custom" else profile.model_copy(update={"name": path.stem})
