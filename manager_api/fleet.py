"""Several fabric managers, one per Redfish service: who they are and which pool each serves.

A cluster may have one Redfish service for its PCIe GPU enclosures and another for a CXL memory
appliance, each with its own manager (docs/manager.md, "Several Redfish services"). The controller
and the plugin are given them all (``--manager NAME=URL``, the unnamed ``--manager-url`` first) and
learn from each manager's inventory which pools it serves. A pool belongs to one manager: when two
report the same pool name, the one listed first keeps it and the later one's is refused
(:class:`PoolOwners`), so the controller never publishes two services' devices in one pool and a
plugin never sends an attach to the wrong service. The rule is the same in both roles, so they
agree on the owner without talking to each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from plumbing.names import is_dns1123_label

__all__ = [
    "UNNAMED",
    "ManagerEndpoint",
    "PoolCollision",
    "PoolOwners",
    "endpoints_of",
    "manager_name_problem",
    "managers_problem",
]

#: the name of the manager given by ``--manager-url`` alone (a deployment of one service)
UNNAMED = ""


def manager_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a manager (it becomes part of label values and metric labels)."""
    if not is_dns1123_label(name) or len(name) > 30:
        return "a manager's name must be a DNS label of at most 30 characters (e.g. pcie, cxl-appliance)"
    return None


def managers_problem(url: str | None, named: Mapping[str, str]) -> str | None:
    """Why the managers a role is given do not do: none at all, a bad name or URL, or a name
    that would read as the unnamed manager's."""
    if not url and not named:
        return "give the fabric manager: --manager-url URL, or --manager NAME=URL once per manager"
    for name, named_url in named.items():
        problem = manager_name_problem(name)
        if problem is not None:
            return f"--manager {name}=…: {problem}"
        if url and name == "default":
            return "--manager default=…: 'default' is the name of --manager-url's manager; choose another"
        if not named_url.startswith(("http://", "https://")):
            return f"--manager {name}={named_url}: expected an http:// or https:// URL"
    return None


@dataclass(frozen=True, slots=True)
class ManagerEndpoint:
    """How to reach one manager: its name (``""`` for the unnamed one), URL and credentials."""

    name: str
    url: str
    token_file: Path | None = None
    ca_file: Path | None = None

    @property
    def label(self) -> str:
        """The name in logs and metrics: ``default`` for the unnamed manager."""
        return self.name or "default"


def endpoints_of(
    url: str | None,
    named: Mapping[str, str],
    *,
    token_file: Path | None = None,
    ca_file: Path | None = None,
    token_files: Mapping[str, Path] | None = None,
    ca_files: Mapping[str, Path] | None = None,
) -> list[ManagerEndpoint]:
    """Every manager a role is given, in the order that decides a pool's owner: the unnamed
    ``url`` first, then ``named`` in the order given. ``token_file`` and ``ca_file`` serve every
    manager that ``token_files`` / ``ca_files`` name no file of its own for."""
    token_files, ca_files = token_files or {}, ca_files or {}
    out = [ManagerEndpoint(UNNAMED, url, token_file, ca_file)] if url else []
    for name, named_url in named.items():
        out.append(
            ManagerEndpoint(name, named_url, token_files.get(name, token_file), ca_files.get(name, ca_file))
        )
    return out


@dataclass(frozen=True, slots=True)
class PoolCollision:
    """``pool`` is reported by ``refused`` too; ``owner`` (listed first) keeps it."""

    pool: str
    owner: str
    refused: str


class PoolOwners:
    """Pool → the manager that serves it, from each manager's latest inventory; the manager listed
    first keeps a pool two of them report."""

    def __init__(self, order: Sequence[str]) -> None:
        self._rank = {name: i for i, name in enumerate(order)}
        self._pools: dict[str, frozenset[str]] = {name: frozenset() for name in order}

    def update(self, manager: str, pools: Iterable[str]) -> list[PoolCollision]:
        """``manager`` now serves ``pools``; the collisions this makes that were not there before."""
        before = set(self.collisions())
        self._pools[manager] = frozenset(pools)
        return [c for c in self.collisions() if c not in before]

    def owner(self, pool: str) -> str | None:
        """The manager that serves ``pool``, or None when no manager reports it."""
        serving = [name for name, pools in self._pools.items() if pool in pools]
        return min(serving, key=self._rank.__getitem__) if serving else None

    def owned(self, manager: str) -> frozenset[str]:
        """The pools ``manager`` reports and keeps."""
        return frozenset(p for p in self._pools.get(manager, ()) if self.owner(p) == manager)

    def refused(self, manager: str) -> frozenset[str]:
        """The pools ``manager`` reports that a manager listed before it keeps."""
        return self._pools.get(manager, frozenset()) - self.owned(manager)

    def collisions(self) -> list[PoolCollision]:
        out = []
        for name, pools in self._pools.items():
            for pool in sorted(pools):
                owner = self.owner(pool)
                if owner is not None and owner != name:
                    out.append(PoolCollision(pool, owner, name))
        return out
