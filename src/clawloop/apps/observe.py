"""What `clawloop up` shows while it runs: /metrics numbers exported to TensorBoard and Weights &
Biases, and the live terminal status."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from clawloop.config import Config
from clawloop.config_out import redacted

log = logging.getLogger("clawloop")


async def export_metrics(cfg: Config, parts: Any, every_s: float = 5.0) -> None:
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
            gw = parts.gateway
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


async def live_status(parts: Any, every_s: float = 1.0) -> None:
    """A live terminal table (rich): traffic, sessions, capture/judge/train counts, version, queues."""
    import asyncio
    import time

    from rich.live import Live
    from rich.table import Table

    last_req, last_t = 0.0, time.time()

    def render() -> Table:
        nonlocal last_req, last_t
        s = parts.gateway.all_stats()
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
