#!/usr/bin/env bash
# The composable-DRA article's scenario on a real kind cluster, end to end.
#
#   deploy/kind/e2e.sh            (or: make kind-e2e)
#
# It creates a kind cluster (deploy/kind/cluster.yaml), builds the fabric-dra image with
# `make image` (the target a release uses) and loads it into the nodes, deploys
# deploy/overlays/kind (the software fabric, the manager, the controller, a plugin per node),
# applies the article's manifest (deploy/kind/agent-infrastructure.yaml) and checks the article's
# four "How to Verify" steps:
#   1. the manifest applies;
#   2. the pod's ResourceClaim is allocated;
#   3. the pod runs and sees its device (the CDI env and mount inside the container), and the
#      fabric has the device bound to the pod's node;
#   4. after scaling to 0 the claim is released, the device is unbound in the fabric and back in
#      the pool.
# Then the same again with deploy/overlays/binding-conditions, applying the article's manifest as
# written for resource.k8s.io/v1beta1 when the cluster serves it. Everything it created is removed
# on exit, also on failure or Ctrl-C (unless FABRIC_DRA_E2E_KEEP=1).
#
# Needs: docker (a running engine), kind >= v0.30, kubectl, make, python3, timeout (coreutils).
# The cluster is always called "kind": the emulator's default topology names its hosts after that
# cluster's workers (kind-worker, kind-worker2, …), and each node's plugin reads the emulated host
# of its own name. An existing cluster of that name is never touched: e2e.sh stops instead.
# The default node image is Kubernetes 1.36.1 as kind v0.32.0 publishes it (containerd 2.3;
# binding conditions beta and on, and the resourceclaims/driver authorization that the
# binding-conditions overlay's RBAC rule is for). Images are loaded with `kind load docker-image`
# where the kind binary can load into the node's containerd, else with `docker save | ctr images
# import` inside each node (kind < v0.32 cannot load into nodes running containerd >= 2.3).
# Settings (environment):
#   FABRIC_DRA_E2E_NODE_IMAGE  kind node image (default: Kubernetes 1.36.1, pinned by digest); with
#                              kind v0.30 or v0.31 use a 1.34 image (NODE_IMAGE_1_34 below)
#   FABRIC_DRA_E2E_IMAGE_LOAD  auto (default), kind or ctr: how images get into the nodes
#   FABRIC_DRA_E2E_TIMEOUT     seconds allowed for each wait (default: 300)
#   FABRIC_DRA_E2E_KEEP        1 = keep the cluster afterwards, for a look around
#   FABRIC_DRA_E2E_ARTIFACTS   directory for diagnostics (pod logs, objects) when a step fails
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly REPO_ROOT
readonly KIND_DIR="${REPO_ROOT}/deploy/kind"
readonly OVERLAYS_DIR="${REPO_ROOT}/deploy/overlays"

readonly CLUSTER="kind"
# Node images pinned by digest, as kind's release notes list them (v0.32.0: 1.36.1; v0.30.0: 1.34.0).
readonly NODE_IMAGE_1_36="kindest/node:v1.36.1@sha256:3489c7674813ba5d8b1a9977baea8a6e553784dab7b84759d1014dbd78f7ebd5"
readonly NODE_IMAGE_1_34="kindest/node:v1.34.0@sha256:7416a61b42b1662ca6ca89f02028ac133a309a2a30ba309614e8ec94d976dc5a"
readonly NODE_IMAGE="${FABRIC_DRA_E2E_NODE_IMAGE:-${NODE_IMAGE_1_36}}"
readonly IMAGE_LOAD="${FABRIC_DRA_E2E_IMAGE_LOAD:-auto}"
readonly WAIT="${FABRIC_DRA_E2E_TIMEOUT:-300}"
readonly KEEP="${FABRIC_DRA_E2E_KEEP:-0}"
readonly ARTIFACTS="${FABRIC_DRA_E2E_ARTIFACTS:-}"
# The oldest kind e2e.sh runs with (node images of Kubernetes >= 1.34), and the first kind release
# that loads images into nodes running containerd >= 2.3 (kind v0.32.0 release notes: "you must
# upgrade kind to this release or newer to use kind load ... with the newly published node images").
readonly KIND_MINIMUM="0.30.0"
readonly KIND_LOADS_CONTAINERD_2_3="0.32.0"

