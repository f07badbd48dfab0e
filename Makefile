# Two commands on a fresh machine: `make run` and `make test`. Both install what they need.
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt setup.py package.json 2>/dev/null | sha1sum | cut -c1-12)
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export CDK_DISABLE_CLI_TELEMETRY := true

.PHONY: install run test test-wheel test-fast test-unit test-functional test-engine test-e2e test-infra test-browser test-stock-moto lint fmt typecheck pr bench bench-smoke bench-zoo bench-report bench-planner synth deploy clean

# pyproject.toml says which versions smlt accepts; constraints.txt, the exact ones installed here.
$(STAMP): pyproject.toml constraints.txt setup.py
	test -x $(BIN)/python || python3 -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -e '.[dev]' -c constraints.txt
	npm ci --no-audit --no-fund --loglevel=error
	rm -f $(VENV)/.installed-* && touch $(STAMP)

# redis-server (for the Redis store tests) and chromium (the browser tests, tests/browser) are
# system packages: checked every time (0.1 s each).
install: $(STAMP)
	@scripts/redis.sh install >/dev/null
	@scripts/chromium.sh install >/dev/null

run: install
	$(BIN)/smlt run --local examples/digits.json --out out/digits

# The suite over every core (pytest-xdist; JOBS=1: one worker). A test file's tests stay on one
# worker (--dist loadfile): their module fixtures (engines, synths) start once. Tests marked
# inproc_moto (moto's in-process mock resets the backends a local engine's server in the same
# process serves) run in a second session; `pytest -m EXPR` runs both halves of what EXPR selects.
# Each half ends with its slowest tests (over 5 s): where the suite's time goes.
JOBS ?= auto
PYTEST = scripts/pytest-split.sh $(BIN)/pytest -q -n $(JOBS) --dist loadfile --durations=15 --durations-min=5

test: install
	$(PYTEST)

# The wheel as a user installs it: built, installed in a fresh venv with the local extra (the pins of
# constraints.txt, from pip's cache: ~70 s) and run on examples/digits.json outside the repo (~40 s).
# `make test` runs it too (tests/e2e/test_wheel.py).
test-wheel: install
	$(BIN)/pytest -q tests/e2e/test_wheel.py

# One kind of test (see tests/conftest.py): `make test-unit` (seconds), test-functional, ...
test-unit test-functional test-engine test-e2e test-infra test-browser: test-%: install
	$(PYTEST) -m $*

# Pure unit tests (tests/unit: no emulated AWS, no servers, no synth): seconds.
test-fast: test-unit

# The engine tests and the e2e tests marked stock_moto on stock moto (the speed patches of
# smlt.local off), so a moto upgrade that breaks a patch cannot hide behind it. The marked e2e
# tests cover what the speed patches replace (a run, faults, write conflicts, chained executions,
# both Maps); the rest of e2e runs on the same moto paths and only repeats them, slower.
# With the engine tests (which hold every patch's behaviour tests, tests/engine/test_moto_patches.py)
# this is the gate of a moto upgrade (docs/local-engine.md).
test-stock-moto: install
	SMLT_LOCAL_SPEEDUPS=0 $(PYTEST) -m "engine or stock_moto"

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: install
	$(BIN)/mypy

# What a change should pass before review (CI runs the same, see .ci/run).
pr: lint typecheck test

# Both sets of curves (tuning, held-out), ten seeds each: 12:22 on this machine's 2 idle cores (365 + 374 s,
# 1,467 CPU-s). Side by side on this machine it takes 0.84x the CPU of de74481's code, which took 11:16
# (1,344 CPU-s) on the machine of the day before: this one is ~1.3x slower
# (bench/experiments/2026-12-0[67]-bench-planner-speed*.md). The second held-out set (bench/curves/held-out-2,
# ~3,900 CPU-s for ten seeds): --curves bench/curves/held-out-2 --out F; its record is
# bench/results/planner-held-out-2.json, headline in bench/README.md.
bench-planner: install
	nice -n 10 $(BIN)/python bench/planner_bench.py

bench: install
	$(BIN)/python bench/local_bench.py
	$(BIN)/python bench/model_zoo.py

# Every bench/ script's --smoke (tiny inputs, nothing written; make test runs the same): ~2 min.
bench-smoke: install
	$(BIN)/pytest -q tests/e2e/test_bench_smoke.py

# The model zoo alone: digits CNN time to accuracy, ResNet-18 throughput, a ResNet-50 sharded round.
bench-zoo: install
	$(BIN)/python bench/model_zoo.py

# Re-render bench/README.md's local section from bench/results/local.json (no measuring).
bench-report: install
	$(BIN)/python bench/local_report.py

synth: install
	npx cdk synth --no-notices

deploy: install
	npx cdk deploy

clean:
	rm -rf out cdk.out .pytest_cache
