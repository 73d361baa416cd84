"""Which Kubernetes node each Redfish host is.

In this order:

1. an explicit map file (``--node-map``): ``{"hosts": {"<ComputerSystem Id, UUID or HostName>": "<node>"}}``
   (YAML or JSON);
2. with API access, the node whose ``status.nodeInfo.systemUUID`` equals the ComputerSystem
   ``UUID`` (both are the SMBIOS system UUID; compared case-insensitively), then the node whose
   name equals the system's Id or HostName;
3. without API access (local runs), the system's Id — else its HostName — lower-cased, when it is
   a valid node name.

Two hosts claiming one node is a configuration error: neither is mapped, and it is logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fabric.errors import ConfigError
from fabric.state.model import HostRecord
from plumbing.backoff import Backoff
from plumbing.kube.client import ApiError, KubeClient
from plumbing.kube.informer import Change, Informer, Origin
from plumbing.kube.resources import NODES
from plumbing.logs import get_logger
from plumbing.names import is_dns1123_subdomain

__all__ = ["NodeMapFile", "NodeResolver", "load_node_map"]

log = get_logger(__name__)


class NodeMapFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hosts: dict[str, str] = Field(
        default_factory=dict, description="ComputerSystem Id, UUID or HostName → Kubernetes node name"
    )


def load_node_map(path: Path) -> dict[str, str]:
    """The ``--node-map`` file; raises ConfigError with one clear line when it is wrong."""
    try:
        raw = yaml.safe_load(path.read_text()) or {}
        parsed = NodeMapFile.model_validate(raw)
    except OSError as err:
        raise ConfigError(f"cannot read node map {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"node map {path} is not YAML/JSON: {err}") from None
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"node map {path}: {where}: {first['msg']}") from None
    for key, node in parsed.hosts.items():
        if not is_dns1123_subdomain(node):
            raise ConfigError(f"node map {path}: hosts.{key}: {node!r} is not a valid node name")
    return {k.lower(): v for k, v in parsed.hosts.items()}


def _node_entry(item: Mapping[str, Any]) -> tuple[str, str | None]:
    """(node name, lower-case SMBIOS system UUID or None) of a Node object."""
    name = str((item.get("metadata") or {}).get("name") or "")
    uuid = ((item.get("status") or {}).get("nodeInfo") or {}).get("systemUUID")
    return name, (str(uuid).lower() if uuid else None)


def _node_table(items: list[dict[str, Any]]) -> dict[str, str | None]:
    """Node name → lower-case SMBIOS system UUID (or None) of listed Node objects."""
    return dict(entry for entry in map(_node_entry, items) if entry[0])


class NodeResolver:
    def __init__(self, explicit: Mapping[str, str] | None = None, kube: KubeClient | None = None) -> None:
        self.explicit = {k.lower(): v for k, v in (explicit or {}).items()}
        self.kube = kube
        #: node name → system UUID (lower case), from the API server
        self._nodes: dict[str, str | None] | None = None

    @property
    def nodes_known(self) -> bool:
        return self._nodes is not None

    async def refresh(self) -> None:
        """Re-read the cluster's nodes (no-op without API access)."""
        if self.kube is None:
            return
        try:
            items, _ = await self.kube.list_all(NODES)
        except ApiError as err:
            log.warning("cannot list nodes, keeping the last node list", error=str(err))
            return
        self._nodes = _node_table(items)

    async def watch(self, on_change: Callable[[], None], *, retry_seconds: float = 2.0) -> None:
        """Follow the cluster's Nodes until cancelled; call ``on_change`` when one registers, goes
        away or reports another system UUID, so a joining node's host gets its devices at once
        rather than at the next full resync."""
        if self.kube is None:
            return

        def changed(changes: Sequence[Change], origin: Origin) -> None:
            # A list is the whole table; a watch event changes one entry of it.
            current = dict(self._nodes or {}) if origin == "watch" else {}
            for change in changes:
                name, uuid = _node_entry(change.object)
                if not name:
                    continue
                if change.type == "DELETED":
                    current.pop(name, None)
                else:
                    current[name] = uuid
            if current != self._nodes:
                self._nodes = current
                on_change()

        # A steady retry, not a growing one: the node list is one request, and a host waits on it.
        steady = Backoff(initial=retry_seconds, maximum=retry_seconds)
        await Informer(self.kube, NODES, on_changes=changed, backoff=steady).run()

    def system_uuid(self, node: str) -> str | None:
        return (self._nodes or {}).get(node)

    def resolve(self, hosts: Mapping[str, HostRecord]) -> dict[str, str]:
        """ComputerSystem Id → node name, for the hosts that are nodes."""
        found: dict[str, str] = {}
        for host in hosts.values():
            node = self._resolve_one(host)
            if node:
                found[host.id] = node
        owners: dict[str, list[str]] = {}
        for host_id, node in found.items():
            owners.setdefault(node, []).append(host_id)
        for node, host_ids in owners.items():
            if len(host_ids) > 1:
                log.warning("several Redfish hosts map to one node; none is used", node=node, hosts=host_ids)
                for host_id in host_ids:
                    del found[host_id]
        return found

    def _resolve_one(self, host: HostRecord) -> str | None:
        keys = [k.lower() for k in (host.id, host.uuid, host.host_name) if k]
        for key in keys:
            if key in self.explicit:
                return self.explicit[key]
        names = [n.lower() for n in (host.id, host.host_name) if n]
        if self._nodes is not None:
            if host.uuid:
                for node, uuid in self._nodes.items():
                    if uuid == host.uuid.lower():
                        return node
            for name in names:
                if name in self._nodes:
                    return name
            return None
        if self.kube is not None:
            return None  # API access configured but no node list yet: do not guess
        for name in names:
            if is_dns1123_subdomain(name):
                return name
        return None