# The image name the kind overlay deploys (deploy/overlays/kind/kustomization.yaml, images:), as
# `make image` tags it with these variables (its other tag is fabric-dra:<version>).
readonly IMAGE="fabric-dra:kind"
readonly MAKE_IMAGE_VARS=(REGISTRY= IMAGE_NAME=fabric-dra IMAGE_TAG=kind)
# The article's workload image: built under a name of our own, served to the cluster as
# docker.io/library/agent-runner:latest by a registry mirror (the article's pod pulls it).
readonly RUNNER_BUILD_TAG="fabric-dra-e2e/agent-runner:latest"
readonly REGISTRY_IMAGE="docker.io/library/registry:2.8.3@sha256:a3d8aaa63ed8681a604f1dea0aa03f100d5895b6a58ace528858a7b332415373"
readonly REGISTRY_NAME="${CLUSTER}-fabric-dra-registry"

readonly NAMESPACE="fabric-dra"
readonly APP_NAMESPACE="agent-platform"
readonly APP_LABEL="app=agent-inference-worker"
readonly DRIVER="fabric-dra.io"
readonly EMULATOR_DIR="/var/lib/fabric-dra/emulator"
readonly CDI_ROOT="/var/run/cdi"
# The path deploy/kind/cluster.yaml mounts into every node; replaced by a directory of our own.
readonly CONFIG_STATE_DIR="/tmp/fabric-dra-kind/emulator"

WORK_DIR=""
CLUSTER_CREATED=0
REGISTRY_STARTED=0

log() { printf '%s e2e: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
step() { printf '\n%s e2e: === %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
fail() {
  printf '%s e2e: FAILED: %s\n' "$(date +%H:%M:%S)" "$*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
}

# kubectl against the e2e cluster only: its own kubeconfig, never the user's current context.
k() { kubectl --kubeconfig "${WORK_DIR}/kubeconfig" "$@"; }

# --- versions, and how images reach the nodes --------------------------------------------------

# version_of TEXT: the first version (vX.Y.Z, with an optional -pre-release) in TEXT, printed as
# "X.Y.Z" or "X.Y.Z-pre"; fails when there is none. `kind version` prints
# "kind v0.32.0 go1.26.3 linux/amd64" (a build from a branch: "kind v0.33.0-alpha+1a2b3c4 …");
# `containerd --version` "containerd github.com/containerd/containerd/v2 v2.3.1 <commit>".
version_of() {
  python3 -c '
import re, sys
found = re.search(r"(?<![\w.])v?(\d+)\.(\d+)\.(\d+)(-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?(?![\w.])", sys.argv[1])
if not found:
    sys.exit(1)
major, minor, patch, pre = found.groups()
print(f"{int(major)}.{int(minor)}.{int(patch)}{pre or str()}")' "$1"
}

# version_at_least HAVE WANT: HAVE >= WANT, both "X.Y.Z[-pre]". A pre-release is older than its
# release (semver): a v0.32.0-alpha build may predate what v0.32.0 changed.
version_at_least() {
  python3 -c '
import sys
def key(text):
    core, _, pre = text.partition("-")
    return tuple(int(x) for x in core.split(".")), 0 if pre else 1
sys.exit(0 if key(sys.argv[1]) >= key(sys.argv[2]) else 1)' "$1" "$2"
}

# kind_version: the version of the kind binary ("X.Y.Z[-pre]").
kind_version() {
  local text
  text="$(kind version 2>&1)" || fail "kind version failed: ${text}"
  version_of "${text}" || fail "cannot tell the kind version from '${text}'"
}

# node_containerd_version NODE: the version of containerd inside a kind node.
node_containerd_version() {
  local text
  text="$(timeout 60 docker exec "$1" containerd --version 2>&1)" || fail "cannot run containerd --version in node $1: ${text}"
  version_of "${text}" || fail "cannot tell the containerd version of node $1 from '${text}'"
}

# image_load_method SETTING KIND_VERSION CONTAINERD_VERSION: "kind" (kind load docker-image) or
# "ctr" (docker save | ctr images import in each node). auto: kind's own loader, unless this kind
# predates the loader that works with the node's containerd.
image_load_method() {
  local setting="$1" kind_version="$2" containerd_version="$3"
  case "${setting}" in
    kind | ctr) echo "${setting}" ;;
    auto)
      if version_at_least "${kind_version}" "${KIND_LOADS_CONTAINERD_2_3}" ||
        ! version_at_least "${containerd_version}" "2.3.0"; then
        echo kind
      else
        echo ctr
      fi
      ;;
    *) fail "FABRIC_DRA_E2E_IMAGE_LOAD must be auto, kind or ctr, not '${setting}'" ;;
  esac
}

