"""A short GUI learning run on MiniWoB++: rollouts through the gateway, one train step per round, publish.

    # as in bench/RESULTS.md: the tiny chat model on the element list, then the tiny random Qwen2-VL on both
    nice -n 10 .venv/bin/python bench/gui_learning.py --policy text --tasks click-test --group 4 --oracle 2 \
        --max-steps 1 --rounds 10 --minutes 10 --out bench/gui_learning_text.json
    nice -n 10 .venv/bin/python bench/gui_learning.py --policy vlm --observation both --tasks click-test \
        --group 4 --oracle 2 --max-steps 1 --rounds 6 --minutes 5 --tool-choice auto --no-constrain \
        --out bench/gui_learning_vlm.json

Real parts only, in one process: the hf engine on the policy, the gateway (capture on, images stored under the
data dir) served by uvicorn on 127.0.0.1, the `gui` track's `AgentRollout` (what `clawloop buffer` runs) with
headless chromium and MiniWoB++ pages, `BufferSource` turning each episode's steps into samples with group
advantages (reward - the task's group mean), the `Trainer` (Binary RL, full weights) and `engine.publish` after
every step. A round: `--group` episodes per task at temperature 1, their success rate (the curve), one train
step on their steps, publish. With `--tool-choice required` (the default) every step is a `computer` call that
the gateway's grammar keeps well-formed, so an episode fails on what it did, not on a reply that was no call.
A VLM policy (`--policy vlm`) sees each observation's screenshot; the trainer rebuilds its pixel inputs from the
images the gateway stored (trainer/vision.py). Writes the curve as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


KEPT = ("train/loss", "train/grad_norm", "train/zero_adv_frac", "train/logprob_diff_abs_mean",
        "train/logprob_diff_abs_max", "train/images", "train/image_samples_skipped", "train/tokens",
        "train/constrained_frac")
"""The step stats each round's row keeps."""


def _action(item: dict) -> str:
    """The policy's first call of an episode, as `action ref` (what the curve's rows show it learning)."""
    for m in item["messages"]:
        for c in m.get("tool_calls") or []:
            try:
                args = json.loads(c["function"]["arguments"])
            except (ValueError, KeyError, TypeError):
                return "malformed"
            return f"{args.get('action')} {args.get('ref', '')}".strip() if isinstance(args, dict) else "malformed"
    return "no call"


