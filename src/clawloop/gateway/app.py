"""The OpenAI-compatible gateway: FastAPI in front of an `Engine`, with capture.

    app = create_app(cfg, engine, store)      # store=None: no capture
    uvicorn.run(app, host=cfg.serve.host, port=cfg.serve.port)

Routes: POST /v1/chat/completions (streaming and not; `run_chat` serves it
and the other generation endpoints), POST /v1/completions (completions.py),
POST/GET/DELETE /v1/responses (responses.py), GET /v1/models[/{id}],
GET /health, GET /metrics, and the web dashboard at / with its /api/* (dashboard.py).
Errors use OpenAI's shape. Extension fields a
trainer-side client may send: `return_token_ids: true` adds the prompt ids,
each choice's sampled ids and logprobs and the policy version to the reply;
`session_id`, `turn_type`, `session_done` mirror the X-Session-* headers.
Every reply carries `X-Policy-Version`: the version of the tokens sent. A
stream's headers leave before its first token exists, so there (and in the
role chunk's `policy_version`) it is the engine's version when the request was
accepted; every later chunk's `system_fingerprint` is the version of the
tokens it carries, and the finish chunk (with `return_token_ids`) the turn's.

API keys are tenants (`--api-key NAME=KEY`): the tenant's name goes on every
turn it captures and its session ids are namespaced (`NAME/SESSION`), so one
tenant can neither link into nor read another's sessions.

Limits answer in OpenAI's error shape: a full generation queue or an
overloaded store is a 429 with `Retry-After`, a request past
`serve.request_timeout_s` a 504 (generation aborted, what was generated kept
as an aborted turn), an unexpected failure a 500 whose body carries only a
request id that the server log also has.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import inspect
import ipaddress
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from clawloop.config import api_key_tenants
from clawloop.engines.base import Engine, EngineUnavailable, GenerationRequest, SamplingParams, TokenEvent
from clawloop.gateway.capture import Capture, TurnSlot
from clawloop.gateway.constraints import build_constraint
from clawloop.gateway.dashboard import mount_dashboard
from clawloop.gateway.metrics import Metrics
from clawloop.gateway.protocol import APIError, ChatRequest, parse_chat_request, parse_json_body
from clawloop.gateway.render import (Detokenizer, TextStream, TokenPieces, ToolCallStream, content_chars,
                                     expand_images, image_policy, renderer_for)
from clawloop.records import TURN_MAIN, TURN_SIDE, Turn

log = logging.getLogger(__name__)

StatsFn = Callable[[], dict[str, float]]
RENDER_IN_THREAD_CHARS = 32_768
"""Prompts with more content than this are rendered off the event loop (tokenizing megabytes takes seconds)."""


def is_loopback(host: str) -> bool:
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, api_keys: list[str], insecure: bool) -> None:
    """Refuse to expose an unauthenticated server beyond this machine."""
    if not is_loopback(host) and not api_keys and not insecure:
        from clawloop.config import ConfigError

        raise ConfigError(
            f"serve.host: binding {host} exposes the API beyond this machine without an API key; "
            "pass --api-key KEY (or OPENCLAW_API_KEY), or --insecure if you really mean it")


class _Slots:
    """Generation slots: at most `capacity` choices generate at once; up to `max_queued` requests
    wait for slots in arrival order, and one more is refused with a 429."""

    def __init__(self, capacity: int, max_queued: int):
        self.capacity, self.max_queued = capacity, max_queued
        self.used = 0
        self.waiters: collections.deque[tuple[int, asyncio.Future]] = collections.deque()
        self.rejected = 0

    async def acquire(self, n: int, deadline: float | None) -> "_Lease":
        """Slots for `n` choices; TimeoutError past `deadline` (event-loop time) while queued."""
        n = min(n, self.capacity)
        if not self.waiters and self.used + n <= self.capacity:
            self.used += n
            return _Lease(self, n)
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
        return _Lease(self, n)

    def release(self, n: int) -> None:
        self.used -= n
        self._wake()

    def _wake(self) -> None:
        while self.waiters and self.used + self.waiters[0][0] <= self.capacity:
            n, fut = self.waiters.popleft()
            if not fut.done():
                self.used += n
                fut.set_result(None)


class _Lease:
    def __init__(self, slots: _Slots, n: int):
        self.slots, self.n = slots, n

    def release(self) -> None:
        if self.n:
            n, self.n = self.n, 0
            self.slots.release(n)


@dataclass
class _Choice:
    """One choice being generated: sampled ids, logprobs, and the text shown so far."""

    index: int
    detok: Detokenizer
    text: TextStream
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """The weight version of each sampled id (engines that swap weights mid-response differ within one)."""
    tops: list[list[tuple[int, float]] | None] = field(default_factory=list)
    finish_reason: str | None = None
    version: int | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    calls: ToolCallStream = field(default_factory=ToolCallStream)


class Gateway:
    def __init__(self, cfg: Any, engine: Engine, store: Any | None, *, stats: list[StatsFn] | None = None):
        self.cfg = cfg
        self.engine = engine
        self.tok = engine.tokenizer
        self.store = store
        self.capture = (Capture(store, cfg.capture.session_idle_timeout_s, cfg.capture.sweep_interval_s)
                        if store is not None and cfg.capture.enabled else None)
        self.metrics = Metrics()
        self.stats_fns: list[StatsFn] = [engine.stats]
        if self.capture is not None:
            self.stats_fns.append(self.capture.stats)
        self.stats_fns.extend(stats or [])
        self.metrics.add_stats(self.all_stats)
        self.inflight = 0
        self.requests = 0
        self.timeouts = 0
        self.store_refusals = 0
        self.started_at = time.time()
        self._eos = set(getattr(engine, "eos_token_ids", ()) or ())
        if self.tok.eos_token_id is not None:
            self._eos.add(self.tok.eos_token_id)
        self.renderer = renderer_for(self.tok)
        self.pieces = TokenPieces(self.tok)
        self.images = image_policy(engine)
        """True when the engine takes image parts, else why they are refused."""
        # Keys are compared as SHA-256 digests, all of them every time: no timing tells which one was close.
        self._keys = [(tenant, hashlib.sha256(key.encode()).digest())
                      for tenant, key in api_key_tenants(list(cfg.serve.api_keys))]
        self.slots = _Slots(cfg.serve.max_concurrent_generations, cfg.serve.max_queued_requests)
        # What this Capture's begin() takes beyond the basics (it grows: tenant, prompt ids, tools).
        self._begin_extras = (set(inspect.signature(self.capture.begin).parameters)
                              & {"tenant", "prompt_ids", "tools", "images"} if self.capture is not None else set())

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

    def session_of(self, request: Request, req: ChatRequest, tenant: str = "") -> tuple[str | None, str, bool]:
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

    async def render(self, req: ChatRequest, use_tools: bool, max_len: int) -> list[int]:
        tools = req.tools if use_tools else None
        chars = sum(content_chars(m.get("content")) for m in req.messages)
        chars += sum(len(c["function"]["arguments"]) for m in req.messages for c in m.get("tool_calls", ()))
        if tools:
            chars += len(json.dumps(tools))
        if (least := self.renderer.min_tokens(chars)) >= max_len:  # refused without tokenizing megabytes
            raise APIError(400, f"This model's maximum context length is {max_len} tokens; your messages "
                           f"use at least {least}.", param="messages", code="context_length_exceeded")
        try:
            if chars > RENDER_IN_THREAD_CHARS:
                return await asyncio.to_thread(self.renderer.render, req.messages, tools,
                                               continue_final=req.continue_final_message,
                                               add_generation_prompt=req.add_generation_prompt)
            return self.renderer.render(req.messages, tools, continue_final=req.continue_final_message,
                                        add_generation_prompt=req.add_generation_prompt)
        except Exception as e:  # a template that rejects the conversation (e.g. role order)
            import jinja2

            if isinstance(e, jinja2.TemplateError):  # the template's own message, written for users
                why = f": {e}"
            else:
                log.info("rendering the messages failed: %s: %s", type(e).__name__, e)
                why = f" ({type(e).__name__})"
            raise APIError(400, f"The messages could not be rendered with the model's chat template{why}",
                           param="messages", code="invalid_value") from None

    def check_store(self) -> None:
        """429 while the store's writer is too far behind (stores that can tell)."""
        overloaded = getattr(self.store, "overloaded", None) if self.capture is not None else None
        if callable(overloaded) and overloaded():
            self.store_refusals += 1
            raise APIError(429, "The server is storing turns slower than they arrive; retry shortly.",
                           code="capture_overloaded", headers={"Retry-After": "2"})

    def begin_capture(self, sid: str | None, turn_type: str, messages: list[dict[str, Any]], done: bool, *,
                      tenant: str, prompt_ids: list[int], tools: list[dict[str, Any]] | None,
                      images: list[Any] | None = None) -> TurnSlot | None:
        if self.capture is None:
            return None
        extras = {"tenant": tenant, "prompt_ids": prompt_ids, "tools": tools, "images": images or None}
        return self.capture.begin(sid, turn_type, messages, done,
                                  **{k: v for k, v in extras.items() if k in self._begin_extras})

    async def chat(self, request: Request) -> Response:
        self.requests += 1
        tenant = self.check_auth(request)
        body = parse_json_body(await self.read_body(request))
        return await self.run_chat(request, body, tenant)

    async def run_chat(self, request: Request, body: dict[str, Any], tenant: str, *,
                       session: tuple[str | None, str, bool] | None = None,
                       rid_prefix: str = "chatcmpl") -> Response:
        """Serve one chat-completions `body` (already authenticated): a `JSONResponse`, or a
        `StreamingResponse` of chat.completion.chunk SSE events. Other endpoints (/v1/responses)
        translate to and from this. `session`: (session id, turn type, done) decided by the
        caller instead of the headers/body."""
        t0 = time.perf_counter()
        timeout = self.cfg.serve.request_timeout_s
        deadline = asyncio.get_running_loop().time() + timeout if timeout > 0 else None
        max_len = self.cfg.model.max_model_len
        req = parse_chat_request(body, max_len, images=self.images)
        sid, turn_type, done = session if session is not None else self.session_of(request, req, tenant)
        use_tools = bool(req.tools) and req.tool_choice != "none"
        constraint = build_constraint(req, use_tools, self.cfg.serve.constrain_tool_calls)
        if req.logit_bias:
            vocab = max(len(self.tok), int(getattr(self.engine, "vocab_size", 0) or 0))
            if bad := [t for t in req.logit_bias if t >= vocab]:
                raise APIError(400, f"Invalid key in 'logit_bias': token id {bad[0]} is outside the vocabulary "
                               f"(size {vocab}).", param="logit_bias", code="invalid_value")
        prompt_ids = await self.render(req, use_tools, max_len)
        multimodal = None
        if req.images:  # placeholders expanded: the ids the engine sees and capture stores
            prompt_ids, multimodal = await expand_images(self.engine, prompt_ids, req.images)
        if len(prompt_ids) >= max_len:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens; your messages "
                           f"use {len(prompt_ids)}.", param="messages", code="context_length_exceeded")
        max_tokens = min(req.max_tokens or self.cfg.serve.default_max_tokens, max_len - len(prompt_ids))
        if not getattr(self.engine, "available", True):
            raise unavailable_error(EngineUnavailable("no inference engine replica is available; retry shortly"))
        self.check_store()
        try:
            lease = await self.slots.acquire(req.n, deadline)
        except TimeoutError:
            self.timeouts += 1
            raise timeout_error(timeout) from None
        try:
            slot = (None if req.store is False else  # the client asked that this exchange not be kept
                    self.begin_capture(sid, turn_type, req.messages, done, tenant=tenant, prompt_ids=prompt_ids,
                                       tools=req.tools if use_tools else None, images=req.images))
        except BaseException:
            lease.release()
            raise
        version = self.engine.policy_version
        rid = f"{rid_prefix}-{uuid.uuid4().hex}"
        choices = [_Choice(i, Detokenizer(self.tok), TextStream(req.stop, use_tools)) for i in range(req.n)]
        params = [SamplingParams(temperature=req.temperature, top_p=req.top_p, max_tokens=max_tokens,
                                 seed=None if req.seed is None else choice_seed(req.seed, i),
                                 top_logprobs=req.top_logprobs, presence_penalty=req.presence_penalty,
                                 frequency_penalty=req.frequency_penalty, logit_bias=req.logit_bias,
                                 constraint=constraint) for i in range(req.n)]
        ctx = _Ctx(self, req, rid, prompt_ids, choices, params, slot, sid or req.prompt_cache_key, turn_type,
                   use_tools, t0,
                   tenant=tenant, lease=lease, deadline=deadline, start_version=version)
        ctx.multimodal = multimodal
        if req.stream:
            # The headers leave before the first token: the version they name is the one at acceptance.
            return StreamingResponse(ctx.stream(), media_type="text/event-stream",
                                     headers={"X-Policy-Version": str(version), "Cache-Control": "no-cache"},
                                     background=BackgroundTask(ctx.close))
        return await ctx.complete()


