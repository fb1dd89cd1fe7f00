"""`make bench`: run every benchmark in this folder, one after another, and
collect their results into bench/last_run.jsonl, one JSON line per result.

    .venv/bin/python bench/run_all.py [name ...]     # e.g. gateway_overhead

A bench's results are the JSON objects it prints on stdout: most print one line
last, gui_rollout one line per agent, ray_scale one object indented over many
lines, so stdout is decoded object by object, not line by line. Each result
gets `bench` (when it has none) and `_seconds`; a bench that fails, or prints no
result, gets a line with `_failed`, so the file tells the whole run. The file is
written as the run goes: a run stopped halfway keeps what it measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# vllm_engine prints {"skipped": ...} and exits 0 when there is no .venv-vllm (`make vllm`).
ORDER = ["gateway_overhead", "buffer_ingest", "train_vs_trl", "serve_while_training", "publish_gate", "rehearsal_cost",
         "form_cost", "learning_diagnosis",
         "tiny_model_arithmetic", "constrained_decoding", "agent_toolcall_learning", "gui_rollout", "ray_scale",
         "vllm_engine", "store_bytes", "trainer_long_sample", "openclaw_latency"]


def bench_results(stdout: str) -> list[dict]:
    """Every JSON object that starts a line of `stdout`, in order, each decoded whole (one line or many);
    a line that only looks like one (`{n} rows`) is text. Objects nested in one are part of it."""
    decoder = json.JSONDecoder()
    out, pos = [], 0
    while pos < len(stdout):
        start = stdout.find("{", pos)
        if start < 0:
            break
        line_start = stdout.rfind("\n", 0, start) + 1
        if stdout[line_start:start].strip():  # a brace inside a line of text
            pos = start + 1
            continue
        try:
            obj, end = decoder.raw_decode(stdout, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        if isinstance(obj, dict):
            out.append(obj)
        pos = end
    return out


def run_bench(name: str) -> list[dict]:
    """Run bench/<name>.py to its end; its results, or one `_failed` record saying why there are none."""
    print(f"== {name}", flush=True)
    t0 = time.time()
    p = subprocess.run([sys.executable, str(HERE / f"{name}.py")], capture_output=True, text=True)
    seconds = round(time.time() - t0, 1)
    sys.stdout.write(p.stdout[-4000:])
    if p.returncode != 0:
        sys.stdout.write(p.stderr[-4000:])
        return [{"bench": name, "_failed": f"exit status {p.returncode}", "_seconds": seconds}]
    results = bench_results(p.stdout)
    if not results:
        sys.stdout.write(p.stderr[-4000:])
        return [{"bench": name, "_failed": "printed no JSON result", "_seconds": seconds}]
    return [{"bench": name, **r, "_seconds": seconds} for r in results]  # a bench's own `bench` wins


def main(argv: list[str]) -> int:
    names = argv or [n for n in ORDER if (HERE / f"{n}.py").exists()]
    failed = []
    with open(HERE / "last_run.jsonl", "w") as f:
        for name in names:
            records = run_bench(name)
            failed += [name for r in records[:1] if "_failed" in r]
            for r in records:
                f.write(json.dumps(r) + "\n")
            f.flush()
    print(f"wrote {HERE / 'last_run.jsonl'}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
