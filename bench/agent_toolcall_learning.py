"""Does the tool-call track teach the tiny model anything? One honest run, whatever it shows.

    .venv/bin/python bench/agent_toolcall_learning.py      # 48 updates at lr 2e-4, as in bench/RESULTS.md

Real parts only: `clawloop up` (tiny model, trainer on `--buffer`), `clawloop buffer` running the
built-in `toolcall` generator with the `calculator` tool (the tool the tiny model's corpus uses),
environments in the sandbox, GRPO groups of `--group` episodes on the 100 packaged problems.
Grammar-constrained tool calls are OFF (`--constrain-tool-calls false`) so the well-formed-call rate
measures the model, not the grammar.

Evaluation, before training and every `--eval-every` updates: `--eval-tasks` held-out problems
(arithmetic pairs kept out of the tiny model's corpus) × `--eval-samples` episodes at temperature
1, through the same gateway (side traffic, never trained on). Reported per evaluation:
success (the final answer right), tool_use (episodes with at least one well-formed calculator
call), well_formed (parsed calls / attempted calls, an attempt being a parsed call or a
`<tool_call>` block that did not parse), mean steps. Writes JSON + PNG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from clawloop.demo import Up, _free_port, version  # noqa: E402
from clawloop.eval import CALCULATOR as CALC, tool_use_eval  # noqa: E402


def evaluate(url: str, tools: str, task_ids: list[str], samples: int, max_tokens: int) -> dict[str, float]:
    return tool_use_eval(url, tools, task_ids, samples, max_tokens, label="bench eval")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=32, help="Step samples per update.")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--method", default="binary")
    ap.add_argument("--estimator", default="grpo", choices=("grpo", "step_wise"))
    ap.add_argument("--eval-tasks", type=int, default=40)
    ap.add_argument("--eval-samples", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-path", default="")
    ap.add_argument("--out", default="bench/agent_toolcall_learning_48.json")
    a = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="clawloop-agent-bench-"))
    tools = work / "calculator.json"
    tools.write_text(json.dumps(CALC))
    buf_port = _free_port()
    buf_url = f"http://127.0.0.1:{buf_port}"
    up = Up(argparse.Namespace(method=a.method, batch_size=a.batch_size, lr=a.lr, seed=a.seed, model_path=a.model_path,
                               up_args=["--buffer", buf_url, "--constrain-tool-calls", "false", "--advantage-estimator",
                                        a.estimator, "--max-staleness", "4"]),
            str(work))
    buf_log = open(work / "buffer.log", "w")
    buf = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "buffer", "--port", str(buf_port), "--data-dir",
                            str(work / "buffer")], stdout=buf_log, stderr=subprocess.STDOUT)
    t0 = time.time()
    curve = []
    try:
        from clawloop.envs.toolcall import generated_problems

        eval_ids = [p["instance_id"] for p in generated_problems()][: a.eval_tasks]
        train_ids = [f"math-{i:03d}" for i in range(100)]
        for _ in range(100):
            try:
                if httpx.get(buf_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        ev = evaluate(up.url, str(tools), eval_ids, a.eval_samples, a.max_tokens)
        curve.append({"updates": 0, "minutes": 0.0, **ev})
        print(f"updates=0 {ev}", flush=True)
        r = httpx.post(buf_url + "/start_rollout", json={
            "task_type": "toolcall", "remote_engine_url": up.url + "/v1", "remote_buffer_url": buf_url,
            "tools_config": str(tools), "task_ids": train_ids, "num_repeat_per_sample": a.group, "num_epoch": 50,
            "max_steps": 4, "max_tokens": a.max_tokens, "sampling_params": {"temperature": 1.0},
            "num_process": 8}, timeout=30)
        r.raise_for_status()
        next_eval = a.eval_every
        while True:
            v = version(up.url)
            if v >= next_eval:
                ev = evaluate(up.url, str(tools), eval_ids, a.eval_samples, a.max_tokens)
                curve.append({"updates": v, "minutes": (time.time() - t0) / 60, **ev})
                print(f"updates={v} {ev}", flush=True)
                if v >= a.updates:
                    break
                next_eval = v + a.eval_every
            if buf.poll() is not None or up.proc.poll() is not None:
                raise RuntimeError("buffer or server exited; see " + str(work))
            time.sleep(2)
        httpx.post(buf_url + "/stop_rollout", json={}, timeout=30)
        stats = httpx.get(buf_url + "/buffer/stats", timeout=30).json()["data"]["data"][0]
    finally:
        if buf.poll() is None:
            buf.send_signal(2)
            try:
                buf.wait(timeout=60)
            except subprocess.TimeoutExpired:
                buf.kill()
        up.stop()
        buf_log.close()
    result = {"curve": curve, "updates": a.updates, "batch_size": a.batch_size, "group": a.group, "lr": a.lr,
              "method": a.method, "estimator": a.estimator, "eval_tasks": a.eval_tasks,
              "eval_samples": a.eval_samples, "minutes": (time.time() - t0) / 60,
              "buffer": {k: stats.get(k) for k in ("total_written", "total_read", "dropped_invalid_groups")},
              "work_dir": str(work)}
    out = Path(a.out)
    out.write_text(json.dumps(result, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [c["updates"] for c in curve]
    for key in ("success", "tool_use", "well_formed"):
        ax.plot(xs, [float("nan") if c[key] is None else c[key] for c in curve], marker="o", label=key)
    ax.set_xlabel("updates")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"tool-call track, tiny model ({a.method}, {a.estimator}, group {a.group})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)
    first, last = curve[0], curve[-1]
    print(json.dumps({"bench": "agent_toolcall_learning", "updates": last["updates"],
                      "success_before": first["success"], "success_after": last["success"],
                      "tool_use_before": first["tool_use"], "tool_use_after": last["tool_use"],
                      "minutes": round(result["minutes"], 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
