"""Bearer-token authentication and TokenReview for the API test server.

A tokens file (YAML or JSON) maps each token to the identity the real server would derive
from it; it is re-read when it changes, so tests may add tokens while the server runs::

    tokens:
      s3cr3t-plugin-node-a:
        username: system:serviceaccount:fabric-dra:fabric-dra-plugin
        uid: 6f1c...
        groups: [system:serviceaccounts, system:serviceaccounts:fabric-dra]
        extra:
          authentication.kubernetes.io/node-name: [node-a]
        audiences: [fabric-dra-manager]      # optional; empty accepts any audience

``system:authenticated`` is added to every identity's groups, as the real authenticator does.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kube_standin.errors import ConfigError

__all__ = [
    "TokenAuthenticator",
    "TokenUser",
    "TokensFile",
    "TokensFileError",
    "node_user",
    "service_account_user",
]

NODE_NAME_KEY = "authentication.kubernetes.io/node-name"
NODE_UID_KEY = "authentication.kubernetes.io/node-uid"
POD_NAME_KEY = "authentication.kubernetes.io/pod-name"
POD_UID_KEY = "authentication.kubernetes.io/pod-uid"
CREDENTIAL_ID_KEY = "authentication.kubernetes.io/credential-id"


class TokensFileError(ConfigError, ValueError):
    """A --tokens file that does not read as a map of bearer tokens to identities."""


class TokenUser(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: str = Field(min_length=1)
    uid: str = ""
    groups: list[str] = Field(default_factory=list)
    extra: dict[str, list[str]] = Field(default_factory=dict)
    audiences: list[str] = Field(default_factory=list)

    def user_info(self) -> dict[str, Any]:
        groups = list(self.groups)
        if "system:authenticated" not in groups:
            groups.append("system:authenticated")
        info: dict[str, Any] = {"username": self.username, "groups": groups}
        if self.uid:
            info["uid"] = self.uid
        if self.extra:
            info["extra"] = {k: list(v) for k, v in self.extra.items()}
        return info


class TokensFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tokens: dict[str, TokenUser] = Field(default_factory=dict)


def service_account_user(
    namespace: str,
    name: str,
    *,
    node: str | None = None,
    pod: str | None = None,
    audiences: list[str] | None = None,
) -> TokenUser:
    """The identity of a bound service-account token, with the node/pod claims a projected
    token carries (Kubernetes 1.32+, ServiceAccountTokenPodNodeInfo)."""
    extra: dict[str, list[str]] = {CREDENTIAL_ID_KEY: [f"JTI={uuid.uuid4()}"]}
    if node:
        extra[NODE_NAME_KEY] = [node]
        extra[NODE_UID_KEY] = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f"node/{node}"))]
    if pod:
        extra[POD_NAME_KEY] = [pod]
        extra[POD_UID_KEY] = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f"pod/{namespace}/{pod}"))]
    return TokenUser(
        username=f"system:serviceaccount:{namespace}:{name}",
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, f"serviceaccount/{namespace}/{name}")),
        groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
        extra=extra,
        audiences=list(audiences or []),
    )


def node_user(node: str) -> TokenUser:
    """A kubelet's identity, as its client certificate gives it (``CN=system:node:<node>``,
    ``O=system:nodes``): the user NodeRestriction restricts (:mod:`.admission`)."""
    return TokenUser(username=f"system:node:{node}", groups=["system:nodes"])


def load_tokens_file(path: Path) -> TokensFile:
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise TokensFileError(f"cannot read tokens file {path}: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise TokensFileError(f"tokens file {path} is not valid YAML/JSON: {err}") from err
    try:
        return TokensFile.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise TokensFileError(f"tokens file {path}: {where}: {first['msg']}") from err


class TokenAuthenticator:
    """Looks tokens up in the tokens file, reloading it when its mtime or size changes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._tokens: dict[str, TokenUser] = {}
        if path is not None:
            self._reload(force=True)

    @property
    def required(self) -> bool:
        return self.path is not None

    def _reload(self, *, force: bool = False) -> None:
        assert self.path is not None
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            if force:
                raise TokensFileError(f"tokens file {self.path} does not exist") from None
            return
        stamp = (stat.st_mtime, stat.st_size)
        if force or stamp != self._stamp:
            # A half-written file keeps the previous tokens rather than locking everyone out.
            try:
                self._tokens = load_tokens_file(self.path).tokens
            except TokensFileError:
                if force:
                    raise
                return
            self._stamp = stamp

    def lookup(self, token: str) -> TokenUser | None:
        if self.path is not None:
            self._reload()
        return self._tokens.get(token)

    def review(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The ``status`` of a TokenReview for ``spec`` (``token``, optional ``audiences``)."""
        token = str(spec.get("token") or "")
        wanted = [str(a) for a in spec.get("audiences") or []]
        user = self.lookup(token) if token else None
        if user is None:
            return {"authenticated": False, "error": "invalid bearer token", "user": {}}
        audiences = wanted
        if wanted and user.audiences:
            audiences = [a for a in wanted if a in user.audiences]
            if not audiences:
                return {
                    "authenticated": False,
                    "error": "token audiences do not intersect the requested audiences",
                    "user": {},
                }
        elif not wanted:
            audiences = list(user.audiences)
        status: dict[str, Any] = {"authenticated": True, "user": user.user_info()}
        if audiences:
            status["audiences"] = audiences
        return status
