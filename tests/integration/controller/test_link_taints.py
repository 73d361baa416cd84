"""A device whose PCIe link keeps erring is tainted ``<driver>/link-errors`` in its stored slice,
with real processes: the emulator (its ``PCIeErrors`` fault adds to the switch port's
``PortMetrics.PCIeErrors``) → the fabric manager (reads the counters into its inventory) → the
controller (judges them with hysteresis) → the API test server.

One correctable error: no taint, ever. Correctable errors above the rate for longer than the sustain
time: ``PCIeCorrectable``. A fatal error: ``PCIeFatal`` at once. Counters quiet past the hold-down:
the taint is gone. (Thresholds shortened through the controller's settings: 60 correctable errors
a minute over a 2 s window, i.e. 2 allowed, sustained for 3 s; hold-down 4 s. The defaults are 10 a
minute over 60 s, sustained 300 s, hold-down 600 s.)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from fabric_dra_testbed.stack import ApiServer, Emulator, Manager, Stack
from tests.support.waiting import wait_until

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
WINDOW, SUSTAIN, RECOVER, PER_MINUTE = 2, 3, 4, 60
LINK_ARGS = (
    *("--link-correctable-per-minute", str(PER_MINUTE), "--link-window-seconds", str(WINDOW)),
    *("--link-sustain-seconds", str(SUSTAIN), "--link-recover-seconds", str(RECOVER)),
)

Taint = tuple[str, str, str]


@dataclass
class Links:
    emulator: Emulator
    manager: Manager
    api: ApiServer
    driver: str

    def taints(self) -> dict[str, list[Taint]]:
        """device → its (key, value, effect) taints as the API test server stores them."""
        with self.api.http() as http:
            response = http.get(
                "/apis/resource.k8s.io/v1/resourceslices",
                params={"fieldSelector": f"spec.driver={self.driver}"},
            )
        response.raise_for_status()
        return {
            d["name"]: [(t["key"], t.get("value", ""), t["effect"]) for t in d.get("taints") or []]
            for s in response.json()["items"]
            for d in s["spec"].get("devices") or []
        }

    def link_taint(self, device: str) -> Taint | None:
        return next((t for t in self.taints().get(device, []) if t[0] == f"{self.driver}/link-errors"), None)

    def counters(self, device: str) -> dict[str, int]:
        with httpx.Client(base_url=self.manager.url, timeout=30) as http:
            found = http.get(
                f"/api/v1/devices/{device}", headers={"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
            )
        found.raise_for_status()
        return dict(found.json().get("pcieErrors") or {})

    def wait_counters(self, device: str, **expected: int) -> None:
        wait_until(
            lambda: all(self.counters(device).get(k) == v for k, v in expected.items()),
            timeout=30,
            what=f"the manager reads {device}'s port counters {expected}",
        )


@pytest.fixture(scope="module")
def links(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Links]:
    with Stack.temporary("fdra-links-") as stack:
        emulator = stack.emulator(auth=False)
        api = stack.apiserver()
        manager = stack.manager(emulator, static_tokens={CONTROLLER_TOKEN: ("controller", None)})
        token: Path = tmp_path_factory.mktemp("tokens") / "controller"
        token.write_text(CONTROLLER_TOKEN + "\n")
        stack.controller(manager, api, token_file=token, args=LINK_ARGS)
        found = Links(emulator, manager, api, stack.driver_name)
        wait_until(lambda: "gpu0" in found.taints(), timeout=60, what="the pool published")
        if not found.counters("gpu0"):
            pytest.skip("the emulator's fabric links no PortMetrics to gpu0's port: no counters to judge")
        yield found


def test_one_correctable_error_never_taints_a_sustained_rate_does_until_the_hold_down(links: Links) -> None:
    links.emulator.inject({"Kind": "PCIeErrors", "Device": "gpu0", "CorrectableErrorCount": 1})
    links.wait_counters("gpu0", correctable=1)
    quiet_until = time.monotonic() + WINDOW + SUSTAIN + 2  # past the sustain, and the judge's next pass
    while time.monotonic() < quiet_until:
        assert links.link_taint("gpu0") is None, "one correctable error tainted the device"
        time.sleep(0.1)

    # 2 more errors every 0.3 s: ~13 in a 2 s window, far above the 2 allowed, until the taint shows
    started = time.monotonic()
    deadline = started + 30
    while links.link_taint("gpu0") is None and time.monotonic() < deadline:
        links.emulator.inject({"Kind": "PCIeErrors", "Device": "gpu0", "CorrectableErrorCount": 2})
        time.sleep(0.3)
    assert links.link_taint("gpu0") == (f"{links.driver}/link-errors", "PCIeCorrectable", "NoSchedule")
    assert time.monotonic() - started >= SUSTAIN - 0.5, "tainted before the rate was sustained"

    links.emulator.reset_faults()  # the counters are cleared and stay quiet
    stopped = time.monotonic()
    wait_until(lambda: links.link_taint("gpu0") is None, timeout=RECOVER + 30, what="the taint lifted")
    assert time.monotonic() - stopped >= RECOVER - 1, "lifted before the hold-down"


def test_a_fatal_error_taints_at_once_and_the_hold_down_lifts_it(links: Links) -> None:
    links.emulator.reset_faults()
    links.emulator.inject({"Kind": "PCIeErrors", "Device": "gpu1", "FatalErrorCount": 1})
    links.wait_counters("gpu1", fatal=1)
    taint = wait_until(lambda: links.link_taint("gpu1"), timeout=30, what="gpu1 tainted for its fatal error")
    assert taint == (f"{links.driver}/link-errors", "PCIeFatal", "NoSchedule")
    assert links.link_taint("gpu0") is None  # the other devices are untouched

    links.emulator.reset_faults()
    stopped = time.monotonic()
    wait_until(lambda: links.link_taint("gpu1") is None, timeout=RECOVER + 30, what="the taint lifted")
    assert time.monotonic() - stopped >= RECOVER - 1, "lifted before the hold-down"
