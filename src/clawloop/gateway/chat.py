"""Chat completions, `POST /v1/chat/completions`: messages in, an assistant message out.

    create_app(...) registers it; `serve_chat(gw, request)` serves one request, and
    `run_chat(gw, request, body, tenant, ...)` serves an already-read body (the Responses API
    translates to and from it, so its rendering, limits and capture are exactly these).

The messages are rendered with the model's chat template once, here; the engine gets the ids and
never re-tokenizes. Each of the `n` choices is sampled with `seed + index` (`choice_seed`). A
stream's text is held back while it could still become a stop string or a tool call; tool calls
stream as their arguments are generated. A thinking model's reasoning (`serve.reasoning_parser`) is
split off as `reasoning_content` (streamed as reasoning deltas); the tool calls are read after it by
the family's tool parser (`serve.tool_parser`); a grammar constraint applies after the reasoning
(`constraints.after_reasoning`). Every choice is captured token-exact as one row of the
turn (`main` trains, `side` is stored only; `store: false` keeps nothing), with how it was sampled
(`sampling_record`). The extension fields and headers are in app.py's docstring.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from clawloop.engines.base import GenerationRequest, SamplingParams
from clawloop.gateway.capture import TurnSlot
from clawloop.gateway.constraints import after_reasoning, build_constraint
from clawloop.gateway.parsers import ReasoningSplit, ToolStream
from clawloop.gateway.protocol import APIError, ChatRequest, parse_chat_request
from clawloop.gateway.render import (Detokenizer, TextStream, content_chars, expand_images, finish_text,
                                    reasoning_end)
from clawloop.gateway.serving import Gateway, Generation, InFlight, Lease, OnDelta, choice_seed, generate
from clawloop.records import TURN_MAIN, Turn

log = logging.getLogger(__name__)

RENDER_IN_THREAD_CHARS = 32_768
"""Prompts with more content than this are rendered off the event loop (tokenizing megabytes takes seconds)."""


async def serve_chat(gw: Gateway, request: Request) -> Response:
    """POST /v1/chat/completions."""
    tenant, body = await gw.accept(request)
    return await run_chat(gw, request, body, tenant)


async def run_chat(gw: Gateway, request: Request, body: dict[str, Any], tenant: str, *,
                   session: tuple[str | None, str, bool] | None = None, rid_prefix: str = "chatcmpl") -> Response:
    """Serve one chat-completions `body` (already authenticated): a `JSONResponse`, or a
    `StreamingResponse` of chat.completion.chunk SSE events. Other endpoints (/v1/responses)
    translate to and from this. `session`: (session id, turn type, done) decided by the
    caller instead of the headers/body."""
    t0 = time.perf_counter()
    deadline = gw.deadline()
    max_len = gw.cfg.model.max_model_len
    req = parse_chat_request(body, max_len, images=gw.images)
    sid, turn_type, done = session if session is not None else gw.session_of(request, req, tenant)
    use_tools = bool(req.tools) and req.tool_choice != "none"
    constraint = build_constraint(req, use_tools, gw.cfg.serve.constrain_tool_calls, gw.cfg.serve.json_whitespace,
                                  tools=gw.tool_parser)
    if req.logit_bias:
        vocab = max(len(gw.tok), int(getattr(gw.engine, "vocab_size", 0) or 0))
        if bad := [t for t in req.logit_bias if t >= vocab]:
            raise APIError(400, f"Invalid key in 'logit_bias': token id {bad[0]} is outside the vocabulary "
                           f"(size {vocab}).", param="logit_bias", code="invalid_value")
    prompt_ids = await render_messages(gw, req, use_tools, max_len)
    multimodal = None
    if req.images:  # placeholders expanded: the ids the engine sees and capture stores
        prompt_ids, multimodal = await expand_images(gw.engine, prompt_ids, req.images)
    if len(prompt_ids) >= max_len:
        raise APIError(400, f"This model's maximum context length is {max_len} tokens; your messages "
                       f"use {len(prompt_ids)}.", param="messages", code="context_length_exceeded")
    thinking = gw.thinking_state(prompt_ids)
    constraint = after_reasoning(constraint, gw.reasoning_parser, thinking)
    max_tokens = min(req.max_tokens or gw.cfg.serve.default_max_tokens, max_len - len(prompt_ids))
    lease = await gw.admit(req.n, deadline)
    try:
        slot = (None if req.store is False else  # the client asked that this exchange not be kept
                await gw.begin_capture(sid, turn_type, req.messages, done, tenant=tenant, prompt_ids=prompt_ids,
                                 tools=req.tools if use_tools else None, images=req.images))
    except BaseException:
        lease.release()
        raise
    params = [SamplingParams(temperature=req.temperature, top_p=req.top_p, max_tokens=max_tokens,
                             seed=None if req.seed is None else choice_seed(req.seed, i),
                             top_logprobs=req.top_logprobs, presence_penalty=req.presence_penalty,
                             frequency_penalty=req.frequency_penalty, logit_bias=req.logit_bias,
                             min_tokens=req.min_tokens,
                             constraint=constraint, close_within=gw.cfg.serve.close_json_tokens if constraint else 0)
              for i in range(req.n)]
    ctx = ChatCompletion(gw, req, f"{rid_prefix}-{uuid.uuid4().hex}", prompt_ids, params, slot,
                         sid or req.prompt_cache_key, turn_type, use_tools, tenant=tenant, t0=t0, deadline=deadline,
                         lease=lease, multimodal=multimodal, thinking=thinking)
    return await ctx.respond(req.stream)


async def render_messages(gw: Gateway, req: ChatRequest, use_tools: bool, max_len: int) -> list[int]:
    """The prompt ids of `req`'s messages (and tools) under the model's chat template; a 400 for a
    conversation the template rejects or one that cannot fit."""
    tools = req.tools if use_tools else None
    chars = sum(content_chars(m.get("content")) for m in req.messages)
    chars += sum(len(c["function"]["arguments"]) for m in req.messages for c in m.get("tool_calls", ()))
    if tools:
        chars += len(json.dumps(tools))
    if (least := gw.renderer.min_tokens(chars)) >= max_len:  # refused without tokenizing megabytes
        raise APIError(400, f"This model's maximum context length is {max_len} tokens; your messages "
                       f"use at least {least}.", param="messages", code="context_length_exceeded")
    try:
        if chars > RENDER_IN_THREAD_CHARS:
            return await asyncio.to_thread(gw.renderer.render, req.messages, tools,
                                           continue_final=req.continue_final_message,
                                           add_generation_prompt=req.add_generation_prompt)
        return gw.renderer.render(req.messages, tools, continue_final=req.continue_final_message,
                                  add_generation_prompt=req.add_generation_prompt)
    except Exception as e:  # a template that rejects the conversation (e.g. role order)
        import jinja2  # only here, on a failure: it comes with the tokenizer's templates (transformers), not ours

        if isinstance(e, jinja2.TemplateError):  # the template's own message, written for users
            why = f": {e}"
        else:
            log.info("rendering the messages failed: %s: %s", type(e).__name__, e)
            why = f" ({type(e).__name__})"
        raise APIError(400, f"The messages could not be rendered with the model's chat template{why}",
                       param="messages", code="invalid_value") from None


@dataclass(kw_only=True)
class ChatChoice(Generation):
    """One choice being generated, with the tool calls split off its text."""

    index: int
    content: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    calls: ToolStream | None = None


class ChatCompletion(InFlight):
    """One chat request in flight."""

    OBJECT = "chat.completion"
    CHUNK_OBJECT = "chat.completion.chunk"

    def __init__(self, gw: Gateway, req: ChatRequest, rid: str, prompt_ids: list[int], params: list[SamplingParams],
                 slot: TurnSlot | None, sid: str | None, turn_type: str, use_tools: bool, *, tenant: str, t0: float,
                 deadline: float | None, lease: Lease | None, multimodal: Any = None, thinking: bool | None = None):
        super().__init__(gw, rid, req.model, tenant=tenant, t0=t0, deadline=deadline, lease=lease,
                         include_usage=req.include_usage)
        self.req, self.prompt_ids, self.params, self.slot = req, prompt_ids, params, slot
        self.sid, self.turn_type, self.use_tools = sid, turn_type, use_tools
        self.multimodal = multimodal
        """The engine's pixel inputs for the prompt's images (None: text only)."""
        self.was_captured = False
        think = gw.reasoning_parser
        self.samples: list[ChatChoice] = [  # thinking: None without a reasoning parser, else whether it starts inside
            ChatChoice(index=i, detok=Detokenizer(gw.tok, gw.marker_ids),
                       text=TextStream(req.stop, gw.tool_parser if use_tools else None,
                                       ReasoningSplit(think, thinking) if think is not None and thinking is not None
                                       else None),
                       calls=ToolStream(gw.tool_parser)) for i in range(req.n)]

    def _version(self, c: ChatChoice) -> int:
        return c.version if c.version is not None else self.start_version

    # -- per-token work ----------------------------------------------------
    def _lp_entry(self, tid: int, lp: float, top: list[tuple[int, float]] | None) -> dict[str, Any]:
        pieces = self.gw.pieces
        e: dict[str, Any] = {"token": pieces.text(tid), "logprob": lp, "bytes": pieces.bytes(tid)}
        e["top_logprobs"] = [{"token": pieces.text(t), "logprob": l, "bytes": pieces.bytes(t)} for t, l in (top or [])]
        return e

    def finalize(self, c: ChatChoice) -> tuple[str, list[dict[str, Any]]]:
        """Split tool calls off the held-back tail: (tail content to show, tool-call deltas not yet
        streamed)."""
        if c.finish_reason is None:
            c.finish_reason = "stop"
        rest, c.content, calls, owed = finish_text(c.text, c.calls if self.use_tools else None)
        if calls:
            c.tool_calls = calls
            if c.finish_reason != "length":
                c.finish_reason = "tool_calls"
        return rest, owed

    def tool_deltas(self, c: ChatChoice) -> list[dict[str, Any]]:
        """Tool-call deltas ready to stream (arguments as they are generated)."""
        return c.calls.feed(c.text.text[c.text.tool_start:]) if self.use_tools and c.text.in_tool else []

    async def run_choice(self, c: ChatChoice, on_delta: OnDelta | None = None) -> None:
        await generate(self.gw.engine, GenerationRequest(self.prompt_ids, self.params[c.index], self.rid,
                                                         session_id=self.sid, multimodal=self.multimodal),
                       c, on_delta)

    async def generate(self) -> None:
        await asyncio.gather(*(self.run_choice(c) for c in self.samples))
        for c in self.samples:
            self.finalize(c)

    # -- capture -------------------------------------------------------------
    def captured(self, aborted: bool = False) -> list[tuple[TurnSlot, list[Turn]]]:
        if self.slot is None or self.was_captured:
            return []
        self.was_captured = True
        turns = []
        for c in self.samples:
            policy_version, response_versions = c.turn_versions(self._version(c))
            turns.append(Turn(
                session_id=self.slot.session_id, index=self.slot.index, type=self.turn_type,
                messages=self.req.messages, tools=self.req.tools if self.use_tools else None,
                prompt_ids=list(self.prompt_ids), response_ids=list(c.ids), response_logprobs=list(c.logprobs),
                response_text=c.content if c.content is not None else c.text.text,
                tool_calls=c.tool_calls or None, finish_reason="abort" if aborted else (c.finish_reason or "stop"),
                reasoning=c.text.reasoning if c.text.split is not None and c.text.split.had_reasoning else None,
                reasoning_end=reasoning_end(self.gw.tok, c.ids, c.text.split, self.gw.reasoning_parser),
                policy_version=policy_version, response_versions=response_versions,
                trainable=self.turn_type == TURN_MAIN and not aborted,
                tenant=self.tenant,
                sampling=self.sampling_record(c.index),
                request_id=self.rid, choice_index=c.index,
            ))
        return [(self.slot, turns)]

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
        if p.min_tokens:
            rec["min_tokens"] = p.min_tokens
        client = {k: v for k, v in (("user", req.user), ("metadata", req.metadata),
                                    ("prompt_cache_key", req.prompt_cache_key),
                                    ("safety_identifier", req.safety_identifier)) if v}
        if client:
            rec["client"] = client
        return rec

    def abandon(self) -> None:
        if self.slot is not None and not self.was_captured:
            self.was_captured = True
            self.gw.capture.abandon(self.slot)

    # -- bodies --------------------------------------------------------------
    def usage(self) -> dict[str, Any]:
        completion = self.completion_tokens()
        u: dict[str, Any] = {"prompt_tokens": len(self.prompt_ids), "completion_tokens": completion,
                             "total_tokens": len(self.prompt_ids) + completion}
        if self.gw.reasoning_parser is not None:  # a thinking model: how many of them were reasoning
            u["completion_tokens_details"] = {"reasoning_tokens": sum(
                reasoning_end(self.gw.tok, c.ids, c.text.split, self.gw.reasoning_parser) or 0 for c in self.samples)}
        return u

    def usage_version(self) -> int:
        return self._version(self.samples[0])

    def _logprobs_block(self, c: ChatChoice, start: int, end: int) -> dict[str, Any]:
        entries = []
        for k in range(start, end):
            if c.is_final_eos(k, self.gw.eos):
                continue  # the end-of-turn token is not content
            entries.append(self._lp_entry(c.ids[k], c.logprobs[k], c.tops[k] if self.req.top_logprobs else None))
        return {"content": entries, "refusal": None}

    def reply(self) -> Response:
        choices = []
        for c in self.samples:
            msg: dict[str, Any] = {"role": "assistant", "content": c.content}
            if c.text.reasoning:
                msg["reasoning_content"] = c.text.reasoning
            if c.tool_calls:
                msg["tool_calls"] = c.tool_calls
            ch: dict[str, Any] = {"index": c.index, "message": msg, "finish_reason": c.finish_reason,
                                  "logprobs": self._logprobs_block(c, 0, len(c.ids)) if self.req.logprobs else None}
            if self.req.return_token_ids:
                ch["token_ids"] = c.ids
                ch["token_logprobs"] = c.logprobs
                ch["token_versions"] = c.versions  # differ only where a publish fell mid-response (vLLM)
            choices.append(ch)
        version = self.usage_version()
        extra = {"prompt_token_ids": self.prompt_ids, "policy_version": version} if self.req.return_token_ids else {}
        return self.answer(choices, version, **extra)

    async def start(self, q: asyncio.Queue) -> AsyncIterator[str]:
        first: dict[str, Any] = {}
        if self.req.return_token_ids:
            first = {"prompt_token_ids": self.prompt_ids, "policy_version": self.start_version}

        async def on_delta(c: ChatChoice, delta: str, start: int) -> None:
            d: dict[str, Any] = {"content": delta} if delta else {}
            if r := c.text.take_reasoning():
                d["reasoning_content"] = r
            if calls := self.tool_deltas(c):
                d["tool_calls"] = calls
            await q.put(self._delta_chunk(c, d, start, len(c.ids)))

        async def run(c: ChatChoice) -> None:
            await self.run_choice(c, on_delta)
            start = len(c.ids)
            tail, owed = self.finalize(c)
            delta: dict[str, Any] = {}
            if r := c.text.take_reasoning():
                delta["reasoning_content"] = r
            if tail:
                delta["content"] = tail
            if owed:
                delta["tool_calls"] = owed
            if delta:
                await q.put(self._delta_chunk(c, delta, start, start))

        # Generation starts before the role chunks go out, so the prefill overlaps sending them.
        self.spawn(q, run)
        for c in self.samples:
            yield self.chunk([{"index": c.index, "delta": {"role": "assistant", "content": ""},
                               "logprobs": None, "finish_reason": None}], self.start_version, **first)

    def finish_chunk(self, c: ChatChoice) -> str:
        fin: dict[str, Any] = {"index": c.index, "delta": {}, "logprobs": None, "finish_reason": c.finish_reason}
        if self.req.return_token_ids:
            fin["policy_version"] = self._version(c)  # the turn's, after the engine's final account
        return self.chunk([fin], self._version(c))

    def _delta_chunk(self, c: ChatChoice, delta: dict[str, Any], start: int, end: int) -> str:
        ch: dict[str, Any] = {"index": c.index, "delta": delta, "finish_reason": None,
                              "logprobs": self._logprobs_block(c, start, end) if self.req.logprobs else None}
        if self.req.return_token_ids:
            ch["token_ids"] = c.ids[start:end]
            ch["token_logprobs"] = c.logprobs[start:end]
            ch["token_versions"] = c.versions[start:end]
        return self.chunk([ch], c.versions[end - 1] if end > start else self._version(c))
