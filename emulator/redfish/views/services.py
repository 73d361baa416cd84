"""The service root and the services around the fabric: sessions, accounts, events, registries,
the manager, and the OData documents (service document and ``$metadata``)."""

from __future__ import annotations

import functools
import json
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from emulator.redfish.model import uris
from emulator.redfish.model.errors import RedfishError
from emulator.redfish.model.oem import OEM_NAMESPACES, OEM_SCHEMA_URI, oem_schema
from emulator.redfish.model.registries import REGISTRIES
from emulator.redfish.model.resources import (
    ALL_TYPES,
    AccountService,
    EventService,
    Manager,
    ManagerAccount,
    ManagerAccountLinks,
    ManagerLinks,
    MessageRegistryFile,
    ProtocolFeaturesSupported,
    RegistryLocation,
    Role,
    ServiceRoot,
    ServiceRootLinks,
    Session,
    SessionService,
    SSEFilterPropertiesSupported,
    Status,
    ref,
    refs,
)
from emulator.redfish.tree.expand import expand_query, expand_served
from emulator.redfish.tree.http import Reply, Request, parse_body
from emulator.redfish.tree.nodes import CollectionNode, Context, Node, collection_of
from emulator.redfish.views.common import Segment, ServiceNode
from emulator.topology import FABRIC_CXL
from plumbing import __version__

__all__ = [
    "COLLECTION_TYPES",
    "AccountServiceNode",
    "EventServiceNode",
    "EventStreamNode",
    "MetadataNode",
    "ODataNode",
    "ServiceRootNode",
    "SessionServiceNode",
    "described_by",
    "managers_node",
    "metadata_document",
    "registries_node",
    "schemas_node",
]

#: Where DMTF publishes the schemas (CSDL ``<Name>_v1.xml``, JSON Schema ``<Namespace>.json``):
#: the emulator serves none of DMTF's schema files, so ``$metadata`` and the ``Link`` headers
#: point there, as DSP0266 allows ("a URI to a local version" or the published one). Its own OEM
#: schema (emulator.redfish.model.oem) it serves itself, under ``/redfish/v1/Schemas``.
DMTF_SCHEMAS = "http://redfish.dmtf.org/schemas/v1"
_TYPE_FIRST = b'{"@odata.type":"#'

#: Every collection type the service serves; ``$metadata`` references their schemas.
COLLECTION_TYPES = (
    "ChassisCollection",
    "ComputerSystemCollection",
    "ConnectionCollection",
    "CXLLogicalDeviceCollection",
    "DriveCollection",
    "EndpointCollection",
    "EventDestinationCollection",
    "FabricCollection",
    "ManagerAccountCollection",
    "ManagerCollection",
    "MemoryChunksCollection",
    "MemoryDomainCollection",
    "MessageRegistryFileCollection",
    "NetworkAdapterCollection",
    "PCIeDeviceCollection",
    "PCIeFunctionCollection",
    "PortCollection",
    "ProcessorCollection",
    "ResourceBlockCollection",
    "RoleCollection",
    "SessionCollection",
    "SwitchCollection",
    "TaskCollection",
    "ZoneCollection",
)

_ROLES = {
    "Administrator": ["Login", "ConfigureManager", "ConfigureUsers", "ConfigureSelf", "ConfigureComponents"],
    "Operator": ["Login", "ConfigureSelf", "ConfigureComponents"],
    "ReadOnly": ["Login", "ConfigureSelf"],
}

_TOP_LEVEL = (
    ("Systems", "/Systems"),
    ("Chassis", "/Chassis"),
    ("Fabrics", "/Fabrics"),
    ("Managers", "/Managers"),
    ("CompositionService", "/CompositionService"),
    ("SessionService", "/SessionService"),
    ("AccountService", "/AccountService"),
    ("Tasks", "/TaskService"),
    ("EventService", "/EventService"),
    ("Registries", "/Registries"),
)


def _manager_uuid(ctx: Context) -> str:
    return str(uuid.uuid5(uuid.UUID(ctx.service_uuid), "fabric-manager"))


