"""The judge loop and the trainer loop as background services of one process (`clawloop up`).

A service is what the gateway's lifespan runs beside serving: `run()` until cancelled, and `stats()`
for /metrics. Each is a thin adapter over its component, so the component itself stays free of
event-loop and deployment concerns."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from clawloop.judge import Judge, JudgeLoop
from clawloop.store import Store
from clawloop.trainer.loop import TrainerLoop


class Service(Protocol):
    """A background part of `clawloop up`."""

    def stats(self) -> dict[str, float]: ...

    async def run(self) -> None: ...


@dataclass
class Parts:
    """What `build_app` composed, for `run`, tests and benchmarks (attributes, not a dict: a typo is an
    AttributeError, not a silent None)."""

    engine: Any
    store: Store
    gateway: Any = None
    judge: JudgeLoop | None = None
    trainer: TrainerLoop | None = None
    ray: Any = None  # clawloop.distributed.ray_runtime.RayRuntime under --ray
    services: list[Service] = field(default_factory=list)


class JudgeService:
    """The judge loop beside serving; its judge's connections close when it stops."""

    def __init__(self, loop: JudgeLoop, judge: Judge):
        self.loop, self.judge = loop, judge

    def stats(self) -> dict[str, float]:
        return self.loop.stats()

    async def run(self) -> None:
        try:
            await self.loop.run()
        finally:
            await self.judge.close()


class TrainerService:
    """The trainer beside serving. Built and resumed at startup off the event loop (loading a model
    takes seconds, serving must not wait), published from its checkpoint when it resumed, stepped on
    its own thread; at shutdown it stops and writes a checkpoint, then `close` runs (the Ray group's
    actors go)."""

    def __init__(self, build: Callable[[asyncio.AbstractEventLoop], TrainerLoop], parts: Parts,
                 close: Callable[[TrainerLoop], None] | None = None):
        self.build, self.parts, self.close = build, parts, close
        self.loop: TrainerLoop | None = None

    def stats(self) -> dict[str, float]:
        return self.loop.stats() if self.loop is not None else {}

    async def run(self) -> None:
        aloop = asyncio.get_running_loop()
        tl = await aloop.run_in_executor(None, lambda: self.build(aloop))
        self.loop = self.parts.trainer = tl

        def stop() -> None:
            try:
                tl.stop()
            finally:
                if self.close is not None:
                    self.close(tl)

        try:
            if tl.resumed_from:
                await aloop.run_in_executor(None, tl.publish_resumed)
            tl.start()
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(aloop.run_in_executor(None, stop))
