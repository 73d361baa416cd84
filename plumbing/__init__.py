"""fabric-dra's plumbing: what every role uses and nothing of the project's roles.

Logging, atomic files, sockets, crash points, the command-line base, settings, running roles as
child processes, the one backoff, Kubernetes name rules and the Kubernetes client (with the one
informer, leader election and events). Nothing here imports another fabric-dra package.

Its rooms, from the ground up; a module imports only rooms on a floor below its own, never one
beside it (``tests/unit/test_layers.py`` reads this list):

* ``errors``      the root of every error plumbing raises (``PlumbingError``);
* the small tools: ``terminal`` (characters no output carries raw), ``names`` (Kubernetes name
  rules), ``backoff``, ``fsutil`` (atomic writes), ``httplimits``, ``forkserver``;
* what reads or writes the outside: ``tokens`` (bearer tokens), ``netutil`` (listening sockets),
  ``logs`` (structured logs), ``http1`` (the lean HTTP/1.1 client of the Redfish transport and
  the manager client);
* the frames every role is built in: ``cli`` (the command-line base and its output), ``settings``
  (one declaration per setting: flags, environment, file), ``httpserve`` (the one uvicorn runner),
  ``kube`` (the Kubernetes client; its rooms in ``plumbing/kube/__init__.py``);
* on top: ``crashpoints``, ``procs`` (a role as a child process), ``promstats``.
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["DEFAULT_DRIVER_NAME", "__version__"]

FLOORS = (
    "errors",
    ("terminal", "names", "backoff", "fsutil", "httplimits", "forkserver", "quantity"),
    ("tokens", "netutil", "logs", "http1"),
    ("cli", "settings", "httpserve", "kube"),
    ("crashpoints", "procs", "promstats"),
)

try:
    __version__ = version("fabric-dra")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

#: The DRA driver name used in ResourceSlices, DeviceClass selectors, CDI kinds and sockets.
DEFAULT_DRIVER_NAME = "fabric-dra.io"
