"""What every role's ``/metrics`` carries besides its own metrics: the process and the build.

``process_*`` (CPU, memory, open files, start time; Linux ``/proc``), ``python_info`` and
``fabric_dra_build_info{role, version}`` = 1, so a dashboard can tell the replicas and versions
apart and an alert can see a process restart. Each role registers them once on its registry.
"""

from __future__ import annotations

import platform
from http import HTTPStatus

from prometheus_client import CollectorRegistry, Gauge, PlatformCollector, ProcessCollector

from plumbing import __version__

__all__ = ["BUILD_INFO", "outcome_word", "register_process_metrics"]

#: the build-info metric's name (a gauge that is always 1, labelled with what was built)
BUILD_INFO = "fabric_dra_build_info"


def register_process_metrics(registry: CollectorRegistry, role: str) -> None:
    """Add the process, platform and build-info collectors to ``registry`` for ``role``."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    Gauge(
        BUILD_INFO,
        "The fabric-dra build a process runs: always 1, labelled with its role and version",
        ["role", "version", "python"],
        registry=registry,
    ).labels(role, __version__, platform.python_version()).set(1)


def outcome_word(outcome: str) -> str:
    """An ``outcome`` label in words: ``404`` → ``not_found``; a word stays as it is.

    HTTP codes make dashboards read like packet dumps and split one failure across several
    numbers; the status phrase is what people search for. An unknown code is ``http_error``."""
    if not outcome.isdigit():
        return outcome
    try:
        return HTTPStatus(int(outcome)).phrase.lower().replace(" ", "_").replace("-", "_")
    except ValueError:
        return "http_error"
