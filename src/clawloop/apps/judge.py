"""The judge composed: its engine for `--judge frozen` (a local copy, or judge actors on Ray), the
service beside serving (`clawloop up`), and `clawloop judge`, the judge loop alone on a store."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Any

from clawloop.apps.services import JudgeService
from clawloop.config import Config, ConfigError
from clawloop.judge import Judge, JudgeLoop, make_judge
from clawloop.naming import open_store, store_exists, store_name, store_path
from clawloop.store import Store

log = logging.getLogger(__name__)


def build_judge(cfg: Config, engine: Any = None) -> Judge:
    """The configured judge; `--judge frozen` under `--ray ... --judge-workers N` judges on a router
    over N judge actors instead of a local frozen copy."""
    return make_judge(cfg, engine, frozen_engine=_ray_judge_engine if cfg.ray.mode and cfg.ray.judge_workers > 0
                      else None)


def _ray_judge_engine(cfg: Config) -> Any:
    from clawloop.distributed.router import RayEngine  # ray: imported only under --ray

    return RayEngine.judge_from_config(cfg)


def judge_service(cfg: Config, engine: Any, store: Store) -> JudgeService:
    """`clawloop up`: the judge loop beside serving (`--judge self` judges with the served engine)."""
    judge = build_judge(cfg, engine)
    return JudgeService(JudgeLoop(store, judge, cfg.judge), judge)


async def run_judge(cfg: Config, stop: asyncio.Event | None = None) -> None:
    """`clawloop judge --data-dir D`: the judge loop alone on D's store, for a judge on another machine
    than the gateway, until SIGINT/SIGTERM or `stop`."""
    if not store_exists(cfg):
        raise ConfigError(f"data_dir: no store at {store_path(cfg)} (start `clawloop up` or `clawloop serve` there "
                          "first, or name a shared one with --store postgresql://...)")
    stop = stop or asyncio.Event()
    aloop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            aloop.add_signal_handler(sig, stop.set)
            installed.append(sig)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals here
            pass
    ray_rt = None
    if cfg.ray.mode:  # `--judge frozen --judge-workers N` on Ray
        from clawloop.distributed.ray_runtime import RayRuntime  # ray: imported only under --ray

        ray_rt = RayRuntime(cfg)
        ray_rt.check_fit(engine=False, judge=cfg.judge.kind == "frozen", train=False)
    store = open_store(cfg)
    try:
        judge = build_judge(cfg)
    except BaseException:
        store.close()
        if ray_rt is not None:
            ray_rt.close()
        raise
    loop = JudgeLoop(store, judge, cfg.judge)
    print(f"clawloop judge: judge={loop.name} store={store_name(cfg)} workers={cfg.judge.num_workers}", flush=True)
    reporter = asyncio.create_task(_report(loop, stop))
    try:
        await loop.run(stop)
    finally:
        reporter.cancel()
        await judge.close()
        await asyncio.to_thread(store.close)
        if ray_rt is not None:
            ray_rt.close()
        for sig in installed:
            aloop.remove_signal_handler(sig)
        s = loop.stats()
        print(f"clawloop judge: stopped; judged={s['judge/judged']:.0f} pending={s['judge/pending']:.0f} "
              f"failures={s['judge/failures']:.0f}", flush=True)


async def _report(loop: JudgeLoop, stop: asyncio.Event, every_s: float = 30.0) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), timeout=every_s)
        except asyncio.TimeoutError:
            s = loop.stats()
            log.info("judge: judged=%d pending=%d failures=%d +1/0/-1=%d/%d/%d latency=%.2fs", s["judge/judged"],
                     s["judge/pending"], s["judge/failures"], s["judge/score_pos"], s["judge/score_zero"],
                     s["judge/score_neg"], s["judge/latency_mean_s"])
