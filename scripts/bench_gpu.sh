#!/usr/bin/env bash
# `make bench-gpu` (issue #30): the gateway's ceiling on a machine with free cores, and vLLM direct vs
# through the gateway where vLLM is installed. One script, well inside 10 minutes.
#
#   scripts/bench_gpu.sh wheels [DIR]   here, with pip and a network: the gateway's web stack as wheels for
#                                       the GPU image's Python 3.12 (it has torch, transformers, httpx,
#                                       uvloop; not fastapi, uvicorn, orjson ...), into DIR (.whl)
#   scripts/bench_gpu.sh [DIR]          there (or anywhere): DIR's wheels (if any) into /tmp/site, then
#     1. bench/gateway_ceiling.py: streamed and plain tokens/s, requests/s and CPU µs per token of one
#        gateway process with capture, bench engine in-process and vLLM stub over HTTP, c1 … c256, with
#        and without --serve-stream-interval-ms 20 (no GPU needed: the point is cores of its own);
#     2. bench/vllm_engine.py (vLLM's own chat endpoint vs the gateway in front of the same vLLM server,
#        c1 and c32, plain and stream) on MODEL (default: a random Qwen2 of 24 x 1024 built here), if a
#        Python with vLLM is found (VLLM_PYTHON, .venv-vllm, or python3 itself). The lent GPU machines
#        have no vLLM and cannot fetch it (its wheels are far over what a run can carry), so there this
#        part says so and is skipped: run it on a GPU machine where `make vllm` (or `pip install vllm`)
#        worked, with VLLM_PYTHON pointing at that Python.
#
# With the device tool (/work/.library/device/README.md): `echo /.whl/ >> .git/info/exclude`,
# `scripts/bench_gpu.sh wheels` here, then `scripts/bench_gpu.sh` there with carry [".whl"]; the output
# is also written under $OUT when set.
set -euo pipefail
cd "$(dirname "$0")/.."

EXTRA="fastapi starlette pydantic pydantic-core typing-inspection annotated-types python-multipart opentelemetry-api
       orjson uvicorn httptools openai distro jiter sniffio vaderSentiment xgrammar
       aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl"

if [ "${1:-}" = wheels ]; then
  dir=${2:-.whl}
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  pins=$(.venv/bin/python -c 'import importlib.metadata as md, sys; print(" ".join(f"{n}=={md.version(n)}" for n in sys.argv[1:]))' $EXTRA)
  # shellcheck disable=SC2086
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d "$dir" $pins
  du -sh "$dir"
  exit 0
fi

dir=${1:-.whl}
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if compgen -G "$dir/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$dir"/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-bench-gpu-out}
mkdir -p "$OUT"
{ nvidia-smi -L || echo "bench_gpu: no nvidia-smi"; nproc; } | tee "$OUT/machine.txt"

# py-spy is not in the GPU image: the ceiling runs without a profile there.
timeout 330 "$PY" bench/gateway_ceiling.py --rounds 1 --levels 1,16,64,256 --also-interval 20 \
  --max-tokens 128 --min-requests 64 | tee "$OUT/gateway_ceiling.txt"

VLLM_PY=${VLLM_PYTHON:-}
if [ -z "$VLLM_PY" ]; then
  for p in .venv-vllm/bin/python python3; do
    if [ -x "$(command -v "$p")" ] && "$p" -c "import vllm" 2>/dev/null; then VLLM_PY=$p; break; fi
  done
fi
if [ -z "$VLLM_PY" ]; then
  echo "bench_gpu: no Python with vLLM here (VLLM_PYTHON, .venv-vllm, python3): the vLLM-direct vs gateway" \
       "comparison (issue #30 item 2) is skipped; run this script where vLLM is installed" | tee "$OUT/vllm_engine.txt"
  exit 0
fi
MODEL=${MODEL:-}
if [ -z "$MODEL" ]; then
  MODEL=$(mktemp -d)/model
  "$PY" -c "import sys; from clawloop.tinymodel.build import build_random_model as b; b(sys.argv[1], layers=24, hidden=1024)" "$MODEL"
fi
timeout 540 "$PY" bench/vllm_engine.py --model "$MODEL" --vllm-python "$VLLM_PY" --rounds 3 --no-hf \
  --max-tokens 128 --n32 256 | tee "$OUT/vllm_engine.txt"