class _Ctx:
    """One chat request in flight."""

    def __init__(self, gw: Gateway, req: ChatRequest, rid: str, prompt_ids: list[int], choices: list[_Choice],
                 params: list[SamplingParams], slot: TurnSlot | None, sid: str | None, turn_type: str,
                 use_tools: bool, t0: float, *, tenant: str = "", lease: _Lease | None = None,
                 deadline: float | None = None, start_version: int = 0):
        self.gw, self.req, self.rid, self.prompt_ids = gw, req, rid, prompt_ids
        self.choices, self.params, self.slot = choices, params, slot
        self.sid, self.turn_type, self.use_tools, self.t0 = sid, turn_type, use_tools, t0
        self.tenant, self.lease, self.deadline = tenant, lease, deadline
        self.start_version = start_version
        """The engine's version when the request was accepted (a stream's headers and role chunk)."""
        self.created = int(time.time())
        self.model = req.model or gw.cfg.serve.served_model_name
        self.captured = False
        self.multimodal: Any = None
        """The engine's pixel inputs for the prompt's images (None: text only)."""

    def close(self) -> None:
        """Free the generation slots and the capture slot if nothing else did (idempotent): also
        run after a stream whose body never started because the client left first."""
        if self.lease is not None:
            self.lease.release()
        self.abandon()

    # -- per-token work ----------------------------------------------------
    def _lp_entry(self, tid: int, lp: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        pieces = self.gw.pieces
        e: dict[str, Any] = {"token": pieces.text(tid), "logprob": lp, "bytes": pieces.bytes(tid)}
        e["top_logprobs"] = [{"token": pieces.text(t), "logprob": l, "bytes": pieces.bytes(t)} for t, l in (top or [])]
        return e

    def on_event(self, c: _Choice, ev: TokenEvent) -> str:
        """Record one sampled token; return the content now safe to show."""
        if c.version is None:
            c.version = ev.policy_version
        delta = ""
        if ev.token_id is not None:
            c.ids.append(ev.token_id)
            c.logprobs.append(ev.logprob)
            c.versions.append(ev.policy_version)
            c.tops.append(ev.top_logprobs)
            delta = c.detok.push(ev.token_id)
        if ev.version_spans:
            for start, end, v in ev.version_spans:  # the engine's own account overrides what we saw live
                for k in range(max(0, start), min(end, len(c.versions))):
                    c.versions[k] = v
            c.version = c.versions[0] if c.versions else c.version
        if ev.finish_reason is not None:
            c.finish_reason = ev.finish_reason
            delta += c.detok.flush()
        out = c.text.feed(delta, final=ev.finish_reason is not None)
        if c.text.stopped:
            c.finish_reason = "stop"
        return out

    def finalize(self, c: _Choice) -> tuple[str, list[dict[str, Any]]]:
        """Split tool calls off the held-back tail: (tail content to show, tool-call deltas not yet
        streamed)."""
        if c.finish_reason is None:
            c.finish_reason = "stop"
        sent = c.text.sent
        rest = c.text.text[sent:]
        c.text.sent = len(c.text.text)
        owed: list[dict[str, Any]] = []
        if self.use_tools:
            if c.text.in_tool:
                c.calls.feed(c.text.text)  # a reply that was not streamed: the same calls a stream would have
            rest_content, calls, owed = c.calls.finish(rest, offset=sent)
            if calls:
                c.tool_calls = calls
                if c.finish_reason != "length":
                    c.finish_reason = "tool_calls"
                rest = rest_content.strip()
                full = (c.text.text[:sent] + rest_content).strip()
                c.content = full or None
                return rest, owed
        c.content = c.text.text
        return rest, owed

    def tool_deltas(self, c: _Choice) -> list[dict[str, Any]]:
        """Tool-call deltas ready to stream (arguments as they are generated)."""
        return c.calls.feed(c.text.text) if self.use_tools and c.text.in_tool else []

    async def run_choice(self, c: _Choice, on_delta: Callable[..., Any] | None = None) -> None:
        n_before = 0
        agen = self.gw.engine.generate(GenerationRequest(self.prompt_ids, self.params[c.index], self.rid,
                                                         session_id=self.sid, multimodal=self.multimodal))
        try:
            async for ev in agen:
                delta = self.on_event(c, ev)
                if on_delta is not None and (delta or len(c.ids) > n_before):
                    await on_delta(c, delta, n_before, self.tool_deltas(c))
                    n_before = len(c.ids)
                if c.text.stopped:
                    break
        finally:
            await agen.aclose()

    # -- capture -------------------------------------------------------------
    def capture(self, aborted: bool = False) -> None:
        if self.slot is None or self.captured:
            return
        self.captured = True
        turns = []
        for c in self.choices:
            first = c.version if c.version is not None else self.start_version
            mixed = any(v != first for v in c.versions)
            turns.append(Turn(
                session_id=self.slot.session_id, index=self.slot.index, type=self.turn_type,
                messages=self.req.messages, tools=self.req.tools if self.use_tools else None,
                prompt_ids=list(self.prompt_ids), response_ids=list(c.ids), response_logprobs=list(c.logprobs),
                response_text=c.content if c.content is not None else c.text.text,
                tool_calls=c.tool_calls or None, finish_reason="abort" if aborted else (c.finish_reason or "stop"),
                policy_version=min(c.versions) if mixed else first,
                response_versions=list(c.versions) if mixed else None,
                trainable=self.turn_type == TURN_MAIN and not aborted,
                tenant=self.tenant,
                sampling=self.sampling_record(c.index),
                request_id=self.rid, choice_index=c.index,
            ))
        self.gw.capture.finish(self.slot, turns)

    def sampling_record(self, index: int) -> dict[str, Any]:
        """How choice `index` was sampled, for the trainer: `logprobs` "raw" (the model at temperature 1)
        or "constrained" (renormalised over the ids a grammar allowed; `constraint` says which: the
        response format and/or the tool choice). Penalties and logit bias shaped sampling only."""
        p, req = self.params[index], self.req
        rec: dict[str, Any] = {"temperature": req.temperature, "top_p": req.top_p, "seed": p.seed,
                               "logprobs": "constrained" if p.constraint is not None else "raw"}
        if p.constraint is not None:
            rec["constraint"] = {"response_format": req.response_format["type"] if req.response_format else None,
                                 "tool_choice": (req.tool_choice if self.use_tools and
                                                 self.gw.cfg.serve.constrain_tool_calls else None),
                                 "parallel_tool_calls": req.parallel_tool_calls}
        for key in ("presence_penalty", "frequency_penalty"):
            if getattr(p, key):
                rec[key] = getattr(p, key)
        if p.logit_bias:
            rec["logit_bias"] = {str(k): v for k, v in p.logit_bias.items()}
        client = {k: v for k, v in (("user", req.user), ("metadata", req.metadata),
                                    ("prompt_cache_key", req.prompt_cache_key),
                                    ("safety_identifier", req.safety_identifier)) if v}
        if client:
            rec["client"] = client
        return rec

    def abandon(self) -> None:
        if self.slot is not None and not self.captured:
            self.captured = True
            self.gw.capture.abandon(self.slot)

    def capture_or_abandon(self) -> None:
        """After a failure: what was generated is kept as an aborted (untrainable) turn, never lost silently."""
        if any(c.ids for c in self.choices):
            self.capture(aborted=True)
        else:
            self.abandon()

    # -- bodies --------------------------------------------------------------
    def _usage(self) -> dict[str, int]:
        completion = sum(len(c.ids) for c in self.choices)
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": completion,
                "total_tokens": len(self.prompt_ids) + completion}

    def _logprobs_block(self, c: _Choice, start: int, end: int) -> dict[str, Any]:
        entries = []
        for k in range(start, end):
            tid = c.ids[k]
            if tid in self.gw._eos and k == len(c.ids) - 1 and c.finish_reason is not None:
                continue  # the end-of-turn token is not content
            entries.append(self._lp_entry(tid, c.logprobs[k], c.tops[k] if self.req.top_logprobs else None))
        return {"content": entries, "refusal": None}

    async def complete(self) -> Response:
        gw = self.gw
        gw.inflight += 1
        try:
            async with asyncio.timeout_at(self.deadline):
                await asyncio.gather(*(self.run_choice(c) for c in self.choices))
            for c in self.choices:
                self.finalize(c)
            self.capture()
        except EngineUnavailable as e:
            self.abandon()
            raise unavailable_error(e) from e
        except TimeoutError:  # the engine rows were cancelled with the gather
            gw.timeouts += 1
            self.capture_or_abandon()
            raise timeout_error(gw.cfg.serve.request_timeout_s) from None
        except BaseException:
            self.abandon()
            raise
        finally:
            gw.inflight -= 1
            self.close()
        choices = []
        for c in self.choices:
            msg: dict[str, Any] = {"role": "assistant", "content": c.content}
            if c.tool_calls:
                msg["tool_calls"] = c.tool_calls
            ch: dict[str, Any] = {"index": c.index, "message": msg, "finish_reason": c.finish_reason,
                                  "logprobs": self._logprobs_block(c, 0, len(c.ids)) if self.req.logprobs else None}
            if self.req.return_token_ids:
                ch["token_ids"] = c.ids
                ch["token_logprobs"] = c.logprobs
                ch["token_versions"] = c.versions  # differ only where a publish fell mid-response (vLLM)
            choices.append(ch)
        version = self.choices[0].version if self.choices[0].version is not None else self.start_version
        body: dict[str, Any] = {"id": self.rid, "object": "chat.completion", "created": self.created,
                                "model": self.model, "choices": choices, "usage": self._usage(),
                                "system_fingerprint": f"clawloop-v{version}"}
        if self.req.return_token_ids:
            body["prompt_token_ids"] = self.prompt_ids
            body["policy_version"] = version
        gw.metrics.observe_request(200, time.perf_counter() - self.t0, self._usage()["completion_tokens"],
                                   self.tenant)
        return JSONResponse(body, headers={"X-Policy-Version": str(version)})

    def _chunk(self, choices: list[dict[str, Any]], version: int, **extra: Any) -> str:
        """One SSE event; `version` is that of the tokens it carries."""
        body = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "system_fingerprint": f"clawloop-v{version}", "choices": choices, **extra}
        return f"data: {json.dumps(body, separators=(',', ':'))}\n\n"

    def _version(self, c: _Choice) -> int:
        return c.version if c.version is not None else self.start_version

    async def stream(self) -> AsyncIterator[str]:
        gw = self.gw
        gw.inflight += 1
        status = 200
        q: asyncio.Queue = asyncio.Queue()
        first: dict[str, Any] = {}
        if self.req.return_token_ids:
            first = {"prompt_token_ids": self.prompt_ids, "policy_version": self.start_version}
        tasks: list[asyncio.Task] = []
        # The deadline is one timer that drops a marker in the queue: nothing per chunk.
        timer = (asyncio.get_running_loop().call_at(self.deadline, q.put_nowait, _TIMED_OUT)
                 if self.deadline is not None else None)
        try:
            async def on_delta(c: _Choice, delta: str, start: int, calls: list[dict[str, Any]]) -> None:
                d: dict[str, Any] = {"content": delta} if delta else {}
                if calls:
                    d["tool_calls"] = calls
                await q.put(self._delta_chunk(c, d, start, len(c.ids)))

            async def run(c: _Choice) -> None:
                try:
                    await self.run_choice(c, on_delta)
                    start = len(c.ids)
                    tail, owed = self.finalize(c)
                    delta: dict[str, Any] = {}
                    if tail:
                        delta["content"] = tail
                    if owed:
                        delta["tool_calls"] = owed
                    if delta:
                        await q.put(self._delta_chunk(c, delta, start, start))
                    await q.put(None)
                except BaseException as e:
                    await q.put(e)
                    raise

            # Generation starts before the role chunks go out, so the prefill overlaps sending them.
            tasks = [asyncio.create_task(run(c)) for c in self.choices]
            for c in self.choices:
                yield self._chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                                    "logprobs": None, "finish_reason": None}], self.start_version, **first)
            async for text in drain(q, len(tasks)):
                yield text
            self.capture()
            for c in self.choices:
                fin: dict[str, Any] = {"index": c.index, "delta": {}, "logprobs": None,
                                       "finish_reason": c.finish_reason}
                if self.req.return_token_ids:
                    fin["policy_version"] = self._version(c)  # the turn's, after the engine's final account
                yield self._chunk([fin], self._version(c))
            if self.req.include_usage:
                yield self._chunk([], self._version(self.choices[0]), usage=self._usage())
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
            for t in tasks:  # stop generating before the turn is stored
                t.cancel()
            self.capture_or_abandon()  # what was streamed is kept (untrainable), never lost silently
            yield f"data: {json.dumps(err.body())}\n\n"
        finally:
            if timer is not None:
                timer.cancel()
            for t in tasks:
                if not t.done():
                    t.cancel()
                elif not t.cancelled():
                    t.exception()  # raised above already; retrieved so asyncio does not log it again
            gw.inflight -= 1
            self.close()
            gw.metrics.observe_request(status, time.perf_counter() - self.t0,
                                       sum(len(c.ids) for c in self.choices), self.tenant)

    def _delta_chunk(self, c: _Choice, delta: dict[str, Any], start: int, end: int) -> str:
        ch: dict[str, Any] = {"index": c.index, "delta": delta, "finish_reason": None,
                              "logprobs": self._logprobs_block(c, start, end) if self.req.logprobs else None}
        if self.req.return_token_ids:
            ch["token_ids"] = c.ids[start:end]
            ch["token_logprobs"] = c.logprobs[start:end]
            ch["token_versions"] = c.versions[start:end]
        return self._chunk([ch], c.versions[end - 1] if end > start else self._version(c))


