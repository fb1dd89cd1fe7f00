"""RayEngine: the `Engine` protocol in the gateway process, over hf engine replicas that are Ray actors.

The gateway, the judge (`--judge self`) and the trainer loop call it exactly as they call the
in-process engine; nothing above it knows about Ray.

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
import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Mapping

from clawloop.engines.base import EngineUnavailable, GenerationRequest, LoraAdapter, TokenEvent

log = logging.getLogger(__name__)

HUNG_AFTER = 3
"""Health checks a replica that is up may miss (timeouts) before it is marked down."""


class _ReplicaFailed(Exception):
    pass


@dataclass
class Replica:
    index: int
    handle: Any
    role: str = "engine"
    ray_name: str = ""
    resources: dict[str, float] = field(default_factory=dict)
    """What its actor reserved ({CPU: n, GPU: m})."""
    state: str = "starting"
    """starting | up | down (failed under a request or a check; back once it answers) | restarting
    (its actor is being restarted by Ray) | failed (given up)."""
    incarnation: str | None = None
    version: int | None = None
    inflight: int = 0
    requests: int = 0
    restarts: int = 0
    failures: int = 0
    down_since: float = 0.0
    last_error: str = ""
    node_id: str = ""
    node_ip: str = ""
    pid: int | None = None
    stats: dict[str, float] = field(default_factory=dict)
    down: asyncio.Future | None = None
    """Resolved when the replica leaves `up`: wakes every request waiting on it."""

    @property
    def name(self) -> str:
        return f"{self.role}-{self.index}"

    def health(self) -> dict[str, Any]:
        return {"name": self.name, "role": self.role, "state": self.state, "policy_version": self.version,
                "inflight": self.inflight, "requests": self.requests, "restarts": self.restarts,
                "node_id": self.node_id, "node_ip": self.node_ip, "pid": self.pid,
                "ray_name": self.ray_name or None, "resources": self.resources,
                "last_error": self.last_error or None}


@dataclass
class _Stats:
    requests: int = 0
    retries: int = 0
    resumed: int = 0
    unavailable: int = 0
    publishes: int = 0
    publish_failures: int = 0
    last_publish_s: float = 0.0
    restarts: int = 0


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
        self._version = int(policy_version)
        self._weights: Any = None
        """The object ref (or path) of the weights served now; None: the base weights."""
        self.role = role
        self.actor_sources: list[Callable[[], list[dict[str, Any]]]] = []
        """More actors for `health()` (the trainer group registers its workers here, judge actors theirs)."""
        self.cluster_info: Callable[[], dict[str, Any]] | None = None
        """The cluster's nodes and resources for `health()` (set by `RayRuntime`)."""
        self.stats_ = _Stats()
        self._running = False
        self._monitor: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None
        self._changed: asyncio.Event | None = None
        self.pg = reserve(replicas, num_cpus, num_gpus, placement, start_timeout_s, f"{role} actor")
        cls = ray.remote(EngineActor)
        self.replicas: list[Replica] = []
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
            self.replicas.append(Replica(index=i, handle=handle, role=role, ray_name=opts.get("name", ""),
                                         resources=_reserved(num_cpus, num_gpus)))
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
        return cls(path, replicas=m.engine_replicas, engine_kwargs=kw, num_cpus=_cpus(r.engine_num_cpus),
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
        return cls(path, replicas=r.judge_workers, engine_kwargs=kw, num_cpus=_cpus(r.judge_num_cpus),
                   num_gpus=r.judge_num_gpus, placement=r.placement, max_restarts=r.max_restarts,
                   token_timeout_s=r.token_timeout_s, replica_wait_s=r.replica_wait_s,
                   health_interval_s=r.health_interval_s, start_timeout_s=r.start_timeout_s, role="judge",
                   name_prefix=actor_prefix(cfg))

    # -- protocol ----------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self._version

    def relabel(self, version: int) -> None:
        """Name the base weights `version` (before start; see HFEngine.relabel)."""
        if self._running:
            raise RuntimeError("relabel before start")
        self._version = int(version)

    async def start(self) -> None:
        if self._running:
            return
        self._lock = asyncio.Lock()
        self._changed = asyncio.Event()
        results = await asyncio.gather(*(self._activate(r) for r in self.replicas), return_exceptions=True)
        bad = [(r, e) for r, e in zip(self.replicas, results) if isinstance(e, BaseException)]
        if len(bad) == len(self.replicas):
            raise RuntimeError(f"no engine actor could start: {bad[0][1]}")
        for r, e in bad:
            self._mark_down(r, f"activation failed: {e}")
        self._running = True
        self._monitor = asyncio.get_running_loop().create_task(self._monitor_loop())

    async def stop(self) -> None:
        self._running = False
        if self._monitor is not None:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
            self._monitor = None
        await asyncio.gather(*(asyncio.wait_for(_aref(r.handle.stop.remote()), 15) for r in self.replicas),
                             return_exceptions=True)
        self._kill_all()

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
        last_version = self._version
        while True:
            r = await self._pick(request.session_id, deadline)
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
                    self._mark_down(r, str(e))
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

    async def _pick(self, session_id: str | None, deadline: float) -> Replica:
        loop = asyncio.get_running_loop()
        while True:
            up = [r for r in self.replicas if r.state == "up"]
            if up:
                if session_id:
                    def score(r: Replica) -> bytes:
                        return hashlib.blake2b(f"{session_id}\0{r.index}".encode(), digest_size=8).digest()

                    return max(up, key=score)
                return min(up, key=lambda r: (r.inflight, r.index))
            left = deadline - loop.time()
            if left <= 0 or not self.available:
                self.stats_.unavailable += 1
                states = ", ".join(f"{r.name} {r.state}" for r in self.replicas)
                raise EngineUnavailable(f"no inference engine replica is available ({states}); retry shortly",
                                        retry_after_s=5.0)
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), timeout=min(left, self.health_interval_s))
            except asyncio.TimeoutError:
                pass

    async def _stream(self, r: Replica, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
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
        async with self._lock:
            if version < self._version:
                raise ValueError(f"publish: v{version} is older than the served v{self._version} (versions only "
                                 "go forward)")
            t0 = time.perf_counter()
            if isinstance(weights, ray.ObjectRef) or isinstance(weights, (str, Path)):
                ref = str(weights) if isinstance(weights, Path) else weights
            elif isinstance(weights, Mapping):
                from clawloop.distributed.weights import pack

                ref = ray.put(await asyncio.to_thread(pack, weights))
            else:
                raise TypeError(f"publish: cannot serve {type(weights).__name__}")
            up = [r for r in self.replicas if r.state == "up"]
            results = await asyncio.gather(*(asyncio.wait_for(_aref(r.handle.publish.remote(ref, version)),
                                                              self.start_timeout_s) for r in up),
                                           return_exceptions=True)
            failed = [(r, e) for r, e in zip(up, results) if isinstance(e, BaseException)]
            for r, e in failed:
                log.error("publish v%d to %s failed: %s; it gets the weights when it is back", version, r.name, e)
                self._mark_down(r, f"publish failed: {e}")
            if up and len(failed) == len(up):
                self.stats_.publish_failures += 1
                raise RuntimeError(f"publish of v{version} failed on every replica: {failed[0][1]}")
            for r, e in zip(up, results):
                if not isinstance(e, BaseException):
                    r.version = version
            self._weights, self._version = ref, version
            self.stats_.publishes += 1
            self.stats_.last_publish_s = time.perf_counter() - t0

    @property
    def weights_ref(self) -> Any:
        """The weights served now (an object ref or a path; None: the base weights)."""
        return self._weights

    # -- monitor -------------------------------------------------------------------
    def _note(self, r: Replica, info: dict[str, Any]) -> None:
        r.node_id, r.node_ip, r.pid = info.get("node_id", ""), info.get("node_ip", ""), info.get("pid")
        r.stats = dict(info.get("stats") or {})

    async def _activate(self, r: Replica) -> None:
        """Bring a (re)started replica to the served weights and version, then route to it."""
        info = await asyncio.wait_for(_aref(r.handle.ping.remote()), self.start_timeout_s)
        async with self._lock:
            same = (info["incarnation"] == r.incarnation and info["active"] and info["version"] == self._version)
            if not same:  # (a replica only marked down by a slow request keeps its weights)
                await asyncio.wait_for(_aref(r.handle.activate.remote(self._weights, self._version)),
                                       self.start_timeout_s)
            if r.incarnation is not None and info["incarnation"] != r.incarnation:
                r.restarts += 1
                self.stats_.restarts += 1
                log.warning("%s restarted (restart %d, pid %s): serving v%d again", r.name, r.restarts,
                            info.get("pid"), self._version)
            r.incarnation, r.version = info["incarnation"], self._version
            self._note(r, info)
            r.failures = 0
            r.last_error = "" if r.state == "starting" else r.last_error
            r.state = "up"
            r.down = asyncio.get_running_loop().create_future()
        if self._changed is not None:
            self._changed.set()

    def _mark_down(self, r: Replica, why: str, state: str = "down") -> None:
        """Stop routing to `r` (and wake the requests waiting on it); the monitor brings it back."""
        r.last_error = why
        if r.state == "failed":
            return
        if r.state in ("up", "starting"):
            r.down_since = time.time()
        r.state = state
        if r.down is not None and not r.down.done():
            r.down.set_result(None)

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            await asyncio.gather(*(self._check(r) for r in self.replicas if r.state != "failed"),
                                 return_exceptions=True)

    async def _check(self, r: Replica) -> None:
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        try:
            info = await asyncio.wait_for(_aref(r.handle.ping.remote()), max(5.0, 3 * self.health_interval_s))
        except asyncio.TimeoutError:
            if r.state == "up":
                r.failures += 1
                if r.failures >= HUNG_AFTER:
                    log.error("%s missed %d health checks; marking it down", r.name, r.failures)
                    self._mark_down(r, "health checks timed out")
            self._give_up_if_stuck(r)
            return
        except ActorUnavailableError as e:  # Ray is restarting it
            self._mark_down(r, f"restarting: {str(e).splitlines()[0][:200]}", "restarting")
            self._give_up_if_stuck(r)
            return
        except (ActorDiedError, RayActorError) as e:
            self._mark_down(r, f"died: {str(e).splitlines()[0][:200]}", "restarting")
            if r.restarts >= self.max_restarts:
                r.state = "failed"
                log.error("%s died after its last restart (%d); given up", r.name, r.restarts)
            self._give_up_if_stuck(r)
            return
        self._note(r, info)
        if r.state == "up" and info["incarnation"] == r.incarnation and info["active"]:
            r.failures = 0
            return
        if r.state == "up":  # restarted under us (new incarnation, inactive)
            self._mark_down(r, "restarted")
        try:
            await self._activate(r)
        except Exception as e:
            r.last_error = f"coming back: {e}"
            self._give_up_if_stuck(r)

    def _give_up_if_stuck(self, r: Replica) -> None:
        if r.state in ("down", "restarting") and r.down_since and time.time() - r.down_since > self.start_timeout_s:
            r.state = "failed"
            log.error("%s has been %s for %.0f s; given up", r.name, r.last_error, time.time() - r.down_since)

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
        up = sum(r.state == "up" for r in self.replicas)
        status = "ok" if up == len(self.replicas) else ("degraded" if up else "unavailable")
        out = {"status": status, "backend": "ray", "replicas": [r.health() for r in self.replicas],
               "actors": self.actors()}
        if self.cluster_info is not None:
            out["ray"] = self.cluster_info()
        return out

    def stats(self) -> dict[str, float]:
        s = self.stats_
        out = {
            "engine/replicas": float(len(self.replicas)),
            "engine/replicas_up": float(sum(r.state == "up" for r in self.replicas)),
            "engine/active_rows": float(sum(r.inflight for r in self.replicas)),
            "engine/requests": float(s.requests), "engine/retries": float(s.retries),
            "engine/resumed": float(s.resumed), "engine/unavailable": float(s.unavailable),
            "engine/publishes": float(s.publishes), "engine/publish_failures": float(s.publish_failures),
            "engine/last_publish_s": s.last_publish_s, "engine/restarts": float(s.restarts),
            "engine/policy_version": float(self._version),
            "engine/tokens_generated": float(sum(r.stats.get("engine/tokens_generated", 0.0)
                                                 for r in self.replicas)),
        }
        for r in self.replicas:
            out[f"engine/{r.name}_up"] = 1.0 if r.state == "up" else 0.0
            out[f"engine/{r.name}_inflight"] = float(r.inflight)
            out[f"engine/{r.name}_restarts"] = float(r.restarts)
            out[f"engine/{r.name}_policy_version"] = float(r.version if r.version is not None else -1)
        return out


def actor_prefix(cfg: Any) -> str:
    """Ray names of this clawloop's actors start with it (one clawloop per serving port on a cluster)."""
    return f"{cfg.ray.name or f'clawloop-{cfg.serve.port}'}-"


def _reserved(num_cpus: float, num_gpus: float) -> dict[str, float]:
    return {k: float(v) for k, v in (("CPU", num_cpus), ("GPU", num_gpus)) if v > 0}


def _cpus(v: float) -> float:
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
