# gpupool: `make help` lists the targets. Every target creates or reuses the virtualenv in .venv.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8443
# Not 8080: that is kubectl's default server when there is no kubeconfig, so `make deploy` (or any
# kubectl) would talk to a running `make run`.
HEALTH_PORT ?= 8081
# What `pip install` gets in the virtualenv: gpupool and its development tools, at the lock's versions.
PIP_INSTALL ?= -c build/constraints.txt -e '.[dev]'
KUBECTL ?= kubectl
POD ?= examples/pods/class-medium.yaml
OVERLAY ?= self-signed
FAILURE_POLICY ?= Fail
IMAGE ?=
# Only kube-apiserver is heard (README: "Only kube-apiserver may call gpupool"): the CA of its client
# certificate, and the control plane's addresses for the NetworkPolicy (space-separated). Empty: off.
CLIENT_CA ?=
CONTROL_PLANE_CIDRS ?=
# Who may reach the health and metrics port 8080: Prometheus' namespaces (space-separated), and for a CNI
# that applies NetworkPolicy to the kubelet's probes, the nodes' address ranges (docs/install.md).
METRICS_NAMESPACES ?= monitoring
HEALTH_CIDRS ?=
# Namespaces never sent to gpupool, by name, besides kube-system, gpupool-system and gpu-operator
# (space-separated); IGNORE_LABEL=false stops honouring gpupool.io/ignore=true (where tenants may label
# their namespaces). docs/install.md, "Opting a namespace out".
EXCLUDE_NAMESPACES ?=
IGNORE_LABEL ?= true
# SINGLE_NODE=true: both replicas may run on one node, for single-node test clusters only
# (manifests/components/single-node); otherwise two replicas never share a node.
SINGLE_NODE ?= false
# MIG_RESHAPING=true: the opt-in RBAC for the policy's migReshaping, patch on nodes and get, list, watch on mig-parted's
# ConfigMap (manifests/components/mig-reshaping, docs/mig.md); otherwise gpupool never writes a node.
MIG_RESHAPING ?= false
# Two certificates that never touch each other: the one installed in the cluster (certs/, made and renewed
# by `make manifests`/`make deploy`) carries only the Service's names, plus CERT_HOSTS if you need more;
# `make run`'s own (certs/dev/, `make certs`) is for localhost. Sharing one directory, each run would
# re-issue the other's certificate, and the cluster's would name localhost.
CERT_HOSTS ?=
DEV_CERTS := certs/dev
DEV_CERT_HOSTS ?= localhost 127.0.0.1
MANIFEST = build/gpupool-$(OVERLAY).yaml
# make release only: the digest of the image pushed as tag VERSION (`sha256:...`; the install then names the
# image by it, not by the tag), and the `release` label kube-prometheus-stack selects the monitoring file's
# PodMonitor and PrometheusRule by (its Helm release name).
IMAGE_DIGEST ?=
PROMETHEUS_RELEASE ?= kube-prometheus-stack

help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# One virtualenv however many makes ask for it at once (`make run & make test`): tools/ensure_venv.py makes it
# under a lock and finds the work done when another make got there first. The runtime dependencies are
# installed at the versions of requirements.lock (what the image installs), so the tests run on what ships;
# the lock's hashes are for the image, pip takes constraints without them. The constraints file is replaced
# whole (mv), so a pip that another make started reads the old file or the new one, never half of one.
$(STAMP): pyproject.toml requirements.lock
	@mkdir -p build && sed -n 's/^\([A-Za-z0-9_.-]*==[^ ]*\).*/\1/p' requirements.lock > build/constraints.txt.$$$$ \
		&& mv -f build/constraints.txt.$$$$ build/constraints.txt
	@$(PYTHON) tools/ensure_venv.py $(VENV) --stamp $@ --after pyproject.toml --after requirements.lock -- --quiet $(PIP_INSTALL)

install: $(STAMP) ## create the virtualenv and install gpupool with its development tools