class ServiceRootNode(Node):
    public = True

    def __init__(self, ctx: Context, children: dict[str, Node]) -> None:
        super().__init__(ctx, uris.ROOT)
        self.children = children

    def render(self) -> ServiceRoot:
        # behaviour.resourceBlocks "root-only": an expansion enclosure's service, which lists its
        # blocks at the root (ServiceRoot 1.5 ResourceBlocks) and has no systems, fabrics or
        # CompositionService of its own (the tree leaves them out too: build_tree)
        enclosure = self.ctx.index.topology.behaviour.resource_blocks == "root-only"
        return ServiceRoot(
            odata_id=f"{uris.ROOT}/",
            Id="RootService",
            Name=self.ctx.service_name,
            RedfishVersion="1.21.0",
            UUID=self.ctx.service_uuid,
            Vendor=self.ctx.vendor,
            Product=self.ctx.product,
            ProtocolFeaturesSupported=ProtocolFeaturesSupported(
                ExpandQuery=expand_query(self.ctx), SelectQuery=expand_served(self.ctx)
            ),
            Systems=None if enclosure else ref(f"{uris.ROOT}/Systems"),
            Chassis=ref(f"{uris.ROOT}/Chassis"),
            Fabrics=None if enclosure else ref(f"{uris.ROOT}/Fabrics"),
            Managers=ref(uris.MANAGERS),
            CompositionService=None if enclosure else ref(uris.COMPOSITION),
            ResourceBlocks=ref(f"{uris.ROOT}/ResourceBlocks") if enclosure else None,
            SessionService=ref(uris.SESSION_SERVICE),
            AccountService=ref(uris.ACCOUNT_SERVICE),
            Tasks=ref(uris.TASK_SERVICE),
            EventService=ref(uris.EVENT_SERVICE),
            Registries=ref(uris.REGISTRIES),
            Links=ServiceRootLinks(Sessions=ref(uris.SESSIONS)),
        )

    def child(self, segment: str) -> Node | None:
        return self.children.get(segment)


class ODataNode(Node):
    """The OData service document (DSP0266 "OData service document")."""

    public = True

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, f"{uris.ROOT}/odata")

    def render(self) -> dict[str, Any]:
        value = [{"name": "Service", "kind": "Singleton", "url": f"{uris.ROOT}/"}]
        value += [
            {"name": name, "kind": "Singleton", "url": f"{uris.ROOT}{path}"} for name, path in _TOP_LEVEL
        ]
        return {"@odata.context": f"{uris.ROOT}/$metadata", "value": value}


def metadata_document() -> str:
    """``$metadata``: a reference to every schema the payloads use (DSP0266 "Service metadata")."""
    namespaces: dict[str, set[str]] = {}
    for model in ALL_TYPES:
        schema, version, _ = model.ODATA_TYPE.split(".")
        namespaces.setdefault(schema, {schema}).add(f"{schema}.{version}")
    for collection in COLLECTION_TYPES:
        namespaces.setdefault(collection, {collection})
    for schema in ("Resource", "Message", "Protocol", "PCIeDevice"):
        namespaces.setdefault(schema, {schema})
    namespaces["Resource"].add("Resource.v1_0_0")
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        '<edmx:Edmx xmlns:edmx="http://docs.oasis-open.org/odata/ns/edmx" Version="4.0">',
    ]
    for schema in sorted(namespaces):
        lines.append(f'  <edmx:Reference Uri="{DMTF_SCHEMAS}/{schema}_v1.xml">')
        lines += [f'    <edmx:Include Namespace="{ns}"/>' for ns in sorted(namespaces[schema])]
        lines.append("  </edmx:Reference>")
    lines.append(f'  <edmx:Reference Uri="{OEM_SCHEMA_URI}">')
    lines += [f'    <edmx:Include Namespace="{ns}"/>' for ns in OEM_NAMESPACES]
    lines.append("  </edmx:Reference>")
    root_version = next(m for m in ALL_TYPES if m.__name__ == "ServiceRoot").ODATA_TYPE.rsplit(".", 1)[0]
    lines += [
        "  <edmx:DataServices>",
        '    <Schema xmlns="http://docs.oasis-open.org/odata/ns/edm" Namespace="Service">',
        f'      <EntityContainer Name="Service" Extends="{root_version}.ServiceContainer"/>',
        "    </Schema>",
        "  </edmx:DataServices>",
        "</edmx:Edmx>",
    ]
    return "\n".join(lines) + "\n"


