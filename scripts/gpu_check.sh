#!/usr/bin/env bash
# The `gpu` marker (what `make test-gpu` runs) on a machine lent a GPU, with that machine's own CUDA
# torch instead of a .venv: a device check that ends well inside 10 minutes.
#
#   scripts/gpu_check.sh wheels [DIR]   here, with pip and a network: the wheels the GPU image lacks, at
#                                       this .venv's versions, built for its Python 3.12, into DIR (.whl)
#   scripts/gpu_check.sh [DIR]          there: DIR's wheels (if any) into /tmp/site, then the gpu-marked
#                                       tests with CLAWLOOP_REQUIRE=gpu, so a machine without CUDA fails
#
# With the device tool (/work/.library/device/README.md): `echo /.whl/ >> .git/info/exclude` and
# `scripts/gpu_check.sh wheels` here, then run `scripts/gpu_check.sh` there with carry [".whl"].
set -euo pipefail
cd "$(dirname "$0")/.."

# What the gpu tests import that the image (torch, transformers, peft, pytest, ... see KINDS.md) lacks:
# the gateway's web stack, which the trainer's OPD path reaches through clawloop.gateway.render. Found by
# running the tests' imports here with every distribution the image does not list blocked.
# bitsandbytes (41 MiB, manylinux_2_24) for --load-in-4bit (tests/test_qlora.py): the carried .whl stays under 64 MiB.
EXTRA="fastapi starlette pydantic pydantic-core typing-inspection annotated-types python-multipart opentelemetry-api orjson
       bitsandbytes"

if [ "${1:-}" = wheels ]; then
  dir=${2:-.whl}
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  pins=$(.venv/bin/python -c 'import importlib.metadata as md, sys; print(" ".join(f"{n}=={md.version(n)}" for n in sys.argv[1:]))' $EXTRA)
  # shellcheck disable=SC2086
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$dir" $pins
  ls "$dir"
  exit 0
fi

dir=${1:-.whl}
PY=${PY:-python3}
if compgen -G "$dir/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$dir"/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi -L || echo "gpu_check: no nvidia-smi"
"$PY" -c "import torch; print('torch', torch.__version__, '| CUDA:', torch.cuda.is_available() and torch.cuda.get_device_name(0))"
mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py)
CLAWLOOP_REQUIRE=gpu exec timeout 540 "$PY" -m pytest -rfEs -s -p no:cacheprovider -m gpu "${files[@]}"