def choice_seed(seed: int, index: int) -> int:
    """Choice `index`'s seed: `seed + index`, wrapped to stay a signed 64-bit integer."""
    return (seed + index + 2**63) % 2**64 - 2**63


_TIMED_OUT = object()
"""Put in a stream's queue when its request's deadline passes."""


async def drain(q: asyncio.Queue, producers: int) -> AsyncIterator[str]:
    """A stream's SSE text from the queue its `producers` choice tasks fill, until each has put its
    closing `None`; what is ready is coalesced into one write. A task's exception, or `_TIMED_OUT`
    (TimeoutError), is raised here."""
    remaining = producers
    while remaining:
        items = [await q.get()]
        while not q.empty():
            items.append(q.get_nowait())
        out = []
        for item in items:
            if item is None:
                remaining -= 1
            elif item is _TIMED_OUT:
                raise TimeoutError
            elif isinstance(item, BaseException):
                raise item
            else:
                out.append(item)
        if out:
            yield "".join(out)


def timeout_error(timeout_s: float) -> APIError:
    return APIError(504, f"The request took longer than the server's limit of {timeout_s:g} s and was stopped "
                    "(serve.request_timeout_s).", code="timeout")


def unavailable_error(e: EngineUnavailable) -> APIError:
    return APIError(503, f"The model is temporarily unavailable: {e}", code="engine_unavailable",
                    headers={"Retry-After": str(max(1, int(round(e.retry_after_s))))})