# load_image IMAGE: into every node of the cluster, the way image_load_method chooses.
load_image() {
  local image="$1" method node
  method="$(image_load_method "${IMAGE_LOAD}" "$(kind_version)" "$(node_containerd_version "${CLUSTER}-control-plane")")"
  log "loading ${image} into the nodes (${method})"
  if [[ "${method}" == "kind" ]]; then
    kind load docker-image "${image}" --name "${CLUSTER}"
    return
  fi
  # What kind's own loader runs in each node, less --all-platforms: the image was built here for
  # this platform only, and an index that names other platforms' manifests fails that import.
  for node in $(kind get nodes --name "${CLUSTER}"); do
    docker save "${image}" | timeout 300 docker exec --privileged -i "${node}" \
      ctr --namespace=k8s.io images import --digests --snapshotter=overlayfs - >/dev/null ||
      fail "could not import ${image} into node ${node} with ctr"
  done
}

# containerd_config_ok: containerd's effective configuration (`containerd config dump`, TOML, on
# stdin) has CDI on and registry hosts read from /etc/containerd/certs.d — what the plugin's CDI
# specs and the agent-runner mirror need — whichever config version the node image uses (v2:
# plugins."io.containerd.grpc.v1.cri"; v3, containerd >= 2.0: plugins."io.containerd.cri.v1.*").
containerd_config_ok() {
  python3 -c '
import sys, tomllib
try:
    config = tomllib.loads(sys.stdin.read())
except tomllib.TOMLDecodeError as err:
    sys.exit(f"containerd config dump printed no valid TOML ({err})")
def values(node, key):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from values(v, key)
problems = []
if True not in list(values(config, "enable_cdi")):
    problems.append("CDI is off (enable_cdi)")
if "/etc/containerd/certs.d" not in list(values(config, "config_path")):
    problems.append("registry config_path is not /etc/containerd/certs.d")
if problems:
    sys.exit("; ".join(problems))
'
}

# wait_until DESCRIPTION COMMAND...: run COMMAND every 2 s until it succeeds, for at most $WAIT s.
wait_until() {
  local description="$1"
  shift
  local deadline=$((SECONDS + WAIT))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      fail "timed out after ${WAIT}s waiting for ${description}"
    fi
    sleep 2
  done
}

check_prerequisites() {
  local tool
  for tool in docker kind kubectl make python3 timeout; do
    command -v "${tool}" >/dev/null 2>&1 || fail "${tool} is not installed; e2e.sh needs docker, kind (>= v0.30), kubectl, make, python3 and timeout"
  done
  timeout 60 docker info >/dev/null 2>&1 || fail "no Docker engine is reachable (docker info failed): start Docker, or check DOCKER_HOST"
  local kind_version
  kind_version="$(kind_version)"
  version_at_least "${kind_version}" "${KIND_MINIMUM}" ||
    fail "kind v${kind_version} is too old: node images for Kubernetes 1.34 need kind >= v0.30"
  image_load_method "${IMAGE_LOAD}" "${kind_version}" 0.0.0 >/dev/null
  if [[ "${NODE_IMAGE}" == "${NODE_IMAGE_1_36}" ]] && ! version_at_least "${kind_version}" "${KIND_LOADS_CONTAINERD_2_3}"; then
    # Node images are supported with the kind release that published them, best effort with others.
    log "kind v${kind_version} predates the default node image (kind v${KIND_LOADS_CONTAINERD_2_3}); if the cluster does not come up, run with FABRIC_DRA_E2E_NODE_IMAGE=${NODE_IMAGE_1_34}"
  fi
  if kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
    fail "a kind cluster named '${CLUSTER}' already exists; e2e.sh only uses a cluster it creates, and the emulated hosts are named after that cluster's nodes: delete it (kind delete cluster --name ${CLUSTER}) and run again"
  fi
  if docker container inspect "${REGISTRY_NAME}" >/dev/null 2>&1; then
    fail "a container named '${REGISTRY_NAME}' already exists (left by an earlier run?): remove it with docker rm -f ${REGISTRY_NAME}"
  fi
  [[ "${WAIT}" =~ ^[1-9][0-9]*$ ]] || fail "FABRIC_DRA_E2E_TIMEOUT must be a whole number of seconds, not '${WAIT}'"
}

