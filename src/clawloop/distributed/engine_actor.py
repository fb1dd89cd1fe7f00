"""EngineActor: one hf engine replica in a Ray actor (an async actor: its event loop is the engine's).

The actor wraps `HFEngine` unchanged (continuous batching on its worker thread, hitless publishes
with cohorts). It is created with `max_restarts`, so when its process dies Ray starts it again
with the same constructor arguments, in the same placement-group bundle. A fresh (or restarted)
actor is *inactive*: it loaded the base weights, but it refuses requests until the router
(`router.RayEngine`) activates it with the weights and version served now. So a restarted replica
never serves stale weights under a current label, and a version keeps naming one set of weights.

`generate` is a Ray streaming generator: it yields lists of `TokenEvent`s, everything the engine
produced for the request since the last yield (one decode step's token when the router keeps up,
more when it lags), so the per-item cost of the object store is paid per batch, not per token.
Cancelling the stream on the router's side (`ray.cancel`) cancels the engine row.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from typing import Any, AsyncIterator

log = logging.getLogger(__name__)


class ReplicaInactive(RuntimeError):
    """The replica has not been given the served weights yet (just started or restarted)."""


_END = object()


class EngineActor:
    def __init__(self, model_path: str, engine_kwargs: dict[str, Any], name: str):
        import ray

        from clawloop.engines.hf import HFEngine

        kw = dict(engine_kwargs)
        if ray.get_gpu_ids():  # Ray set CUDA_VISIBLE_DEVICES to this actor's GPU(s)
            kw["device"] = "cuda"
        elif kw.get("device", "auto") == "auto":
            kw["device"] = "cpu"
        self.name = name
        self.incarnation = uuid.uuid4().hex[:12]
        self.engine = HFEngine(model_path, **kw)
        self.active = False
        self.inflight = 0
        self.requests = 0
        self.started_at = time.time()
        self.pid = os.getpid()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.node_ip = ray.util.get_node_ip_address()
        self._started = False

    async def _ensure_started(self) -> None:
        if not self._started:
            await self.engine.start()
            self._started = True

    async def info(self) -> dict[str, Any]:
        """What the router needs to stand in for the engine, plus `ping`."""
        e = self.engine
        return {"eos_token_ids": sorted(e.eos_token_ids), "vocab_size": e.vocab_size, "pad_token_id": e.pad_token_id,
                "max_model_len": e.max_model_len, "device": str(e.device), **(await self.ping())}

    async def ping(self) -> dict[str, Any]:
        return {"name": self.name, "incarnation": self.incarnation, "active": self.active,
                "version": self.engine.policy_version, "inflight": self.inflight, "requests": self.requests,
                "pid": self.pid, "node_id": self.node_id, "node_ip": self.node_ip, "stats": self.engine.stats()}

    async def activate(self, weights: Any, version: int) -> int:
        """Serve `weights` (a packed state dict, resolved by Ray from the router's object ref; a folder
        path; or None: the base weights this actor loaded) as `version`, then take requests."""
        await self._ensure_started()
        if weights is None:
            self.engine.relabel(int(version))
        else:
            await self.engine.publish(_weights(weights), int(version))
        self.active = True
        return self.engine.policy_version

    async def publish(self, weights: Any, version: int) -> int:
        await self._ensure_started()
        await self.engine.publish(_weights(weights), int(version))
        return self.engine.policy_version

    async def generate(self, request: Any) -> AsyncIterator[list[Any]]:
        if not self.active:
            raise ReplicaInactive(f"{self.name} is not serving yet (incarnation {self.incarnation})")
        await self._ensure_started()
        self.inflight += 1
        self.requests += 1
        q: asyncio.Queue = asyncio.Queue()

        async def pump() -> None:
            try:
                async for ev in self.engine.generate(request):
                    q.put_nowait(ev)
            except asyncio.CancelledError:
                raise
            except BaseException as e:  # the request's own error (bad logit_bias, a failed step...)
                q.put_nowait(e)
            finally:
                q.put_nowait(_END)

        task = asyncio.get_running_loop().create_task(pump())
        try:
            done = False
            while not done:
                items = [await q.get()]
                while not q.empty():
                    items.append(q.get_nowait())
                events = []
                for it in items:
                    if it is _END:
                        done = True
                    elif isinstance(it, BaseException):
                        raise it
                    else:
                        events.append(it)
                if events:
                    yield events
        finally:
            self.inflight -= 1
            task.cancel()  # cancels the engine row when the router went away early

    async def stop(self) -> None:
        self.active = False
        if self._started:
            await self.engine.stop()
            self._started = False


def _weights(w: Any) -> Any:
    from clawloop.distributed.weights import is_packed, unpack

    return unpack(w) if is_packed(w) else w
