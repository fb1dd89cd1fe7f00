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

import logging
from pathlib import Path
from typing import Any, Callable

import uvicorn

from clawloop.config import Config, write_resolved
from clawloop.engines import make_engine
from clawloop.gateway import check_bind, create_app
from clawloop.store import Store

log = logging.getLogger("clawloop")


def store_path(cfg: Config) -> Path:
    return Path(cfg.data_dir) / "clawloop.db"


def open_store(cfg: Config) -> Store:
    Path(cfg.data_dir).mkdir(parents=True, exist_ok=True)
    return Store(store_path(cfg))


def build_app(cfg: Config, *, judge: bool, train: bool, engine: Any = None, store: Store | None = None):
    """The app with its background loops; returns (app, parts) so tests and
    benchmarks can reach the engine, store, judge loop and trainer."""
    engine = engine or make_engine(cfg)
    store = store or open_store(cfg)
    parts: dict[str, Any] = {"engine": engine, "store": store}
    stats: list[Callable[[], dict[str, float]]] = []
    background: list[Callable[[], Any]] = []
    if judge:
        from clawloop.judge import attach_judge

        attach_judge(cfg, engine, store, parts, stats, background)
    if train:
        from clawloop.trainer import attach_trainer

        attach_trainer(cfg, engine, store, parts, stats, background)
    app = create_app(cfg, engine, store if cfg.capture.enabled else None, stats=stats, background=background)
    parts["gateway"] = app.state.gateway
    return app, parts


def run(cfg: Config, *, judge: bool, train: bool) -> int:
    check_bind(cfg.serve.host, cfg.serve.api_keys, cfg.serve.insecure)
    resolved = write_resolved(cfg)
    app, parts = build_app(cfg, judge=judge, train=train)
    engine = parts["engine"]
    print(f"clawloop: serving {getattr(engine, 'model_path', cfg.model.path)} on "
          f"http://{cfg.serve.host}:{cfg.serve.port}/v1 (policy v{engine.policy_version}); "
          f"data in {cfg.data_dir} (config: {resolved}); judge={'on' if judge else 'off'} "
          f"train={'on' if train else 'off'}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, host=cfg.serve.host, port=cfg.serve.port,
                                           log_level="warning" if cfg.log_level != "debug" else "debug",
                                           timeout_graceful_shutdown=30))
    try:
        server.run()
    finally:
        parts["store"].close()
    return 0
