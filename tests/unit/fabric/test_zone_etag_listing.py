"""The Zones listing that carries each zone's ETag (``$expand`` + ``$select``): what it is read
as, and when it cannot be used (the zone backend then reads every zone as before)."""

from __future__ import annotations

from typing import Any

from fabric.backends.views import ServiceRoot
from fabric.backends.zone_reads import _member_etags

ZONES = "/redfish/v1/Fabrics/PCIe/Zones"


def _member(ident: str, **extra: Any) -> dict[str, Any]:
    return {"@odata.id": f"{ZONES}/{ident}", "Id": ident, **extra}


def test_each_member_with_its_etag() -> None:
    page = {"Members": [_member("a", **{"@odata.etag": 'W/"1"'}), _member("b/", **{"@odata.etag": 'W/"2"'})]}
    assert _member_etags(page) == {f"{ZONES}/a": 'W/"1"', f"{ZONES}/b": 'W/"2"'}
    assert _member_etags({"Members": []}) == {}


def test_a_listing_that_cannot_say_what_changed_is_not_used() -> None:
    tagged = _member("a", **{"@odata.etag": 'W/"1"'})
    assert _member_etags({"Members": [tagged, _member("b")]}) is None, "a member without its ETag"
    assert _member_etags({"Members": [tagged, {"@odata.id": f"{ZONES}/c"}]}) is None, "a bare link"
    assert _member_etags({"Members": [tagged], "Members@odata.nextLink": f"{ZONES}?$skip=1"}) is None
    assert _member_etags({"Id": "a"}) is None, "$select applied to the collection itself: no Members"
    assert _member_etags({"Members": {"a": tagged}}) is None


def test_select_is_used_only_where_the_service_root_advertises_it() -> None:
    def root(features: dict[str, Any]) -> ServiceRoot:
        return ServiceRoot.model_validate({"ProtocolFeaturesSupported": features})

    assert root({"SelectQuery": True}).supports_select
    assert not root({"SelectQuery": False}).supports_select
    assert not root({}).supports_select
    assert not root({"SelectQuery": "yes"}).supports_select, "not a boolean: not advertised"