run: $(STAMP) certs ## serve the demo inventory over TLS on https://127.0.0.1:8443 (health and metrics on :8081)
	$(BIN)/gpupool serve --cert $(DEV_CERTS)/tls.crt --key $(DEV_CERTS)/tls.key --inventory examples/cluster.yaml \
		--policy examples/policy.yaml --host 127.0.0.1 --port $(PORT) --health-port $(HEALTH_PORT)

explain: $(STAMP) ## explain the decision for a Pod (POD=examples/pods/...) on the demo inventory
	@# A denial is an answer (exit 1), not a failure of make: only a bad file or argument (exit 2) is.
	@$(BIN)/gpupool explain $(POD) --inventory examples/cluster.yaml --policy examples/policy.yaml; \
		status=$$?; [ $$status -le 1 ]

inventory: $(STAMP) ## show the demo inventory's pools
	$(BIN)/gpupool inventory --inventory examples/cluster.yaml --policy examples/policy.yaml

quota: $(STAMP) ## show every quota gpupool checks on the demo inventory
	$(BIN)/gpupool quota -A --inventory examples/cluster.yaml --policy examples/policy.yaml

certs: $(STAMP) ## make run's certificates (localhost, 127.0.0.1) into certs/dev/; the cluster's are made by make manifests
	$(BIN)/gpupool certs --out $(DEV_CERTS) $(addprefix --host ,$(DEV_CERT_HOSTS))

# Two test workers a core (pytest-xdist): the suite waits (servers starting, deadlines passing) more than it
# computes, so one a core left the cores idle (4 Dec 2026, 2 cores: 234 s with 2 workers, 159 s with 4;
# docs/development.md, "Tests"). A module's tests stay on one worker, so its servers and simulated clusters
# are set up once. PYTEST_WORKERS=N to choose, 0 runs them in-process.
# mypy runs beside pytest, in the time the workers wait for the servers they start (on a fresh clone it is
# most of the fixed cost); its report follows pytest's, and either failing fails make test.
PYTEST_WORKERS ?= $(shell echo $$(( 2 * $$(nproc 2>/dev/null || echo 1) )))
test: lint ## lint, then type check and run the whole test suite side by side, on every core
	@mkdir -p build; echo "$(BIN)/mypy > build/typecheck.log &"; $(BIN)/mypy > build/typecheck.log 2>&1 & typecheck=$$!; \
	echo "$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadscope"; \
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadscope; tests=$$?; \
	wait $$typecheck; types=$$?; echo "$(BIN)/mypy:"; cat build/typecheck.log; \
	[ $$types -eq 0 ] || echo "make test: mypy failed (above)" >&2; \
	[ $$tests -eq 0 ] && [ $$types -eq 0 ]

fuzz: $(STAMP) ## the test suite with new random examples for the property tests (repeat it; add finds as @example)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q

PYCODE := webhook tests bench manifests/render.py manifests/rendering tools

lint: $(STAMP) ## ruff (lint and formatting) and import-linter (the layers of webhook/, see docs/development.md)
	$(BIN)/ruff check $(PYCODE)
	$(BIN)/ruff format --check $(PYCODE)
	$(BIN)/lint-imports

typecheck: $(STAMP) ## mypy --strict on the package, the manifest renderer and tools/
	$(BIN)/mypy

format: $(STAMP) ## reformat the code with ruff
	$(BIN)/ruff format $(PYCODE)
	$(BIN)/ruff check --fix $(PYCODE)

bench: $(STAMP) ## run every benchmark in bench/ (minutes; not part of make test)
	$(BIN)/python bench/bench_decision.py
	$(BIN)/python bench/bench_cache.py
	$(BIN)/python bench/bench_server.py
	$(BIN)/python bench/bench_slow_clients.py
	$(BIN)/python bench/bench_queue.py

