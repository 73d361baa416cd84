"""The stand-ins' one exception tree: every error they raise on purpose derives from
:class:`StandinError`, so a caller catches the level it can handle (as with httpx)::

    StandinError
    ├── ConfigError                     a file or option a stand-in cannot start with
    │   ├── TokensFileError (ValueError)      --tokens (apiserver.auth)
    │   ├── FeatureGateError (ValueError)     --feature-gates, --runtime-config (apiserver.features)
    │   ├── StateFileError (RuntimeError)     --state-file (apiserver.statefile)
    │   └── SchemasUnavailable (RuntimeError) --validate-versions without their schemas (apiserver.schemas)
    ├── RequestError                    what a request asks for cannot be read or applied
    │   ├── SelectorError (ValueError)        a label or field selector (apiserver.selectors)
    │   └── PatchError (ValueError)           a patch body (apiserver.patchbodies)
    ├── StatusError                     the API server refuses a request with a Kubernetes Status:
    │                                   HTTP code, reason, message, details (apiserver.status)
    └── KubeletError                    what the kubelet would report of a plugin protocol
        ├── RegistrationFailed                registration (kubelet_client)
        ├── DraCallError                      a DRA call as a whole (kubelet_client)
        └── PluginNotRegistered               no plugin registered for a driver (cluster.kubelet)

Each class keeps the built-in base it had before the tree (in parentheses), so code that caught
that still does. A Kubernetes Status is made in one place per kind of failure
(:mod:`kube_standin.apiserver.status`); the request handlers turn a :class:`RequestError` into the
Status the real server answers with.
"""

from __future__ import annotations

__all__ = ["ConfigError", "KubeletError", "RequestError", "StandinError"]


class StandinError(Exception):
    """Root of every error the stand-ins raise on purpose."""


class ConfigError(StandinError):
    """A file or option a stand-in cannot start with; the message says what is wrong and where."""


class RequestError(StandinError):
    """What a request asks for cannot be read (a selector) or applied (a patch)."""


class KubeletError(StandinError):
    """A failure the kubelet would report (its message says what, where and why)."""
