"""A device's facts are declared once (:class:`dra_driver.plugin.facts.DeviceFacts`); the records
that hold them derive from that declaration and agree with the manager's own."""

from __future__ import annotations

from dra_driver.plugin import cdi
from dra_driver.plugin.checkpoint import PreparedDevice
from dra_driver.plugin.facts import CLAIM_FACTS, CdiEnv, DeviceFacts
from manager_api.models import BindingState, Device, DeviceType

GPU = Device(
    name="gpu-0",
    pool="fabric-pcie",
    fabric="PCIe",
    type=DeviceType.GPU,
    model="H100",
    serial="1654922000123",
    vendor_id="0x10de",
    device_id="0x2330",
    memory_bytes=80 << 30,
    state=BindingState.BOUND,
    binding_style="zone",
    redfish_uri="/redfish/v1/Fabrics/PCIe/Endpoints/gpu-0",
)


def test_every_fact_is_a_field_of_the_managers_device() -> None:
    wire = set(Device.model_fields) | {"device"}  # the manager names the device ``name``
    assert set(DeviceFacts.fact_names()) - set(CLAIM_FACTS) <= wire
    # a share's ID and a partition's GPU come from the claim's allocation, never from the manager
    assert not set(CLAIM_FACTS) & wire


def test_the_records_inherit_the_facts_rather_than_copy_them() -> None:
    for record in (PreparedDevice, cdi.SpecDevice):
        assert issubclass(record, DeviceFacts)
        assert set(DeviceFacts.model_fields) <= set(record.model_fields)


def test_the_managers_answer_reaches_the_checkpoint_the_spec_and_the_scanner_whole() -> None:
    prepared = PreparedDevice(**DeviceFacts.of(GPU), request_names=["gpu"], attached=True)
    spec = prepared.spec_device("uid-1")
    for name in DeviceFacts.fact_names():
        if name in CLAIM_FACTS:
            assert getattr(prepared, name) is None, name
            continue
        expected = GPU.name if name == "device" else GPU.type.value if name == "type" else getattr(GPU, name)
        assert getattr(prepared, name) == expected, name
        assert getattr(spec, name) == expected, name
    identity = prepared.identity()
    assert (identity.name, identity.type, identity.serial, identity.memory_bytes) == (
        "gpu-0",
        "gpu",
        "1654922000123",
        80 << 30,
    )


def test_the_spec_variables_give_back_the_facts_they_carry() -> None:
    spec = PreparedDevice(**DeviceFacts.of(GPU), request_names=["gpu"]).spec_device("uid-1")
    prefix = cdi.env_prefix(spec.device)
    always, known = spec.cdi_env(prefix)
    env = {**always, **{k: v for k, v in known.items() if v}}
    back = DeviceFacts.from_cdi_env(env, prefix, type_of_kind="other")
    carried = [
        n for n, f in DeviceFacts.model_fields.items() if any(isinstance(m, CdiEnv) for m in f.metadata)
    ]
    assert {n: back[n] for n in carried} == {n: getattr(spec, n) for n in carried}
    assert "memory_bytes" not in carried  # never given to the container