# Who may reach the two ports and which namespaces are left out: the same for `make manifests` and `make release`.
ACCESS_OPTIONS = $(addprefix --control-plane-cidr ,$(CONTROL_PLANE_CIDRS)) \
	$(addprefix --metrics-namespace ,$(METRICS_NAMESPACES)) $(addprefix --health-cidr ,$(HEALTH_CIDRS)) \
	$(addprefix --exclude-namespace ,$(EXCLUDE_NAMESPACES)) $(if $(filter false,$(IGNORE_LABEL)),--no-ignore-label)

match-conditions: $(STAMP) ## write the default policy's GPU resources into both webhook configurations' matchConditions (after its vendors change)
	PYTHONPATH=. $(BIN)/python tools/match_conditions.py

manifests: $(STAMP) ## render deployable YAML into build/gpupool-<overlay>.yaml (OVERLAY=self-signed|cert-manager FAILURE_POLICY=Fail|Ignore IMAGE=ref CLIENT_CA=file CONTROL_PLANE_CIDRS="cidr ..." METRICS_NAMESPACES="ns ..." HEALTH_CIDRS="cidr ..." EXCLUDE_NAMESPACES="ns ..." IGNORE_LABEL=false SINGLE_NODE=true MIG_RESHAPING=true)
	$(BIN)/python manifests/render.py --overlay $(OVERLAY) --failure-policy $(FAILURE_POLICY) $(if $(IMAGE),--image $(IMAGE)) $(addprefix --host ,$(CERT_HOSTS)) \
		$(if $(CLIENT_CA),--client-ca $(CLIENT_CA)) $(ACCESS_OPTIONS) $(if $(filter true,$(SINGLE_NODE)),--single-node) \
		$(if $(filter true,$(MIG_RESHAPING)),--mig-reshaping) \
		--out $(MANIFEST)

# The kubectl context deploy and undeploy act on, said first; without one they stop (kubectl would
# otherwise fall back to http://localhost:8080). Every kubectl call then names it, so a context switched
# in another terminal half-way cannot split an install between two clusters.
KUBE_CONTEXT = context="$$($(KUBECTL) config current-context 2>/dev/null)" && [ -n "$$context" ] || { \
	echo "make $@: no current kubectl context; choose one (kubectl config use-context NAME) or set KUBECONFIG" >&2; \
	exit 2; }; \
	server="$$($(KUBECTL) config view --minify -o jsonpath='{.clusters[0].cluster.server}' 2>/dev/null)"; \
	[ -n "$$server" ] || { echo "make $@: context $$context names no cluster server in the kubeconfig" >&2; exit 2; }; \
	echo "make $@: kubectl context $$context, server $$server"; \
	kubectl=( $(KUBECTL) --context "$$context" )

# The webhook configurations go last, once the Pods are ready: the mutating one, then the validating one
# (kustomize writes them in that order, and kubectl applies a file in order), so no Pod is validated before
# gpupool could place it.
deploy: $(STAMP) ## install on the current kubectl context (says which; stops without one); the webhook configurations go last, once the Pods are ready
	@set -e; $(KUBE_CONTEXT); \
	$(MAKE) --no-print-directory manifests; \
	"$${kubectl[@]}" apply -f $(MANIFEST) -l 'app.kubernetes.io/component!=webhook-configuration'; \
	"$${kubectl[@]}" -n gpupool-system rollout status deployment/gpupool-webhook --timeout=300s; \
	"$${kubectl[@]}" apply -f $(MANIFEST)

# The validating webhook goes first: without the mutating one, it would refuse every GPU Pod as unplaced.
undeploy: ## remove gpupool from the current kubectl context (says which; stops without one): the webhook configurations first (validating, then mutating), then the rest, the GPUPool CRD (and its objects) last
	@set -e; $(KUBE_CONTEXT); \
	"$${kubectl[@]}" delete validatingwebhookconfiguration gpupool-webhook --ignore-not-found; \
	"$${kubectl[@]}" delete mutatingwebhookconfiguration gpupool-webhook --ignore-not-found; \
	"$${kubectl[@]}" delete namespace gpupool-system --ignore-not-found; \
	"$${kubectl[@]}" delete clusterrolebinding,clusterrole gpupool-webhook gpupool-mig-reshaping --ignore-not-found; \
	"$${kubectl[@]}" delete clusterrole gpupool-view --ignore-not-found; \
	"$${kubectl[@]}" delete customresourcedefinition gpupools.gpupool.io --ignore-not-found