def described_by(body: bytes) -> str | None:
    """The ``Link`` header of a resource read (DSP0266 v1.20.0 "Link header": ``rel=describedby``
    on every GET and HEAD, naming the JSON Schema of the resource; a versioned schema must be
    the version of its ``@odata.type``): ``<…/ServiceRoot.v1_20_0.json>; rel=describedby``, or
    ``<…/ZoneCollection.json>`` for a collection, whose type is unversioned. ``None`` for a body
    without ``@odata.type``."""
    if body.startswith(_TYPE_FIRST):  # every model renders it first (models.Typed, Collection)
        odata_type = body[len(_TYPE_FIRST) : body.index(b'"', len(_TYPE_FIRST))].decode()
    else:
        found = json.loads(body).get("@odata.type")
        if not isinstance(found, str):
            return None
        odata_type = found.lstrip("#")
    namespace = odata_type.rsplit(".", 1)[0]  # ServiceRoot.v1_20_0.ServiceRoot → ServiceRoot.v1_20_0
    return f"<{DMTF_SCHEMAS}/{namespace}.json>; rel=describedby"


class MetadataNode(Node):
    """``$metadata``, and every other CSDL document the service serves: open to all, as XML."""

    public = True
    is_resource = False

    def __init__(
        self, ctx: Context, uri: str = f"{uris.ROOT}/$metadata", document: str | None = None
    ) -> None:
        super().__init__(ctx, uri)
        self.document = (document if document is not None else metadata_document()).encode()

    async def get(self, request: Request) -> Reply:
        raise AssertionError("served by the application as XML")


def schemas_node(ctx: Context) -> Node:
    """``/redfish/v1/Schemas``: the service's own schema files (its OEM extension's CSDL)."""
    oem = MetadataNode(ctx, OEM_SCHEMA_URI, oem_schema())
    return Segment(ctx, OEM_SCHEMA_URI.rsplit("/", 1)[0], {OEM_SCHEMA_URI.rsplit("/", 1)[1]: oem})


# --- sessions and accounts -------------------------------------------------------------------


class _Login(BaseModel):
    model_config = ConfigDict(extra="forbid")
    UserName: str
    Password: str
    Context: str | None = Field(default=None, max_length=256)


class _SessionServicePatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    SessionTimeout: int | None = None


class SessionServiceNode(ServiceNode, at=uris.SESSION_SERVICE):
    allow = ("GET", "HEAD", "PATCH")

    def render(self) -> SessionService:
        return SessionService(
            **self.service(),
            ServiceEnabled=True,
            SessionTimeout=self.ctx.sessions.timeout_seconds,
            Sessions=ref(uris.SESSIONS),
        )

    async def patch(self, request: Request) -> Reply:
        body = parse_body(_SessionServicePatch, request.json())
        if body.SessionTimeout is not None:
            # SessionService v1_0: SessionTimeout is between 30 and 86400 seconds
            if not 30 <= body.SessionTimeout <= 86400:
                raise RedfishError.of(
                    400,
                    "PropertyValueOutOfRange",
                    body.SessionTimeout,
                    "SessionTimeout",
                    related=["/SessionTimeout"],
                )
            self.ctx.sessions.timeout_seconds = body.SessionTimeout
            self.ctx.revision.bump()
        return Reply(200, self.payload())

    def child(self, segment: str) -> Node | None:
        if segment == "Sessions":
            return SessionsNode(self.ctx)
        return None