collect_diagnostics() {
  [[ -n "${WORK_DIR}" && -f "${WORK_DIR}/kubeconfig" ]] || return 0
  local out="${ARTIFACTS:-${WORK_DIR}/artifacts}"
  mkdir -p "${out}"
  log "collecting diagnostics in ${out}"
  {
    k get nodes -o wide
    k get pods -A -o wide
    k get resourceslices -o yaml
    k get resourceclaims -A -o yaml
    k get deviceclasses -o yaml
    k get events -A --sort-by=.lastTimestamp
  } >"${out}/cluster.txt" 2>&1 || true
  k describe pods -n "${APP_NAMESPACE}" >"${out}/agent-platform-pods.txt" 2>&1 || true
  k describe pods -n "${NAMESPACE}" >"${out}/fabric-dra-pods.txt" 2>&1 || true
  k logs -n "${NAMESPACE}" -l app.kubernetes.io/name=fabric-dra --all-containers --prefix \
    --tail=500 --max-log-requests=20 >"${out}/fabric-dra-logs.txt" 2>&1 || true
  if [[ -z "${ARTIFACTS}" ]]; then
    # Without an artifacts directory the work dir is removed below: show the essentials here.
    tail -n 60 "${out}/fabric-dra-logs.txt" >&2 || true
    grep -E 'Warning|Failed' "${out}/cluster.txt" | tail -n 30 >&2 || true
  fi
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  if ((status != 0)); then
    collect_diagnostics
  fi
  if [[ "${KEEP}" == "1" && ${CLUSTER_CREATED} -eq 1 ]]; then
    log "keeping cluster '${CLUSTER}' (FABRIC_DRA_E2E_KEEP=1): kubectl --kubeconfig ${WORK_DIR}/kubeconfig …; remove it with kind delete cluster --name ${CLUSTER} && docker rm -f ${REGISTRY_NAME}"
  else
    if ((CLUSTER_CREATED == 1)); then
      log "deleting kind cluster '${CLUSTER}'"
      # First the cluster: the emulator runs in it and writes the shared directory until its
      # node is gone; emptying the directory before that races with its writes.
      timeout 300 kind delete cluster --name "${CLUSTER}" --kubeconfig "${WORK_DIR}/kubeconfig" >/dev/null 2>&1 ||
        log "could not delete the kind cluster '${CLUSTER}': run kind delete cluster --name ${CLUSTER}"
    fi
    if ((REGISTRY_STARTED == 1)); then
      timeout 60 docker rm -f "${REGISTRY_NAME}" >/dev/null 2>&1
    fi
    empty_shared_dir
    if [[ -n "${WORK_DIR}" ]]; then
      rm -rf "${WORK_DIR}" 2>/dev/null || log "could not remove ${WORK_DIR} completely; remove it by hand"
    fi
  fi
  if ((status == 0)); then
    log "PASSED: the article's four verification steps held with the kind and binding-conditions overlays"
  fi
  exit "${status}"
}

# empty_shared_dir: remove what the emulator (uid 65532, in a node) wrote to the shared directory
# — only once the cluster is deleted, so nothing writes there any more. The files are not ours to
# delete as a user: a container of the agent-runner image (built here, on busybox) does it as
# root. No such image means nothing ever ran in the cluster, so there is nothing to remove.
empty_shared_dir() {
  [[ -n "${WORK_DIR}" && -d "${WORK_DIR}/emulator" ]] || return 0
  if kind get clusters 2>/dev/null | grep -qx "${CLUSTER}"; then
    log "the cluster '${CLUSTER}' still exists: leaving ${WORK_DIR}/emulator as it is"
    return 0
  fi
  docker image inspect "${RUNNER_BUILD_TAG}" >/dev/null 2>&1 || return 0
  timeout 120 docker run --rm --network none --user 0 --volume "${WORK_DIR}/emulator:/shared" \
    "${RUNNER_BUILD_TAG}" sh -c 'rm -rf /shared/* /shared/.[!.]*' >/dev/null 2>&1 ||
    log "could not empty ${WORK_DIR}/emulator"
}

