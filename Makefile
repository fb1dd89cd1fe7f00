# Two commands set everything up on a fresh machine: `make run` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev
BENCHSTAMP:= $(VENV)/.installed-bench

.PHONY: run test bench install install-dev tiny-model clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch first, pinned to the local CPU wheel when there is no CUDA driver:
# an unpinned torch pulls a multi-GB CUDA build. GPU users install their CUDA
# torch into .venv before `make`, and this step leaves it alone.
$(STAMP): $(BIN)/python pyproject.toml
	@if ! $(BIN)/python -c "import torch" 2>/dev/null; then \
	  if command -v nvidia-smi >/dev/null 2>&1; then $(BIN)/pip install -q torch; \
	  else $(BIN)/pip install -q torch==2.13.0; fi; fi
	$(BIN)/pip install -q -e .
	touch $(STAMP)

$(DEVSTAMP): $(STAMP)
	$(BIN)/pip install -q -e ".[dev]"
	touch $(DEVSTAMP)

$(BENCHSTAMP): $(DEVSTAMP)
	$(BIN)/pip install -q -e ".[dev,bench]"
	touch $(BENCHSTAMP)

install: $(STAMP)
install-dev: $(DEVSTAMP)

tiny-model: $(STAMP)
	$(BIN)/clawloop tiny-model

run: $(STAMP)
	$(BIN)/clawloop tiny-model --if-missing
	$(BIN)/clawloop up

test: $(DEVSTAMP)
	$(BIN)/python -m pytest tests

bench: $(BENCHSTAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) clawloop-data
