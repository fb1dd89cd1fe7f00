#!/usr/bin/env bash
# The persona evaluation (`clawloop eval`, issue #27 item 2) on a lent GPU machine, many cells at once:
# one process a persona cell (method x wording x persona x model), engine and trainer on the GPU, each
# with the same flags as the CPU runs (`--train-updates 16 --problems 32`, the committed defaults). A
# device check that ends inside 10 minutes: the eval's own 7-minute training budget a persona, then
# the measure.
#
#   here:  scripts/gpu_eval.sh wheels        # what the GPU image lacks for a clawloop server, as cp312 wheels (.whl2)
#          mkdir -p .gpumodel && cp -r MODEL .gpumodel/NAME   # (optional) other models to compare
#   there: scripts/gpu_eval.sh "CELLS"       # with the device tool, carry [".whl2", ".gpumodel"]
#
# CELLS: space separated method:wording:persona:model[:flags] (model: `shipped` or a folder name under
# .gpumodel; flags: more `clawloop up` flags, commas for spaces, e.g. --retry-weight,0); EVAL_ARGS: more eval flags (e.g. --max-minutes 6.5 to end inside the call). Writes $OUT/evals.tgz (every cell's JSON and log, the gate's lines) and $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = wheels ]; then
  # The closure of clawloop's runtime dependencies that the image (device KINDS.md) does not hold,
  # at this .venv's versions (openai 3.x needs httpx2; xgrammar needs apache-tvm-ffi).
  pkgs="annotated-types apache-tvm-ffi fastapi httpcore2 httptools httpx2 jiter openai opentelemetry-api orjson pydantic
        pydantic-core python-multipart sniffio starlette truststore typing-inspection uvicorn vaderSentiment xgrammar
        typing-extensions anyio"
  # shellcheck disable=SC2086
  pins=$(.venv/bin/python -c 'import importlib.metadata as md, sys; print(" ".join(f"{n}=={md.version(n)}" for n in sys.argv[1:]))' $pkgs)
  mkdir -p .whl2
  # shellcheck disable=SC2086
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl2 $pins
  ls .whl2
  exit 0
fi

OUT=${OUT:-gpu-out}
mkdir -p "$OUT" /tmp/evals
PY=${PY:-python3}
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl || exit 1
export PYTHONPATH=src:/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false OMP_NUM_THREADS=1
{ nvidia-smi -L; env -u OMP_NUM_THREADS nproc; "$PY" -c "import torch, transformers, openai, uvicorn, xgrammar, clawloop.cli, clawloop.eval; print(torch.__version__, transformers.__version__, openai.__version__)"; } \
  > "$OUT/summary.txt" 2>&1 || { cat "$OUT/summary.txt"; exit 1; }

pids=()
for cell in ${1:?cells}; do
  IFS=: read -r method wording persona model up <<<"$cell"
  name="${method}_${wording}_${persona}_${model}${up:+_${up//[^a-z0-9]/}}"
  mp=()
  [ "$model" != shipped ] && mp=(--model-path ".gpumodel/$model")
  [ -n "$up" ] && mp+=(-- ${up//,/ })
  mkdir -p "/tmp/evals/$name"
  timeout "${CELL_TIMEOUT:-560}" "$PY" -m clawloop.cli eval --personas "$persona" --train-updates 16 --problems 32 \
    --method "$method" --wording "$wording" ${EVAL_ARGS:-} --out "/tmp/evals/$name.json" --data-dir "/tmp/evals/$name" "${mp[@]}" \
    > "/tmp/evals/$name.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for f in /tmp/evals/*.log; do
  echo "== $(basename "$f" .log): $(grep -h "^persona=" "$f" || tail -c 300 "$f")"
done >> "$OUT/summary.txt"
for d in /tmp/evals/*/; do echo "== $d"; grep -h "publish gate" "$d"*/up.log | cut -c1-260; done > /tmp/evals/gates.txt
(cd /tmp/evals && tar -czf "$OUT/evals.tgz" ./*.json ./*.log gates.txt)
cat "$OUT/summary.txt"
