"""`make bench`: run every benchmark in this folder, one after another, and
collect their final JSON lines into bench/last_run.jsonl.

    .venv/bin/python bench/run_all.py [name ...]     # e.g. gateway_overhead
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# vllm_engine prints {"skipped": ...} and exits 0 when there is no .venv-vllm (`make vllm`).
ORDER = ["gateway_overhead", "buffer_ingest", "train_vs_trl", "serve_while_training", "publish_gate", "learning_diagnosis",
         "tiny_model_arithmetic", "constrained_decoding", "agent_toolcall_learning", "gui_rollout", "ray_scale",
         "vllm_engine"]


def main(argv: list[str]) -> int:
    names = argv or [n for n in ORDER if (HERE / f"{n}.py").exists()]
    results, failed = [], []
    for name in names:
        print(f"== {name}", flush=True)
        t0 = time.time()
        p = subprocess.run([sys.executable, str(HERE / f"{name}.py")], capture_output=True, text=True)
        sys.stdout.write(p.stdout[-4000:])
        if p.returncode != 0:
            sys.stdout.write(p.stderr[-4000:])
            failed.append(name)
            continue
        last = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
        if last:
            rec = json.loads(last[-1])
            rec["_seconds"] = round(time.time() - t0, 1)
            results.append(rec)
    with open(HERE / "last_run.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps(r) + "\n")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
