# sandbox-supervisor. `make run` and `make test` each do their own set-up on a fresh machine.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
#: Parallel test workers (0: none, in process). Three fit this 2-core machine: the tests
#: mostly wait on the engine, and the serial phase keeps the machine-wide checks alone.
WORKERS ?= 3

.DEFAULT_GOAL := help
.PHONY: help venv engine engine-down browser swarm-lab swarm-lab-down images run test check lint types fmt unit fuzz integration e2e adversarial bench clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-15s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

venv: $(STAMP) ## create .venv with the package and dev tools

engine: ## make sure a Docker engine answers (installs docker.io + runsc on Debian as root)
	scripts/engine.sh up

engine-down: ## stop the dockerd that `make engine` started (never any other)
	scripts/engine.sh down

browser: ## make sure a headless Chromium runs, for the dashboard's browser tests (installs Debian's chromium as root)
	scripts/browser.sh up

swarm-lab: engine images ## a 3-node Swarm on this machine (manager + 2 workers, one gVisor); idempotent
	scripts/swarm-lab.sh up

swarm-lab-down: ## stop the Swarm lab and remove its netns and files (the host engine stays)
	scripts/swarm-lab.sh down

images: venv engine ## build the sandbox images offline (only when their sources changed)
	$(BIN)/sandvisor images build

run: venv engine images ## the main job: the daemon in the foreground on the embedded defaults, with the dashboard
	$(BIN)/sandvisor serve --banner --ui

lint: venv ## ruff format --check + ruff check
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

fmt: venv ## apply ruff format and safe fixes
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

types: venv ## mypy --strict
	$(BIN)/mypy

check: ## lint + types + all tests, without set-up: on WORKERS parallel workers, then the serial ones alone
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy
	@par=0; ser=0; \
	$(BIN)/pytest -n $(WORKERS) -m "not serial" $(PYTEST_ARGS) || par=$$?; \
	$(BIN)/pytest -m serial $(PYTEST_ARGS) || ser=$$?; \
	[ $$ser -eq 5 ] && ser=0; \
	echo "parallel run: exit $$par; serial run: exit $$ser"; \
	[ $$par -eq 0 ] && [ $$ser -eq 0 ]

test: venv engine images browser ## everything, with its set-up: lint, types, unit, integration, e2e, browser, adversarial
	$(MAKE) --no-print-directory check

unit: venv ## fast tests, no engine: pure logic, and the runtime on the fake engine (not the slow API fuzzer: `make test` runs it)
	$(BIN)/pytest -n $(WORKERS) tests/unit tests/component -m "not slow" $(PYTEST_ARGS)

fuzz: venv ## the property tests with random draws and 20x the examples (not in `make test`; keep what it finds as an @example)
	SANDVISOR_HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest -n $(WORKERS) tests/unit tests/component -m hypothesis $(PYTEST_ARGS)

integration: venv engine images ## tests against the real engine
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

bench: venv engine images ## benchmarks against raw docker-py and a plain pipe (writes bench/results/)
	$(BIN)/python -m bench.run

clean: ## remove the virtualenv and caches (not images, not state)
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info