class SessionsNode(CollectionNode):
    public_post = True

    def __init__(self, ctx: Context) -> None:
        super().__init__(
            ctx,
            uris.SESSIONS,
            "SessionCollection",
            "Sessions",
            ctx.sessions.ids,
            lambda s: SessionNode(ctx, s) if ctx.sessions.get(s) else None,
            on_post=self._login,
        )

    async def _login(self, request: Request) -> Reply:
        body = parse_body(_Login, request.json())
        account = self.ctx.account
        if account is not None and not await self.ctx.sessions.throttle.check(
            request.client, lambda: account.check(body.UserName, body.Password)
        ):
            raise RedfishError.of(401, "NoValidSession", detail="Wrong user name or password.")
        info = self.ctx.sessions.create(body.UserName, request.client)
        if info is None:
            raise RedfishError.of(
                503, "CreateLimitReachedForResource", detail="Too many open sessions; delete unused ones."
            )
        node = SessionNode(self.ctx, info.id)
        headers = {"X-Auth-Token": info.token, "Location": node.uri}
        if self.ctx.index.topology.behaviour.session_login == "no-content":
            return Reply(204, None, headers)  # as some services do; DMTF's library accepts it
        return Reply(201, node.payload(), headers)

    def child(self, segment: str) -> Node | None:
        if segment == "Members":
            return _SessionMembersNode(self)
        return super().child(segment)


class _SessionMembersNode(Node):
    """``POST .../Sessions/Members`` logs in like a POST to the collection (DSP0266 "Creating a
    session": the collection's ``Members`` property URI takes the POST too)."""

    allow = ("POST",)
    is_resource = False

    def __init__(self, sessions: SessionsNode) -> None:
        super().__init__(sessions.ctx, f"{sessions.uri}/Members")
        self.sessions = sessions

    async def post(self, request: Request) -> Reply:
        return await self.sessions._login(request)


class SessionNode(Node):
    allow = ("GET", "HEAD", "DELETE")

    def __init__(self, ctx: Context, session_id: str) -> None:
        super().__init__(ctx, f"{uris.SESSIONS}/{session_id}")
        self.session_id = session_id

    def render(self) -> Session:
        info = self.ctx.sessions.get(self.session_id)
        if info is None:
            raise RedfishError.of(404, "ResourceNotFound", "Session", self.session_id)
        return Session(
            odata_id=self.uri,
            Id=info.id,
            Name=f"Session of {info.username}",
            UserName=info.username,
            CreatedTime=info.created,
            ClientOriginIPAddress=info.origin,
        )

    async def delete(self, request: Request) -> Reply:
        self.ctx.sessions.delete(self.session_id)
        return Reply(204)


class AccountServiceNode(ServiceNode, at=uris.ACCOUNT_SERVICE):
    def render(self) -> AccountService:
        return AccountService(
            **self.service(),
            MinPasswordLength=8,
            Accounts=ref(uris.ACCOUNTS),
            Roles=ref(uris.ROLES),
        )

    def child(self, segment: str) -> Node | None:
        ctx = self.ctx
        if segment == "Accounts":
            accounts = {"1": functools.partial(AccountNode, ctx)} if ctx.account is not None else {}
            return collection_of(ctx, uris.ACCOUNTS, "ManagerAccountCollection", "Accounts", accounts)
        if segment == "Roles":
            roles = {r: functools.partial(RoleNode, ctx, r) for r in _ROLES}
            return collection_of(ctx, uris.ROLES, "RoleCollection", "Roles", roles)
        return None


class AccountNode(Node):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, f"{uris.ACCOUNTS}/1")

    def render(self) -> ManagerAccount:
        if self.ctx.account is None:  # an anonymous service has no account to show
            raise RedfishError.of(404, "ResourceNotFound", "ManagerAccount", "1")
        return ManagerAccount(
            odata_id=self.uri,
            Id="1",
            Name="Fabric administrator",
            UserName=self.ctx.account.username,
            RoleId=self.ctx.account.role,
            AccountTypes=["Redfish"],
            Links=ManagerAccountLinks(Role=ref(f"{uris.ROLES}/{self.ctx.account.role}")),
        )


class RoleNode(Node):
    def __init__(self, ctx: Context, role: str) -> None:
        super().__init__(ctx, f"{uris.ROLES}/{role}")
        self.role = role

    def render(self) -> Role:
        return Role(
            odata_id=self.uri,
            Id=self.role,
            Name=f"{self.role} role",
            RoleId=self.role,
            AssignedPrivileges=_ROLES[self.role],
        )


