"""`clawloop env check`: every task's reference solution must score the maximum, doing nothing must not.

    clawloop env check --track terminal [--task-dir DIR] [--tasks a,b] [--parallel-envs 4]
    oracle_pass=32/32 noop_fail=32/32

Each task runs twice in its sandbox, in parallel over tasks: the oracle (the
task's reference solution, replayed through `Env.step` as an agent would send
it) and a do-nothing agent (`NOOP_MESSAGE`). A task whose oracle does not reach
the track's maximum reward, or whose do-nothing run does, is printed by name
with the reason; the exit code is 0 only when every task passes both.
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from clawloop.envs.base import NOOP_MESSAGE, EnvOptions, Task, Track, get_track
from clawloop.progress import Progress


@dataclass
class TaskCheck:
    task_id: str
    oracle_reward: float | None
    noop_reward: float | None
    max_reward: float
    error: str = ""
    seconds: float = 0.0

    @property
    def oracle_pass(self) -> bool:
        return self.oracle_reward is not None and self.oracle_reward >= self.max_reward - 1e-9

    @property
    def noop_fail(self) -> bool:
        return self.noop_reward is not None and self.noop_reward < self.max_reward - 1e-9


def play(track: Track, task: Task, opts: EnvOptions, messages: list[dict[str, Any]] | None, slot: int
         ) -> tuple[float, dict[str, Any]]:
    """Run one episode with fixed assistant messages (None: the task's oracle); (reward, details)."""
    env = track.make_env(task, opts, slot=slot)
    try:
        env.reset()
        script = env.oracle() if messages is None else messages
        for m in script[: opts.max_steps]:
            if env.step(m).done:
                break
        ev = env.evaluate()
        return ev.reward, ev.details
    finally:
        env.close()


def check_task(track: Track, task: Task, opts: EnvOptions, slot: int) -> TaskCheck:
    t0 = time.monotonic()
    out = TaskCheck(task.task_id, None, None, track.max_reward(task))
    errors = []
    for which in ("oracle", "noop"):
        try:
            reward, details = play(track, task, opts, None if which == "oracle" else [dict(NOOP_MESSAGE)],
                                   slot * 2 + (which == "noop"))
        except Exception as e:  # noqa: BLE001 - a broken task is reported by name, the others go on
            errors.append(f"{which}: {type(e).__name__}: {e}")
            continue
        if which == "oracle":
            out.oracle_reward = reward
            if not out.oracle_pass:
                why = details.get("reason") or details.get("tests") or details
                errors.append(f"oracle scored {reward:g} < {out.max_reward:g}: {str(why)[:300]}")
        else:
            out.noop_reward = reward
            if not out.noop_fail:
                errors.append(f"doing nothing scored the maximum {reward:g}")
    out.error = "; ".join(errors)
    out.seconds = time.monotonic() - t0
    return out


def run_check(track_name: str, opts: EnvOptions, *, task_ids: list[str] | None = None, parallel: int = 4,
              out=sys.stdout) -> list[TaskCheck]:
    track = get_track(track_name)
    tasks = track.load_tasks(opts)
    if task_ids:
        known = {t.task_id: t for t in tasks}
        extra = getattr(track, "get_task", None)  # a task the track has but does not list (gui: no solver)
        missing = []
        for tid in task_ids:
            if tid not in known and extra is not None:
                try:
                    known[tid] = extra(tid)
                except ValueError:
                    pass
            if tid not in known:
                missing.append(tid)
        if missing:
            raise ValueError(f"--tasks: no such {track_name} task(s): {', '.join(missing)}")
        tasks = [known[t] for t in dict.fromkeys(task_ids)]
    results: list[TaskCheck] = []
    with Progress(len(tasks), f"env check {track_name}", out=sys.stderr) as bar, \
            ThreadPoolExecutor(max(1, parallel)) as ex:
        futures = {ex.submit(check_task, track, t, opts, i % max(1, parallel)): t for i, t in enumerate(tasks)}
        for f in as_completed(futures):
            r = f.result()
            results.append(r)
            bar.update(1, note=f"{r.task_id}: {'ok' if not r.error else 'FAIL'}")
    results.sort(key=lambda r: r.task_id)
    for r in results:
        if r.error:
            print(f"FAIL {r.task_id}: {r.error}", file=out)
    n = len(results)
    print(f"oracle_pass={sum(r.oracle_pass for r in results)}/{n} noop_fail={sum(r.noop_fail for r in results)}/{n}",
          file=out, flush=True)
    return results
