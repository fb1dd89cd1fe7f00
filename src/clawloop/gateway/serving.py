"""The serving base every generation endpoint stands on (as vLLM's `serving_engine.py` under its
`serving_chat.py` / `serving_completion.py`).

    gw = Gateway(cfg, engine, store)                 # create_app builds one per app
    tenant, body = await gw.accept(request)          # count, authenticate, read the body
    lease = await gw.admit(n, deadline)              # 503 / 429 / 504 before any work
    ...an endpoint's `InFlight` subclass generates, streams or answers, and captures...

What the endpoints share lives here and nowhere else: the `Gateway` (engine, tokenizer, capture,
metrics, API keys, generation slots), admission (`Slots`: at most `max_concurrent_generations`
choices at once, a bounded queue, a 429 beyond it), the per-choice seeds (`choice_seed`), token
accumulation (`Generation.record`: ids, logprobs, the weight version of each id, the text safe to
show), the engine loop (`generate`), and one request's lifecycle (`InFlight`: the deadline, the
SSE queue and its `drain`, the 503/504/500 mapping, keeping what was generated as an aborted turn
when a request fails, freeing its slots exactly once). An endpoint module says only what is its
own: how its request parses, what it sends the engine, and the shape of its replies.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol

import orjson
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask

from clawloop.config import api_key_tenants
from clawloop.engines.base import Engine, EngineUnavailable, GenerationRequest, StreamsChunks, TokenEvent
from clawloop.gateway import gcpause
from clawloop.gateway.capture import Capture, TurnSlot
from clawloop.gateway.metrics import Metrics
from clawloop.gateway.protocol import APIError, parse_json_body
from clawloop.gateway.parsers import select_parsers
from clawloop.gateway.render import Detokenizer, TextStream, TokenPieces, image_policy, marker_ids, renderer_for
from clawloop.records import TURN_MAIN, TURN_SIDE, Turn
from clawloop.store import Store

log = logging.getLogger(__name__)

StatsFn = Callable[[], dict[str, float]]

TIMED_OUT = object()
"""Put in a stream's queue when its request's deadline passes (`drain` raises TimeoutError)."""


class FastJSONResponse(JSONResponse):
    """A JSON reply serialized by orjson (several times faster than json.dumps on logprob-heavy
    bodies); the same JSON, with non-ASCII text as UTF-8 as starlette's JSONResponse writes it."""

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def choice_seed(seed: int, index: int) -> int:
    """Choice `index`'s seed: `seed + index`, wrapped to stay a signed 64-bit integer."""
    return (seed + index + 2**63) % 2**64 - 2**63


def timeout_error(timeout_s: float) -> APIError:
    return APIError(504, f"The request took longer than the server's limit of {timeout_s:g} s and was stopped "
                    "(serve.request_timeout_s).", code="timeout")


def unavailable_error(e: EngineUnavailable) -> APIError:
    return APIError(503, f"The model is temporarily unavailable: {e}", code="engine_unavailable",
                    headers={"Retry-After": str(max(1, int(round(e.retry_after_s))))})


async def drain(q: asyncio.Queue, producers: int, interval_s: float = 0.0) -> AsyncIterator[str]:
    """A stream's SSE text from the queue its `producers` choice tasks fill, until each has put its
    closing `None`; what is ready is coalesced into one write. With `interval_s`, a write follows the
    previous one no sooner than that (the first goes at once): the chunks in between leave together,
    one socket write instead of one per token. A task's exception, or `TIMED_OUT` (TimeoutError), is
    raised here."""
    remaining = producers
    loop = asyncio.get_running_loop()
    last = -interval_s
    while remaining:
        items = [await q.get()]
        if interval_s and isinstance(items[0], str) and (wait := last + interval_s - loop.time()) > 0:
            await asyncio.sleep(wait)
        while not q.empty():
            items.append(q.get_nowait())
        out = []
        for item in items:
            if item is None:
                remaining -= 1
            elif item is TIMED_OUT:
                raise TimeoutError
            elif isinstance(item, BaseException):
                raise item
            else:
                out.append(item)
        if out:
            yield "".join(out)
            last = loop.time()