create_cluster() {
  step "creating kind cluster '${CLUSTER}' (${NODE_IMAGE%%@*}, kind $(kind_version))"
  mkdir -m 0777 "${WORK_DIR}/emulator"
  sed "s|${CONFIG_STATE_DIR}|${WORK_DIR}/emulator|g" "${KIND_DIR}/cluster.yaml" >"${WORK_DIR}/cluster.yaml"
  grep -q "${WORK_DIR}/emulator" "${WORK_DIR}/cluster.yaml" || fail "deploy/kind/cluster.yaml no longer mounts ${CONFIG_STATE_DIR}"
  CLUSTER_CREATED=1
  kind create cluster --name "${CLUSTER}" --image "${NODE_IMAGE}" --config "${WORK_DIR}/cluster.yaml" \
    --kubeconfig "${WORK_DIR}/kubeconfig" --wait "${WAIT}s"
  local version
  version="$(k get --raw /version | python3 -c 'import json, sys; v = json.load(sys.stdin); print(v["major"] + "." + v["minor"].rstrip("+"))')"
  python3 -c 'import sys; a, b = sys.argv[1].split("."); sys.exit(0 if (int(a), int(b)) >= (1, 34) else 1)' "${version}" ||
    fail "the node image runs Kubernetes ${version}; fabric-dra needs >= 1.34 (resource.k8s.io/v1)"
  k get --raw /apis/resource.k8s.io/v1 >/dev/null || fail "the cluster does not serve resource.k8s.io/v1"
  local node problem containerd_version
  for node in $(kind get nodes --name "${CLUSTER}"); do
    # Only stdout is TOML: containerd warns on stderr (e.g. about keys of an older config version).
    problem="$(timeout 60 docker exec "${node}" containerd config dump 2>/dev/null | containerd_config_ok 2>&1)" ||
      fail "containerd in node ${node} is not set up for fabric-dra: ${problem}"
  done
  containerd_version="$(node_containerd_version "${CLUSTER}-control-plane")"
  log "Kubernetes ${version}, resource.k8s.io/v1 served; containerd ${containerd_version} with CDI; kind $(kind_version)"
}

build_images() {
  step "building the fabric-dra image (make image) and the article's agent-runner stand-in"
  local refs
  refs="$(make -C "${REPO_ROOT}" --no-print-directory -s print-image "${MAKE_IMAGE_VARS[@]}")"
  grep -qxF "${IMAGE}" <<<"${refs}" ||
    fail "make image no longer tags ${IMAGE} (the kind overlay's image) with ${MAKE_IMAGE_VARS[*]}, only: ${refs//$'\n'/ }"
  make -C "${REPO_ROOT}" --no-print-directory image "${MAKE_IMAGE_VARS[@]}"
  docker build --tag "${RUNNER_BUILD_TAG}" "${KIND_DIR}/agent-runner"
  load_image "${IMAGE}"
}

# The article's pod pulls agent-runner:latest (":latest" means imagePullPolicy Always), so the
# image must come from a registry: a local one, set up on every node as a mirror of docker.io.
serve_runner_image() {
  step "serving agent-runner:latest to the cluster from a local registry"
  docker run --detach --name "${REGISTRY_NAME}" --network kind --publish 127.0.0.1::5000 \
    "${REGISTRY_IMAGE}" >/dev/null
  REGISTRY_STARTED=1
  local address
  address="$(docker port "${REGISTRY_NAME}" 5000/tcp | head -n 1)"
  [[ -n "${address}" ]] || fail "the local registry publishes no port"
  wait_until "the local registry at ${address}" python3 -c \
    'import sys, urllib.request; urllib.request.urlopen("http://" + sys.argv[1] + "/v2/", timeout=5)' "${address}"
  docker tag "${RUNNER_BUILD_TAG}" "${address}/library/agent-runner:latest"
  docker push "${address}/library/agent-runner:latest" >/dev/null
  local node
  for node in $(kind get nodes --name "${CLUSTER}"); do
    docker exec -i "${node}" sh -c 'mkdir -p /etc/containerd/certs.d/docker.io && cat >/etc/containerd/certs.d/docker.io/hosts.toml' <<EOF
server = "https://registry-1.docker.io"

[host."http://${REGISTRY_NAME}:5000"]
  capabilities = ["pull", "resolve"]
EOF
  done
}

deploy_overlay() {
  local overlay="$1"
  step "deploying deploy/overlays/${overlay}"
  k apply -k "${OVERLAYS_DIR}/${overlay}"
  k -n "${NAMESPACE}" rollout status deployment/fabric-dra-emulator --timeout="${WAIT}s"
  # Only the manager's leader is Ready (followers answer 503), so a rollout "status" never
  # completes for it: wait for the Deployment to be updated and for one Ready leader.
  wait_until "the fabric manager to elect a Ready leader" manager_has_leader
  k -n "${NAMESPACE}" rollout status deployment/fabric-dra-controller --timeout="${WAIT}s"
  k -n "${NAMESPACE}" rollout status daemonset/fabric-dra-plugin --timeout="${WAIT}s"
  wait_until "the controller to publish the fabric's pool as ResourceSlices" pool_has_devices
  log "pool published: $(pool_summary)"
}

