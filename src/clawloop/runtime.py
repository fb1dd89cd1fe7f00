"""`clawloop up` / `clawloop serve`: the engine, the store, the gateway and
(for `up`) the judge and trainer loops, in one process and one event loop.

Serving owns the event loop; the engine decodes on its own thread, the judge
runs as asyncio workers, and the trainer steps on its own thread with a
capped number of torch threads, so none of them blocks another.

SIGINT/SIGTERM: uvicorn stops accepting, in-flight requests finish, then the
lifespan shutdown stops the background loops (the trainer writes a
checkpoint), flushes the store and stops the engine; exit code 0.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable

import uvicorn

from clawloop.config import Config, redacted, write_resolved
from clawloop.engines import make_engine
from clawloop.gateway import check_bind, create_app
from clawloop.naming import open_store, store_path  # noqa: F401 (re-exported: `from clawloop.runtime import ...`)
from clawloop.store import Store

log = logging.getLogger("clawloop")


def build_app(cfg: Config, *, judge: bool, train: bool, engine: Any = None, store: Store | None = None):
    """The app with its background loops; returns (app, parts) so tests and
    benchmarks can reach the engine, store, judge loop and trainer.

    With `--ray` (cfg.ray.mode) the engine is a router over engine actors and the trainer a group of
    data-parallel actors (`clawloop.distributed`); without it `ray` is never imported."""
    if cfg.ray.mode and engine is None:
        ray_rt = _ray_runtime(cfg)
        try:
            ray_rt.check_fit(judge=judge and cfg.judge.kind == "frozen", train=train)
            return _build_app(cfg, judge=judge, train=train, engine=ray_rt.make_engine(), store=store, ray_rt=ray_rt)
        except BaseException:
            ray_rt.close()
            raise
    return _build_app(cfg, judge=judge, train=train, engine=engine, store=store)


def _ray_runtime(cfg: Config) -> Any:
    from clawloop.distributed.ray_runtime import RayRuntime

    if cfg.model.threads == 0:
        cfg.model.threads = 1  # one torch thread per engine actor: actors share the node's cores
    return RayRuntime(cfg)


def _build_app(cfg: Config, *, judge: bool, train: bool, engine: Any = None, store: Store | None = None,
               ray_rt: Any = None):
    if train and cfg.model.threads == 0 and engine is None:
        # Small machines: the engine and the trainer get a core each, so training never starves serving.
        cfg.model.threads = 1
    engine = engine or make_engine(cfg)
    store = store or open_store(cfg)
    continue_versions(cfg, engine, store)
    parts: dict[str, Any] = {"engine": engine, "store": store}
    stats: list[Callable[[], dict[str, float]]] = []
    background: list[Callable[[], Any]] = []
    if judge:
        from clawloop.judge import attach_judge

        attach_judge(cfg, engine, store, parts, stats, background)
    if train and ray_rt is not None and cfg.ray.trainer_workers > 0:
        ray_rt.attach_trainer(cfg, engine, store, parts, stats, background)
    elif train:
        from clawloop.trainer import attach_trainer

        attach_trainer(cfg, engine, store, parts, stats, background)
    if ray_rt is not None:
        parts["ray"] = ray_rt
        ray_rt.register(engine, parts)
    background.append(lambda: export_metrics(cfg, parts))
    if cfg.serve.status and sys.stdout.isatty():
        background.append(lambda: live_status(parts))
    app = create_app(cfg, engine, store if cfg.capture.enabled else None, stats=stats, background=background)
    parts["gateway"] = app.state.gateway
    return app, parts


def continue_versions(cfg: Config, engine: Any, store: Store) -> None:
    """A fresh start (no resume) on a store that holds turns labels the base weights one past the
    newest version stored, so a version number names one set of weights per store; a resume
    publishes the checkpoint's own version instead."""
    top = store.max_policy_version() if hasattr(store, "max_policy_version") else None
    if top is None or cfg.train.resume_from_checkpoint or not hasattr(engine, "relabel"):
        return
    if engine.policy_version <= top:
        engine.relabel(top + 1)
        log.info("the store has turns up to v%d: serving the base weights as v%d", top, top + 1)


