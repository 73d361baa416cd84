"""The ``resource.k8s.io`` and core objects device selection reads, as pydantic models.

Field names follow ``k8s.io/api/resource/v1/types.go``. The same models read ``v1beta1``
and ``v1beta2`` objects: a ``v1beta1`` device's ``basic`` block is unwrapped and a
``v1beta1`` request (``deviceClassName`` directly on the request) becomes an ``exactly``
request, as the API server's own conversion does. Unknown fields are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from dra_driver.selection.quantity import Quantity, parse_quantity

__all__ = [
    "AllocationMode",
    "CELDeviceSelector",
    "CapacityRequestPolicy",
    "CapacityRequestPolicyRange",
    "CapacityRequirements",
    "CounterSet",
    "Device",
    "DeviceAttribute",
    "DeviceClaim",
    "DeviceClass",
    "DeviceConstraint",
    "DeviceCounterConsumption",
    "DeviceRequest",
    "DeviceSelector",
    "DeviceSubRequest",
    "DeviceTaint",
    "DeviceToleration",
    "ExactDeviceRequest",
    "Meta",
    "Node",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "ResourceClaimSpec",
    "ResourceSlice",
    "ResourceSlicePool",
    "ResourceSliceSpec",
]

AllocationMode = Literal["ExactCount", "All"]


class _Model(BaseModel):
    model_config = ConfigDict(
        extra="ignore", populate_by_name=True, frozen=True, arbitrary_types_allowed=True
    )


def _to_quantity(value: Any) -> Any:
    if isinstance(value, Quantity) or value is None:
        return value
    if isinstance(value, bool):
        raise ValueError("a quantity, not a boolean")
    return parse_quantity(str(value))


#: a ``resource.Quantity`` field, read from its string (or number) form
QuantityField = Annotated[Quantity, BeforeValidator(_to_quantity)]


def _counter_values(value: Any) -> Any:
    """``counters: {name: {value: 4Gi}}`` → ``{name: Quantity}``."""
    if not isinstance(value, dict):
        return value
    return {
        name: _to_quantity(entry.get("value") if isinstance(entry, dict) else entry)
        for name, entry in value.items()
    }


class Meta(_Model):
    name: str = ""
    namespace: str | None = None
    uid: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class NodeSelectorRequirement(_Model):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)


class NodeSelectorTerm(_Model):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list, alias="matchExpressions")
    match_fields: list[NodeSelectorRequirement] = Field(default_factory=list, alias="matchFields")


class NodeSelector(_Model):
    node_selector_terms: list[NodeSelectorTerm] = Field(default_factory=list, alias="nodeSelectorTerms")


class Node(_Model):
    metadata: Meta

    @property
    def name(self) -> str:
        return self.metadata.name


class DeviceAttribute(_Model):
    int_value: int | None = Field(default=None, alias="int")
    bool_value: bool | None = Field(default=None, alias="bool")
    string_value: str | None = Field(default=None, alias="string")
    version_value: str | None = Field(default=None, alias="version")

    def value(self) -> int | bool | str | None:
        """The one value set, in the order compile.go's ``getAttributeValue`` checks them."""
        for candidate in (self.int_value, self.bool_value, self.string_value, self.version_value):
            if candidate is not None:
                return candidate
        return None

    def kind(self) -> str:
        if self.int_value is not None:
            return "int"
        if self.bool_value is not None:
            return "bool"
        if self.string_value is not None:
            return "string"
        if self.version_value is not None:
            return "version"
        return "unknown"

    def display(self) -> str:
        value = self.value()
        return str(value).lower() if isinstance(value, bool) else str(value)


