"""GUI track throughput on this machine: episodes per minute with a pool of browsers, memory per browser, and
where a step's time goes (browser vs model).

    .venv/bin/python bench/gui_rollout.py                       # 2 browsers, the tiny model, as in bench/RESULTS.md
    .venv/bin/python bench/gui_rollout.py --backend selenium --episodes 40

Real parts only: `clawloop serve` on the tiny model (side turns with token ids, as the generator makes them),
`AgentRollout` on the `gui` track (the same code `clawloop buffer` runs) with `--browsers` headless chromium
instances and as many episodes in flight, MiniWoB++ pages from the miniwob package. Two agents: `oracle` (the
scripted solver's actions rendered through the gateway: browser-bound) and `model` (the tiny model samples each
step: what training rollouts cost; it is a text model that was never taught this tool, so its episodes mostly
end at the step limit or on a malformed call). Per step: `model_ms` (the gateway call), `env_ms` (the pool's
step call) and `browser_ms` (the browser work inside it). Memory: RSS and PSS of each browser's process tree
after the run (PSS splits shared pages between processes, so it is the per-browser cost).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def run(agent: str, url: str, a: argparse.Namespace) -> dict:
    from clawloop.envs import gui
    from clawloop.envs.rollout import AgentRollout

    ro = AgentRollout("gui", {"remote_engine_url": url + "/v1", "remote_buffer_url": "http://unused",
                              "max_steps": a.max_steps, "max_tokens": a.max_tokens, "num_process": a.browsers,
                              "screenshot_backend": a.backend, "sampling_params": {"temperature": 1.0},
                              "artifact_dir": tempfile.mkdtemp(prefix="clawloop-gui-bench-")})
    ids = ro.task_ids()
    jobs = [ids[k % len(ids)] for k in range(a.episodes)]
    t0 = time.monotonic()
    try:
        with ThreadPoolExecutor(a.browsers) as ex:
            items = [x for x in ex.map(lambda t: ro.run_episode(t, agent), jobs) if x is not None]
        wall = time.monotonic() - t0
        mem = gui.browser_stats()
    finally:
        ro.pool.shutdown()
    steps = [s for it in items for s in it["steps"]]
    return {"agent": agent, "episodes": len(items), "wall_s": round(wall, 1),
            "episodes_per_min": round(60 * len(items) / wall, 1),
            "success": round(sum(it["extra_info"]["success"] for it in items) / max(1, len(items)), 3),
            "steps": len(steps), "mean_steps": round(statistics.mean(len(it["steps"]) for it in items), 2),
            "model_ms_p50": pct([s["model_ms"] for s in steps], 0.5),
            "env_ms_p50": pct([s["env_ms"] for s in steps], 0.5),
            "browser_ms_p50": pct([s["info"].get("browser_ms", 0.0) for s in steps], 0.5),
            "browser_ms_p90": pct([s["info"].get("browser_ms", 0.0) for s in steps], 0.9),
            "browsers": [{k: b[k] for k in ("pid", "episodes", "processes", "rss_mb", "pss_mb")} | {
                "driver_rss_mb": b["driver"]["rss_mb"]} for b in mem]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--browsers", type=int, default=2)
    ap.add_argument("--episodes", type=int, default=40)
    ap.add_argument("--max-steps", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--backend", default="playwright", choices=("playwright", "selenium"))
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    os.environ["CLAWLOOP_GUI_BROWSERS"] = str(a.browsers)
    from clawloop.envs import gui
    from clawloop.users import Server

    why = gui.missing_requirements(a.backend)
    if why:
        print(f"gui bench cannot run here: {why}", file=sys.stderr)
        return 2
    server = Server(["--no-serve-status"], tempfile.mkdtemp(prefix="clawloop-gui-bench-"), command="serve")
    try:
        results = [run(agent, server.url, a) for agent in ("oracle", "model")]
    finally:
        server.stop()
        gui.close_browsers()
    for r in results:
        print(json.dumps(r))
    if a.out:
        Path(a.out).write_text(json.dumps({"backend": a.backend, "browsers": a.browsers, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