def create_app(cfg: Any, engine: Engine, store: Any | None = None, *, stats: list[StatsFn] | None = None,
               manage_engine: bool = True, background: list[Callable[[], Any]] | None = None) -> FastAPI:
    """The gateway app. `store=None` serves without capture. With
    `manage_engine` the app starts and stops the engine in its lifespan.
    `background` coroutine factories run beside the server (judge, trainer)."""
    gw = Gateway(cfg, engine, store, stats=stats)
    background = list(background or [])  # the dashboard's history sampler joins them below

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        if manage_engine:
            await engine.start()
        tasks = []
        if gw.capture is not None:
            tasks.append(asyncio.create_task(gw.capture.run_sweeper()))
        for factory in background:
            tasks.append(asyncio.create_task(factory()))
        try:
            yield
        finally:
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await t
            if store is not None:
                await asyncio.get_running_loop().run_in_executor(None, store.flush)
            if manage_engine:
                await engine.stop()

    app = FastAPI(title="clawloop", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gw

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        gw.metrics.observe_request(e.status, 0.0, 0, getattr(request.state, "tenant", ""))
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        code = "not_found" if e.status_code == 404 else None
        msg = f"Unknown route {request.method} {request.url.path}" if e.status_code == 404 else str(e.detail)
        return JSONResponse(APIError(e.status_code, msg, code=code).body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        # The exception's text may hold anything (paths, prompts, keys): it goes to the log, under an id
        # the client gets instead.
        rid = f"req_{uuid.uuid4().hex[:24]}"
        log.exception("request %s (%s %s) failed", rid, request.method, request.url.path)
        gw.metrics.observe_request(500, 0.0, 0, getattr(request.state, "tenant", ""))
        err = APIError(500, f"The server had an error processing your request (request id {rid}); the server "
                            "log has the details.", code="internal_error")
        return JSONResponse(err.body(), status_code=500, headers={"X-Request-Id": rid})

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await gw.chat(request)

    # Legacy completions and the Responses API (their own modules; they import this one).
    from clawloop.gateway.completions import serve_completions
    from clawloop.gateway.responses import ResponsesAPI

    responses_api = ResponsesAPI(gw)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serve_completions(gw, request)

    @app.post("/v1/responses")
    async def responses_create(request: Request) -> Response:
        return await responses_api.create(request)

    @app.get("/v1/responses/{response_id}")
    async def responses_get(request: Request, response_id: str) -> Response:
        return await responses_api.retrieve(request, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def responses_delete(request: Request, response_id: str) -> Response:
        return await responses_api.delete(request, response_id)

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str) -> JSONResponse:
        gw.check_auth(request)
        if model_id != cfg.serve.served_model_name:
            raise APIError(404, f"The model '{model_id}' does not exist.", param="model", code="model_not_found",
                           type="invalid_request_error")
        return JSONResponse({"id": model_id, "object": "model", "created": int(gw.started_at),
                             "owned_by": "clawloop", "policy_version": engine.policy_version})

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        gw.check_auth(request)
        return JSONResponse({"object": "list", "data": [{
            "id": cfg.serve.served_model_name, "object": "model", "created": int(gw.started_at),
            "owned_by": "clawloop", "policy_version": engine.policy_version}]})

    @app.get("/health")
    async def health() -> JSONResponse:
        body: dict[str, Any] = {"status": "ok", "policy_version": engine.policy_version, "inflight": gw.inflight}
        if hasattr(engine, "health"):  # engines with replicas: each one's state; degraded when one is down
            body.update(engine.health())
            body["policy_version"] = engine.policy_version
        gate = {k[len("gate/"):]: v for k, v in gw.all_stats().items() if k.startswith("gate/")}
        if gate:  # the trainer's publish gate (trainer/gate.py): what it checked, refused, scored
            body["gate"] = gate
        code = 503 if body["status"] == "unavailable" else 200
        return JSONResponse(body, status_code=code, headers={"X-Policy-Version": str(engine.policy_version)})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        if cfg.serve.metrics_auth:
            gw.check_auth(request)
        data, ctype = gw.metrics.render()
        return Response(data, media_type=ctype)

    background.append(mount_dashboard(app, gw))  # the page at / and its /api/*
    return app