remove_overlay() {
  local overlay="$1"
  step "removing deploy/overlays/${overlay}"
  k delete -k "${OVERLAYS_DIR}/${overlay}" --ignore-not-found --wait=true --timeout="${WAIT}s"
  # The pool's slices outlive the controller that wrote them; the next deployment starts clean.
  k delete resourceslices --field-selector "spec.driver=${DRIVER}" --ignore-not-found --timeout="${WAIT}s"
}

# --- reading the cluster and the fabric ------------------------------------------------------

manager_has_leader() {
  k -n "${NAMESPACE}" get deployment fabric-dra-manager -o json | python3 -c '
import json, sys
d = json.load(sys.stdin)
sys.exit(0 if d["status"].get("updatedReplicas") == d["spec"]["replicas"] and d["status"].get("readyReplicas") == 1 else 1)'
}

# JSON of this driver's ResourceSlices.
slices_json() { k get resourceslices --field-selector "spec.driver=${DRIVER}" -o json; }

pool_has_devices() {
  slices_json | python3 -c 'import json, sys; sys.exit(0 if any(s["spec"].get("devices") for s in json.load(sys.stdin)["items"]) else 1)'
}

pool_summary() {
  slices_json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
devices = sum(len(s["spec"].get("devices", [])) for s in items)
pools = sorted({s["spec"]["pool"]["name"] for s in items})
print(f"{devices} devices in {len(items)} slices, pools {pools}")'
}

# pool_has_device POOL DEVICE: the device is published in the pool's slices.
pool_has_device() {
  slices_json | python3 -c '
import json, sys
pool, device = sys.argv[1:3]
items = json.load(sys.stdin)["items"]
sys.exit(0 if any(s["spec"]["pool"]["name"] == pool and any(d["name"] == device for d in s["spec"].get("devices", [])) for s in items) else 1)' "$1" "$2"
}

# The one ResourceClaim of the article's pod, as JSON (fails unless there is exactly one).
claim_json() {
  k -n "${APP_NAMESPACE}" get resourceclaims -o json | python3 -c '
import json, sys
items = json.load(sys.stdin)["items"]
if len(items) != 1:
    sys.exit(f"expected one ResourceClaim in the namespace, found {len(items)}")
json.dump(items[0], sys.stdout)'
}

claim_is_allocated() {
  claim_json | python3 -c 'import json, sys; c = json.load(sys.stdin); sys.exit(0 if c.get("status", {}).get("allocation") else 1)'
}

