"""fabric-dra's plumbing: what every role uses and nothing of the project's roles.

Logging, atomic files, sockets, crash points, the command-line base, running roles as child
processes, the one backoff, Kubernetes name rules and the Kubernetes client (with the one
informer, leader election and events). Nothing here imports another fabric-dra package.
"""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["DEFAULT_DRIVER_NAME", "__version__"]

try:
    __version__ = version("fabric-dra")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

#: The DRA driver name used in ResourceSlices, DeviceClass selectors, CDI kinds and sockets.
DEFAULT_DRIVER_NAME = "fabric-dra.io"
