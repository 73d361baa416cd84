"""The emulator's Redfish resource tree, rooted at ``/redfish/v1``."""

from __future__ import annotations

from typing import Any

from emulator.redfish.model import uris
from emulator.redfish.tree.nodes import Context, Node
from emulator.redfish.views.chassis import ChassisCollectionNode
from emulator.redfish.views.composition import CompositionServiceNode, root_blocks_node
from emulator.redfish.views.fabrics import fabrics_node
from emulator.redfish.views.oem import OemNode
from emulator.redfish.views.services import (
    AccountServiceNode,
    EventServiceNode,
    EventStreamNode,
    MetadataNode,
    ODataNode,
    ServiceRootNode,
    SessionServiceNode,
    managers_node,
    registries_node,
    schemas_node,
)
from emulator.redfish.views.systems import systems_node
from emulator.redfish.views.tasks import TaskServiceNode

__all__ = ["EventStreamNode", "MetadataNode", "build_tree", "resolve", "resolve_under"]


class _Oem(Node):
    allow = ()
    is_resource = False

    def child(self, segment: str) -> Node | None:
        return OemNode(self.ctx) if segment == "FabricDRA" else None


def build_tree(ctx: Context) -> ServiceRootNode:
    children: dict[str, Node] = {
        "odata": ODataNode(ctx),
        "$metadata": MetadataNode(ctx),
        "Schemas": schemas_node(ctx),
        "Systems": systems_node(ctx),
        "Chassis": ChassisCollectionNode(ctx),
        "Fabrics": fabrics_node(ctx),
        "Managers": managers_node(ctx),
        "CompositionService": CompositionServiceNode(ctx),
        "SessionService": SessionServiceNode(ctx),
        "AccountService": AccountServiceNode(ctx),
        "TaskService": TaskServiceNode(ctx),
        "EventService": EventServiceNode(ctx),
        "Registries": registries_node(ctx),
        "Oem": _Oem(ctx, f"{uris.ROOT}/Oem"),
    }
    if ctx.index.topology.behaviour.resource_blocks == "root-only":
        for name in ("Systems", "Fabrics", "CompositionService"):
            del children[name]
        children["ResourceBlocks"] = root_blocks_node(ctx)
    return ServiceRootNode(ctx, children)


def resolve(root: ServiceRootNode, path: str) -> Node | None:
    """The node at ``path`` (``/redfish/v1/...``, trailing slash ignored), or None."""
    if path.rstrip("/") == uris.ROOT:
        return root
    if not path.startswith(uris.ROOT + "/"):
        return None
    node: Node | None = root
    for segment in path[len(uris.ROOT) + 1 :].rstrip("/").split("/"):
        if node is None or not segment:
            return None
        node = node.child(segment)
    return node


def resolve_under(root: ServiceRootNode, base: Node, path: str, made: dict[str, Node | None]) -> Node | None:
    """The node at ``path``, reached from ``base`` when it lies under it (else from the root), as
    :func:`resolve` would give it. ``made`` (URI → node, ``base`` among them) keeps the nodes met
    on the way for the next path: the members of one expanded collection are its children, so
    the collection (a switch's 116 ports, each port's metrics) is not made again from the root for
    each of them."""
    path = path.rstrip("/")
    if path in made:
        return made[path]
    parent, _, segment = path.rpartition("/")
    if not segment or "//" in path or not parent.startswith(base.uri):
        made[path] = found = resolve(root, path)
        return found
    above = made[parent] if parent in made else resolve_under(root, base, parent, made)
    made[path] = found = above.child(segment) if above is not None else None
    return found


def render_uri(root: ServiceRootNode, uri: str) -> dict[str, Any] | None:
    node = resolve(root, uri)
    if node is None or not node.is_resource:
        return None
    return node.payload()
