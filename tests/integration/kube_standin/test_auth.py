"""Bearer tokens and TokenReview from the tokens file, as node plugins' identities need."""

from __future__ import annotations

from pathlib import Path

import httpx

from kube_standin.apiserver.auth import NODE_NAME_KEY
from plumbing.kube import KubeClient
from plumbing.kube.resources import NAMESPACES, TOKEN_REVIEWS
from tests.support.apiserver import ApiServerProcess, start_apiserver


async def review(kube: KubeClient, token: str, audiences: list[str] | None = None) -> dict:  # type: ignore[type-arg]
    spec: dict[str, object] = {"token": token}
    if audiences is not None:
        spec["audiences"] = audiences
    answer = await kube.create(
        TOKEN_REVIEWS, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
    )
    return dict(answer["status"])


async def test_token_review_of_a_node_bound_service_account_token(
    shared_apiserver: ApiServerProcess, mkube: KubeClient
) -> None:
    token = shared_apiserver.service_account_token(
        "fabric-dra", "fabric-dra-plugin", node="node-a", pod="plugin-x7k2p"
    )
    status = await review(mkube, token)
    assert status["authenticated"] is True
    user = status["user"]
    assert user["username"] == "system:serviceaccount:fabric-dra:fabric-dra-plugin"
    assert "system:serviceaccounts:fabric-dra" in user["groups"] and "system:authenticated" in user["groups"]
    assert user["extra"][NODE_NAME_KEY] == ["node-a"]
    assert (await review(mkube, "forged"))["authenticated"] is False
    # The token itself authenticates requests too.
    async with shared_apiserver.client(token) as plugin:
        assert (await plugin.get(NAMESPACES, "default"))["metadata"]["name"] == "default"


async def test_audiences(shared_apiserver: ApiServerProcess, mkube: KubeClient) -> None:
    token = shared_apiserver.service_account_token(
        "fabric-dra", "p", node="node-b", audiences=["fabric-manager"]
    )
    assert (await review(mkube, token, ["fabric-manager"]))["audiences"] == ["fabric-manager"]
    wrong = await review(mkube, token, ["https://kubernetes.default.svc"])
    assert wrong["authenticated"] is False and "audiences" in wrong["error"]


async def test_anonymous_requests_only_when_allowed(tmp_path: Path) -> None:
    with start_apiserver(tmp_path / "open", extra_args=["--allow-anonymous"]) as server:
        async with httpx.AsyncClient(base_url=server.url) as http:
            assert (await http.get("/api/v1/namespaces/default")).status_code == 200
            bad = await http.get("/api/v1/namespaces/default", headers={"Authorization": "Bearer wrong"})
            assert bad.status_code == 401 and bad.json()["reason"] == "Unauthorized"
