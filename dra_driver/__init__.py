"""fabric-dra: the Kubernetes side — kubelet plugin, ResourceSlice publisher, claim preparation."""

from importlib.metadata import PackageNotFoundError, version

__all__ = ["DEFAULT_DRIVER_NAME", "__version__"]

try:
    __version__ = version("fabric-dra")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

#: The DRA driver name used in ResourceSlices, DeviceClass selectors, CDI kinds and sockets.
DEFAULT_DRIVER_NAME = "fabric-dra.io"
