"""Does the tool-call track teach the tiny model to use its tool? One honest run, whatever it shows.

    .venv/bin/python bench/agent_toolcall_learning.py                     # the default row of bench/RESULTS.md
    .venv/bin/python bench/agent_toolcall_learning.py --reward outcome --estimator grpo   # the reference's reward

Default: 48 updates at lr 2e-4, the toolcall generator's shaped reward (`"reward": "shaped"`: the outcome
+ `--call-coef` x the calls' mean score + `--use-coef` for answering with the tool's result) with
step-wise credit (`--advantage-estimator step_wise`). `--oracle-per-group N` puts N reference
solutions in every group (the rollout's `agent` list).

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
`<tool_call>` block that did not parse), correct_call, call_score, answer_from_tool (see `evaluate`),
mean steps, and arithmetic (the same questions without tools, greedy). The publish gate is off
(`--no-publish-gate`): it would refuse the versions measured here. Writes JSON + PNG (`--replot`
redraws a PNG from its JSON).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from clawloop.demo import Up, _free_port, version  # noqa: E402
from clawloop.eval import CALCULATOR as CALC  # noqa: E402


def evaluate(url: str, tools: str, task_ids: list[str], samples: int, max_tokens: int) -> dict[str, Any]:
    """`clawloop eval`'s tool-use numbers (`tool_use_eval`, same episodes, same formulas) plus how the tool was
    used: correct_call (episodes with a call whose result is the answer), call_score (mean of the episodes'
    call scores, `clawloop.envs.toolcall.call_score`),
    answer_from_tool (of episodes with a tool result, those whose final answer is one)."""
    from concurrent.futures import ThreadPoolExecutor

    from clawloop.envs.rollout import AgentRollout
    from clawloop.users import base_url

    ro = AgentRollout("toolcall", {"remote_engine_url": base_url(url) + "/v1", "remote_buffer_url": "http://unused",
                                   "tools_config": tools, "max_steps": 4, "max_tokens": max_tokens,
                                   "sampling_params": {"temperature": 1.0}, "num_process": 8})
    jobs = [t for t in task_ids for _ in range(samples)]
    try:
        with ThreadPoolExecutor(8) as ex:
            items = [x for x in ex.map(lambda t: ro.run_episode(t, "model"), jobs) if x is not None]
    finally:
        ro.pool.shutdown()
    n = max(1, len(items))
    parsed = sum(x["extra_info"]["well_formed_calls"] for x in items)
    broken = sum(m.get("content", "").count("<tool_call>") for x in items for m in x["messages"]
                 if m["role"] == "assistant")
    details = [x["extra_info"]["details"] for x in items]
    with_result = [d for d, x in zip(details, items) if x["extra_info"]["well_formed_calls"] > 0]
    return {"episodes": len(items),
            "success": sum(x["extra_info"]["success"] for x in items) / n,
            "tool_use": sum(x["extra_info"]["well_formed_calls"] > 0 for x in items) / n,
            "well_formed": parsed / (parsed + broken) if parsed + broken else None,
            "correct_call": sum(d["exact_call"] for d in details) / n,
            "call_score": sum(d["call_score"] for d in details) / n,
            "answer_from_tool": (sum(d["answer_from_tool"] for d in with_result) / len(with_result)
                                 if with_result else None),
            "success_with_tool": sum(x["extra_info"]["success"] and x["extra_info"]["well_formed_calls"] > 0
                                     for x in items) / n,
            "mean_steps": statistics.mean(x["extra_info"]["n_steps"] for x in items) if items else 0.0,
            "versions": sorted({v for x in items for v in x["extra_info"]["policy_versions"]})}


def arithmetic(url: str, task_ids: list[str]) -> float:
    """The same held-out questions asked without tools, greedy: what the model can still do on its own (the
    publish gate's built-in arithmetic checks measure the same skill)."""
    from concurrent.futures import ThreadPoolExecutor

    from clawloop.envs.toolcall import generated_problems
    from clawloop.generators.math_generator import score_answer

    problems = {p["instance_id"]: p for p in generated_problems()}

    def one(tid: str) -> float:
        r = httpx.post(url + "/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": problems[tid]["prompt"]}], "max_tokens": 16,
            "temperature": 0.0}, headers={"X-Turn-Type": "side"}, timeout=120)
        r.raise_for_status()
        return score_answer(r.json()["choices"][0]["message"]["content"], problems[tid]["label"])

    with ThreadPoolExecutor(8) as ex:
        return statistics.mean(ex.map(one, task_ids))


