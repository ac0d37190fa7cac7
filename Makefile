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

help: ## show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $@

install: $(STAMP) ## create the virtualenv and install gpupool with its development tools

run: $(STAMP) ## explain the demo Pod (POD=...) against the demo inventory in examples/
	$(BIN)/gpupool explain $(POD) --inventory examples/cluster.yaml --policy examples/policy.yaml

explain: run ## alias of run

test: lint typecheck ## lint, type check and run the whole test suite
	$(BIN)/pytest -q

lint: $(STAMP) ## ruff: lint and formatting check
	$(BIN)/ruff check webhook tests bench
	$(BIN)/ruff format --check webhook tests bench

typecheck: $(STAMP) ## mypy --strict on the package
	$(BIN)/mypy

format: $(STAMP) ## reformat the code with ruff
	$(BIN)/ruff format webhook tests bench
	$(BIN)/ruff check --fix webhook tests bench

bench: $(STAMP) ## run the benchmarks in bench/ (not part of make test)
	$(BIN)/python bench/bench_decision.py

clean: ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis build dist *.egg-info

.PHONY: help install run explain test lint typecheck format bench clean
