"""The controller labels a node for a pool only while a kubelet plugin pod is Ready on it
(``--plugin-pod-selector``): the real controller process against the API test server, with plugin
pods whose Ready condition the test sets as a kubelet would."""

from __future__ import annotations

import itertools
from typing import Any

from dra_driver.controller.pluginpods import ready_node
from dra_driver.controller.resourcenames import pool_label_key
from tests.integration.controller.conftest import ApiServer, ControllerFactory
from tests.support.controller import InventoryServer, make_device, make_inventory
from tests.support.waiting import wait_until

_namespaces = itertools.count(1)


def _pod(apiserver: ApiServer, namespace: str, name: str, node: str, labels: dict[str, str]) -> None:
    apiserver.create(
        f"/api/v1/namespaces/{namespace}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "plugin", "image": "fabric-dra:test"}]},
        },
    )


def _set_ready(apiserver: ApiServer, namespace: str, name: str, ready: bool) -> None:
    """What the kubelet writes after the readiness probe answered."""
    path = f"/api/v1/namespaces/{namespace}/pods/{name}"
    pod = apiserver.http.get(path).json()
    pod["status"] = {
        "phase": "Running",
        "conditions": [
            {
                "type": "Ready",
                "status": "True" if ready else "False",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    response = apiserver.http.put(f"{path}/status", json=pod)
    assert response.status_code == 200, response.text


def test_only_nodes_with_a_ready_plugin_are_labelled(
    apiserver: ApiServer, start_controller: ControllerFactory, driver: str
) -> None:
    prefix = driver.split(".")[0]
    namespace = f"plugins-{prefix}-{next(_namespaces)}"
    apiserver.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    )
    nodes = [f"{prefix}-ready", f"{prefix}-starting", f"{prefix}-none", f"{prefix}-other"]
    for node in nodes:
        apiserver.node(node)
    plugin = {"app.kubernetes.io/component": "plugin", "test-driver": prefix}
    _pod(apiserver, namespace, "plugin-a", nodes[0], plugin)
    _set_ready(apiserver, namespace, "plugin-a", True)
    _pod(apiserver, namespace, "plugin-b", nodes[1], plugin)
    _set_ready(apiserver, namespace, "plugin-b", False)
    # A Ready pod that is not the plugin's does not count.
    _pod(apiserver, namespace, "someone-else", nodes[3], {"app.kubernetes.io/component": "other"})
    _set_ready(apiserver, namespace, "someone-else", True)

    key = pool_label_key(driver, "fabric-pcie")
    inventory = make_inventory([make_device("gpu-0000")], pools={"fabric-pcie": nodes})
    with InventoryServer(inventory) as manager:
        start_controller(
            manager,
            driver,
            "--plugin-namespace",
            namespace,
            "--plugin-pod-selector",
            f"app.kubernetes.io/component=plugin,test-driver={prefix}",
        )
        wait_until(
            lambda: apiserver.node_labels(nodes[0]).get(key) == "true", what="label where the plugin is Ready"
        )
        assert all(key not in apiserver.node_labels(n) for n in nodes[1:])

        # The second plugin registers with its kubelet: its node is labelled too.
        _set_ready(apiserver, namespace, "plugin-b", True)
        wait_until(
            lambda: apiserver.node_labels(nodes[1]).get(key) == "true", what="label once the plugin is Ready"
        )

        # The first node loses its plugin: no more devices are allocated there.
        response = apiserver.http.delete(f"/api/v1/namespaces/{namespace}/pods/plugin-a")
        assert response.status_code == 200, response.text
        wait_until(lambda: key not in apiserver.node_labels(nodes[0]), what="label removed with the plugin")
        assert apiserver.node_labels(nodes[1]).get(key) == "true"
        assert all(key not in apiserver.node_labels(n) for n in nodes[2:])


def _pod_object(**changes: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": "p"},
        "spec": {"nodeName": "n1"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    for key, value in changes.items():
        pod[key] = value
    return pod


def test_ready_node_counts_ready_pods_that_are_not_going_away() -> None:
    assert ready_node(_pod_object()) == "n1"
    assert ready_node(_pod_object(status={"conditions": [{"type": "Ready", "status": "False"}]})) is None
    assert ready_node(_pod_object(status={})) is None
    assert ready_node(_pod_object(spec={})) is None  # not scheduled yet
    terminating = _pod_object(metadata={"name": "p", "deletionTimestamp": "2026-01-01T00:00:00Z"})
    assert ready_node(terminating) is None