class ServerThread:
    """uvicorn serving `app` on a loopback port, in a thread of this process."""

    def __init__(self, app):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--policy", choices=("text", "vlm"), default="text")
    ap.add_argument("--observation", choices=("dom", "screenshot", "both"), default="")
    ap.add_argument("--tasks", default="click-test,click-test-2,click-button")
    ap.add_argument("--group", type=int, default=6, help="policy episodes per task per round")
    ap.add_argument("--oracle", type=int, default=0,
                    help="scripted-solver episodes per task per round, in the same group (a signal when the policy "
                         "never succeeds: its -1s beside the oracle's +1s; replayed through the gateway, logprobs 0.0)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--minutes", type=float, default=6.0, help="stop starting rounds after this long")
    ap.add_argument("--max-steps", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--tool-choice", default="required")
    ap.add_argument("--no-constrain", action="store_true",
                    help="serve.constrain_tool_calls off: raw logprobs, so the trainer/engine drift is measured")
    ap.add_argument("--tis-cap", type=float, default=0.0,
                    help="train.tis_cap; 0 (off) by default: a grammar-forced token's engine logprob is renormalised "
                         "over the allowed ids, and TIS would scale its gradient by the allowed mass (~e^-10 on the "
                         "tiny model)")
    ap.add_argument("--browsers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (engine and trainer share them)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    observation = a.observation or ("both" if a.policy == "vlm" else "dom")
    os.environ["CLAWLOOP_GUI_BROWSERS"] = str(a.browsers)

    import torch

    from clawloop.buffer.source import BufferSource
    from clawloop.config import load_config
    from clawloop.engines.hf import HFEngine
    from clawloop.envs import gui
    from clawloop.envs.rollout import AgentRollout
    from clawloop.gateway import create_app
    from clawloop.naming import model_path, open_store
    from clawloop.trainer import Trainer

    why = gui.missing_requirements("playwright")
    if why:
        print(f"gui learning bench cannot run here: {why}", file=sys.stderr)
        return 2
    torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix="clawloop-gui-learning-"))
    if a.policy == "vlm":
        from clawloop.tinymodel.vlm import build_tiny_vlm

        path = str(build_tiny_vlm(work / "tiny-vlm"))
    else:
        path = model_path(load_config({}, env={}))
    data = work / "data"
    cfg = load_config({"model__path": path, "data_dir": str(data), "train__method": "binary",
                       "train__lr": str(a.lr), "train__micro_batch_tokens": "16384",
                       "train__tis_cap": str(a.tis_cap),
                       "serve__constrain_tool_calls": "false" if a.no_constrain else "true"}, env={})
    engine = HFEngine(path, device="cpu", dtype="float32", max_batch_size=8,
                      max_model_len=2048 if a.policy == "text" else 1024)
    store = open_store(cfg)
    server = ServerThread(create_app(cfg, engine, store, manage_engine=True)).start()
    trainer = Trainer(cfg, path, tokenizer=engine.tokenizer)
    tasks = a.tasks.split(",")
    ro = AgentRollout("gui", {"remote_engine_url": server.url + "/v1", "remote_buffer_url": "http://unused",
                              "max_steps": a.max_steps, "max_tokens": a.max_tokens, "num_process": a.browsers,
                              "gui_observation": observation, "tool_choice": a.tool_choice,
                              "sampling_params": {"temperature": 1.0}, "artifact_dir": str(work / "artifacts"),
                              "images_dir": str(data / "images")})
    source = BufferSource("http://unused")
    curve = []
    t_start = time.monotonic()
    try:
        for rnd in range(a.rounds):
            if rnd and time.monotonic() - t_start > 60 * a.minutes:
                break
            t0 = time.monotonic()
            jobs = [(t, "model") for t in tasks for _ in range(a.group)] + \
                [(t, "oracle") for t in tasks for _ in range(a.oracle)]
            with ThreadPoolExecutor(a.browsers) as ex:
                items = [x for x in ex.map(lambda j: ro.run_episode(*j), jobs) if x is not None]
            t_roll = time.monotonic() - t0
            mine = [it for it in items if it["extra_info"]["behaviour"] == "model"]  # the curve: the policy's own
            oracle = [it for it in items if it["extra_info"]["behaviour"] == "oracle"]
            per_task = {t: [it["extra_info"]["success"] for it in mine if it["instance_id"] == t] for t in tasks}
            row = {"round": rnd, "policy_version": engine.policy_version, "episodes": len(mine),
                   "success": round(sum(it["extra_info"]["success"] for it in mine) / max(1, len(mine)), 3),
                   "oracle_success": round(sum(it["extra_info"]["success"] for it in oracle) / len(oracle), 3)
                   if oracle else None,
                   "actions": sorted(_action(it) for it in mine),
                   "per_task": {t: round(sum(v) / max(1, len(v)), 2) for t, v in per_task.items()},
                   "mean_steps": round(statistics.mean(len(it["steps"]) for it in mine), 2) if mine else 0,
                   "end_reasons": dict(sorted({r: sum(1 for it in mine if it["extra_info"]["end_reason"] == r)
                                               for r in {it["extra_info"]["end_reason"] for it in mine}}.items())),
                   "rollout_s": round(t_roll, 1)}
            samples = source.to_samples(items)
            if not a.no_constrain:  # the gateway's grammar shaped each call (serve.constrain_tool_calls)
                for smp in samples:  # say so, as a captured turn's `sampling` does: the drift metric skips them
                    smp.sampling = {"temperature": 1.0, "logprobs": "constrained"}
            t1 = time.monotonic()
            stats = trainer.step(samples, served_version=engine.policy_version)
            asyncio.run(engine.publish(trainer.served_state_dict(), trainer.version))
            row.update({"samples": len(samples), "train_s": round(time.monotonic() - t1, 1),
                        **{k.split("/", 1)[1]: float(f"{v:.4g}") for k, v in stats.items() if k in KEPT}})
            curve.append(row)
            print(json.dumps(row), flush=True)
    finally:
        ro.pool.shutdown()
        gui.close_browsers()
        server.stop()
        store.close()
    out = {"policy": a.policy, "model": path if a.policy == "text" else "tiny random Qwen2-VL (built)",
           "observation": observation, "tasks": tasks, "group": a.group, "oracle": a.oracle, "max_steps": a.max_steps,
           "tool_choice": a.tool_choice, "constrained": not a.no_constrain, "lr": a.lr, "tis_cap": a.tis_cap,
           "wall_s": round(time.monotonic() - t_start, 1), "curve": curve}
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
