"""RayEngine: the `Engine` protocol in the gateway process, over hf engine replicas that are Ray actors.

The gateway, the judge (`--judge self`) and the trainer loop call it exactly as they call the
in-process engine; nothing above it knows about Ray.

The replicas are a replica set (`engines/replicas.py`, shared with the vLLM engine: routing,
health monitor, publish fan-out); this engine is its transport over Ray actor handles.

Routing. A request goes to a replica that is *up*: a session sticks to one replica (rendezvous
hashing of the session id over the up replicas: its prefix stays warm, and losing a replica moves
only that replica's sessions), a request without a session goes to the least busy one. When no
replica is up but one is expected back (down or restarting, not failed), the request waits for it
(`ray.replica_wait_s`), then gets `EngineUnavailable` (the gateway's 503 with Retry-After); it
never hangs: each wait for the next batch of tokens is bounded by `ray.token_timeout_s`, and a
replica that is marked down ends the waits of its requests at once.

A replica that fails under a request (its actor died or hangs) is marked down and the request
goes on elsewhere, unseen by the client: before its first token it simply starts again; after
some tokens, it continues on another replica from the prompt plus the tokens already streamed
(max_tokens reduced by as many). Logprobs are those of each token in the same context, and every
event keeps the version of the replica that produced it, so the captured turn is still
token-exact, with per-token versions where the continuation ran on other weights. A request under
a grammar constraint cannot be continued that way (the grammar state lives in the dead replica):
it fails with `EngineUnavailable` if tokens were already sent. Penalties restart counting on the
continuation (they only shape sampling; the logprobs are raw).

Weights. `publish(weights, version)` takes an object ref of a packed state dict (what the rank-0
trainer actor returns from `served_weights`: the driver owns that object, so it outlives the
trainer actor), a state dict (packed and `ray.put` here), or a folder path every replica can read.
All up replicas load it at once (their own hitless cohort swap); the router keeps the ref as the
current weights. Versions only go forward: a publish below the served version is refused.

Faults. A monitor pings every replica each `ray.health_interval_s`. Ray restarts a dead actor
(`ray.max_restarts`) in its bundle; the monitor sees the new incarnation, activates it with the
current weights and version under the publish lock (no publish can slip in between), and only then
routes to it. A replica that stays unreachable for `ray.start_timeout_s`, or dies after its last
restart, is `failed`. `health()` lists every actor (replicas, and whatever `actor_sources` add:
the trainer workers) with its state, node, pid and restarts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from clawloop.engines.base import EngineUnavailable, GenerationRequest, LoraAdapter, TokenEvent
from clawloop.engines.replicas import Counters, Probe, Replica, ReplicaSet

log = logging.getLogger(__name__)


class _ReplicaFailed(Exception):
    pass


@dataclass
class ActorReplica(Replica):
    """An hf engine in a Ray actor (`engine_actor.EngineActor`), reached through its handle. Its
    state `restarting` means Ray is restarting the actor."""

    handle: Any = None
    role: str = "engine"
    ray_name: str = ""
    resources: dict[str, float] = field(default_factory=dict)
    """What its actor reserved ({CPU: n, GPU: m})."""
    incarnation: str | None = None
    """The actor process it last caught up (a restarted actor has a new one)."""
    seen: dict[str, Any] = field(default_factory=dict)
    """Its last answer to `ping` (incarnation, active, version, ...)."""
    node_id: str = ""
    node_ip: str = ""
    pid: int | None = None
    stats: dict[str, float] = field(default_factory=dict)

    def health(self) -> dict[str, Any]:
        return {**super().health(), "role": self.role, "node_id": self.node_id, "node_ip": self.node_ip,
                "pid": self.pid, "ray_name": self.ray_name or None, "resources": self.resources}


@dataclass
class _Stats(Counters):
    resumed: int = 0
    """Of the retries, those continued mid-response (after some tokens were streamed)."""


class RayEngine:
    backend = "ray"
    accepts_lora_adapters = False
    supports_images = False
    images_unsupported_reason = "images are not served with --ray yet (the engine actors take text only)"

    def __init__(self, model_path: str, *, replicas: int = 1, engine_kwargs: dict[str, Any] | None = None,
                 num_cpus: float = 1.0, num_gpus: float = 0.0, placement: str = "PACK", max_restarts: int = 3,
                 token_timeout_s: float = 60.0, replica_wait_s: float = 60.0, health_interval_s: float = 1.0,
                 start_timeout_s: float = 300.0, policy_version: int = 0, role: str = "engine",
                 name_prefix: str = ""):
        import ray
        from transformers import AutoTokenizer

        from clawloop.distributed.engine_actor import EngineActor
        from clawloop.distributed.placement import in_bundle, reserve

        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.token_timeout_s = token_timeout_s
        self.replica_wait_s = replica_wait_s
        self.health_interval_s = health_interval_s
        self.start_timeout_s = start_timeout_s
        self.max_restarts = max_restarts
        self._weights: Any = None
        """The object ref (or path) of the weights served now; None: the base weights."""
        self.role = role
        self.actor_sources: list[Callable[[], list[dict[str, Any]]]] = []
        """More actors for `health()` (the trainer group registers its workers here, judge actors theirs)."""
        self.cluster_info: Callable[[], dict[str, Any]] | None = None
        """The cluster's nodes and resources for `health()` (set by `RayRuntime`)."""
        self.stats_ = _Stats()
        self._running = False
        self.pg = reserve(replicas, num_cpus, num_gpus, placement, start_timeout_s, f"{role} actor")
        cls = ray.remote(EngineActor)
        self.replicas = ReplicaSet([], self, version=policy_version, health_interval_s=health_interval_s,
                                   max_restarts=max_restarts, down_timeout_s=start_timeout_s)
        for i in range(replicas):
            opts = in_bundle(dict(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=max_restarts,
                                  max_task_retries=0, max_concurrency=1000), self.pg, i)
            if name_prefix:  # `ray kill-actor --namespace clawloop --name clawloop-8000-engine-0` finds it
                opts["name"] = f"{name_prefix}{role}-{i}"
            try:
                handle = cls.options(**opts).remote(self.model_path, dict(engine_kwargs or {}), f"{role}-{i}")
            except ValueError as e:  # the name is taken
                self._kill_all()
                from clawloop.config import ConfigError

                raise ConfigError(f"ray.name: {e} (another clawloop on this cluster? give each its own --ray-name)"
                                  ) from None
            self.replicas.append(ActorReplica(i, f"{role}-{i}", handle=handle, role=role,
                                              ray_name=opts.get("name", ""), resources=_reserved(num_cpus, num_gpus)))
        try:
            infos = ray.get([r.handle.info.remote() for r in self.replicas], timeout=start_timeout_s)
        except BaseException:
            self._kill_all()
            raise
        first = infos[0]
        self.eos_token_ids = frozenset(int(x) for x in first["eos_token_ids"])
        self.vocab_size = int(first["vocab_size"])
        self.pad_token_id = int(first["pad_token_id"])
        self.max_model_len = int(first["max_model_len"])
        for r, info in zip(self.replicas, infos):
            self._note(r, info)

    @classmethod
    def from_config(cls, cfg: Any) -> "RayEngine":
        from clawloop.naming import model_path

        r, m = cfg.ray, cfg.model
        path = model_path(cfg)
        if not Path(path).exists():
            raise FileNotFoundError(f"model.path: {path} does not exist (build the tiny model with "
                                    "`clawloop tiny-model`, or pass --model-path)")
        kw = dict(device=m.device, dtype=m.dtype,
                  max_batch_size=m.max_batch_size, max_model_len=m.max_model_len, threads=m.threads,
                  admit_wait_ms=m.admit_wait_ms)
        return cls(path, replicas=m.engine_replicas, engine_kwargs=kw, num_cpus=cpu_reservation(r.engine_num_cpus),
                   num_gpus=r.engine_num_gpus, placement=r.placement, max_restarts=r.max_restarts,
                   token_timeout_s=r.token_timeout_s, replica_wait_s=r.replica_wait_s,
                   health_interval_s=r.health_interval_s, start_timeout_s=r.start_timeout_s,
                   name_prefix=actor_prefix(cfg))

    @classmethod
    def judge_from_config(cls, cfg: Any) -> "RayEngine":
        """`--judge frozen --judge-workers N`: N judge actors on the --judge-model folder (else the base
        model). Nothing ever publishes to them; the judge loop's calls spread over them (least busy)."""
        from clawloop.naming import model_path

        r, m = cfg.ray, cfg.model
        path = str(Path(cfg.judge.model).expanduser()) if cfg.judge.model else model_path(cfg)
        if not Path(path).exists():
            raise FileNotFoundError(f"judge.model: {path} does not exist")
        kw = dict(device=m.device, dtype=m.dtype, max_batch_size=m.max_batch_size, max_model_len=m.max_model_len,
                  threads=m.threads, admit_wait_ms=m.admit_wait_ms)
        return cls(path, replicas=r.judge_workers, engine_kwargs=kw, num_cpus=cpu_reservation(r.judge_num_cpus),
                   num_gpus=r.judge_num_gpus, placement=r.placement, max_restarts=r.max_restarts,
                   token_timeout_s=r.token_timeout_s, replica_wait_s=r.replica_wait_s,
                   health_interval_s=r.health_interval_s, start_timeout_s=r.start_timeout_s, role="judge",
                   name_prefix=actor_prefix(cfg))

    # -- protocol ----------------------------------------------------------------
    async def start(self) -> None:
        if self._running:
            return
        self.replicas.open()
        results = await asyncio.gather(*(self.replicas.bring_up(r) for r in self.replicas), return_exceptions=True)
        bad = [(r, e) for r, e in zip(self.replicas, results) if isinstance(e, BaseException)]
        if len(bad) == len(self.replicas):
            raise RuntimeError(f"no engine actor could start: {bad[0][1]}")
        for r, e in bad:
            self.replicas.mark_down(r, f"activation failed: {e}")
        self._running = True
        self.replicas.start_monitor()

    async def stop(self) -> None:
        self._running = False
        await self.replicas.stop()
        await asyncio.gather(*(asyncio.wait_for(_aref(r.handle.stop.remote()), 15) for r in self.replicas),
                             return_exceptions=True)
        self._kill_all()

    @property
    def policy_version(self) -> int:
        return self.replicas.version

    def relabel(self, version: int) -> None:
        self.replicas.relabel(version)

    def _kill_all(self) -> None:
        from clawloop.distributed.placement import release

        release([r.handle for r in self.replicas], self.pg)
        self.pg = None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        if not self._running:
            raise RuntimeError("engine is not started")
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        if request.multimodal:
            raise ValueError(f"images are not supported: {self.images_unsupported_reason}")
        self.stats_.requests += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.replica_wait_s
        emitted: list[int] = []
        last_version = self.policy_version
        while True:
            r = await self.replicas.wait_route(request.session_id, deadline)
            sub = request
            if emitted:
                remaining = request.params.max_tokens - len(emitted)
                if remaining <= 0:  # the replica died right after the last allowed token
                    yield TokenEvent(token_id=None, logprob=0.0, finish_reason="length", policy_version=last_version)
                    return
                params = dataclasses.replace(request.params, max_tokens=remaining)
                sub = GenerationRequest(list(request.prompt_ids) + emitted, params, request.request_id,
                                        session_id=request.session_id)
            r.inflight += 1
            r.requests += 1
            try:
                async for ev in self._stream(r, sub):
                    if ev.token_id is not None:
                        emitted.append(ev.token_id)
                    last_version = ev.policy_version
                    yield ev
                return
            except _ReplicaFailed as e:
                if r.state == "up":
                    self.replicas.mark_down(r, str(e))
                if emitted and request.params.constraint is not None:
                    raise EngineUnavailable(f"{r.name} failed after {len(emitted)} constrained tokens: {e}") from None
                self.stats_.retries += 1
                if emitted:
                    self.stats_.resumed += 1
                log.warning("%s failed under a request (%s); %s on another replica", r.name, e,
                            f"continuing after {len(emitted)} tokens" if emitted else "starting it again")
                deadline = loop.time() + self.replica_wait_s
            finally:
                r.inflight -= 1

    async def _stream(self, r: ActorReplica, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        import ray
        from ray.exceptions import RayActorError, RayTaskError, TaskCancelledError

        from clawloop.distributed.engine_actor import ReplicaInactive

        down = r.down
        gen = r.handle.generate.options(num_returns="streaming").remote(request)
        finished = False
        nxt: asyncio.Future | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(_anext(gen))
                waits = {nxt} | ({down} if down is not None else set())
                done, _ = await asyncio.wait(waits, timeout=self.token_timeout_s, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    nxt.cancel()
                    if down is not None and down.done():
                        raise _ReplicaFailed(f"{r.name} went down ({r.last_error})")
                    raise _ReplicaFailed(f"{r.name} sent nothing for {self.token_timeout_s:.0f} s")
                try:
                    ref = nxt.result()
                    if ref is None:
                        raise _ReplicaFailed(f"{r.name}: the stream ended before the response finished")
                    batch = await ref
                except RayTaskError as e:
                    cause = e.as_instanceof_cause()
                    if isinstance(cause, ReplicaInactive):
                        raise _ReplicaFailed(str(cause)) from None
                    raise cause from None  # the request's own error (bad logit_bias, ...)
                except (RayActorError, TaskCancelledError, ray.exceptions.ObjectLostError) as e:
                    raise _ReplicaFailed(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
                for ev in batch:
                    yield ev
                    if ev.finish_reason is not None:
                        finished = True
                if finished:
                    return
        finally:
            if nxt is not None and not nxt.done():
                nxt.cancel()
            if not finished:
                try:
                    ray.cancel(gen)
                except Exception:
                    pass

    # -- publish -------------------------------------------------------------------
    async def publish(self, weights: Any, version: int) -> None:
        """Serve `weights` as `version` on every replica that is up (a replica that is down gets them
        when it comes back). Returns once new requests get `version`."""
        import ray

        if isinstance(weights, LoraAdapter):
            raise ValueError("publish: the ray engine takes merged full weights, not a LoRA adapter")
        version = int(version)
        async with self.replicas.lock:
            if version < self.policy_version:
                raise ValueError(f"publish: v{version} is older than the served v{self.policy_version} (versions only "
                                 "go forward)")
            t0 = time.perf_counter()
            if isinstance(weights, ray.ObjectRef) or isinstance(weights, (str, Path)):
                ref = str(weights) if isinstance(weights, Path) else weights
            elif isinstance(weights, Mapping):
                from clawloop.distributed.weights import pack

                ref = ray.put(await asyncio.to_thread(pack, weights))
            else:
                raise TypeError(f"publish: cannot serve {type(weights).__name__}")
            try:  # a replica that is down gets the weights when it is back
                await self.replicas.fan_out("publish", version, lambda r: _aref(r.handle.publish.remote(ref, version)),
                                            self.start_timeout_s)
            except RuntimeError:
                self.stats_.publish_failures += 1
                raise
            self._weights = ref
            self.stats_.publishes += 1
            self.stats_.last_publish_s = time.perf_counter() - t0

    @property
    def weights_ref(self) -> Any:
        """The weights served now (an object ref or a path; None: the base weights)."""
        return self._weights

    # -- the replica set's transport (see engines/replicas.py) ----------------------
    def _note(self, r: ActorReplica, info: dict[str, Any]) -> None:
        r.seen = info
        r.node_id, r.node_ip, r.pid = info.get("node_id", ""), info.get("node_ip", ""), info.get("pid")
        r.stats = dict(info.get("stats") or {})

    def owns_process(self, r: ActorReplica) -> bool:
        return False  # Ray restarts a dead actor (max_restarts) in its bundle; the set waits for it

    async def probe_replica(self, r: ActorReplica) -> Probe:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        try:
            info = await asyncio.wait_for(_aref(r.handle.ping.remote()), max(5.0, 3 * self.health_interval_s))
        except asyncio.TimeoutError:
            return Probe("missed", "health checks timed out")
        except ActorUnavailableError as e:  # Ray is restarting it
            return Probe("gone", f"restarting: {str(e).splitlines()[0][:200]}", "restarting")
        except (ActorDiedError, RayActorError) as e:
            given_up = r.restarts >= self.max_restarts  # it died after its last restart
            return Probe("gone", f"died: {str(e).splitlines()[0][:200]}", "failed" if given_up else "restarting")
        self._note(r, info)
        return Probe("ok" if info["incarnation"] == r.incarnation and info["active"] else "fresh")

    async def catch_up_replica(self, r: ActorReplica) -> None:
        """Activate a (re)started actor with the served weights and version (one only marked down by a
        slow request, still serving them, is left as it is)."""
        info = r.seen
        version = self.policy_version
        if not (info["incarnation"] == r.incarnation and info["active"] and info["version"] == version):
            await asyncio.wait_for(_aref(r.handle.activate.remote(self._weights, version)),
                                   self.start_timeout_s)
        if r.incarnation is not None and info["incarnation"] != r.incarnation:
            r.restarts += 1
            log.warning("%s restarted (restart %d, pid %s): serving v%d again", r.name, r.restarts,
                        info.get("pid"), version)
        r.incarnation, r.version = info["incarnation"], version

    async def launch_replica(self, r: ActorReplica) -> None:
        raise NotImplementedError("Ray restarts engine actors")

    async def halt_replica(self, r: ActorReplica) -> None:
        raise NotImplementedError("Ray restarts engine actors")

    def replica_down(self, r: ActorReplica) -> None:
        pass  # its requests wait on `r.down`, resolved by the set

    # -- reporting -----------------------------------------------------------------
    @property
    def available(self) -> bool:
        """False only when every replica is given up: while one may come back, requests wait for it."""
        return any(r.state != "failed" for r in self.replicas)

    def actors(self) -> list[dict[str, Any]]:
        out = [r.health() for r in self.replicas]
        for src in self.actor_sources:
            try:
                out.extend(src())
            except Exception as e:  # reporting never breaks /health
                out.append({"name": "?", "state": "unknown", "last_error": str(e)})
        return out

    def health(self) -> dict[str, Any]:
        out = {**self.replicas.health("ray"), "actors": self.actors()}
        if self.cluster_info is not None:
            out["ray"] = self.cluster_info()
        return out

    def stats(self) -> dict[str, float]:
        s = self.stats_
        out = {
            **s.stats(), "engine/resumed": float(s.resumed),
            "engine/tokens_generated": float(sum(r.stats.get("engine/tokens_generated", 0.0)
                                                 for r in self.replicas)),
        }
        out.update(self.replicas.stats())
        return out


def actor_prefix(cfg: Any) -> str:
    """Ray names of this clawloop's actors start with it (one clawloop per serving port on a cluster)."""
    return f"{cfg.ray.name or f'clawloop-{cfg.serve.port}'}-"


def _reserved(num_cpus: float, num_gpus: float) -> dict[str, float]:
    return {k: float(v) for k, v in (("CPU", num_cpus), ("GPU", num_gpus)) if v > 0}


def cpu_reservation(v: float) -> float:
    """A CPU reservation left on auto (-1) when nothing resolved it (`RayRuntime.check_fit` does): 1."""
    return float(v) if v >= 0 else 1.0


async def _aref(ref: Any) -> Any:
    return await ref


async def _anext(gen: Any) -> Any:
    """The stream's next object ref; None when it ended."""
    try:
        return await gen.__anext__()
    except StopAsyncIteration:
        return None
