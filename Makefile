# llmgw — the two commands a fresh machine needs are `make run` and `make test`.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
export LLMGW_DATA_DIR ?= $(CURDIR)/data

.PHONY: run test lint services venv clean bench

$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3-venv is missing; installing it with apt-get"; \
	  apt-get update -q && apt-get install -y -q python3-venv && $(PYTHON) -m venv $(VENV); }
	@$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

venv: $(VENV)/.installed

## Run llmgw with the embedded defaults (SQLite and a filesystem broker in ./data).
run: venv
	$(BIN)/llmgw serve

## Make sure PostgreSQL and Redis run (install them when missing).
services:
	@scripts/ensure-services

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python manage.py check --fail-level WARNING
	$(BIN)/python manage.py makemigrations --check --dry-run

## Everything CI runs: lint, import contracts, Django checks, and the tests on PostgreSQL.
test: venv services lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv services
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) data .pytest_cache .ruff_cache