# -- admission -------------------------------------------------------------------
class Slots:
    """Generation slots: at most `capacity` choices generate at once; up to `max_queued` requests
    wait for slots in arrival order, and one more is refused with a 429."""

    def __init__(self, capacity: int, max_queued: int):
        self.capacity, self.max_queued = capacity, max_queued
        self.used = 0
        self.waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        self.rejected = 0

    async def acquire(self, n: int, deadline: float | None) -> "Lease":
        """Slots for `n` choices; TimeoutError past `deadline` (event-loop time) while queued."""
        n = min(n, self.capacity)
        if not self.waiters and self.used + n <= self.capacity:
            self.used += n
            return Lease(self, n)
        if len(self.waiters) >= self.max_queued:
            self.rejected += 1
            raise APIError(429, "The server is at capacity (generation queue full); retry shortly.",
                           code="rate_limit_exceeded", headers={"Retry-After": "1"})
        entry = (n, asyncio.get_running_loop().create_future())
        self.waiters.append(entry)
        try:
            async with asyncio.timeout_at(deadline):
                await entry[1]
        except BaseException:
            if entry[1].done() and not entry[1].cancelled():
                self.release(n)  # granted just as we gave up
            elif entry in self.waiters:
                self.waiters.remove(entry)
                self._wake()
            raise
        return Lease(self, n)

    def release(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _wake(self) -> None:
        while self.waiters and self.used + self.waiters[0][0] <= self.capacity:
            n, fut = self.waiters.popleft()
            if not fut.done():
                self.used += n
                fut.set_result(None)


class Lease:
    """Slots held by one request; `release` is idempotent (a stream's body and its background task
    both release)."""

    def __init__(self, slots: Slots, n: int):
        self.slots, self.n = slots, n

    def release(self) -> None:
        if self.n:
            n, self.n = self.n, 0
            self.slots.release(n)


class SessionFields(Protocol):
    """What `Gateway.session_of` reads off a parsed request (chat, completions and responses all have it)."""

    session_id: str | None
    turn_type: str | None
    session_done: bool
    user: str | None


class Gateway:
    """The state the endpoints share: one per app (`app.state.gateway`)."""

    def __init__(self, cfg: Any, engine: Engine, store: Store | None, *, stats: list[StatsFn] | None = None):
        self.cfg = cfg
        self.engine = engine
        self.tok = engine.tokenizer
        self.store = store
        self.capture = (Capture(store, cfg.capture.session_idle_timeout_s, cfg.capture.sweep_interval_s)
                        if store is not None and cfg.capture.enabled else None)
        self.metrics = Metrics()
        self.stats_fns: list[StatsFn] = [engine.stats, gcpause.watch().stats]
        if self.capture is not None:
            self.stats_fns.append(self.capture.stats)
        self.stats_fns.extend(stats or [])
        self.metrics.add_stats(self.all_stats)
        self.inflight = 0
        self.requests = 0
        self.timeouts = 0
        self.store_refusals = 0
        self.started_at = time.time()
        self.eos = set(getattr(engine, "eos_token_ids", ()) or ())
        """Ids that end a turn: a final one is not content (logprob blocks leave it out)."""
        if self.tok.eos_token_id is not None:
            self.eos.add(self.tok.eos_token_id)
        self.renderer = renderer_for(self.tok)
        self.pieces = TokenPieces(self.tok)
        self.images = image_policy(engine)
        """True when the engine takes image parts, else why they are refused."""
        self.reasoning_parser, self.tool_parser = select_parsers(
            cfg.serve.reasoning_parser, cfg.serve.tool_parser, getattr(self.tok, "chat_template", None))
        """The model family's parsers (gateway/parsers/; `auto` read off the chat template)."""
        markers = self.tool_parser.markers + ((self.reasoning_parser.start, self.reasoning_parser.end)
                                              if self.reasoning_parser is not None else ())
        self.marker_ids = marker_ids(self.tok, markers)
        """Special tokens the parsers read, kept in the detokenized text."""
        # Keys are compared as SHA-256 digests, all of them every time: no timing tells which one was close.
        self._keys = [(tenant, hashlib.sha256(key.encode()).digest())
                      for tenant, key in api_key_tenants(list(cfg.serve.api_keys))]
        self.slots = Slots(cfg.serve.max_concurrent_generations, cfg.serve.max_queued_requests)

    def all_stats(self) -> dict[str, float]:
        out: dict[str, float] = {"gateway/inflight": float(self.inflight), "gateway/requests": float(self.requests),
                                 "gateway/generation_slots_used": float(self.slots.used),
                                 "gateway/queued": float(len(self.slots.waiters)),
                                 "gateway/queue_full_refusals": float(self.slots.rejected),
                                 "gateway/store_overload_refusals": float(self.store_refusals),
                                 "gateway/timeouts": float(self.timeouts)}
        for fn in self.stats_fns:
            try:
                out.update(fn())
            except Exception:  # a broken stats source must not break /metrics
                log.exception("stats source failed")
        return out

    def thinking_state(self, prompt_ids: list[int]) -> bool | None:
        """None without a reasoning parser; else whether the output begins inside the reasoning (the
        prompt opened it, as Qwen3's thinking templates do)."""
        if self.reasoning_parser is None:
            return None
        return self.reasoning_parser.starts_inside(self.tok.decode(prompt_ids[-16:], skip_special_tokens=False))

    # -- request handling --------------------------------------------------
    def check_auth(self, request: Request) -> str:
        """The tenant the request's key belongs to ("" when the server has no keys); 401 otherwise."""
        if not self._keys:
            return ""
        auth = request.headers.get("authorization", "")
        token = auth[7:].strip() if auth.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        digest = hashlib.sha256(token.encode()).digest()
        tenant = ""
        for name, key in self._keys:  # no early exit
            if hmac.compare_digest(digest, key):
                tenant = name
        if not token or not tenant:
            raise APIError(401, "Incorrect API key provided." if token else
                           "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                           code="invalid_api_key")
        request.state.tenant = tenant
        return tenant

    async def read_body(self, request: Request) -> bytes:
        limit = self.cfg.serve.max_body_bytes
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"Request body too large: {declared} bytes (limit {limit}).",
                           code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise APIError(413, f"Request body too large: over {limit} bytes.", code="request_too_large")
            chunks.append(chunk)
        return b"".join(chunks)

    async def accept(self, request: Request) -> tuple[str, dict[str, Any]]:
        """A generation request's first steps, the same for every endpoint: counted, authenticated
        (its tenant), its JSON body read within the size limit."""
        self.requests += 1
        tenant = self.check_auth(request)
        return tenant, parse_json_body(await self.read_body(request))

    def session_of(self, request: Request, req: SessionFields, tenant: str = "") -> tuple[str | None, str, bool]:
        h = request.headers
        sid = h.get("x-session-id") or req.session_id or req.user
        if sid and tenant:
            sid = f"{tenant}/{sid}"  # tenant names have no '/': no tenant can name another's session
        tt = (h.get("x-turn-type") or req.turn_type or TURN_MAIN).strip().lower()
        if tt not in (TURN_MAIN, TURN_SIDE):
            raise APIError(400, f"Invalid X-Turn-Type {tt!r}: expected 'main' or 'side'.", param="X-Turn-Type",
                           code="invalid_value")
        done = h.get("x-session-done", "").strip().lower() in ("1", "true", "yes") or req.session_done
        return sid, tt, done

    def deadline(self) -> float | None:
        """Event-loop time past which the request is stopped (None: `serve.request_timeout_s` is 0)."""
        timeout = self.cfg.serve.request_timeout_s
        return asyncio.get_running_loop().time() + timeout if timeout > 0 else None

    def check_store(self) -> None:
        """429 while the store's writer is too far behind."""
        if self.capture is not None and self.store is not None and self.store.overloaded():
            self.store_refusals += 1
            raise APIError(429, "The server is storing turns slower than they arrive; retry shortly.",
                           code="capture_overloaded", headers={"Retry-After": "2"})

    async def admit(self, n: int, deadline: float | None) -> Lease:
        """Slots for `n` choices, after the refusals that cost nothing: no engine replica up (503),
        the store's writer behind (429); then a full queue is a 429 and waiting past `deadline` a 504."""
        if not getattr(self.engine, "available", True):
            raise unavailable_error(EngineUnavailable("no inference engine replica is available; retry shortly"))
        self.check_store()
        try:
            return await self.slots.acquire(n, deadline)
        except TimeoutError:
            self.timeouts += 1
            raise timeout_error(self.cfg.serve.request_timeout_s) from None

    async def begin_capture(self, sid: str | None, turn_type: str, messages: list[dict[str, Any]], done: bool, *,
                            tenant: str, prompt_ids: list[int], tools: list[dict[str, Any]] | None,
                            images: list[Any] | None = None) -> TurnSlot | None:
        """The turn's capture slot (`Capture.begin_async`: a shared store's claim off the event loop), or
        None when this gateway captures nothing."""
        if self.capture is None:
            return None
        return await self.capture.begin_async(sid, turn_type, messages, done, prompt_ids=prompt_ids, tools=tools,
                                              tenant=tenant, images=images or None)


# -- token accumulation ------------------------------------------------------------
@dataclass
class Generation:
    """One sequence being generated: the sampled ids, their logprobs and weight versions, and the
    text shown so far. Endpoints add what their replies need (a choice index, tool calls)."""

    detok: Detokenizer
    text: TextStream
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The weight version of each sampled id (engines that swap weights mid-response differ within one)."""
    tops: list[list[tuple[int, float]] | None] = field(default_factory=list)
    finish_reason: str | None = None
    version: int | None = None
    """The version that began it (the first event's, then the engine's final account of the first id)."""

    def record(self, ev: TokenEvent) -> str:
        """Record one token event; return the text now safe to show (stop strings held back)."""
        if self.version is None:
            self.version = ev.policy_version
        delta = ""
        if ev.token_id is not None:
            self.ids.append(ev.token_id)
            self.logprobs.append(ev.logprob)
            self.versions.append(ev.policy_version)
            self.tops.append(ev.top_logprobs)
            delta = self.detok.push(ev.token_id)
        if ev.version_spans:
            for start, end, v in ev.version_spans:  # the engine's own account overrides what we saw live
                for k in range(max(0, start), min(end, len(self.versions))):
                    self.versions[k] = v
            self.version = self.versions[0] if self.versions else self.version
        if ev.finish_reason is not None:
            self.finish_reason = ev.finish_reason
            delta += self.detok.flush()
        out = self.text.feed(delta, final=ev.finish_reason is not None)
        if self.text.stopped:
            self.finish_reason = "stop"
        return out

    def record_many(self, events: list[TokenEvent]) -> str:
        """`record` of one engine step's events: the same ids, logprobs, versions and text, with one
        detokenizing and one text update per step instead of per token. With stop strings the events
        go one by one, so no id past the stop is recorded."""
        if len(events) == 1 or self.text.stop:
            out = ""
            for ev in events:
                out += self.record(ev)
                if self.text.stopped:
                    break
            return out
        if not events:
            return ""
        if self.version is None:
            self.version = events[0].policy_version
        new = [ev.token_id for ev in events if ev.token_id is not None]
        for ev in events:
            if ev.token_id is not None:
                self.ids.append(ev.token_id)
                self.logprobs.append(ev.logprob)
                self.versions.append(ev.policy_version)
                self.tops.append(ev.top_logprobs)
        delta = self.detok.push_many(new) if new else ""
        last = events[-1]
        for ev in events:
            if ev.version_spans:
                for start, end, v in ev.version_spans:
                    for k in range(max(0, start), min(end, len(self.versions))):
                        self.versions[k] = v
                self.version = self.versions[0] if self.versions else self.version
        if last.finish_reason is not None:
            self.finish_reason = last.finish_reason
            delta += self.detok.flush()
        out = self.text.feed(delta, final=last.finish_reason is not None)
        if self.text.stopped:
            self.finish_reason = "stop"
        return out

    def is_final_eos(self, k: int, eos: set[int]) -> bool:
        """Whether id `k` is the end-of-turn token that closed it (not content)."""
        return self.ids[k] in eos and k == len(self.ids) - 1 and self.finish_reason is not None

    def turn_versions(self, first: int) -> tuple[int, list[int] | None]:
        """(policy_version, response_versions) for its captured turn: a response whose ids came from
        more than one version is recorded under the oldest, with each id's version beside it."""
        mixed = any(v != first for v in self.versions)
        return (min(self.versions), list(self.versions)) if mixed else (first, None)


OnDelta = Callable[[Any, str, int], Awaitable[None]]
"""`(generation, text now safe to show, index of its first id not yet sent)`."""


async def generate(engine: Engine, request: GenerationRequest, gen: Generation,
                   on_delta: OnDelta | None = None) -> None:
    """Run one generation to its end (or its stop string), recording each event in `gen`;
    `on_delta` hears each engine step (one event list) that has new text or new ids: the events
    that arrive together go to the client together (one chunk), not one chunk per token."""
    before = 0
    if on_delta is None:
        request.stream = False  # nobody hears the steps: the engine may answer in one piece
    steps = engine.generate_chunks(request) if isinstance(engine, StreamsChunks) else _one_by_one(engine, request)
    try:
        async for events in steps:
            delta = gen.record_many(events)
            if on_delta is not None and (delta or len(gen.ids) > before):
                await on_delta(gen, delta, before)
                before = len(gen.ids)
            if gen.text.stopped:
                break
    finally:
        await steps.aclose()


async def _one_by_one(engine: Engine, request: GenerationRequest) -> AsyncIterator[list[TokenEvent]]:
    """An engine without `generate_chunks`: each event is a step of its own."""
    agen = engine.generate(request)
    try:
        async for ev in agen:
            yield [ev]
    finally:
        await agen.aclose()


# -- one request's lifecycle ----------------------------------------------------------
class InFlight:
    """One generation request in flight, after admission. A subclass (one per endpoint) fills
    `samples` and says what is its own: `generate` (every sample, no stream), `capture` and
    `abandon` (its capture slots), `start` (a stream's first events; it starts the sample tasks
    with `spawn`), `finish_chunk`, `usage`, `reply`. This class keeps the rest the same for all:
    the deadline, in-flight counts, metrics, the error mapping, freeing slots exactly once."""

    OBJECT = ""
    CHUNK_OBJECT = ""
    """The `object` of the endpoint's replies and of its stream chunks."""

    def __init__(self, gw: Gateway, rid: str, model: str, *, tenant: str, t0: float, deadline: float | None,
                 lease: Lease | None, include_usage: bool):
        self.gw, self.rid, self.tenant, self.t0, self.deadline = gw, rid, tenant, t0, deadline
        self.lease, self.include_usage = lease, include_usage
        self.model = model or gw.cfg.serve.served_model_name
        self.created = int(time.time())
        self.start_version = gw.engine.policy_version
        """The engine's version when the request was accepted (a stream's headers and first chunk)."""
        self.samples: list[Generation] = []
        self.tasks: list[asyncio.Task] = []

    # -- what an endpoint says -----------------------------------------------------
    async def generate(self) -> None:
        raise NotImplementedError

    def captured(self, aborted: bool = False) -> list[tuple[TurnSlot, list[Turn]]]:
        """The turns to store, per capture slot (each slot once: later calls give nothing)."""
        raise NotImplementedError

    def capture(self, aborted: bool = False) -> None:
        """Store what was generated (`captured`); also the way out of failures, so synchronous."""
        for slot, turns in self.captured(aborted):
            self.gw.capture.finish(slot, turns)

    async def capture_async(self) -> None:
        """`capture` of a reply that completed, with a shared store's commit off the event loop."""
        for slot, turns in self.captured(False):
            await self.gw.capture.finish_async(slot, turns)

    def abandon(self) -> None:
        raise NotImplementedError

    def start(self, q: asyncio.Queue) -> AsyncIterator[str]:
        raise NotImplementedError

    def finish_chunk(self, gen: Any) -> str:
        raise NotImplementedError

    def usage(self) -> dict[str, int]:
        raise NotImplementedError

    def usage_version(self) -> int:
        raise NotImplementedError

    def reply(self) -> Response:
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------
    def close(self) -> None:
        """Free the generation slots and any capture slot still open (idempotent): also run after
        a stream whose body never started because the client left first."""
        if self.lease is not None:
            self.lease.release()
        self.abandon()

    def capture_or_abandon(self) -> None:
        """After a failure: what was generated is kept as an aborted (untrainable) turn, never lost silently."""
        if any(s.ids for s in self.samples):
            self.capture(aborted=True)
        else:
            self.abandon()

    def completion_tokens(self) -> int:
        return sum(len(s.ids) for s in self.samples)

    def chunk(self, choices: list[dict[str, Any]], version: int, **extra: Any) -> str:
        """One SSE event; `version` is that of the tokens it carries."""
        body = {"id": self.rid, "object": self.CHUNK_OBJECT, "created": self.created, "model": self.model,
                "system_fingerprint": f"clawloop-v{version}", "choices": choices, **extra}
        return f"data: {orjson.dumps(body).decode()}\n\n"

    def answer(self, choices: list[dict[str, Any]], version: int, **extra: Any) -> JSONResponse:
        """The whole reply (no stream), counted in the metrics."""
        usage = self.usage()
        self.gw.metrics.observe_request(200, time.perf_counter() - self.t0, usage["completion_tokens"], self.tenant)
        return FastJSONResponse({"id": self.rid, "object": self.OBJECT, "created": self.created, "model": self.model,
                             "choices": choices, "usage": usage, "system_fingerprint": f"clawloop-v{version}",
                             **extra}, headers={"X-Policy-Version": str(version)})

    def spawn(self, q: asyncio.Queue, run: Callable[[Any], Awaitable[None]]) -> None:
        """One task per sample running `run(sample)`; each puts its closing `None` (or its exception) in `q`."""
        async def produce(s: Any) -> None:
            try:
                await run(s)
                await q.put(None)
            except BaseException as e:
                await q.put(e)
                raise

        self.tasks = [asyncio.create_task(produce(s)) for s in self.samples]

    async def respond(self, stream: bool) -> Response:
        """The reply: a stream of SSE events (`stream`), else the whole body once generated."""
        if stream:
            # The headers leave before the first token: the version they name is the one at acceptance.
            return StreamingResponse(self.stream(), media_type="text/event-stream",
                                     headers={"X-Policy-Version": str(self.start_version), "Cache-Control": "no-cache"},
                                     background=BackgroundTask(self.close))
        return await self.complete()

    async def complete(self) -> Response:
        """Generate every sample under the deadline, capture, then the endpoint's `reply`."""
        gw = self.gw
        gw.inflight += 1
        try:
            async with asyncio.timeout_at(self.deadline):
                await self.generate()
            await self.capture_async()
        except EngineUnavailable as e:
            raise unavailable_error(e) from e  # close() below drops the capture slots
        except TimeoutError:  # the engine rows were cancelled with the gather
            gw.timeouts += 1
            self.capture_or_abandon()
            raise timeout_error(gw.cfg.serve.request_timeout_s) from None
        finally:
            gw.inflight -= 1
            self.close()
        return self.reply()

    async def stream(self) -> AsyncIterator[str]:
        """The SSE body: the endpoint's first events, then each sample's deltas as they come, its
        finish chunks, usage when asked, `[DONE]`. A failure after the headers left is one error
        event; what was streamed is kept as an aborted turn."""
        gw = self.gw
        gw.inflight += 1
        status = 200
        q: asyncio.Queue = asyncio.Queue()
        # The deadline is one timer that drops a marker in the queue: nothing per chunk.
        timer = (asyncio.get_running_loop().call_at(self.deadline, q.put_nowait, TIMED_OUT)
                 if self.deadline is not None else None)
        try:
            async for text in self.start(q):
                yield text
            async for text in drain(q, len(self.tasks), gw.cfg.serve.stream_interval_ms / 1000):
                yield text
            await self.capture_async()
            for s in self.samples:
                yield self.finish_chunk(s)
            if self.include_usage:
                yield self.chunk([], self.usage_version(), usage=self.usage())
            yield "data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            status = 499  # the client went away
            self.capture_or_abandon()
            raise
        except Exception as e:
            if isinstance(e, EngineUnavailable):
                status, err = 503, unavailable_error(e)
                log.warning("stream ended: %s", e)
            elif isinstance(e, TimeoutError):
                gw.timeouts += 1
                status, err = 504, timeout_error(gw.cfg.serve.request_timeout_s)
            else:
                status, err = 500, APIError(500, f"Generation failed (request id {self.rid}); the server log "
                                                 "has the details.", code="internal_error")
                log.exception("stream %s failed", self.rid)
            for t in self.tasks:  # stop generating before the turn is stored
                t.cancel()
            self.capture_or_abandon()  # what was streamed is kept (untrainable), never lost silently
            yield f"data: {json.dumps(err.body())}\n\n"
        finally:
            if timer is not None:
                timer.cancel()
            for t in self.tasks:
                if not t.done():
                    t.cancel()
                elif not t.cancelled():
                    t.exception()  # raised above already; retrieved so asyncio does not log it again
            gw.inflight -= 1
            self.close()
            gw.metrics.observe_request(status, time.perf_counter() - self.t0, self.completion_tokens(), self.tenant)
