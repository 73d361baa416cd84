# The two commands of the README:  `make demo`  (set up, then run the main scenario)
#                                  `make test`  (set up, then lint, type-check and run every test)
# Both create ./.venv on first use; nothing is installed outside this directory. They install the
# product and its testbed (testbed/: the Kubernetes stand-ins, the stack builder, the demo), which a
# plain `pip install fabric-dra` and the image leave out.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-qemu lint typecheck pytest bench kind-e2e clean image push print-image

# --- the container image ------------------------------------------------------------------------
# `make image` builds the Dockerfile and tags it twice: <IMAGE>:<VERSION> (the package version in
# pyproject.toml, the tag deploy/base names) and <IMAGE>:<IMAGE_TAG> (version + git revision, for
# telling builds apart). `make push REGISTRY=registry.example.com/team` builds and pushes both to
# your registry; then point the manifests at it (docs/deploy.md, "Production checklist"):
#   cd deploy/overlays/production && kustomize edit set image ghcr.io/fabric-dra/fabric-dra=<IMAGE>:<tag>
# `make print-image` prints the references `make image` would tag, one a line (tests and e2e.sh
# read them instead of repeating the naming rule).
REGISTRY   ?= ghcr.io/fabric-dra
IMAGE_NAME ?= fabric-dra
IMAGE      ?= $(if $(REGISTRY),$(REGISTRY)/)$(IMAGE_NAME)
VERSION    := $(shell sed -n 's/^version = "\(.*\)"$$/\1/p' pyproject.toml)
REVISION   := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# Uncommitted changes to tracked files make the revision a lie: say so in the tag.
DIRTY      := $(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo -dirty)
IMAGE_TAG  ?= $(VERSION)-g$(REVISION)$(DIRTY)
IMAGE_REFS  = $(IMAGE):$(VERSION) $(IMAGE):$(IMAGE_TAG)
DOCKER     ?= docker

print-image:
	@printf '%s\n' $(IMAGE_REFS)

image:
	@test -n "$(VERSION)" || { echo "make image: no version in pyproject.toml" >&2; exit 1; }
	$(DOCKER) build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION)$(DIRTY) \
		$(addprefix --tag ,$(IMAGE_REFS)) .

# Pushing a build of uncommitted changes under the release tag would publish something no commit
# describes; ALLOW_DIRTY=1 overrides that for a private registry.
push:
	@test -z "$(DIRTY)" || test "$(ALLOW_DIRTY)" = 1 || { echo "make push: the work tree has uncommitted changes; commit them (or ALLOW_DIRTY=1)" >&2; exit 1; }
	@test "$(REGISTRY)" != ghcr.io/fabric-dra || test "$(ALLOW_UPSTREAM)" = 1 || { echo "make push: name your registry, e.g. make push REGISTRY=registry.example.com/team" >&2; exit 1; }
	$(MAKE) --no-print-directory image
	$(foreach ref,$(IMAGE_REFS),$(DOCKER) push $(ref) &&) true
	@$(DOCKER) image inspect --format '{{range .RepoDigests}}{{println .}}{{end}}' $(IMAGE):$(VERSION) | grep -F '$(IMAGE)@' || true

$(STAMP): pyproject.toml testbed/pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -e ".[test]" -e ./testbed
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/fabric-dra demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# pytest exits 5 when it collects nothing; make treats any non-zero exit as failure.
pytest: $(STAMP)
	$(BIN)/python -m pytest

test: lint typecheck pytest

# The QEMU guest suite (docs/emulator.md "QEMU hosts"), alone, printing its figures (-s): needs
# qemu-system-x86 linux-image-amd64 busybox-static udev kmod iproute2. `make test` runs it too (first).
test-qemu: $(STAMP)
	$(BIN)/python -m pytest -n 0 -m qemu tests/integration/qemu -s

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]" -e ./testbed
	$(BIN)/python -m bench

kind-e2e:
	deploy/kind/e2e.sh

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
