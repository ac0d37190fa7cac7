# gpupool: `make help` lists the targets. Every target creates or reuses the virtualenv in .venv.
.DEFAULT_GOAL := help
SHELL := /bin/bash

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PORT ?= 8443
HEALTH_PORT ?= 8080
POD ?= examples/pods/class-medium.yaml
OVERLAY ?= self-signed
FAILURE_POLICY ?= Fail
IMAGE ?=
# Only kube-apiserver is heard (README: "Only kube-apiserver may call gpupool"): the CA of its client
# certificate, and the control plane's addresses for the NetworkPolicy (space-separated). Empty: off.
CLIENT_CA ?=
CONTROL_PLANE_CIDRS ?=
# The names `make certs` puts in certs/tls.crt (besides the in-cluster Service names); `make manifests`
# uses the same ones, or each would re-issue the other's serving certificate.
CERT_HOSTS ?= localhost 127.0.0.1
MANIFEST = build/gpupool-$(OVERLAY).yaml

help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP) ## create the virtualenv and install gpupool with its development tools

run: $(STAMP) certs ## serve the demo inventory over TLS on https://127.0.0.1:8443 (health and metrics on :8080)
	$(BIN)/gpupool serve --cert certs/tls.crt --key certs/tls.key --inventory examples/cluster.yaml \
		--policy examples/policy.yaml --host 127.0.0.1 --port $(PORT) --health-port $(HEALTH_PORT)

explain: $(STAMP) ## explain the decision for a Pod (POD=examples/pods/...) on the demo inventory
	$(BIN)/gpupool explain $(POD) --inventory examples/cluster.yaml --policy examples/policy.yaml

inventory: $(STAMP) ## show the demo inventory's pools
	$(BIN)/gpupool inventory --inventory examples/cluster.yaml --policy examples/policy.yaml

quota: $(STAMP) ## show every quota gpupool checks on the demo inventory
	$(BIN)/gpupool quota -A --inventory examples/cluster.yaml --policy examples/policy.yaml

certs: $(STAMP) ## dev certificates for localhost, 127.0.0.1 and the in-cluster Service name, into certs/
	$(BIN)/gpupool certs --out certs $(addprefix --host ,$(CERT_HOSTS))

test: lint typecheck ## lint, type check and run the whole test suite
	$(BIN)/pytest -q

fuzz: $(STAMP) ## the test suite with new random examples for the property tests (repeat it; add finds as @example)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -q

PYCODE := webhook tests bench manifests/render.py

lint: $(STAMP) ## ruff (lint and formatting) and import-linter (the layers of webhook/, see docs/development.md)
	$(BIN)/ruff check $(PYCODE)
	$(BIN)/ruff format --check $(PYCODE)
	$(BIN)/lint-imports

typecheck: $(STAMP) ## mypy --strict on the package and the manifest renderer
	$(BIN)/mypy

format: $(STAMP) ## reformat the code with ruff
	$(BIN)/ruff format $(PYCODE)
	$(BIN)/ruff check --fix $(PYCODE)

bench: $(STAMP) ## run every benchmark in bench/ (minutes; not part of make test)
	$(BIN)/python bench/bench_decision.py
	$(BIN)/python bench/bench_cache.py
	$(BIN)/python bench/bench_server.py
	$(BIN)/python bench/bench_slow_clients.py

manifests: $(STAMP) ## render deployable YAML into build/gpupool-<overlay>.yaml (OVERLAY=self-signed|cert-manager FAILURE_POLICY=Fail|Ignore IMAGE=ref CLIENT_CA=file CONTROL_PLANE_CIDRS="cidr ...")
	$(BIN)/python manifests/render.py --overlay $(OVERLAY) --failure-policy $(FAILURE_POLICY) $(if $(IMAGE),--image $(IMAGE)) $(addprefix --host ,$(CERT_HOSTS)) \
		$(if $(CLIENT_CA),--client-ca $(CLIENT_CA)) $(addprefix --control-plane-cidr ,$(CONTROL_PLANE_CIDRS)) --out $(MANIFEST)

deploy: manifests ## install on the current kubectl context; the webhook configuration goes last, once the Pods are ready
	kubectl apply -f $(MANIFEST) -l 'app.kubernetes.io/component!=webhook-configuration'
	kubectl -n gpupool-system rollout status deployment/gpupool-webhook --timeout=300s
	kubectl apply -f $(MANIFEST)

undeploy: ## remove gpupool from the current kubectl context: the webhook configuration first, then the rest
	kubectl delete mutatingwebhookconfiguration gpupool-webhook --ignore-not-found
	kubectl delete namespace gpupool-system --ignore-not-found
	kubectl delete clusterrolebinding,clusterrole gpupool-webhook --ignore-not-found

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info

.PHONY: help install run explain inventory certs test fuzz lint typecheck format bench manifests deploy undeploy clean
