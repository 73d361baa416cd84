# One image for every fabric-dra role: `fabric-dra emulator serve`, `fabric-dra manager serve`,
# `fabric-dra controller`, `fabric-dra plugin` (the role is the first argument).
#
#   make image                      (tags <registry>/fabric-dra:<version> and :<version>-g<revision>)
#   docker build -t fabric-dra:dev .
#
# The image runs as an unprivileged user (65532). Only the kubelet plugin overrides that, in its
# DaemonSet, with runAsUser 0: it creates sockets in the kubelet's root-owned plugin directories
# and writes CDI specs to the host's CDI root (see docs/deploy.md, "Privileges").

# Pinned by tag and digest so a rebuild of the same commit gets the same interpreter and libc.
ARG PYTHON_IMAGE=docker.io/library/python:3.11.13-slim-bookworm@sha256:86adf8dbadc3d6e82ee5dd2c74bec2e1c2467cdad47886280501df722372d2e1

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# Every runtime dependency ships as a binary wheel for CPython 3.11 on glibc, so the build stage
# needs no compiler; the virtualenv is what the runtime stage copies.
RUN python -m venv /opt/fabric-dra
# .dockerignore admits exactly pyproject.toml, README.md and the packages pyproject.toml lists.
COPY . ./
# pip byte-compiles what it installs: the runtime root filesystem is read-only, so imports must
# find their .pyc files already there.
RUN /opt/fabric-dra/bin/python -m pip install --no-cache-dir /src

FROM ${PYTHON_IMAGE}
# `make image` passes the package version and the git revision it builds (docs/deploy.md).
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="fabric-dra" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.description="Kubernetes DRA driver and Redfish fabric manager for composable PCIe/CXL devices, with a fabric emulator" \
      org.opencontainers.image.source="https://github.com/fabric-dra/fabric-dra" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/fabric-dra /opt/fabric-dra
# HOME=/tmp: libraries that look for ~/.kube or ~/.cache find a writable emptyDir there, since
# every Deployment mounts the root filesystem read-only.
ENV PATH=/opt/fabric-dra/bin:${PATH} \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Fail the build, not the first pod, when the CLI cannot start or libudev (pyudev's backend for the
# plugin's hot-plug events on real hosts) is missing from the base image.
RUN fabric-dra --version \
 && python -c "import ctypes.util, sys; sys.exit(ctypes.util.find_library('udev') is None)"
USER 65532:65532
ENTRYPOINT ["fabric-dra"]
CMD ["--help"]
