"""The fabric map (``/ui``) in a real headless Chromium against a running emulator and manager.

The page must show a device bound by an attach made through the API without being reloaded (it
follows the inventory's long poll), keep its data behind the read API's token, and draw a
1,000-device fabric quickly. The screenshot it leaves is ``<artifacts>/fabric-map.png``
(:func:`tests.support.browser.artifacts_dir`: ``$FABRIC_DRA_ARTIFACTS`` or ``build/artifacts``);
``docs/images/fabric-map.png`` in the README is a copy of it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fabric_dra_testbed.stack import Manager, Stack
from tests.support.browser import Browser, artifacts_dir, chromium_binary
from tests.support.tools import needs_tool
from tests.support.uids import claim_uid

CONTROLLER_TOKEN = "controller-token-0123456789abcdef"
OPERATOR_TOKEN = "operator-token-0123456789abcdef"

CHROMIUM, WHY_NOT = chromium_binary()
pytestmark = needs_tool(CHROMIUM, WHY_NOT)


@pytest.fixture(scope="module")
def manager() -> Iterator[Manager]:
    with Stack.temporary("fdra-ui-") as stack:
        emulator = stack.emulator(auth=False)
        yield stack.manager(
            emulator,
            ledger="file",
            static_tokens={CONTROLLER_TOKEN: ("controller", None), OPERATOR_TOKEN: ("operator", None)},
        )


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    assert CHROMIUM is not None
    profile = tmp_path / "chromium"
    profile.mkdir()
    with Browser(CHROMIUM, profile) as browser:
        yield browser


def _state(browser: Browser, device: str) -> dict[str, str] | None:
    found = browser.evaluate(
        f"(() => {{ const e = document.querySelector('[data-device={json.dumps(device)}]');"
        " return e && {state: e.dataset.state, node: e.dataset.node, claim: e.dataset.claim}; })()"
    )
    return found if isinstance(found, dict) else None


def test_the_map_follows_an_attach_without_reload(manager: Manager, browser: Browser) -> None:
    controller = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    with httpx.Client(base_url=manager.url, timeout=60) as http:
        inventory = http.get("/api/v1/inventory", headers=controller).json()
        node = inventory["nodes"][0]["name"]
        device = next(d["name"] for d in inventory["devices"] if d["state"] == "free" and d["type"] == "gpu")

        # The fragment carries the token: a browser never sends it to the server.
        browser.navigate(f"{manager.url}/ui#token={OPERATOR_TOKEN}")
        browser.wait_for("document.body.dataset.version")
        assert browser.evaluate("document.querySelectorAll('[data-device]').length") == len(
            inventory["devices"]
        )
        assert _state(browser, device) == {"state": "free", "node": "", "claim": ""}
        assert browser.evaluate("location.hash") == ""  # the token left the address bar
        # A mark on this very document: a reload or a navigation would drop it.
        browser.evaluate("window.__sameDocument = 'yes'")

        started = time.monotonic()
        attached = http.post(
            "/api/v1/attachments",
            params={"waitSeconds": 30},
            json={"device": device, "node": node, "claimUid": claim_uid("claim-ui")},
            headers=controller,
        )
        assert attached.status_code == 200, attached.text
        browser.wait_for(
            f"document.querySelector('[data-device={json.dumps(device)}]')?.dataset.state === 'bound'",
            timeout=10,
        )
        seen_after = time.monotonic() - started
        assert _state(browser, device) == {"state": "bound", "node": node, "claim": claim_uid("claim-ui")}
        # ... and the node's box lists it
        chip = f"[data-node-box={json.dumps(node)}] [data-node-device={json.dumps(device)}]"
        assert browser.evaluate(f"!!document.querySelector('{chip}')")
        assert browser.evaluate("window.__sameDocument") == "yes"
        assert browser.evaluate("document.getElementById('live').dataset.live") == "live"
        print(f"fabric map showed the attach {seen_after:.2f} s after the request was sent")

        browser.evaluate(  # select the device: its detail panel and its link to the node
            f"document.querySelector('[data-device={json.dumps(device)}]')"
            ".dispatchEvent(new MouseEvent('click', {bubbles: true}))"
        )
        browser.wait_for("!document.getElementById('detail').hidden")
        assert browser.evaluate("document.querySelectorAll('#links path').length") == 1
        shot = browser.screenshot(artifacts_dir() / "fabric-map.png")
        assert shot.stat().st_size > 10_000

        http.delete(
            f"/api/v1/attachments/{device}",
            params={"claimUid": claim_uid("claim-ui"), "node": node, "waitSeconds": 30},
            headers=controller,
        ).raise_for_status()
        browser.wait_for(
            f"document.querySelector('[data-device={json.dumps(device)}]')?.dataset.state === 'free'",
            timeout=10,
        )


def test_the_map_shows_each_pool_s_memory_and_each_gpu_s_partitions(
    manager: Manager, browser: Browser
) -> None:
    """A memory pool's used and free memory and a partitioned GPU's holders, followed live: a share
    and a partition made and released while the page is open."""
    controller = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
    part, mem = claim_uid("ui-part"), claim_uid("ui-mem")
    share = "0f5e2a8c-3b1d-4e6f-8a9b-1c2d3e4f5a6b"
    with httpx.Client(base_url=manager.url, timeout=60, headers=controller) as http:
        pool = http.get("/api/v1/devices/cxlpool0-pool").json()["memoryPool"]
        browser.navigate(f"{manager.url}/ui#token={OPERATOR_TOKEN}")
        row = "document.querySelector('[data-pool=\"cxlpool0-pool\"]')"
        browser.wait_for(f"!!{row}")
        assert browser.evaluate(f"{row}.dataset.usedBytes") == str(pool["usedBytes"])
        for body in (
            {"device": "gpu1-1g10gb-2", "node": "kind-worker", "claimUid": part},
            {"device": "cxlpool0-pool", "node": "kind-worker2", "claimUid": mem, "shareId": share,
             "memoryBytes": 4 << 30},
        ):  # fmt: skip
            http.post("/api/v1/attachments", params={"waitSeconds": 30}, json=body).raise_for_status()
        used = pool["usedBytes"] + (4 << 30)
        browser.wait_for(f"{row}.dataset.usedBytes === '{used}'", timeout=10)
        assert browser.evaluate(f"{row}.dataset.freeBytes") == str(pool["sizeBytes"] - used)
        assert "4 GiB used" in browser.evaluate(f"{row}.textContent")
        shared = browser.evaluate(
            f"(() => {{ const e = document.querySelector('[data-share=\"{share}\"]');"
            " return e && {node: e.dataset.node, claim: e.dataset.claim}; })()"
        )
        assert shared == {"node": "kind-worker2", "claim": mem}
        browser.wait_for("!!document.querySelector('[data-gpu=\"gpu1\"]')", timeout=10)
        gpu = browser.evaluate(
            "(() => { const e = document.querySelector('[data-gpu=\"gpu1\"]');"
            " return {node: e.dataset.node, holders: e.dataset.holders}; })()"
        )
        assert gpu == {"node": "kind-worker", "holders": "1"}
        holder = browser.evaluate(
            "document.querySelector('[data-partition=\"gpu1-1g10gb-2\"]')?.dataset.claim"
        )
        assert holder == part
        browser.screenshot(artifacts_dir() / "fabric-map-sharing.png")

        http.delete(
            "/api/v1/attachments/gpu1-1g10gb-2",
            params={"claimUid": part, "node": "kind-worker", "waitSeconds": 30},
        ).raise_for_status()
        http.delete(
            "/api/v1/attachments/cxlpool0-pool",
            params={"claimUid": mem, "node": "kind-worker2", "waitSeconds": 30, "shareId": share},
        ).raise_for_status()
        browser.wait_for(f"{row}.dataset.usedBytes === '{pool['usedBytes']}'", timeout=10)
        browser.wait_for("!document.querySelector('[data-gpu=\"gpu1\"]')", timeout=10)


def test_the_map_has_the_read_api_s_auth(manager: Manager, browser: Browser) -> None:
    """The page is static and holds no data; without a valid token it shows nothing but a sign-in."""
    with httpx.Client(base_url=manager.url, timeout=30) as http:
        page = http.get("/ui")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert http.get("/api/v1/inventory").status_code == 401
    browser.navigate(f"{manager.url}/ui#token=not-a-token-of-this-manager")
    browser.wait_for("!document.getElementById('login').hidden")
    assert "Unauthenticated" in browser.evaluate("document.getElementById('login-error').textContent")
    assert browser.evaluate("document.getElementById('main').hidden") is True
    assert browser.evaluate("document.querySelectorAll('[data-device]').length") == 0
    # signing in with the operator's token shows the fabric
    browser.evaluate(f"document.getElementById('token').value = {json.dumps(OPERATOR_TOKEN)}")
    browser.evaluate("document.getElementById('login').requestSubmit()")
    browser.wait_for("document.querySelectorAll('[data-device]').length > 0")


def test_the_map_draws_a_thousand_devices_quickly(manager: Manager, browser: Browser) -> None:
    """1,000 devices on 8 switches and 64 nodes, half of them bound: drawn and laid out quickly (the
    whole map is redrawn on every inventory version). About 0.2-0.4 s on an idle machine; the bound
    is 3 s because CI runs this beside the whole suite on two cores (2 s was seen there)."""
    browser.navigate(f"{manager.url}/ui#token={OPERATOR_TOKEN}")
    browser.wait_for("document.body.dataset.version")
    elapsed = browser.evaluate(
        """(() => {
          const nodes = Array.from({length: 64}, (_, i) => ({name: `node-${i}`, host: `host-${i}`,
            systemUuid: null, fabrics: ['PCIe'], pools: ['fabric-pcie']}));
          const types = ['gpu', 'nvme', 'nic', 'fpga', 'cxl-memory'];
          const devices = Array.from({length: 1000}, (_, i) => {
            const bound = i % 2 === 0;
            return {name: `dev-${i}`, pool: 'fabric-pcie', fabric: 'PCIe', type: types[i % 5],
              model: 'M' + (i % 3), switch: `sw${i % 8}`, port: `p${i}`, health: i % 97 ? 'OK' : 'Critical',
              state: bound ? 'bound' : 'free', node: bound ? `node-${i % 64}` : null,
              host: bound ? `host-${i % 64}` : null, claimUid: bound ? `c-${i}` : null,
              managed: i % 50 !== 0, bindingStyle: 'zone', redfishUri: `/redfish/v1/x/${i}`};
          });
          const t0 = performance.now();
          window.fabricMap.render({version: 999999, pools: [{pool: 'fabric-pcie', fabric: 'PCIe',
            nodes: nodes.map(n => n.name)}], devices, nodes});
          document.getElementById('map').getBBox();  // force layout
          return performance.now() - t0;
        })()"""
    )
    assert browser.evaluate("document.querySelectorAll('#map [data-device]').length") == 1000
    assert browser.evaluate("document.querySelectorAll('#map [data-node-device]').length") == 500
    print(f"fabric map: 1,000 devices drawn in {elapsed:.0f} ms")
    assert elapsed < 3000
    browser.screenshot(artifacts_dir() / "fabric-map-1000.png")


def test_the_map_marks_a_drained_device_with_its_reason(manager: Manager, browser: Browser) -> None:
    operator = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}
    device = "gpu2"
    browser.navigate(f"{manager.url}/ui#token={OPERATOR_TOKEN}")
    browser.wait_for("document.body.dataset.version")
    marked = f"document.querySelector('[data-device={json.dumps(device)}]')"
    assert browser.evaluate(f"{marked}.dataset.drain") == ""
    with httpx.Client(base_url=manager.url, timeout=30) as http:
        drained = http.post(
            "/api/v1/drains",
            json={"target": "device", "name": device, "reason": "firmware-2.1", "evict": True},
            headers=operator,
        )
        assert drained.status_code == 201, drained.text
        try:
            browser.wait_for(f"{marked}?.dataset.drain === 'NoExecute firmware-2.1'", timeout=10)
            assert browser.evaluate(f"{marked}.classList.contains('drained')") is True
            title = browser.evaluate(f"{marked}.querySelector('title').textContent")
            assert "drained: firmware-2.1 (NoExecute)" in title and "by device/gpu2" in title, title
            assert "drained 1" in browser.evaluate("document.getElementById('summary').textContent")
        finally:
            http.delete("/api/v1/drains", params={"target": "device", "name": device}, headers=operator)
        browser.wait_for(f"{marked}?.dataset.drain === ''", timeout=10)
        assert browser.evaluate(f"{marked}.classList.contains('drained')") is False