class DeviceTaint(_Model):
    key: str
    value: str = ""
    effect: str

    def display(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


class CounterSet(_Model):
    """``spec.sharedCounters[]``: a named set of counters devices of the pool consume from."""

    name: str
    counters: Annotated[dict[str, Quantity], BeforeValidator(_counter_values)] = Field(default_factory=dict)


class DeviceCounterConsumption(_Model):
    """``device.consumesCounters[]``: what the device takes from one counter set while allocated."""

    counter_set: str = Field(alias="counterSet")
    counters: Annotated[dict[str, Quantity], BeforeValidator(_counter_values)] = Field(default_factory=dict)


class CapacityRequestPolicyRange(_Model):
    min: QuantityField | None = None
    max: QuantityField | None = None
    step: QuantityField | None = None


class CapacityRequestPolicy(_Model):
    """``capacity[name].requestPolicy``: how a share's request is rounded (consumable capacity)."""

    default: QuantityField | None = None
    valid_values: list[QuantityField] | None = Field(default=None, alias="validValues")
    valid_range: CapacityRequestPolicyRange | None = Field(default=None, alias="validRange")


class Device(_Model):
    name: str
    attributes: dict[str, DeviceAttribute] = Field(default_factory=dict)
    capacity: dict[str, Quantity] = Field(default_factory=dict)
    node_name: str | None = Field(default=None, alias="nodeName")
    node_selector: NodeSelector | None = Field(default=None, alias="nodeSelector")
    all_nodes: bool | None = Field(default=None, alias="allNodes")
    taints: list[DeviceTaint] = Field(default_factory=list)
    binds_to_node: bool | None = Field(default=None, alias="bindsToNode")
    binding_conditions: list[str] = Field(default_factory=list, alias="bindingConditions")
    binding_failure_conditions: list[str] = Field(default_factory=list, alias="bindingFailureConditions")
    allow_multiple_allocations: bool | None = Field(default=None, alias="allowMultipleAllocations")
    consumes_counters: list[DeviceCounterConsumption] = Field(default_factory=list, alias="consumesCounters")
    #: ``capacity[name].requestPolicy``, by capacity name (read from the same ``capacity`` map)
    request_policies: dict[str, CapacityRequestPolicy] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _unwrap_basic(cls, data: Any) -> Any:
        # v1beta1 nests everything but the name under ``basic``.
        if isinstance(data, dict) and isinstance(data.get("basic"), dict):
            merged = {k: v for k, v in data.items() if k != "basic"}
            merged.update(data["basic"])
            data = merged
        if (
            isinstance(data, dict)
            and isinstance(data.get("capacity"), dict)
            and "request_policies" not in data
        ):
            policies = {
                name: entry["requestPolicy"]
                for name, entry in data["capacity"].items()
                if isinstance(entry, dict) and isinstance(entry.get("requestPolicy"), dict)
            }
            if policies:
                data = {**data, "request_policies": policies}
        return data

    @field_validator("capacity", mode="before")
    @classmethod
    def _parse_capacity(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        parsed: dict[str, Quantity] = {}
        for name, entry in value.items():
            raw = entry.get("value") if isinstance(entry, dict) else entry  # v1alpha3: bare quantity
            if isinstance(raw, Quantity):
                parsed[name] = raw
            elif isinstance(raw, int | float) and not isinstance(raw, bool):
                parsed[name] = parse_quantity(str(raw))
            else:
                parsed[name] = parse_quantity(str(raw))
        return parsed


class ResourceSlicePool(_Model):
    name: str
    generation: int = 0
    resource_slice_count: int = Field(default=1, alias="resourceSliceCount")


class ResourceSliceSpec(_Model):
    driver: str
    pool: ResourceSlicePool
    node_name: str | None = Field(default=None, alias="nodeName")
    node_selector: NodeSelector | None = Field(default=None, alias="nodeSelector")
    all_nodes: bool | None = Field(default=None, alias="allNodes")
    per_device_node_selection: bool | None = Field(default=None, alias="perDeviceNodeSelection")
    devices: list[Device] = Field(default_factory=list)
    shared_counters: list[CounterSet] = Field(default_factory=list, alias="sharedCounters")


class ResourceSlice(_Model):
    metadata: Meta
    spec: ResourceSliceSpec

    @property
    def name(self) -> str:
        return self.metadata.name


class CELDeviceSelector(_Model):
    expression: str


class DeviceSelector(_Model):
    cel: CELDeviceSelector | None = None


class DeviceClassSpec(_Model):
    selectors: list[DeviceSelector] = Field(default_factory=list)
    config: list[dict[str, Any]] = Field(default_factory=list)


class DeviceClass(_Model):
    metadata: Meta
    spec: DeviceClassSpec = Field(default_factory=DeviceClassSpec)

    @property
    def name(self) -> str:
        return self.metadata.name


class DeviceToleration(_Model):
    key: str = ""
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = Field(default=None, alias="tolerationSeconds")


class CapacityRequirements(_Model):
    """``capacity.requests`` of a request: the share of each consumable capacity it asks for."""

    requests: dict[str, QuantityField] = Field(default_factory=dict)


class _RequestFields(_Model):
    device_class_name: str = Field(default="", alias="deviceClassName")
    selectors: list[DeviceSelector] = Field(default_factory=list)
    allocation_mode: AllocationMode = Field(default="ExactCount", alias="allocationMode")
    count: int = 1
    tolerations: list[DeviceToleration] = Field(default_factory=list)
    capacity: CapacityRequirements | None = None

    @field_validator("allocation_mode", mode="before")
    @classmethod
    def _default_mode(cls, value: Any) -> Any:
        return "ExactCount" if value in (None, "") else value

    @field_validator("count", mode="before")
    @classmethod
    def _default_count(cls, value: Any) -> Any:
        return 1 if value is None else value


class ExactDeviceRequest(_RequestFields):
    admin_access: bool | None = Field(default=None, alias="adminAccess")


class DeviceSubRequest(_RequestFields):
    name: str


class DeviceRequest(_Model):
    name: str
    exactly: ExactDeviceRequest | None = None
    first_available: list[DeviceSubRequest] = Field(default_factory=list, alias="firstAvailable")

    @model_validator(mode="before")
    @classmethod
    def _from_v1beta1(cls, data: Any) -> Any:
        # v1beta1/v1beta2 requests carry the exact-request fields directly on the request.
        if not isinstance(data, dict) or "exactly" in data or data.get("firstAvailable"):
            return data
        fields = {
            "deviceClassName",
            "selectors",
            "allocationMode",
            "count",
            "adminAccess",
            "tolerations",
            "capacity",
        }
        if any(k in data for k in fields):
            exactly = {k: data[k] for k in fields if k in data}
            rest = {k: v for k, v in data.items() if k not in fields}
            return {**rest, "exactly": exactly}
        return data


class DeviceConstraint(_Model):
    requests: list[str] = Field(default_factory=list)
    match_attribute: str | None = Field(default=None, alias="matchAttribute")
    distinct_attribute: str | None = Field(default=None, alias="distinctAttribute")


class DeviceClaim(_Model):
    requests: list[DeviceRequest] = Field(default_factory=list)
    constraints: list[DeviceConstraint] = Field(default_factory=list)
    config: list[dict[str, Any]] = Field(default_factory=list)


class ResourceClaimSpec(_Model):
    devices: DeviceClaim = Field(default_factory=DeviceClaim)