# --- events, registries, manager --------------------------------------------------------------


class EventStreamNode(Node):
    """``GET /redfish/v1/EventService/SSE``: served as a stream by the application."""

    is_resource = False

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, uris.SSE)


class EventServiceNode(ServiceNode, at=uris.EVENT_SERVICE):
    def render(self) -> EventService:
        return EventService(
            **self.service(),
            # SSE only, stated as the EventService schema allows: no property of it says "no push"
            # (DSP8010 2025.x), so ServerSentEventUri is the one delivery offered, the push-only
            # delivery settings (DeliveryRetry*) are left out, Subscriptions takes no POST (its
            # Allow header), and the Description says so in words.
            Description="Fabric events as Server-Sent Events at ServerSentEventUri only; "
            "push-style subscriptions (POST to Subscriptions) are not offered",
            ServerSentEventUri=uris.SSE,
            SSEFilterPropertiesSupported=SSEFilterPropertiesSupported(),
            RegistryPrefixes=sorted(REGISTRIES),
            ResourceTypes=sorted(
                {
                    "Endpoint",
                    "Zone",
                    "Connection",
                    "ComputerSystem",
                    "ResourceBlock",
                    "Task",
                    "Port",
                    "PCIeDevice",
                    "MemoryChunks",
                }
            ),
            Subscriptions=ref(f"{self.uri}/Subscriptions"),
        )

    def child(self, segment: str) -> Node | None:
        if segment == "SSE":
            return EventStreamNode(self.ctx)
        if segment == "Subscriptions":
            uri = f"{self.uri}/Subscriptions"
            return collection_of(self.ctx, uri, "EventDestinationCollection", "Event subscriptions", {})
        return None


def registries_node(ctx: Context) -> CollectionNode:
    files = {f"{prefix}.{version}": prefix for prefix, version in REGISTRIES.items()}
    members = {f: functools.partial(RegistryFileNode, ctx, f, files[f]) for f in sorted(files)}
    return collection_of(ctx, uris.REGISTRIES, "MessageRegistryFileCollection", "Message registries", members)


class RegistryFileNode(Node):
    def __init__(self, ctx: Context, file_id: str, prefix: str) -> None:
        super().__init__(ctx, f"{uris.REGISTRIES}/{file_id}")
        self.file_id, self.prefix = file_id, prefix

    def render(self) -> MessageRegistryFile:
        major, minor, _ = REGISTRIES[self.prefix].split(".")
        return MessageRegistryFile(
            odata_id=self.uri,
            Id=self.file_id,
            Name=f"{self.prefix} message registry",
            Languages=["en"],
            Registry=f"{self.prefix}.{major}.{minor}",
            Location=[
                RegistryLocation(PublicationUri=f"https://redfish.dmtf.org/registries/{self.file_id}.json")
            ],
        )


def managers_node(ctx: Context) -> CollectionNode:
    managers = {"FabricManager": functools.partial(ManagerNode, ctx)}
    return collection_of(ctx, uris.MANAGERS, "ManagerCollection", "Managers", managers)


class ManagerNode(Node):
    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, uris.MANAGER)

    def render(self) -> Manager:
        index = self.ctx.index
        return Manager(
            odata_id=self.uri,
            Id="FabricManager",
            Name="Fabric manager",
            Description="The emulated fabric's management service",
            ManagerType="FabricManager",
            UUID=_manager_uuid(self.ctx),
            Model="fabric-dra emulator",
            FirmwareVersion=__version__,
            ServiceEntryPointUUID=self.ctx.service_uuid,
            Status=Status(),
            Links=ManagerLinks(
                ManagerForChassis=refs(
                    [
                        uris.chassis(c)
                        for c in list(index.switches) + [d.id for d in index.fabric_devices(FABRIC_CXL)]
                    ]
                ),
                ManagerForSwitches=refs([uris.switch(s.fabric, s.id) for s in index.switches.values()]),
                ManagerForServers=refs([uris.system(h) for h in index.hosts]),
            ),
        )
