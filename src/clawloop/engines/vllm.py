"""The vLLM engine: one or more vLLM servers behind the `Engine` protocol.

    engine = VLLMEngine.from_config(cfg)     # --backend vllm [--engine-replicas N | --engine-url URL ...]
    await engine.start()                     # starts (or attaches to) the servers, waits until healthy

vLLM runs in its own environment (`make vllm` → `.venv-vllm`: it pins its
own torch/transformers) and its own processes. clawloop either starts each
replica as a child (`vllm_launch.py`: own process group, parent-death signal,
so no orphaned vLLM even after `kill -9` of clawloop) or attaches to servers
someone else runs (`--engine-url`, started with `VLLM_SERVER_DEV_MODE=1
--enable-scale-out --logprobs-mode raw_logprobs`).

Generation goes through vLLM's token-in/token-out endpoint
(`/inference/v1/generate`): the gateway's prompt ids go in as ids, sampled ids
stream back one by one with their logprobs and top logprobs *by id*; nothing
is rendered or tokenized on either side. `--logprobs-mode raw_logprobs` makes
the logprobs those of the unmodified distribution (temperature 1, no top-p),
the hf engine's contract and what the trainer recomputes. Closing the stream
aborts the request in vLLM.

The generate call goes over aiohttp; httpx stays for the control calls
(health, pause, publish). Measured on vLLM itself (bench/RESULTS.md "vLLM
engine"): 32 concurrent generate calls from one httpx AsyncClient reached
vLLM's engine core a few at a time (13-15 running on average against 22-25
from aiohttp or a raw socket client, p99 2-6 s against 0.4 s), which is what
left vLLM's batches under-filled behind the gateway.

Publishing full weights to servers clawloop started on this machine: the
state dict is copied into a shared-memory image (`vllm_publish.py`; groups
that did not change are not sent), then on every replica `/pause?mode=keep`
(running requests freeze in place, none fails) → at once: clawloop's worker
extension loads the changed groups from the image, `/update_weight_version N`,
reset the prefix cache (its KV was computed by the old weights: running
requests are preempted and recompute on resume) → `/resume`. Attached servers
(`--engine-url`) and Ray's get safetensors under `DATA_DIR/weights/vN` (last
`--model-keep-weights` kept) and `reload_weights(weights_path)` instead. A
request that spans a publish finishes on the new weights; vLLM reports which
output tokens came from which weight version, and those spans reach the
gateway on the last event so every captured token carries its own version.

Publishing LoRA (`--use-lora`): the adapter is written as a peft folder and
loaded with `/v1/load_lora_adapter` under a per-version name; new requests
use the newest adapter, an old one is unloaded once its last request ends.
A request never changes adapter, so its tokens share one version.

Replicas: the replica set (`engines/replicas.py`, shared with the Ray engine)
routes (a session sticks to one replica, others go to the least busy), watches
and restarts them and fans publishes out; this engine is its HTTP transport.
A started replica that exits or stops answering is restarted with bounded
exponential backoff and brought back to the current weights before it takes
traffic. While no replica is up, requests get `EngineUnavailable` (the
gateway's 503 with Retry-After), never a hang.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import aiohttp
import httpx
import orjson

from clawloop.config import ConfigError
from clawloop.engines.base import EngineUnavailable, GenerationRequest, LoraAdapter, TokenEvent
from clawloop.engines.replicas import Counters, Probe, Replica, ReplicaSet
from clawloop.engines.vllm_process import (VLLMNotInstalled, VLLMProcess, _explain, _free_port, _has_cuda,
                                          find_vllm_python)
from clawloop.engines.vllm_publish import (ImageLoader, Staged, WeightImages, is_tied, shared_memory_available,
                                          untied_model_dir)

log = logging.getLogger(__name__)

WORKER_DIR = Path(__file__).with_name("vllm_worker")
"""On a started server's PYTHONPATH: clawloop's worker extension (`clawloop_weight_sync.py`) and logits
processor (`clawloop_json_close.py`)."""
BASE_NAME = "clawloop-base"
"""The name the base model is served under; LoRA versions are `clawloop-vN`."""

__all__ = ["BASE_NAME", "HTTPReplica", "VLLMEngine", "VLLMNotInstalled", "VLLMProcess", "WORKER_DIR",
           "find_vllm_python"]


@dataclass
class HTTPReplica(Replica):
    """A vLLM server reached over HTTP."""

    version: int | None = 0
    url: str = ""
    process: VLLMProcess | None = None
    """None for a server someone else runs (`--engine-url`): never restarted by us."""
    streams: set = field(default_factory=set)
    """Open response streams; closed when the replica is taken down, so no request waits on a hung server."""

    def health(self) -> dict[str, Any]:
        return {**super().health(), "url": self.url, "managed": self.process is not None,
                "pid": self.process.pid if self.process else None}


@dataclass
class _Adapter:
    name: str
    version: int
    path: str
    inflight: int = 0


@dataclass
class _Stats(Counters):
    tokens: int = 0
    last_pause_s: float = 0.0
    mixed_version_responses: int = 0
    adapters_unloaded: int = 0
    stale_connections: int = 0
    """Generate calls sent again on a fresh connection: the kept-alive one was closed before any answer."""
    extra: dict[str, float] = field(default_factory=dict)


class VLLMEngine:
    """vLLM servers behind the Engine protocol; see the module docstring."""

    accepts_lora_adapters = True
    local_replicas = True
    """Replicas run on this machine (not Ray's): started ones take publishes through shared memory."""

    def __init__(self, model_path: str | Path, *, urls: list[str] | None = None, replicas: int = 1,
                 python: Path | None = None, data_dir: str | Path = "./clawloop-data", max_model_len: int = 2048,
                 dtype: str = "auto", lora_rank: int = 0, gpu_memory_utilization: float = 0.0,
                 kv_cache_gib: float = 1.0, extra_args: list[str] | None = None, gpus: list[str] | None = None,
                 sleep_mode: bool = False, start_timeout_s: float = 900.0, request_timeout_s: float = 600.0,
                 health_interval_s: float = 2.0, max_restarts: int = 5, keep_weights: int = 3,
                 policy_version: int = 0, max_logprobs: int = 20):
        from transformers import AutoTokenizer

        self.model_path = str(model_path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.data_dir = Path(data_dir)
        self.weights_dir = self.data_dir / "weights"
        self.max_model_len = max_model_len
        self.dtype = dtype
        self.lora_rank = lora_rank
        self.gpu_memory_utilization = gpu_memory_utilization
        self.kv_cache_gib = kv_cache_gib
        self.extra_args = list(extra_args or [])
        self.gpus = list(gpus or [])
        self.sleep_mode = sleep_mode
        if sleep_mode and not _has_cuda():
            raise ConfigError("model.sleep_while_training: --colocate uses vLLM's sleep mode, which vLLM has on "
                              "CUDA only; on CPU the trainer and vLLM share the cores without it")
        self.start_timeout_s = start_timeout_s
        self.request_timeout_s = request_timeout_s
        self.health_interval_s = health_interval_s
        self.max_restarts = max_restarts
        self.keep_weights = max(1, keep_weights)
        self.max_logprobs = max_logprobs
        self.python = python
        self.serve_dir = self.model_path
        """The folder vLLM loads (an untied copy for tied-embedding models; see `_untied_model_dir`)."""
        self._weights_path: str | None = None
        """The folder of the weights now served (None: the base model at `model_path`)."""
        self._adapter: _Adapter | None = None
        self._old_adapters: list[_Adapter] = []
        self.managed = not urls
        self.images = WeightImages()
        self.loader = ImageLoader()
        self._thread_wait = 0.0
        self.shared_memory = False
        """Full weights go through `self.images` and the worker extension (set at start), else as files."""
        reps = ([HTTPReplica(i, f"replica{i}", url=u.rstrip("/")) for i, u in enumerate(urls)] if urls else
                [HTTPReplica(i, f"replica{i}") for i in range(max(1, replicas))])
        self.replicas = ReplicaSet(reps, self, version=policy_version, health_interval_s=health_interval_s,
                                   max_restarts=max_restarts)
        self.eos_token_ids = self._eos_ids()
        self.stats_ = _Stats()
        self._client: Any = None
        self._gen: aiohttp.ClientSession | None = None
        """The generate calls' client (module docstring: why not httpx)."""
        self._awake: asyncio.Event | None = None
        self._running = False

    @classmethod
    def from_config(cls, cfg: Any) -> "VLLMEngine":
        m = cfg.model
        python = None if m.engine_urls else find_vllm_python(m.vllm_python)
        from clawloop.naming import model_path

        path = model_path(cfg)
        if not Path(path).exists():
            raise ConfigError(f"model.path: {path} does not exist (a local HF folder: clawloop never downloads; "
                              "build the tiny model with `clawloop tiny-model`)")
        gpus = list(cfg.train.rollout_gpus)
        replicas = m.engine_replicas
        if gpus and replicas == 1 and len(gpus) > 1:
            replicas = len(gpus)  # one replica per rollout GPU unless told otherwise
        return cls(path, urls=list(m.engine_urls), replicas=replicas, python=python, data_dir=cfg.data_dir,
                   max_model_len=m.max_model_len, dtype=m.dtype,
                   lora_rank=cfg.train.lora_rank if cfg.train.use_lora else 0,
                   gpu_memory_utilization=m.gpu_memory_utilization, kv_cache_gib=m.kv_cache_gib,
                   extra_args=list(m.vllm_args), gpus=gpus, sleep_mode=m.sleep_while_training,
                   start_timeout_s=m.start_timeout_s, request_timeout_s=m.request_timeout_s,
                   health_interval_s=m.health_interval_s, max_restarts=m.max_restarts,
                   keep_weights=m.keep_weights)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gc = Path(self.model_path) / "generation_config.json"
        if gc.exists():
            e = json.loads(gc.read_text()).get("eos_token_id")
            ids.update([int(e)] if isinstance(e, int) else [int(x) for x in (e or [])])
        return frozenset(ids)

    # -- protocol ----------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return self.replicas.version

    def relabel(self, version: int) -> None:
        self.replicas.relabel(version)

    async def start(self) -> None:
        if self._running:
            return
        # httpx logs every request at INFO: one line per generation and health check is noise here.
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(connect=5.0, read=self.request_timeout_s, write=30.0, pool=30.0),
            limits=httpx.Limits(max_connections=4096, max_keepalive_connections=512))
        # keep-alive under vLLM's own 5 s (uvicorn's timeout_keep_alive), so no request goes out on a
        # connection the server is closing; no total timeout (a long generation is fine), a read timeout
        # per read as httpx had
        self._gen = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=4096, limit_per_host=0, keepalive_timeout=4.0),
            timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_connect=5.0,
                                          sock_read=self.request_timeout_s), auto_decompress=False)
        self.replicas.open()
        self._awake = asyncio.Event()
        self._awake.set()
        try:
            if self.managed:
                self.serve_dir = await asyncio.to_thread(self._untied_model_dir)
                self.shared_memory = self.local_replicas and shared_memory_available()
                for r in self.replicas:
                    self._spawn(r)
            elif self._tied():
                log.warning("%s ties lm_head to the embeddings: vLLM's in-place reload leaves a tied lm_head "
                            "on the old weights; start the attached server on an untied copy (clawloop does "
                            "this for servers it starts) or publish LoRA adapters", self.model_path)
            await asyncio.gather(*(self._wait_healthy(r, self.start_timeout_s, first=True) for r in self.replicas))
            for r in self.replicas:
                await self.replicas.bring_up(r)
            if self.shared_memory:  # publishes go through the loader's threads: their clients ready now
                for r in self.replicas:
                    log.info("vLLM %s: publish clients ready in %.3f s", r.name,
                             await asyncio.to_thread(self.loader.warm, r.url))
        except BaseException:
            await self._shutdown_processes()
            await self._client.aclose()
            await self._gen.close()
            raise
        self._running = True
        self.replicas.start_monitor()

    async def stop(self) -> None:
        self._running = False
        await self.replicas.stop()
        await self._shutdown_processes()
        self.images.close()
        self.loader.close()
        if self._client is not None:
            await self._client.aclose()
        if self._gen is not None:
            await self._gen.close()

    async def _shutdown_processes(self) -> None:
        procs = [r.process for r in self.replicas if r.process is not None]
        await asyncio.gather(*(asyncio.to_thread(p.stop) for p in procs))

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        async for events in self.generate_chunks(request):
            for ev in events:
                yield ev

    async def generate_chunks(self, request: GenerationRequest) -> AsyncIterator[list[TokenEvent]]:
        """The events as they arrive: all tokens of the stream messages one read brought (vLLM sends
        several per message once its output lags its steps) are one list; a request with `stream`
        False is one non-streamed call and one list."""
        if not self._running:
            raise RuntimeError("engine is not started")
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        if not self._awake.is_set():  # colocated training: wait for the wake-up, never refuse
            await self._awake.wait()
        tried: set[int] = set()
        while True:
            replica = self._route(request.session_id, tried)
            adapter = self._adapter
            emitted = 0
            replica.inflight += 1
            replica.requests += 1
            if adapter is not None:
                adapter.inflight += 1
            try:
                async for events in self._stream(replica, request, adapter):
                    emitted += len(events)
                    yield events
                return
            except EngineUnavailable:
                # Nothing sent yet: the request can go to another replica unseen by the client.
                if emitted == 0 and any(r.state == "up" and r.index not in tried | {replica.index}
                                        for r in self.replicas):
                    tried.add(replica.index)
                    self.stats_.retries += 1
                    continue
                raise
            finally:
                replica.inflight -= 1
                if adapter is not None:
                    adapter.inflight -= 1
                    if adapter is not self._adapter and adapter.inflight == 0:
                        self._schedule_unload(adapter)

    def _route(self, session_id: str | None, exclude: set[int]) -> HTTPReplica:
        return self.replicas.route(session_id, exclude)

    async def _stream(self, r: HTTPReplica, request: GenerationRequest,
                      adapter: _Adapter | None) -> AsyncIterator[list[TokenEvent]]:
        p = request.params
        k = max(0, min(p.top_logprobs, self.max_logprobs))
        sp: dict[str, Any] = {"temperature": p.temperature, "top_p": p.top_p, "max_tokens": p.max_tokens,
                              "stop_token_ids": sorted(set(p.stop_token_ids) | self.eos_token_ids),
                              # vLLM lists the sampled id first, then ranks 1.., k+1 entries in all
                              "logprobs": k + 1 if k else 0, "detokenize": False,
                              "skip_special_tokens": False}
        if p.seed is not None:
            sp["seed"] = int(p.seed)
        if p.presence_penalty:
            sp["presence_penalty"] = p.presence_penalty
        if p.frequency_penalty:
            sp["frequency_penalty"] = p.frequency_penalty
        if p.logit_bias:
            sp["logit_bias"] = {str(t): b for t, b in p.logit_bias.items()}
        if p.min_tokens:
            sp["min_tokens"] = p.min_tokens
        if p.constraint is not None:
            # vLLM compiles the same structural tag with xgrammar, its default backend; its raw logprobs
            # are then taken after the grammar's mask, as the hf engine reports them.
            sp["structured_outputs"] = {"structural_tag": json.dumps(p.constraint)}
            if p.close_within:  # the servers load clawloop_json_close.JsonClose (`_server_args`)
                from clawloop.engines.grammar import json_anchors
                from clawloop.engines.vllm_worker.clawloop_json_close import ANCHORS, CLOSE_WITHIN

                sp["extra_args"] = {CLOSE_WITHIN: int(p.close_within), ANCHORS: list(json_anchors(p.constraint))}
        body: dict[str, Any] = {"token_ids": list(request.prompt_ids), "sampling_params": sp,
                                "stream": request.stream}
        if adapter is not None:
            body["model"] = adapter.name
        if request.request_id:
            body["request_id"] = f"{request.request_id}-{os.urandom(4).hex()}"
        version_at_start = adapter.version if adapter is not None else r.version
        payload = orjson.dumps(body)
        for attempt in (0, 1):
            n = 0
            opened = None
            finished = False
            try:
                async with self._gen.post(r.url + "/inference/v1/generate", data=payload,
                                          headers={"content-type": "application/json"}) as resp:
                    opened = resp
                    r.streams.add(resp)
                    if r.state != "up":  # taken down while this request connected
                        raise EngineUnavailable(f"{r.name} is {r.state}")
                    if resp.status != 200:
                        text = (await resp.read()).decode(errors="replace")[:500]
                        if resp.status >= 500 or resp.status in (404, 409, 503):
                            raise EngineUnavailable(f"{r.name}: HTTP {resp.status}: {text}")
                        raise ValueError(f"vLLM refused the request: HTTP {resp.status}: {text}")
                    if not request.stream:  # one body: the whole response
                        msg = orjson.loads(await resp.read())
                        events = [ev for ch in msg.get("choices") or [] for ev in
                                  self._events(ch, r, adapter, version_at_start, 0, k)]
                        finished = bool(events) and events[-1].finish_reason is not None
                        if events:
                            yield events
                    else:
                        buf = b""
                        async for data in resp.content.iter_any():
                            # SSE messages end with a blank line; what one read brought is one step
                            *messages, buf = (buf + data).split(b"\n\n")
                            events = []
                            for m in messages:
                                if not m.startswith(b"data: ") or m == b"data: [DONE]":
                                    continue  # [DONE]: read on to the end, so the connection goes back to the pool
                                msg = orjson.loads(m[6:])
                                if "error" in msg and "choices" not in msg:
                                    raise EngineUnavailable(f"{r.name}: {msg['error']}")
                                for ch in msg.get("choices") or []:
                                    evs = self._events(ch, r, adapter, version_at_start, n, k)
                                    n += sum(1 for ev in evs if ev.token_id is not None)
                                    events += evs
                            if events:
                                finished = events[-1].finish_reason is not None
                                yield events
                if not finished:  # the stream ended without a finish: never pass a cut response off as whole
                    raise EngineUnavailable(f"{r.name}: the stream ended before the response finished")
                return
            except (aiohttp.ClientError, asyncio.TimeoutError) as e:  # connection, payload, read timeout
                if opened is None and attempt == 0 and isinstance(e, aiohttp.ServerDisconnectedError):
                    # closed before any answer: a kept-alive connection the server had just timed out (its
                    # keep-alive clock runs from its last byte, ours from our read of it); on a fresh one
                    self.stats_.stale_connections += 1
                    continue
                self.replicas.suspect(r, f"{type(e).__name__}: {e}")
                raise EngineUnavailable(f"{r.name} failed mid-request: {type(e).__name__}: {e}") from e
            finally:
                if opened is not None:
                    r.streams.discard(opened)

    def _events(self, ch: dict[str, Any], r: HTTPReplica, adapter: _Adapter | None, v0: int, n0: int,
                k: int) -> list[TokenEvent]:
        ids = ch.get("token_ids") or []
        content = ((ch.get("logprobs") or {}).get("content")) or []
        finish = ch.get("finish_reason")
        out: list[TokenEvent] = []
        live_version = adapter.version if adapter is not None else r.version
        for j, tid in enumerate(ids):
            lp_entry = content[j] if j < len(content) else None
            lp = float(lp_entry["logprob"]) if lp_entry is not None else 0.0
            top = None
            if k and lp_entry is not None:
                ranked = sorted((t for t in lp_entry.get("top_logprobs") or [] if t.get("rank") and t["rank"] <= k),
                                key=lambda t: t["rank"])
                top = [(int(t["token_id"]), float(t["logprob"])) for t in ranked[:k]]
            out.append(TokenEvent(token_id=int(tid), logprob=lp, top_logprobs=top, policy_version=live_version))
        self.stats_.tokens += len(ids)
        if finish is not None:
            spans = None
            if adapter is None and ch.get("weight_versions"):
                spans = [(int(s["start"]), int(s["end"]), _as_version(s["version"], v0))
                         for s in ch["weight_versions"]]
                if len({v for _, _, v in spans}) > 1:
                    self.stats_.mixed_version_responses += 1
            reason = "length" if finish == "length" else "stop"
            if out:
                out[-1].finish_reason = reason
                out[-1].version_spans = spans
            else:
                out.append(TokenEvent(token_id=None, logprob=0.0, finish_reason=reason, policy_version=live_version,
                                      version_spans=spans))
            self.stats_.requests += 1
        return out

    # -- publish -------------------------------------------------------------------
    async def publish(self, weights: Mapping[str, Any] | str | Path | LoraAdapter, version: int) -> None:
        """Serve `weights` as `version` on every replica that is up; a replica that is
        down gets them when it comes back. Returns once new requests get `version`."""
        async with self.replicas.lock:
            t0 = time.perf_counter()
            self._thread_wait = 0.0
            version = int(version)
            try:
                if isinstance(weights, LoraAdapter):
                    if not weights.state_dict or not any("lora_" in k for k in weights.state_dict):
                        raise ValueError("publish: the LoRA adapter has no tensors (lora_A/lora_B); vLLM would "
                                         "crash loading it")
                    path = await asyncio.to_thread(self._write_adapter, weights, version)
                    await self._publish_adapter(path, version)
                elif self.shared_memory and not isinstance(weights, (str, Path)):
                    staged = await self._in_publish_thread(self.images.stage, self._served_tensors(weights), version)
                    await self._publish_image(staged)
                else:
                    if isinstance(weights, (str, Path)):
                        path = str(weights)
                    else:
                        path = await asyncio.to_thread(self._write_full, weights, version)
                    await self._publish_full(path, version)
            except Exception:
                self.stats_.publish_failures += 1
                raise
            self.stats_.publishes += 1
            self.stats_.last_publish_s = time.perf_counter() - t0
            self.stats_.extra["publish_thread_wait_s"] = self._thread_wait
            await asyncio.to_thread(self._prune_weights)

    async def _publish_full(self, path: str, version: int) -> None:
        # A replica that fails is taken down and restarted: it comes back on the current weights.
        await self.replicas.fan_out("publish", version, lambda r: self._reload(r, path, version))
        self._weights_path = path
        self._adapter = None
        self.images.forget()

    async def _publish_image(self, staged: Staged) -> None:
        x = self.stats_.extra
        x.update(publish_stage_s=staged.stage_s, publish_bytes=float(staged.bytes_total),
                 publish_bytes_sent=float(staged.bytes_changed), publish_groups_sent=float(len(staged.changed)))
        manifest = staged.manifest()
        await self.replicas.fan_out("publish", staged.version, lambda r: self._load_image(r, manifest, staged.version))
        self.images.commit(staged)
        self._weights_path = None
        self._adapter = None

    async def _in_publish_thread(self, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on a thread kept for publishes: not queued behind the default executor's work
        (long prompts' rendering, shared-store claims). The longest wait for a thread in the last
        publish is `publish_thread_wait_s`."""
        t0 = time.perf_counter()
        waited: list[float] = []

        def run() -> Any:
            waited.append(time.perf_counter() - t0)
            return fn(*args)

        try:
            return await asyncio.get_running_loop().run_in_executor(self.loader.outer, run)
        finally:
            if waited:
                self._thread_wait = max(self._thread_wait, waited[0])

    async def _load_image(self, r: HTTPReplica, manifest: str, version: int) -> None:
        """Paused, the replica loads the image's changed groups, is tagged and drops its prefix
        cache (see `ImageLoader`: from a thread, off the serving loop)."""
        done = await self._in_publish_thread(self.loader.load, r.url, manifest, version)
        r.version = version
        self.stats_.last_pause_s = done["pause_s"]
        self.stats_.extra.update({f"publish_{k}": float(done[k]) for k in
                                  ("load_s", "map_s", "pause_call_s", "paused_work_s")})
        if not done["reset_ok"]:
            self.stats_.extra["prefix_cache_reset_failures"] = self.stats_.extra.get(
                "prefix_cache_reset_failures", 0.0) + 1

    async def _reload(self, r: HTTPReplica, path: str, version: int) -> None:
        """pause(keep) → reload → tag → reset prefix cache → resume; resumes even on failure."""
        t0 = time.perf_counter()
        await self._post(r, "/pause", params={"mode": "keep"})
        try:
            res = await self._post(r, "/collective_rpc", json={"method": "reload_weights",
                                                              "kwargs": {"weights_path": path}}, timeout=600)
            if res.get("results") is None and res.get("error"):
                raise RuntimeError(f"reload_weights: {res}")
            await self._post(r, "/update_weight_version", json={"new_version": str(version)})
            r.version = version
            await self._reset_prefix_cache(r)
        finally:
            await self._post(r, "/resume")
            self.stats_.last_pause_s = time.perf_counter() - t0

    async def _reset_prefix_cache(self, r: HTTPReplica) -> None:
        """Drop KV computed by the old weights. Running requests are preempted and recomputed on
        resume, so every token sampled after a publish is conditioned on new-weight KV only: its
        logprob is exactly the new policy's, as its version says."""
        res = await self._post(r, "/reset_prefix_cache", params={"reset_running_requests": "true"})
        if not res.get("success", True):
            self.stats_.extra["prefix_cache_reset_failures"] = self.stats_.extra.get(
                "prefix_cache_reset_failures", 0.0) + 1
            log.warning("%s: prefix cache reset refused; old-weight KV may serve a few requests", r.name)

    async def _publish_adapter(self, path: str, version: int) -> None:
        name = f"clawloop-v{version}"
        await self.replicas.fan_out("LoRA publish", version, lambda r: self._post(
            r, "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": path}, timeout=300))
        old = self._adapter
        self._adapter = _Adapter(name, version, path)
        self._weights_path = path
        self.images.forget()  # an adapter over the base weights: restarted replicas start from those
        if old is not None:
            if old.inflight == 0:
                self._schedule_unload(old)
            else:
                self._old_adapters.append(old)

    def _schedule_unload(self, adapter: _Adapter) -> None:
        if adapter in self._old_adapters:
            self._old_adapters.remove(adapter)

        async def unload() -> None:
            for r in self.replicas:
                if r.state != "up":
                    continue
                try:
                    await self._post(r, "/v1/unload_lora_adapter", json={"lora_name": adapter.name})
                except Exception as e:  # harmless: the adapter stays loaded until the replica restarts
                    log.warning("unloading %s from %s failed: %s", adapter.name, r.name, e)
            self.stats_.adapters_unloaded += 1

        asyncio.get_running_loop().create_task(unload())

    def _tied(self) -> bool:
        return is_tied(self.model_path)

    def _untied_model_dir(self) -> str:
        return untied_model_dir(self.model_path, self.weights_dir)

    def _served_tensors(self, weights: Mapping[str, Any]) -> dict[str, Any]:
        """`weights` plus, for the untied copy of a tied model, its head (see _untied_model_dir)."""
        tensors = dict(weights)
        if self.serve_dir != self.model_path and "lm_head.weight" not in tensors:
            tensors["lm_head.weight"] = tensors[next(k for k in tensors if k.endswith("embed_tokens.weight"))]
        return tensors

    def _write_full(self, weights: Mapping[str, Any], version: int) -> str:
        """The state dict as safetensors in DATA_DIR/weights/vN (atomically: temp dir + rename)."""
        from safetensors.torch import save_file

        tensors = {k: v.detach().to("cpu").contiguous().clone()  # no shared storage
                   for k, v in self._served_tensors(weights).items()}
        return self._write_dir(f"v{version}", lambda d: save_file(tensors, str(d / "model.safetensors"),
                                                                   metadata={"format": "pt"}))

    def _write_adapter(self, adapter: LoraAdapter, version: int) -> str:
        from safetensors.torch import save_file

        tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in adapter.state_dict.items()}
        config = dict(adapter.config)
        config.setdefault("base_model_name_or_path", self.model_path)

        def write(d: Path) -> None:
            save_file(tensors, str(d / "adapter_model.safetensors"), metadata={"format": "pt"})
            (d / "adapter_config.json").write_text(json.dumps(config, default=list))

        return self._write_dir(f"v{version}-lora", write)

    def _write_dir(self, name: str, write: Any) -> str:
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        final = self.weights_dir / name
        tmp = self.weights_dir / f".{name}.tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        write(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return str(final)

    def _prune_weights(self) -> None:
        """Keep the newest `keep_weights` published folders (never the served one or an adapter in use)."""
        if not self.weights_dir.exists():
            return
        keep = {self._weights_path} | {a.path for a in self._old_adapters}
        dirs = []
        for d in self.weights_dir.iterdir():
            stem = d.name.removesuffix("-lora")
            if d.is_dir() and stem.startswith("v") and stem[1:].isdigit():
                dirs.append((int(stem[1:]), d))
        dirs.sort()
        for _, d in dirs[:-self.keep_weights]:
            if str(d) not in keep:
                shutil.rmtree(d, ignore_errors=True)

    # -- colocated training ------------------------------------------------------------
    async def sleep(self) -> None:
        """Free the GPU for a train step: requests already in vLLM finish (pause, mode wait),
        then vLLM sleeps (level 1: weights offloaded to CPU memory, KV cache dropped). New
        requests wait in clawloop for `wake_up`; none is refused."""
        if not self.sleep_mode:
            return
        self._awake.clear()
        up = self.replicas.up()
        await asyncio.gather(*(self._post(r, "/pause", params={"mode": "wait"}, timeout=self.request_timeout_s)
                               for r in up))
        await asyncio.gather(*(self._post(r, "/sleep", params={"level": "1"}, timeout=300) for r in up))

    async def wake_up(self) -> None:
        if not self.sleep_mode:
            return
        try:
            up = self.replicas.up()
            await asyncio.gather(*(self._post(r, "/wake_up", timeout=300) for r in up))
            await asyncio.gather(*(self._post(r, "/resume") for r in up))
        finally:
            self._awake.set()

    # -- health, restarts ---------------------------------------------------------------
    def _spawn(self, r: HTTPReplica) -> None:
        port = _free_port()
        r.url = f"http://127.0.0.1:{port}"
        env = dict(os.environ)
        env.pop("VIRTUAL_ENV", None)
        env.pop("PYTHONPATH", None)  # never leak clawloop's environment into vLLM's
        env.update(self._server_env(r))
        if self.gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.gpus[r.index % len(self.gpus)]
        assert self.python is not None
        r.process = VLLMProcess(self.python, self._server_args("127.0.0.1", port), env,
                                self.data_dir / "logs" / f"vllm-{r.name}.log")
        r.process.start()
        log.info("started vLLM %s (pid %s) on %s; log %s", r.name, r.process.pid, r.url, r.process.log_path)

    def _server_args(self, host: str, port: int) -> list[str]:
        """A replica's vLLM command line (after `python launcher.py PARENT --`)."""
        args = ["--model", self.serve_dir, "--served-model-name", BASE_NAME, "--host", host,
                "--port", str(port), "--max-model-len", str(self.max_model_len),
                "--logprobs-mode", "raw_logprobs", "--max-logprobs", str(self.max_logprobs + 1),
                "--enable-scale-out", "--disable-uvicorn-access-log"]
        if self.dtype != "auto":
            args += ["--dtype", self.dtype]
        elif not _has_cuda():
            args += ["--dtype", "float32"]  # the hf engine's CPU dtype: logprobs the trainer can match
        if self.lora_rank:
            rank = next(x for x in (8, 16, 32, 64, 128, 256, 512) if x >= self.lora_rank)
            args += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", "4"]
        if self.gpu_memory_utilization:
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
        if self.sleep_mode:
            args += ["--enable-sleep-mode"]
        if self.shared_memory:
            args += ["--worker-extension-cls", "clawloop_weight_sync.WeightSync"]
        args += ["--logits-processors", "clawloop_json_close:JsonClose"]  # constrained JSON ends within max_tokens
        return args + self.extra_args

    def _server_env(self, r: HTTPReplica) -> dict[str, str]:
        """What a replica's environment adds to the one it starts in."""
        env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
               "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")}
        env["PYTHONPATH"] = str(WORKER_DIR)  # the worker extension and logits processor, nothing else of clawloop's
        if not _has_cuda():
            env["VLLM_CPU_KVCACHE_SPACE"] = os.environ.get("VLLM_CPU_KVCACHE_SPACE",
                                                           str(max(1, int(round(self.kv_cache_gib)))))
            if len(self.replicas) > 1 and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ:
                # vLLM binds each CPU server to core 0 by default: spread replicas over the cores.
                env["VLLM_CPU_OMP_THREADS_BIND"] = str(r.index % (os.cpu_count() or 1))
        return env

    async def _wait_healthy(self, r: HTTPReplica, timeout_s: float, first: bool = False) -> None:
        t0 = time.monotonic()
        last_note = t0
        while True:
            if r.process is not None and r.process.exited() is not None:
                tail = r.process.log_tail()
                raise RuntimeError(f"vLLM {r.name} exited with code {r.process.exited()} while starting:\n"
                                   f"{_explain(tail)}\n(full log: {r.process.log_path})")
            if await self._healthy(r):
                if first:
                    print(f"clawloop: vLLM {r.name} ready on {r.url} after {time.monotonic() - t0:.0f} s",
                          file=sys.stderr, flush=True)
                return
            now = time.monotonic()
            if now - t0 > timeout_s:
                raise RuntimeError(f"vLLM {r.name} at {r.url} not healthy after {timeout_s:.0f} s"
                                   + (f" (log: {r.process.log_path})" if r.process else ""))
            if now - last_note >= 15:
                last_note = now
                where = f"log {r.process.log_path}" if r.process else r.url
                print(f"clawloop: waiting for vLLM {r.name} ({now - t0:.0f} s; {where})", file=sys.stderr,
                      flush=True)
            await asyncio.sleep(0.5)

    async def _healthy(self, r: HTTPReplica) -> bool:
        try:
            resp = await self._client.get(r.url + "/health", timeout=5.0)
            return resp.status_code == 200
        except Exception:
            return False

    # -- the replica set's transport (see engines/replicas.py) ---------------------------
    def owns_process(self, r: HTTPReplica) -> bool:
        return r.process is not None

    async def probe_replica(self, r: HTTPReplica) -> Probe:
        if r.process is not None and r.process.exited() is not None:
            return Probe("gone", f"exited with code {r.process.exited()}")
        return Probe("ok") if await self._healthy(r) else Probe("missed", "health check failed")

    async def catch_up_replica(self, r: HTTPReplica) -> None:
        """A (re)started replica: serve the current weights as the current version before traffic."""
        if self._adapter is not None:
            await self._post(r, "/v1/load_lora_adapter", json={"lora_name": self._adapter.name,
                                                               "lora_path": self._adapter.path}, timeout=300)
        elif self.images.current is not None:
            await self._post(r, "/collective_rpc", json={"method": "clawloop_load_weights", "kwargs": {
                "manifest": self.images.current.manifest(everything=True)}}, timeout=600)
            await self._reset_prefix_cache(r)
        elif self._weights_path is not None:
            await self._post(r, "/collective_rpc", json={"method": "reload_weights",
                                                        "kwargs": {"weights_path": self._weights_path}}, timeout=600)
            await self._reset_prefix_cache(r)
        await self._post(r, "/update_weight_version", json={"new_version": str(self.policy_version)})
        r.version = self.policy_version

    async def launch_replica(self, r: HTTPReplica) -> None:
        self._spawn(r)
        await self._wait_healthy(r, self.start_timeout_s)

    async def halt_replica(self, r: HTTPReplica) -> None:
        await asyncio.to_thread(r.process.stop, 5.0)

    def replica_down(self, r: HTTPReplica) -> None:
        for resp in list(r.streams):  # requests waiting on it end now (503 / error chunk), not at a timeout
            resp.close()  # aiohttp: the connection closes now; its reader raises ClientConnectionError
        r.streams.clear()

    async def _post(self, r: HTTPReplica, path: str, *, json: Any = None, params: Any = None,
                    timeout: float = 60.0) -> dict[str, Any]:
        resp = await self._client.post(r.url + path, json=json, params=params, timeout=timeout)
        if resp.status_code != 200:
            raise RuntimeError(f"{r.name} {path}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json()
        except ValueError:
            return {}

    # -- reporting -----------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return any(r.state == "up" for r in self.replicas)

    def health(self) -> dict[str, Any]:
        return self.replicas.health("vllm")

    def stats(self) -> dict[str, float]:
        s = self.stats_
        out = {
            **s.stats(), "engine/tokens_generated": float(s.tokens), "engine/last_pause_s": s.last_pause_s,
            "engine/mixed_version_responses": float(s.mixed_version_responses),
            "engine/lora_adapters_unloaded": float(s.adapters_unloaded),
            "engine/stale_connections": float(s.stale_connections),
        }
        out.update({f"engine/{k}": v for k, v in s.extra.items()})
        out.update(self.replicas.stats())
        return out


def _as_version(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default  # "default": a server that was never tagged
