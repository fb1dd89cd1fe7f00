"""`clawloop up` / `clawloop serve`: the engine, the store, the gateway and (for `up`) the judge and
trainer loops, in one process and one event loop.

Serving owns the event loop; the engine decodes on its own thread, the judge runs as asyncio workers,
and the trainer steps on its own thread with a capped number of torch threads, so none of them blocks
another. With `--ray` the engine is a router over engine actors, the trainer a group of data-parallel
actors and the frozen judge a router over judge actors (`clawloop.distributed`); without it `ray` is
never imported.

SIGINT/SIGTERM: uvicorn stops accepting, in-flight requests finish, then the lifespan shutdown stops
the background services (the trainer writes a checkpoint), flushes the store and stops the engine;
exit code 0.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
from typing import Any, Callable

import uvicorn

from clawloop.apps.judge import judge_service
from clawloop.apps.observe import export_metrics, live_status
from clawloop.apps.services import Parts, TrainerService
from clawloop.apps.train import build_loop, build_ray_loop
from clawloop.apps.workers import run_workers
from clawloop.config import Config, ConfigError
from clawloop.config_out import write_resolved
from clawloop.engines import make_engine
from clawloop.engines.base import HasActors, Relabels
from clawloop.gateway import check_bind, create_app
from clawloop.naming import model_path, open_store
from clawloop.store import Store
from clawloop.trainer.gate import gate_checks

log = logging.getLogger("clawloop")


def build_app(cfg: Config, *, judge: bool, train: bool, engine: Any = None, store: Store | None = None):
    """The gateway app and what it runs: (app, parts). In order:

        ray      --ray: connect to (or start) the cluster; check the actors fit
        engine   hf / vLLM in-process, or a router over engine actors
        store    the store (--store, else the SQLite file of data_dir); the version continues its numbering
        judge    the judge loop beside serving (--judge none: off)
        trainer  the trainer loop, or a Ray data-parallel group (built at startup, off the event loop)
        gateway  the OpenAI-compatible app with capture, /metrics and the dashboard
    """
    ray_rt = None
    if cfg.ray.mode and engine is None:
        from clawloop.distributed.ray_runtime import RayRuntime  # ray: imported only under --ray

        if cfg.model.threads == 0:
            cfg.model.threads = 1  # one torch thread per engine actor: actors share the node's cores
        ray_rt = RayRuntime(cfg)
    try:
        if ray_rt is not None:
            ray_rt.check_fit(judge=judge and cfg.judge.kind == "frozen", train=train)
            engine = ray_rt.make_engine()
        elif train and cfg.model.threads == 0 and engine is None:
            cfg.model.threads = 1  # small machines: the engine and the trainer get a core each
        engine = engine or make_engine(cfg)
        store = store or open_store(cfg)
        continue_versions(cfg, engine, store)
        parts = Parts(engine=engine, store=store, ray=ray_rt)
        if judge:
            js = judge_service(cfg, engine, store)
            parts.judge = js.loop
            parts.services.append(js)
        if train:
            parts.services.append(trainer_service(cfg, engine, store, parts))
        if ray_rt is not None:
            ray_rt.register(engine, parts.judge)
        background = [s.run for s in parts.services] + [lambda: export_metrics(cfg, parts)]
        if cfg.serve.status and sys.stdout.isatty():
            background.append(lambda: live_status(parts))
        app = create_app(cfg, engine, store if cfg.capture.enabled else None,
                         stats=[s.stats for s in parts.services], background=background)
    except BaseException:
        if ray_rt is not None:
            ray_rt.close()
        raise
    parts.gateway = app.state.gateway
    return app, parts


def trainer_service(cfg: Config, engine: Any, store: Store, parts: Parts) -> TrainerService:
    """The trainer beside serving: in this process, or (`--ray --trainer-workers N`) a data-parallel
    group of actors whose health joins /health's actors. The publish gate's checks are loaded here,
    before serving starts, so a bad --regression-set stops `clawloop up` with a config error."""
    if parts.ray is not None and cfg.ray.trainer_workers > 0:
        def build_ray(aloop: Any) -> Any:
            tl = build_ray_loop(cfg, engine, store, loop=aloop)
            if isinstance(engine, HasActors):
                engine.actor_sources.append(tl.group.health)
            return tl

        return TrainerService(build_ray, parts, close=lambda tl: tl.group.shutdown())
    checks = gate_checks(cfg, model_path(cfg))
    return TrainerService(lambda aloop: build_loop(cfg, engine, store, loop=aloop, checks=checks), parts)


def continue_versions(cfg: Config, engine: Any, store: Store) -> None:
    """A fresh start (no resume) on a store that holds turns labels the base weights one past the
    newest version stored, so a version number names one set of weights per store; a resume
    publishes the checkpoint's own version instead."""
    top = store.max_policy_version()
    if top is None or cfg.train.resume_from_checkpoint or not isinstance(engine, Relabels):
        return
    if engine.policy_version <= top:
        engine.relabel(top + 1)
        log.info("the store has turns up to v%d: serving the base weights as v%d", top, top + 1)


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


def run(cfg: Config, *, judge: bool, train: bool, workers: int = 1) -> int:
    """Serve (`up`: with the judge and trainer); `workers` > 1: that many gateway processes (apps/workers.py)."""
    check_bind(cfg.serve.host, cfg.serve.api_keys, cfg.serve.insecure)
    if workers > 1:
        if judge or train:
            raise ConfigError("--workers: several gateway processes serve only: run `clawloop serve --workers N`, "
                              "with `clawloop judge` and `clawloop train` on the same --store beside them")
        return run_workers(workers, cfg.serve.host, cfg.serve.port,
                           lambda bind: serve(cfg, judge=False, train=False, bind=bind))
    return serve(cfg, judge=judge, train=train)


def serve(cfg: Config, *, judge: bool, train: bool, bind: Callable[[], socket.socket] | None = None) -> int:
    """Serve in this process until SIGINT/SIGTERM. `bind`: makes the listening socket (a worker's, shared with
    the others), called once the app is built, so the kernel sends no connection to a worker still loading."""
    resolved = write_resolved(cfg)
    app, parts = build_app(cfg, judge=judge, train=train)
    engine = parts.engine
    print(f"clawloop: serving {getattr(engine, 'model_path', cfg.model.path)} on "
          f"http://{cfg.serve.host}:{cfg.serve.port}/v1 (policy v{engine.policy_version}); "
          f"data in {cfg.data_dir} (config: {resolved}); judge={'on' if judge else 'off'} "
          f"train={'on' if train else 'off'}", flush=True)
    if parts.ray is not None:
        print(f"clawloop: {parts.ray.describe()}", flush=True)
    server = _Server(uvicorn.Config(app, host=cfg.serve.host, port=cfg.serve.port,
                                    log_level="warning" if cfg.log_level != "debug" else "debug",
                                    timeout_graceful_shutdown=30))
    try:
        server.run(sockets=[bind()] if bind is not None else None)
    finally:
        parts.store.close()
        if parts.ray is not None:
            parts.ray.close()
    return 0