def plot(result: dict[str, Any], png: Path) -> None:
    """The curve: what the reward asks for (success, tool use, correct calls, answers taken from the tool)
    beside what it may cost (well-formed calls, arithmetic without tools, dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["curve"]
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    xs = [c["updates"] for c in curve]
    for key, style in (("success", "-"), ("tool_use", "-"), ("correct_call", "-"), ("answer_from_tool", "-"),
                       ("well_formed", "--"), ("arithmetic", "--")):
        ax.plot(xs, [float("nan") if c.get(key) is None else c[key] for c in curve], style, marker="o", label=key)
    ax.set_xlabel("updates")
    ax.set_ylim(0, 1.05)
    guide = f", {result['oracle_per_group']} oracle/group" if result.get("oracle_per_group") else ""
    if result.get("credit") == "step":
        guide += ", step credit"
    if result.get("cold_start"):
        guide += f", after {result['cold_start']['steps']} cold-start steps"
    ax.set_title(f"tool-call track, tiny model: {result['reward']} reward, {result['estimator']}, "
                 f"lr {result['lr']:g}{guide}", fontsize=9)
    ax.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


class _Done(Exception):
    """`--updates 0`: the starting point is measured, nothing is trained."""


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM (and SIGINT, which a background shell ignores) stop the servers in `finally`


def main() -> int:
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=32, help="Step samples per update.")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--method", default="binary")
    ap.add_argument("--estimator", default="step_wise", choices=("grpo", "step_wise"))
    ap.add_argument("--reward", default="shaped", choices=("outcome", "shaped"),
                    help="The toolcall generator's reward (clawloop.envs.toolcall.RewardShaping).")
    ap.add_argument("--call-coef", type=float, default=1.0, help="reward: shaped: reward for a correct call.")
    ap.add_argument("--call-partial", type=float, default=1.0,
                    help="reward: shaped: weight of a near call's partial credit (0: only correct calls score).")
    ap.add_argument("--use-coef", type=float, default=0.5, help="reward: shaped: reward for answering with its result.")
    ap.add_argument("--credit", default="outcome", choices=("outcome", "step"),
                    help="reward: shaped: every step carries the outcome, or each step its own check (the call: "
                         "its result is the answer; the final answer: it reports a tool's result).")
    ap.add_argument("--oracle-per-group", type=int, default=0,
                    help="Reference solutions replayed in each group beside the policy's episodes (`agent`).")
    ap.add_argument("--cold-start-steps", type=int, default=0,
                    help="Supervised cold start on the training tasks' reference solutions first (`clawloop env "
                         "coldstart`, envs/coldstart.py); 0: none.")
    ap.add_argument("--cold-start-lr", type=float, default=3e-4)
    ap.add_argument("--cold-start-replay", type=float, default=0.75)
    ap.add_argument("--cold-start-batch", type=int, default=4)
    ap.add_argument("--eval-tasks", type=int, default=40)
    ap.add_argument("--eval-samples", type=int, default=3)
    ap.add_argument("--eval-every", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model-path", default="")
    ap.add_argument("--out", default="bench/agent_toolcall_learning_48.json")
    ap.add_argument("--replot", default="", help="Only redraw the PNG of this result JSON.")
    a = ap.parse_args()
    if a.replot:
        plot(json.loads(Path(a.replot).read_text()), Path(a.replot).with_suffix(".png"))
        return 0

    work = Path(tempfile.mkdtemp(prefix="clawloop-agent-bench-"))
    tools = work / "calculator.json"
    tools.write_text(json.dumps(CALC))
    train_ids = [f"math-{i:03d}" for i in range(100)]
    cold = None
    if a.cold_start_steps > 0:
        from clawloop.envs.base import EnvOptions
        from clawloop.envs.coldstart import cold_start
        from clawloop.naming import model_path

        base = a.model_path or model_path(argparse.Namespace(path=""))
        res = cold_start(base, str(work / "coldstart"), "toolcall", EnvOptions(max_steps=4, tools_config=str(tools)),
                         steps=a.cold_start_steps, lr=a.cold_start_lr, replay=a.cold_start_replay,
                         batch_size=a.cold_start_batch,
                         task_ids=train_ids, seed=a.seed)
        cold = {"from": base, "steps": a.cold_start_steps, "lr": a.cold_start_lr, "replay": a.cold_start_replay,
                "batch_size": a.cold_start_batch,
                "demos": res.demos, "first_loss": res.losses[0], "final_loss": res.losses[-1], "seconds": res.seconds}
        print(f"cold start: {cold}", flush=True)
        a.model_path = res.out
    buf_port = _free_port()
    buf_url = f"http://127.0.0.1:{buf_port}"
    up = Up(argparse.Namespace(method=a.method, batch_size=a.batch_size, lr=a.lr, seed=a.seed, model_path=a.model_path,
                               # no publish gate: it would refuse the versions this run measures (they lose
                               # some plain arithmetic); the bench measures that itself (`arithmetic`)
                               up_args=["--buffer", buf_url, "--constrain-tool-calls", "false", "--advantage-estimator",
                                        a.estimator, "--max-staleness", "4", "--no-publish-gate"]),
            str(work))
    buf_log = open(work / "buffer.log", "w")
    buf = subprocess.Popen([sys.executable, "-m", "clawloop.cli", "buffer", "--port", str(buf_port), "--data-dir",
                            str(work / "buffer")], stdout=buf_log, stderr=subprocess.STDOUT)
    t0 = time.time()
    curve = []
    try:
        from clawloop.envs.toolcall import generated_problems

        eval_ids = [p["instance_id"] for p in generated_problems()][: a.eval_tasks]
        for _ in range(100):
            try:
                if httpx.get(buf_url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        ev = evaluate(up.url, str(tools), eval_ids, a.eval_samples, a.max_tokens)
        ev["arithmetic"] = arithmetic(up.url, eval_ids)
        curve.append({"updates": 0, "minutes": 0.0, **ev})
        print(f"updates=0 {ev}", flush=True)
        if a.updates == 0:  # only the starting point (a cold start's effect)
            raise _Done
        r = httpx.post(buf_url + "/start_rollout", json={
            "task_type": "toolcall", "remote_engine_url": up.url + "/v1", "remote_buffer_url": buf_url,
            "tools_config": str(tools), "task_ids": train_ids, "num_repeat_per_sample": a.group, "num_epoch": 50,
            "max_steps": 4, "max_tokens": a.max_tokens, "sampling_params": {"temperature": 1.0},
            "num_process": 8, "agent": ["model"] * (a.group - a.oracle_per_group) + ["oracle"] * a.oracle_per_group,
            "reward": a.reward, "reward_call_coef": a.call_coef, "reward_use_coef": a.use_coef,
            "reward_call_partial": a.call_partial, "reward_credit": a.credit},
            timeout=30)
        r.raise_for_status()
        next_eval = a.eval_every
        while True:
            v = version(up.url)
            if v >= next_eval:
                ev = evaluate(up.url, str(tools), eval_ids, a.eval_samples, a.max_tokens)
                ev["arithmetic"] = arithmetic(up.url, eval_ids)
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
    except _Done:
        stats = {}
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
              "method": a.method, "estimator": a.estimator, "reward": a.reward, "call_coef": a.call_coef, "call_partial": a.call_partial, "credit": a.credit,
              "use_coef": a.use_coef, "oracle_per_group": a.oracle_per_group, "eval_tasks": a.eval_tasks,
              "eval_samples": a.eval_samples, "minutes": (time.time() - t0) / 60, "cold_start": cold,
              "buffer": {k: stats.get(k) for k in ("total_written", "total_read", "dropped_invalid_groups")},
              "work_dir": str(work)}
    out = Path(a.out)
    out.write_text(json.dumps(result, indent=1))
    plot(result, out.with_suffix(".png"))
    first, last = curve[0], curve[-1]
    print(json.dumps({"bench": "agent_toolcall_learning", "updates": last["updates"],
                      "success_before": first["success"], "success_after": last["success"],
                      "tool_use_before": first["tool_use"], "tool_use_after": last["tool_use"],
                      "correct_call_before": first["correct_call"], "correct_call_after": last["correct_call"],
                      "minutes": round(result["minutes"], 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
