# The README's two commands. Each sets up .venv on first use (scripts/bootstrap.sh).
SHELL := /bin/bash
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export RAY_USAGE_STATS_ENABLED := 0
export MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR := false

.PHONY: setup demo test lint format clean

setup:
	@scripts/bootstrap.sh

demo: setup
	$(BIN)/scalelab submit sweeps/demo.yaml

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two pytest-xdist workers (the CI machine's 2 cores): much of a test's time is spent waiting
# on the processes it starts; tests/conftest.py keeps tests that share a service together
# and orders the groups heaviest first, the order in which workers take them.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder $(PYTEST_ARGS)

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache scalelab-runs
