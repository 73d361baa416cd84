"""The resource tree: every URI is a :class:`Node` reached segment by segment from the root.

A node renders its payload (a model from :mod:`emulator.redfish.model.resources`), names its children,
and handles the methods it allows; ``Allow`` headers and 405 answers come from
:attr:`Node.allow`, so they cannot disagree with what the node does. Actions are children of a
resource's ``Actions`` segment (``.../Actions/Zone.AddEndpoint``) and call
:meth:`Node.action` on the resource.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from emulator.redfish.engine.bindings import Revision
from emulator.redfish.engine.engine import Engine
from emulator.redfish.engine.events import EventBus
from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.resources import Action, Collection, Ref, Typed
from emulator.redfish.tree.auth import Account, Sessions
from emulator.redfish.tree.http import Reply, Request
from emulator.redfish.tree.render import Renderer
from emulator.topology import FabricIndex

__all__ = ["ActionNode", "CollectionNode", "Context", "Node", "actions", "collection_of", "not_allowed"]


@dataclass
class Context:
    """What views read and change: the topology, the engine, sessions and events."""

    index: FabricIndex
    engine: Engine
    sessions: Sessions
    account: Account | None
    events: EventBus
    revision: Revision
    renderer: Renderer
    service_uuid: str
    service_name: str
    vendor: str
    product: str


def not_allowed(node: Node, method: str) -> RedfishError:
    return RedfishError.of(
        405,
        "OperationNotAllowed",
        detail=f"{method} is not allowed on {node.uri}; allowed: {', '.join(node.allow)}.",
        headers={"Allow": ", ".join(node.allow)},
    )


def actions(uri: str, *names: str) -> dict[str, Action]:
    """The ``Actions`` property for ``names`` like ``Zone.AddEndpoint``."""
    return {f"#{name}": Action(target=f"{uri}/Actions/{name}") for name in names}


class Node:
    allow: tuple[str, ...] = ("GET", "HEAD")
    #: served without authentication (service root, OData documents)
    public = False
    #: Redfish resource (rendered as JSON with an ETag) as opposed to a task monitor or stream
    is_resource = True
    #: rendered once per state revision; False for a payload that also reads what changes without
    #: one (the hosts' trees, which their node agents write)
    cached = True

    def __init__(self, ctx: Context, uri: str) -> None:
        self.ctx = ctx
        self.uri = uri

    def render(self) -> Typed | Collection | dict[str, Any]:
        raise NotImplementedError

    def payload(self) -> dict[str, Any]:
        rendered = self.render()
        return rendered if isinstance(rendered, dict) else rendered.payload()

    def fingerprint(self) -> Hashable | None:
        """What :meth:`render` depends on, when that is a few facts cheaper to get than the
        rendering: its serialisation is then kept across state revisions while they stay the same
        (:class:`emulator.redfish.tree.render.Renderer`). None: rendered again on every revision."""
        return None

    def child(self, segment: str) -> Node | None:
        return None

    def action_names(self) -> tuple[str, ...]:
        return ()

    async def action(self, name: str, request: Request) -> Reply:
        raise not_allowed(self, "POST")

    async def get(self, request: Request) -> Reply:
        """Only for nodes that are not plain resources (task monitors); resources are rendered."""
        raise not_allowed(self, "GET")

    async def post(self, request: Request) -> Reply:
        raise not_allowed(self, "POST")

    async def patch(self, request: Request) -> Reply:
        raise not_allowed(self, "PATCH")

    async def delete(self, request: Request) -> Reply:
        raise not_allowed(self, "DELETE")

    def actions_child(self, segment: str) -> Node | None:
        """Resolve ``Actions`` for nodes that offer actions."""
        if segment == "Actions" and self.action_names():
            return _ActionsNode(self)
        return None


class _ActionsNode(Node):
    allow = ()
    is_resource = False

    def __init__(self, owner: Node) -> None:
        super().__init__(owner.ctx, f"{owner.uri}/Actions")
        self.owner = owner

    def child(self, segment: str) -> Node | None:
        if segment in self.owner.action_names():
            return ActionNode(self.owner, segment)
        return None


class ActionNode(Node):
    """``POST <resource>/Actions/<Name>``: the only method an action target takes."""

    allow = ("POST",)
    is_resource = False

    def __init__(self, owner: Node, name: str) -> None:
        super().__init__(owner.ctx, f"{owner.uri}/Actions/{name}")
        self.owner = owner
        self.name = name

    async def post(self, request: Request) -> Reply:
        return await self.owner.action(self.name, request)


class CollectionNode(Node):
    """A resource collection: members named by ``ids``, each made by ``make``."""

    def __init__(
        self,
        ctx: Context,
        uri: str,
        collection_type: str,
        name: str,
        ids: Callable[[], Iterable[str]],
        make: Callable[[str], Node | None],
        *,
        member_uri: Callable[[str], str] | None = None,
        on_post: Callable[[Request], Awaitable[Reply]] | None = None,
    ) -> None:
        super().__init__(ctx, uri)
        self.collection_type = collection_type
        self.name = name
        self.ids = ids
        self.make = make
        self.member_uri = member_uri or (lambda ident: f"{uri}/{ident}")
        self.on_post = on_post
        if on_post is not None:
            self.allow = ("GET", "HEAD", "POST")

    def render(self) -> Collection:
        return Collection(
            odata_id=self.uri,
            collection_type=self.collection_type,
            Name=self.name,
            Members=[Ref(odata_id=self.member_uri(i)) for i in self.ids()],
        )

    def fingerprint(self) -> Hashable | None:
        """All the rendering depends on: the members' Ids (the URI, type and name are the node's
        own). A collection is then serialised again only when its members change, not on every
        state revision — the Zones of a fabric not for each bind (and an expanded answer that
        holds it is checked without rendering it, :mod:`emulator.redfish.service.expanded`)."""
        if type(self).render is not CollectionNode.render:
            return None  # a subclass that renders more than its members
        return (self.collection_type, self.name, tuple(self.ids()))

    def child(self, segment: str) -> Node | None:
        return self.make(segment)

    async def post(self, request: Request) -> Reply:
        if self.on_post is None:
            raise not_allowed(self, "POST")
        return await self.on_post(request)


def collection_of(
    ctx: Context, uri: str, collection_type: str, name: str, members: Mapping[str, Callable[[], Node]]
) -> CollectionNode:
    """A collection whose members are known when it is made: member Id → how to make its node."""
    return CollectionNode(
        ctx,
        uri,
        collection_type,
        name,
        lambda: list(members),
        lambda i: members[i]() if i in members else None,
    )