async def export_metrics(cfg: Config, parts: dict[str, Any], every_s: float = 5.0) -> None:
    """The /metrics numbers to TensorBoard (DATA_DIR/tensorboard, when the
    `tensorboard` package is installed: `pip install clawloop[tensorboard]`)
    and to Weights & Biases (when `wandb` is installed and WANDB_PROJECT is set)."""
    import asyncio
    import os

    sinks = []
    try:
        from torch.utils.tensorboard import SummaryWriter

        tb = SummaryWriter(str(Path(cfg.data_dir) / "tensorboard"))
        sinks.append(lambda stats, step: [tb.add_scalar(k, v, step) for k, v in stats.items()])
    except ImportError:
        log.info("tensorboard is not installed; metrics stay on /metrics only")
        tb = None
    if os.environ.get("WANDB_PROJECT"):
        try:
            import wandb

            run = wandb.init(project=os.environ["WANDB_PROJECT"], config=redacted(cfg))  # no keys uploaded
            sinks.append(lambda stats, step: run.log(stats, step=step))
        except ImportError:
            log.warning("WANDB_PROJECT is set but wandb is not installed")
    if not sinks:
        return
    tick = 0
    try:
        while True:
            await asyncio.sleep(every_s)
            gw = parts.get("gateway")
            if gw is None:
                continue
            stats = gw.all_stats()
            step = int(stats.get("train/step", tick))
            tick += 1
            for sink in sinks:
                sink(stats, step)
    finally:
        if tb is not None:
            tb.close()


async def live_status(parts: dict[str, Any], every_s: float = 1.0) -> None:
    """A live terminal table (rich): traffic, sessions, capture/judge/train counts, version, queues."""
    import asyncio
    import time

    from rich.live import Live
    from rich.table import Table

    last_req, last_t = 0.0, time.time()

    def render() -> Table:
        nonlocal last_req, last_t
        s = parts["gateway"].all_stats()
        now = time.time()
        req = s.get("gateway/requests", 0.0)
        rps = (req - last_req) / max(now - last_t, 1e-6)
        last_req, last_t = req, now
        t = Table(title="clawloop up", show_header=False, expand=False)
        rows = [
            ("requests/s", f"{rps:.1f}"), ("in flight", f"{s.get('gateway/inflight', 0):.0f}"),
            ("open sessions", f"{s.get('capture/open_sessions', 0):.0f}"),
            ("turns captured", f"{s.get('capture/turns_captured', 0):.0f}"),
            ("turns judged", f"{s.get('judge/judged', 0):.0f}"),
            ("judge pending", f"{s.get('judge/pending', 0):.0f}"),
            ("mean score", f"{(s.get('judge/score_pos', 0) - s.get('judge/score_neg', 0)) / max(s.get('judge/judged', 0), 1):+.2f}"),
            ("train steps", f"{s.get('train/steps', 0):.0f}"),
            ("samples waiting", f"{s.get('train/pending_samples', 0):.0f}"),
            ("policy version", f"{s.get('engine/policy_version', 0):.0f}"),
            ("last step", f"{s.get('train/step_s', 0):.2f} s"),
            ("store writes queued", f"{s.get('capture/store_pending_writes', 0):.0f}"),
        ]
        for k, v in rows:
            t.add_row(k, v)
        return t

    with Live(render(), refresh_per_second=2, transient=True) as live:
        while True:
            await asyncio.sleep(every_s)
            live.update(render())


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGINT/SIGTERM after its graceful shutdown; we have
    finished cleanly by then and exit 0 instead."""

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)


def run(cfg: Config, *, judge: bool, train: bool) -> int:
    check_bind(cfg.serve.host, cfg.serve.api_keys, cfg.serve.insecure)
    resolved = write_resolved(cfg)
    app, parts = build_app(cfg, judge=judge, train=train)
    engine = parts["engine"]
    print(f"clawloop: serving {getattr(engine, 'model_path', cfg.model.path)} on "
          f"http://{cfg.serve.host}:{cfg.serve.port}/v1 (policy v{engine.policy_version}); "
          f"data in {cfg.data_dir} (config: {resolved}); judge={'on' if judge else 'off'} "
          f"train={'on' if train else 'off'}", flush=True)
    if "ray" in parts:
        print(f"clawloop: {parts['ray'].describe()}", flush=True)
    server = _Server(uvicorn.Config(app, host=cfg.serve.host, port=cfg.serve.port,
                                           log_level="warning" if cfg.log_level != "debug" else "debug",
                                           timeout_graceful_shutdown=30))
    try:
        server.run()
    finally:
        parts["store"].close()
        if "ray" in parts:
            parts["ray"].close()
    return 0