# What a release decides itself: given on the command line, refused rather than silently dropped.
RELEASE_FIXED = $(strip $(foreach v,OVERLAY FAILURE_POLICY IMAGE CLIENT_CA SINGLE_NODE MIG_RESHAPING,$(if $(filter command line,$(origin $(v))),$(v))))
release: ## write a release into dist/: gpupool-VERSION.yaml for kubectl apply -f (image tag VERSION, or IMAGE_DIGEST), gpupool-monitoring-VERSION.yaml (label release: PROMETHEUS_RELEASE), gpupool-mig-reshaping-VERSION.yaml (opt-in), SHA256SUMS (VERSION=x.y.z; METRICS_NAMESPACES, CONTROL_PLANE_CIDRS, HEALTH_CIDRS, EXCLUDE_NAMESPACES, IGNORE_LABEL as for manifests)
	@test -n "$(VERSION)" || { echo "make release: give the version, e.g. make release VERSION=0.1.0" >&2; exit 2; }
	@test -z "$(RELEASE_FIXED)" || { echo "make release: a release is the cert-manager overlay, failurePolicy Fail, the image tagged VERSION and no file of this machine; $(RELEASE_FIXED) cannot be given" >&2; exit 2; }
	$(PYTHON) manifests/render.py --release $(VERSION) $(ACCESS_OPTIONS) $(if $(IMAGE_DIGEST),--image-digest $(IMAGE_DIGEST)) --prometheus-release $(PROMETHEUS_RELEASE) --out-dir dist

# requirements.lock: every package the image installs, at an exact version with its hashes, resolved from
# pyproject.toml's dependencies (and the build backend) for the image's Python. pip-compile keeps the pins
# that still satisfy pyproject.toml; UPGRADE=1 takes the newest. tests/test_image.py fails when the two disagree.
LOCK_VENV := build/lock-venv
lock: ## re-resolve requirements.lock from pyproject.toml (exact versions and hashes; UPGRADE=1 for the newest; needs PyPI)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "make lock: resolve with Python 3.11, the image'"'"'s (PYTHON=python3.11)")'
	@test -x $(LOCK_VENV)/bin/pip-compile || { $(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install --quiet 'pip-tools>=7.4'; }
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile --quiet --generate-hashes --allow-unsafe \
		--all-build-deps --strip-extras --no-emit-index-url --no-emit-find-links $(if $(UPGRADE),--upgrade) \
		--output-file requirements.lock pyproject.toml

# The Dockerfile's base images are pinned by digest (ARG BUILDER_IMAGE, RUNTIME_IMAGE = tag@sha256:...).
pin-images: ## re-pin the Dockerfile's base images to their tags' current digests (needs docker buildx and the registries)
	@for arg in BUILDER_IMAGE RUNTIME_IMAGE; do \
		ref=$$(sed -n "s/^ARG $$arg=\([^@]*\)@sha256:.*/\1/p" Dockerfile); \
		test -n "$$ref" || { echo "pin-images: no 'ARG $$arg=name:tag@sha256:...' in Dockerfile" >&2; exit 1; }; \
		digest=$$(docker buildx imagetools inspect "$$ref" --format '{{json .Manifest}}' \
			| $(PYTHON) -c 'import json, sys; print(json.load(sys.stdin)["digest"])') || exit 1; \
		sed -i "s|^ARG $$arg=.*|ARG $$arg=$$ref@$$digest|" Dockerfile && echo "$$arg=$$ref@$$digest"; \
	done

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) $(VENV).lock .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info

.PHONY: help install run explain inventory certs test fuzz lint typecheck format bench match-conditions manifests deploy undeploy release lock pin-images clean
