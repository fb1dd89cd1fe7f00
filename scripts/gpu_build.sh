#!/usr/bin/env bash
# One device check on a lent GPU machine (issue #27): tiny-model builds on the GPU, several recipes at
# once, beside the `gpu`-marked tests (scripts/gpu_check.sh). Ends well inside 10 minutes.
#
#   here:  scripts/gpu_check.sh wheels                      # the web stack + bitsandbytes as wheels (.whl)
#          CLAWLOOP_CACHE=.gpucache .venv/bin/python -c "from clawloop.tinymodel import build; build._tokenizer_json()"
#                                                           # the tokenizer, so the GPU builds use the shipped one
#   there: scripts/gpu_build.sh                             # with the device tool, carry [".whl", ".gpucache"]
#
# Writes under $OUT (or gpu-out/): gpu_tests.txt, one NAME.tgz per recipe (the model folder with its
# build_info.json and build.log), summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
PY=${PY:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
export CLAWLOOP_CACHE=$PWD/.gpucache CLAWLOOP_BUILD_PROCS=${CLAWLOOP_BUILD_PROCS:-6}
{ nvidia-smi -L; nproc; "$PY" -c "import torch, transformers; print(torch.__version__, transformers.__version__)"; } \
  > "$OUT/summary.txt" 2>&1

mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
( CLAWLOOP_REQUIRE=gpu timeout 420 "$PY" -m pytest -rfEs -s -p no:cacheprovider -m gpu "${files[@]}" \
    > "$OUT/gpu_tests.txt" 2>&1; echo "gpu tests rc=$?" >> "$OUT/gpu_tests.txt" ) &

BUDGET=${BUDGET:-300}   # seconds of training per recipe (the plan is thinned evenly to fit) ...
export CLAWLOOP_TRAIN_UNTIL=$(( $(date +%s) + ${TRAIN_FOR:-380} ))  # ... and all training ends by then
build() {  # NAME ARGS...
  local name=$1; shift
  mkdir -p /tmp/models
  timeout 500 "$PY" -m clawloop.tinymodel.build --out "/tmp/models/$name" --force --device "${DEVICE:-cuda}" \
    --max-train-seconds "$BUDGET" "$@" > "/tmp/models/$name.log" 2>&1
  echo "$name rc=$? args: $*" >> "$OUT/summary.txt"
  mkdir -p "/tmp/models/$name"
  cp "/tmp/models/$name.log" "/tmp/models/$name/build.log"
  tar -C /tmp/models -czf "$OUT/$name.tgz" "$name"
}
# The first run (2026-11-27, three recipes at once, 4x the steps at batch 64) learnt that the 1.1 M model
# is launch-bound on an H100: 150-170 ms a step per build, only ~2.7x two CPU cores, so the plans were
# thinned to ~600 steps. A GPU's gain is the batch: 4x the conversations a step at the CPU recipe's
# step count. Two recipes, not three (the data for each takes minutes to encode).
build b256 --batch-size 256 --final-bare 0.25 --tool-rows 24 --long-every 8 &
build b256lr --batch-size 256 --final-bare 0.25 --tool-rows 24 --long-every 8 --lr 6e-3 &
wait
for f in /tmp/models/*/build_info.json; do
  "$PY" -c "import json,sys; i=json.load(open(sys.argv[1])); print(sys.argv[1], i['steps'], i['train_seconds'], json.dumps(i['accuracy']))" "$f"
done >> "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
tail -3 "$OUT/gpu_tests.txt"