# claim_field EXPR: a Python expression over the claim `c`, printed.
claim_field() {
  claim_json | python3 -c 'import json, sys; c = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}

no_claims_left() {
  k -n "${APP_NAMESPACE}" get resourceclaims -o json | python3 -c 'import json, sys; sys.exit(1 if json.load(sys.stdin)["items"] else 0)'
}

no_pods_left() {
  k -n "${APP_NAMESPACE}" get pods -l "${APP_LABEL}" -o json | python3 -c 'import json, sys; sys.exit(1 if json.load(sys.stdin)["items"] else 0)'
}

# binding_conditions_met: every binding condition of the allocation is True in status.devices.
binding_conditions_met() {
  claim_json | python3 -c '
import json, sys
c = json.load(sys.stdin)
results = c["status"]["allocation"]["devices"]["results"]
statuses = {(d["driver"], d["pool"], d["device"]): d for d in c["status"].get("devices", [])}
for r in results:
    wanted = r.get("bindingConditions") or []
    if not wanted:
        sys.exit("the allocation carries no binding conditions")
    conditions = {x["type"]: x["status"] for x in statuses.get((r["driver"], r["pool"], r["device"]), {}).get("conditions", [])}
    if any(conditions.get(t) != "True" for t in wanted):
        sys.exit(1)
'
}

# The fabric manager's own view (`fabric-dra status -o json`), asked from inside a manager pod
# through the manager's Service (which reaches the leader). The token is the controller's, minted
# for the manager's audience; it goes in on stdin, never on a command line.
fabric_status_json() {
  local token
  token="$(k -n "${NAMESPACE}" create token fabric-dra-controller --audience fabric-dra-manager --duration 10m)"
  # shellcheck disable=SC2016 # $(cat) runs in the pod's shell, reading the token from stdin
  timeout 60 kubectl --kubeconfig "${WORK_DIR}/kubeconfig" -n "${NAMESPACE}" exec -i deployment/fabric-dra-manager -c manager -- \
    sh -c 'FABRIC_DRA_TOKEN="$(cat)" exec fabric-dra status --manager-url http://fabric-dra-manager.fabric-dra.svc:8080 --output json' \
    <<<"${token}"
}

# fabric_binding DEVICE: "<state> <node>" of DEVICE in the fabric ("free -" when nothing holds it).
fabric_binding() {
  fabric_status_json | python3 -c '
import json, sys
held = [b for b in json.load(sys.stdin)["bindings"] if b["name"] == sys.argv[1]]
print(" ".join([held[0]["state"], held[0].get("node") or "-"]) if held else "free -")' "$1"
}

device_is_free() {
  [[ "$(fabric_binding "$1")" == "free -" ]]
}

# node_pci_devices NODE: the PCIe devices (BDFs) in the emulated host NODE's sysfs tree.
node_pci_devices() {
  timeout 60 docker exec "$1" sh -c "ls ${EMULATOR_DIR}/hosts/$1/sys/bus/pci/devices 2>/dev/null || true"
}

node_sees_no_device() {
  [[ -z "$(node_pci_devices "$1")" ]]
}

# cdi_edits FILE: what CDI specs (one or more JSON documents in FILE) inject into a container, one
# line each: "env NAME=VALUE", "mount CONTAINER-PATH", "device PATH".
cdi_edits() {
  python3 - "$1" <<'EOF'
import json, sys
text, decoder, position, specs = open(sys.argv[1]).read(), json.JSONDecoder(), 0, []
while True:
    while position < len(text) and text[position].isspace():
        position += 1
    if position == len(text):
        break
    spec, position = decoder.raw_decode(text, position)
    specs.append(spec)
for spec in specs:
    edits = [spec.get("containerEdits") or {}] + [d.get("containerEdits") or {} for d in spec.get("devices", [])]
    for e in edits:
        for env in e.get("env") or []:
            print("env", env)
        for mount in e.get("mounts") or []:
            print("mount", mount["containerPath"])
        for node in e.get("deviceNodes") or []:
            print("device", node["path"])
EOF
}

# --- the article's scenario --------------------------------------------------------------------

run_article_scenario() {
  local manifest="$1" expect_binding_conditions="$2"

  step "How to Verify, step 1 — deploy the manifest ($(basename "${manifest}"), $(sed -n 's/^apiVersion: \(resource.k8s.io\/.*\)/\1/p' "${manifest}" | head -n 1))"
  k create namespace "${APP_NAMESPACE}"
  k apply -f "${manifest}"

  step "How to Verify, step 2 — the claim is allocated once the pod is scheduled"
  wait_until "a ResourceClaim of the pod in ${APP_NAMESPACE}" claim_json
  wait_until "the ResourceClaim to be allocated" claim_is_allocated
  k -n "${APP_NAMESPACE}" get resourceclaims
  local claim claim_uid driver pool device
  claim="$(claim_field 'c["metadata"]["name"]')"
  claim_uid="$(claim_field 'c["metadata"]["uid"]')"
  driver="$(claim_field 'c["status"]["allocation"]["devices"]["results"][0]["driver"]')"
  pool="$(claim_field 'c["status"]["allocation"]["devices"]["results"][0]["pool"]')"
  device="$(claim_field 'c["status"]["allocation"]["devices"]["results"][0]["device"]')"
  [[ "${driver}" == "${DRIVER}" ]] || fail "claim ${claim} was allocated by driver '${driver}', not ${DRIVER}"
  log "claim ${claim} allocated: device ${device} of pool ${pool}"
  if [[ "${expect_binding_conditions}" == "yes" ]]; then
    wait_until "the controller to set the claim's binding conditions True" binding_conditions_met
    log "binding conditions True in the claim's status.devices"
  fi

  step "How to Verify, step 3 — the pod runs, sees its device, and the fabric bound it to the pod's node"
  k -n "${APP_NAMESPACE}" wait --for=condition=Ready pod -l "${APP_LABEL}" --timeout="${WAIT}s"
  local pod node
  pod="$(k -n "${APP_NAMESPACE}" get pods -l "${APP_LABEL}" -o jsonpath='{.items[0].metadata.name}')"
  node="$(k -n "${APP_NAMESPACE}" get pod "${pod}" -o jsonpath='{.spec.nodeName}')"
  log "pod ${pod} runs on ${node}"
  k -n "${APP_NAMESPACE}" describe pod "${pod}" | sed -n '/^Events:/,$p'

  # What the plugin asked containerd to inject: the claim's CDI specs on that node, one file per
  # device type, k8s.<driver>-<type>_<claim uid>.json (docs/plugin.md, "CDI specs").
  local spec_glob="${CDI_ROOT}/k8s.${DRIVER}-*_${claim_uid}.json"
  timeout 60 docker exec "${node}" sh -c "cat ${spec_glob}" >"${WORK_DIR}/cdi-specs.json" ||
    fail "no CDI spec ${spec_glob} on node ${node}"
  cdi_edits "${WORK_DIR}/cdi-specs.json" >"${WORK_DIR}/cdi-edits.txt"
  grep -q . "${WORK_DIR}/cdi-edits.txt" || fail "the CDI specs ${spec_glob} inject nothing"
  timeout 60 kubectl --kubeconfig "${WORK_DIR}/kubeconfig" -n "${APP_NAMESPACE}" exec "${pod}" -c agent-runner -- env >"${WORK_DIR}/pod-env.txt" ||
    fail "cannot run env in pod ${pod}"
  local kind value
  while read -r kind value; do
    case "${kind}" in
      env)
        grep -qxF -- "${value}" "${WORK_DIR}/pod-env.txt" || fail "the container lacks the CDI env ${value}"
        log "container env: ${value}"
        ;;
      mount | device)
        timeout 60 kubectl --kubeconfig "${WORK_DIR}/kubeconfig" -n "${APP_NAMESPACE}" exec "${pod}" -c agent-runner -- ls -d "${value}" >/dev/null ||
          fail "the container lacks the CDI ${kind} ${value}"
        log "container ${kind}: ${value}"
        ;;
    esac
  done <"${WORK_DIR}/cdi-edits.txt"

  local binding
  binding="$(fabric_binding "${device}")" || fail "cannot ask the fabric manager about device ${device}"
  [[ "${binding}" == "bound ${node}" ]] || fail "the fabric manager reports device ${device} as '${binding}', not bound to ${node}"
  log "fabric: ${device} is bound to ${node}"
  [[ -n "$(node_pci_devices "${node}")" ]] || fail "the emulated host ${node} sees no PCIe device"
  log "host ${node} sees: $(node_pci_devices "${node}" | tr '\n' ' ')"

  step "How to Verify, step 4 — scaled to 0, the claim is released and the device is back in the pool"
  k -n "${APP_NAMESPACE}" scale deployment agent-inference-worker --replicas=0
  wait_until "the pod to terminate (the kubelet unprepares its claim on the way)" no_pods_left
  wait_until "the pod's ResourceClaim to be released" no_claims_left
  k -n "${APP_NAMESPACE}" get resourceclaims
  wait_until "device ${device} to be detached in the fabric" device_is_free "${device}"
  log "fabric: ${device} is unbound"
  wait_until "the emulated host ${node} to lose the device" node_sees_no_device "${node}"
  if timeout 60 docker exec "${node}" sh -c "ls ${spec_glob}" >/dev/null 2>&1; then
    fail "a CDI spec ${spec_glob} is still on ${node}"
  fi
  pool_has_device "${pool}" "${device}" || fail "device ${device} is not published in pool ${pool} any more"
  log "pool ${pool} still offers ${device}: $(pool_summary)"

  k delete namespace "${APP_NAMESPACE}" --wait=true --timeout="${WAIT}s"
}

main() {
  if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    usage
    exit 0
  fi
  [[ $# -eq 0 ]] || fail "unknown argument '$1' (settings come from the environment; see --help)"
  check_prerequisites
  WORK_DIR="$(mktemp -d "${TMPDIR:-/tmp}/fabric-dra-e2e.XXXXXX")"
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM

  create_cluster
  build_images
  serve_runner_image

  deploy_overlay kind
  run_article_scenario "${KIND_DIR}/agent-infrastructure.yaml" no
  remove_overlay kind

  local manifest="${KIND_DIR}/agent-infrastructure.yaml"
  if k get --raw /apis/resource.k8s.io/v1beta1 >/dev/null 2>&1; then
    manifest="${KIND_DIR}/agent-infrastructure.v1beta1.yaml"
  else
    log "the cluster does not serve resource.k8s.io/v1beta1: using the v1 manifest again"
  fi
  deploy_overlay binding-conditions
  run_article_scenario "${manifest}" yes
  remove_overlay binding-conditions
}

# Sourced (by tests/unit/deploy), only the functions are defined.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
