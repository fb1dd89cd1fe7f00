"""Legacy completions, `POST /v1/completions`: a raw prompt in, its continuation out.

    create_app(...) registers it; `serve_completions(gw, request)` serves one request.

The prompt is not rendered with the chat template: a string is tokenized as is (control-token
strings in it are control tokens: the client wrote its own template), a list of ids is used as
given. `prompt` may be a string, a list of strings, a list of ids or a list of lists of ids;
each prompt gets `n` choices, indexed `prompt * n + choice` as OpenAI does. Choice `j` of every
prompt is sampled with `seed + j`, so a batch answers each prompt as a request of its own would.

Departures from OpenAI, all deliberate:
- `max_tokens` defaults to 16 (OpenAI's legacy default) and may be 0 only with `echo` (scoring a
  prompt: its text and logprobs, nothing generated).
- `logprobs: k` (0..20) reports each token's logprob under the raw model (temperature 1, as chat
  does) and its top `k` alternatives; each `top_logprobs` dict also holds the sampled token (up
  to k+1 entries, as OpenAI documents). `text_offset` counts characters of the token strings
  into prompt + completion, so a reply without `echo` starts at the prompt's length. Every
  sampled token is listed except a final end-of-text token (a stop string's tokens included).
- `echo` with `logprobs` needs prompt logprobs, which engines do not report: they come from one
  forward pass of the engine's model (`engine.model`, the in-process engine); other engines
  refuse `echo`+`logprobs` with a 400 naming `echo`. The first prompt token has logprob null.
- `best_of` > n samples `best_of` per prompt and returns the `n` with the highest mean logprob
  per token (refused with `stream`, as OpenAI does); `suffix` (insertion) is refused.
- `presence_penalty`, `frequency_penalty`, `logit_bias` go to the engine's `SamplingParams`
  where it has those fields; an engine without them refuses non-default values by name.

Capture: completions have no chat messages, and the judge and the trainer work on chat turns,
so a completion is captured only when the request names a session (`X-Session-Id`,
`session_id`, `user`), and then always as a `side` turn (stored, never trained on): messages
`[{"role": "user", "content": PROMPT_TEXT}]`, the exact prompt and response ids, sampling
`endpoint: "completions"`. Without a session id, or with `store: false`, nothing is stored.
`prompt_cache_key` routes like a session id; `user` is a session id, as in chat. As in chat,
`return_token_ids: true` adds each choice's `prompt_token_ids`, `token_ids` and `token_logprobs`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from fastapi import Request
from fastapi.responses import Response

from clawloop.engines.base import GenerationRequest, SamplingParams
from clawloop.gateway.capture import TurnSlot
from clawloop.gateway.protocol import MAX_N, MAX_TOP_LOGPROBS, APIError, bad_value, number_field, parse_sampling
from clawloop.gateway.render import Detokenizer, TextStream
from clawloop.gateway.serving import Gateway, Generation, InFlight, Lease, OnDelta, choice_seed, generate
from clawloop.records import TURN_SIDE, Turn

DEFAULT_MAX_TOKENS = 16
"""OpenAI's default for legacy completions."""
MAX_PROMPTS = 64
MAX_CHOICES = 256
"""Prompts x best_of generated for one request at most."""
_KNOBS = {f.name for f in dataclasses.fields(SamplingParams)}


@dataclass
class CompletionRequest:
    prompts: list[list[int]]
    """Token ids of each prompt."""
    texts: list[str]
    """Each prompt's text (what `echo` shows)."""
    model: str = ""
    n: int = 1
    best_of: int = 1
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: int | None = None
    echo: bool = False
    stream: bool = False
    include_usage: bool = False
    knobs: dict[str, Any] = field(default_factory=dict)
    """presence_penalty / frequency_penalty / logit_bias for `SamplingParams`, when set."""
    return_token_ids: bool = False
    """clawloop's extension (as in chat): each choice carries its prompt's ids, its sampled ids and their logprobs."""
    store: bool = True
    """False: not captured even with a session id (as chat's `store: false`)."""
    prompt_cache_key: str | None = None
    """Routes like a session id (engines with replicas keep a key on one warm prefix cache)."""
    session_id: str | None = None
    turn_type: str | None = None
    session_done: bool = False
    user: str | None = None


def _prompts(raw: Any, tok: Any, vocab: int, min_tokens: Callable[[int], int],
             max_len: int) -> tuple[list[list[int]], list[str]]:
    """`prompt` in any of its four forms → (ids per prompt, text per prompt). `min_tokens(chars)`
    bounds a string's token count from below, so a hopeless one is refused without tokenizing it."""
    if raw is None:
        raise bad_value("Missing required parameter: 'prompt'.", "prompt", code="missing_required_parameter")
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, int) and not isinstance(x, bool) for x in raw):
        items = [raw]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise bad_value("Invalid value for 'prompt': expected a string, a list of strings, a list of token ids or a "
                   "list of lists of token ids (not empty).", "prompt")
    if len(items) > MAX_PROMPTS:
        raise bad_value(f"Invalid value for 'prompt': at most {MAX_PROMPTS} prompts per request.", "prompt")
    ids_out, texts = [], []
    for i, item in enumerate(items):
        p = "prompt" if items[0] is raw or isinstance(raw, str) else f"prompt[{i}]"
        if isinstance(item, str):
            if not item:
                raise bad_value(f"Invalid value for '{p}': the prompt is empty.", p)
            if (least := min_tokens(len(item))) >= max_len:
                raise APIError(400, f"This model's maximum context length is {max_len} tokens; your prompt uses "
                               f"at least {least}.", param="prompt", code="context_length_exceeded")
            ids = list(tok.encode(item, add_special_tokens=True))
            text = item
        elif isinstance(item, list) and item:
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in item):
                raise bad_value(f"Invalid value for '{p}': token ids must be integers.", p)
            bad = [t for t in item if not 0 <= t < vocab]
            if bad:
                raise bad_value(f"Invalid value for '{p}': token ids {bad[:5]} are outside the vocabulary "
                           f"(size {vocab}).", p)
            ids = list(item)
            text = tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        else:
            raise bad_value(f"Invalid value for '{p}': expected a non-empty string or list of token ids.", p)
        if not ids:
            raise bad_value(f"Invalid value for '{p}': the prompt has no tokens.", p)
        ids_out.append(ids)
        texts.append(text)
    return ids_out, texts


def parse_completion_request(body: dict[str, Any], tok: Any, vocab: int, max_len: int,
                             min_tokens: Callable[[int], int] = lambda n: 0) -> CompletionRequest:
    prompts, texts = _prompts(body.get("prompt"), tok, vocab, min_tokens, max_len)
    req = CompletionRequest(prompts=prompts, texts=texts)
    model = body.get("model", "")
    if not isinstance(model, str):
        raise bad_value("Invalid type for 'model': expected a string.", "model", code="invalid_type")
    req.model = model
    suffix = body.get("suffix")
    if suffix is not None and suffix != "":
        raise bad_value("'suffix' (insertion) is not supported by this server.", "suffix", code="unsupported_parameter")
    for key in ("stream", "echo", "return_token_ids"):
        v = body.get(key)
        if v is not None and not isinstance(v, bool):
            raise bad_value(f"Invalid type for '{key}': expected a boolean.", key, code="invalid_type")
    req.stream, req.echo = bool(body.get("stream")), bool(body.get("echo"))
    req.return_token_ids = bool(body.get("return_token_ids"))
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise bad_value("Invalid type for 'stream_options': expected an object.", "stream_options",
                       code="invalid_type")
        if not req.stream:
            raise bad_value("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        req.include_usage = bool(so.get("include_usage", False))
    req.n = number_field(body, "n", 1, MAX_N, 1, integer=True)
    req.best_of = number_field(body, "best_of", 1, MAX_N, req.n, integer=True)
    if req.best_of < req.n:
        raise bad_value(f"Invalid value for 'best_of': {req.best_of} is less than n ({req.n}).", "best_of")
    if req.best_of > req.n and req.stream:
        raise bad_value("'best_of' greater than 'n' cannot be streamed.", "best_of")
    if len(prompts) * req.best_of > MAX_CHOICES:
        raise bad_value(f"Too many completions in one request: {len(prompts)} prompts x {req.best_of} "
                   f"(at most {MAX_CHOICES}).", "prompt")
    req.max_tokens = number_field(body, "max_tokens", 0, max_len, DEFAULT_MAX_TOKENS, integer=True)
    if req.max_tokens == 0 and not req.echo:
        raise bad_value("Invalid value for 'max_tokens': 0 is only allowed with 'echo' (scoring the prompt).",
                   "max_tokens")
    req.temperature, req.top_p, req.stop, req.seed = parse_sampling(body)
    req.logprobs = number_field(body, "logprobs", 0, MAX_TOP_LOGPROBS, None, integer=True)
    for key in ("presence_penalty", "frequency_penalty"):
        v = number_field(body, key, -2.0, 2.0, 0.0)
        if v:
            if key not in _KNOBS:
                raise bad_value(f"'{key}' is not supported by this server's engine.", key, code="unsupported_parameter")
            req.knobs[key] = v
    least = number_field(body, "min_tokens", 0, req.max_tokens, 0, integer=True)
    if least:
        req.knobs["min_tokens"] = least
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise bad_value("Invalid type for 'logit_bias': expected an object of token id -> bias.", "logit_bias",
                       code="invalid_type")
        parsed: dict[int, float] = {}
        for k, v in bias.items():
            if not str(k).lstrip("-").isdigit() or not 0 <= int(k) < vocab:
                raise bad_value(f"Invalid key in 'logit_bias': {k!r} is not a token id of this model (0..{vocab - 1}).",
                           "logit_bias")
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                raise bad_value(f"Invalid value in 'logit_bias' for {k}: expected a number from -100 to 100.",
                           "logit_bias")
            parsed[int(k)] = float(v)
        if parsed:
            if "logit_bias" not in _KNOBS:
                raise bad_value("'logit_bias' is not supported by this server's engine.", "logit_bias",
                           code="unsupported_parameter")
            req.knobs["logit_bias"] = parsed
    if body.get("store") is not None and not isinstance(body["store"], bool):
        raise bad_value("Invalid type for 'store': expected a boolean.", "store", code="invalid_type")
    req.store = body.get("store") is not False
    for key in ("session_id", "user", "prompt_cache_key"):
        v = body.get(key)
        if v is not None and not isinstance(v, str):
            raise bad_value(f"Invalid type for '{key}': expected a string.", key, code="invalid_type")
    req.session_id = body.get("session_id") or None
    req.user = body.get("user") or None
    req.prompt_cache_key = body.get("prompt_cache_key") or None
    tt = body.get("turn_type")
    if tt is not None and tt not in ("main", "side"):
        raise bad_value(f"Invalid value for 'turn_type': {tt!r} (main or side).", "turn_type")
    req.turn_type = tt
    req.session_done = body.get("session_done", False) in (True, 1, "1", "true")
    return req


def can_score_prompts(engine: Any) -> bool:
    """Whether `engine` exposes an in-process torch model to compute prompt logprobs with."""
    import torch  # heavy: kept off the gateway's import path (engines out of process never need it)

    return isinstance(getattr(engine, "model", None), torch.nn.Module)


def prompt_logprobs(model: Any, ids: list[int], k: int) -> list[tuple[float, list[tuple[int, float]]]]:
    """For prompt tokens 1.. : (logprob of the token given the ones before, top-k alternatives),
    from one forward pass at temperature 1."""
    import torch  # heavy: see can_score_prompts

    if len(ids) < 2:
        return []
    device = next(model.parameters()).device
    with torch.inference_mode():
        x = torch.tensor([ids], dtype=torch.long, device=device)  # (1, T)
        logits = model(input_ids=x, use_cache=False).logits[0, :-1].float()  # (T-1, V)
        lp = torch.log_softmax(logits, dim=-1)
        chosen = lp.gather(1, x[0, 1:, None])[:, 0].cpu().tolist()  # (T-1,)
        if k:
            top_v, top_i = lp.topk(k, dim=-1)  # (T-1, k)
            tops = [list(zip(i, v)) for i, v in zip(top_i.cpu().tolist(), top_v.cpu().tolist())]
        else:
            tops = [[] for _ in chosen]
    return list(zip(chosen, tops))


@dataclass(kw_only=True)
class CompletionChoice(Generation):
    """One sampled completion of one prompt."""

    prompt: int
    j: int
    """Its place among its prompt's samples (seed + j)."""
    index: int = -1
    """The choice index it is returned as (-1: not returned, best_of)."""
    offset: int = 0
    """Characters of token strings reported so far (text_offset)."""

    def mean_logprob(self) -> float:
        return sum(self.logprobs) / len(self.logprobs) if self.logprobs else 0.0


class Completion(InFlight):
    """One /v1/completions request in flight."""

    OBJECT = CHUNK_OBJECT = "text_completion"

    def __init__(self, gw: Gateway, req: CompletionRequest, *, tenant: str, sid: str | None, done: bool,
                 t0: float, deadline: float | None, lease: Lease | None):
        super().__init__(gw, f"cmpl-{uuid.uuid4().hex}", req.model, tenant=tenant, t0=t0, deadline=deadline,
                         lease=lease, include_usage=req.include_usage)
        self.req, self.sid, self.done = req, sid, done
        max_len = gw.cfg.model.max_model_len
        self.max_tokens = [min(req.max_tokens, max_len - len(p)) for p in req.prompts]
        self.samples: list[CompletionChoice] = [
            CompletionChoice(prompt=i, j=j, detok=Detokenizer(gw.tok), text=TextStream(req.stop, False),
                             offset=0 if req.echo else len(req.texts[i]))
            for i in range(len(req.prompts)) for j in range(req.best_of)]
        if req.best_of == req.n:
            for g in self.samples:
                g.index = g.prompt * req.n + g.j
        self.echo_lps: list[list[tuple[float, list[tuple[int, float]]]]] = [[] for _ in req.prompts]
        self.slots: list[TurnSlot | None] = []

    # -- generation ------------------------------------------------------------
    def params(self, g: CompletionChoice) -> SamplingParams:
        r = self.req
        return SamplingParams(temperature=r.temperature, top_p=r.top_p, max_tokens=self.max_tokens[g.prompt],
                              seed=None if r.seed is None else choice_seed(r.seed, g.j),
                              top_logprobs=r.logprobs or 0, **r.knobs)

    async def run(self, g: CompletionChoice, on_delta: OnDelta | None = None) -> None:
        if self.max_tokens[g.prompt] <= 0:  # echo with max_tokens 0: scoring only
            g.finish_reason = "length"
            return
        await generate(self.gw.engine, GenerationRequest(self.req.prompts[g.prompt], self.params(g), self.rid,
                                                         session_id=self.sid or self.req.prompt_cache_key),
                       g, on_delta)
        if g.finish_reason is None:
            g.finish_reason = "stop"

    async def generate(self) -> None:
        await self.score_prompts()
        await asyncio.gather(*(self.run(g) for g in self.samples))

    async def score_prompts(self) -> None:
        """Prompt logprobs for `echo` + `logprobs`, from the engine's model (one forward per prompt)."""
        if not (self.req.echo and self.req.logprobs is not None):
            return
        engine = self.gw.engine
        for i, ids in enumerate(self.req.prompts):
            for _ in range(3):  # a publish during the pass may reload the model object: recompute then
                version = engine.policy_version
                lps = await asyncio.to_thread(prompt_logprobs, engine.model, ids, self.req.logprobs)
                if engine.policy_version == version:
                    break
            self.echo_lps[i] = lps

    def pick_best(self) -> None:
        """best_of > n: each prompt's `n` samples with the highest mean logprob per token."""
        if self.req.best_of == self.req.n:
            return
        for i in range(len(self.req.prompts)):
            mine = [g for g in self.samples if g.prompt == i]
            best = sorted(mine, key=lambda g: (-g.mean_logprob(), g.j))[:self.req.n]
            for rank, g in enumerate(sorted(best, key=lambda g: g.j)):
                g.index = i * self.req.n + rank

    # -- shapes ----------------------------------------------------------------
    def logprobs_block(self, g: CompletionChoice, start: int, end: int, *, echo: bool) -> dict[str, Any] | None:
        """Legacy logprobs for sampled tokens [start, end), preceded by the prompt's when `echo`."""
        if self.req.logprobs is None:
            return None
        pieces = self.gw.pieces
        k = self.req.logprobs
        block: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

        def add(tid: int, lp: float | None, top: list[tuple[int, float]] | None) -> None:
            text = pieces.text(tid)
            block["tokens"].append(text)
            block["token_logprobs"].append(lp)
            if lp is None:
                block["top_logprobs"].append(None)
            else:
                alts: dict[str, float] = {}
                for t, l in (top or [])[:k]:
                    alts.setdefault(pieces.text(t), l)
                alts.setdefault(text, lp)
                block["top_logprobs"].append(alts)
            block["text_offset"].append(g.offset)
            g.offset += len(text)

        if echo:
            ids = self.req.prompts[g.prompt]
            lps = self.echo_lps[g.prompt]
            for pos, tid in enumerate(ids):
                lp, top = lps[pos - 1] if pos else (None, None)
                add(tid, lp, top)
        for pos in range(start, end):
            if not g.is_final_eos(pos, self.gw.eos):
                add(g.ids[pos], g.logprobs[pos], g.tops[pos])
        return block

    def usage(self) -> dict[str, int]:
        prompt = sum(len(p) for p in self.req.prompts)
        completion = self.completion_tokens()
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def usage_version(self) -> int:
        vs = [g.versions[0] for g in self.samples if g.versions]
        return min(vs) if vs else self.start_version

    # -- capture ---------------------------------------------------------------
    async def begin_capture(self) -> None:
        """Side turns, one per prompt, only for a named session (see the module docstring)."""
        if self.sid is None or self.gw.capture is None or self.req.max_tokens == 0 or not self.req.store:
            return
        last = len(self.req.prompts) - 1
        for i, ids in enumerate(self.req.prompts):
            self.slots.append(await self.gw.begin_capture(
                self.sid, TURN_SIDE, [{"role": "user", "content": self.req.texts[i]}], self.done and i == last,
                tenant=self.tenant, prompt_ids=ids, tools=None))

    def captured(self, aborted: bool = False) -> list[tuple[TurnSlot, list[Turn]]]:
        out = []
        for i, slot in enumerate(self.slots):
            if slot is None:
                continue
            turns = []
            for g in self.samples:
                if g.prompt != i or (aborted and not g.ids):
                    continue
                policy_version, response_versions = g.turn_versions(g.versions[0] if g.versions
                                                                    else self.start_version)
                turns.append(Turn(
                    session_id=slot.session_id, index=slot.index, type=TURN_SIDE,
                    messages=[{"role": "user", "content": self.req.texts[i]}], prompt_ids=list(self.req.prompts[i]),
                    response_ids=list(g.ids), response_logprobs=list(g.logprobs), response_text=g.text.text,
                    finish_reason="abort" if aborted else (g.finish_reason or "stop"),
                    policy_version=policy_version, response_versions=response_versions, trainable=False,
                    tenant=self.tenant,
                    sampling={"temperature": self.req.temperature, "top_p": self.req.top_p,
                              "seed": self.params(g).seed, "logprobs": "raw", "endpoint": "completions"},
                    request_id=self.rid, choice_index=g.j))
            out.append((slot, turns))
        self.slots = []
        return out

    def abandon(self) -> None:
        for slot in self.slots:
            if slot is not None:
                self.gw.capture.abandon(slot)
        self.slots = []

    # -- bodies ----------------------------------------------------------------
    def reply(self) -> Response:
        self.pick_best()
        choices = []
        for g in sorted((g for g in self.samples if g.index >= 0), key=lambda g: g.index):
            echo = self.req.texts[g.prompt] if self.req.echo else ""
            ch = {"text": echo + g.text.text, "index": g.index,
                  "logprobs": self.logprobs_block(g, 0, len(g.ids), echo=self.req.echo),
                  "finish_reason": g.finish_reason}
            if self.req.return_token_ids:
                ch.update(prompt_token_ids=self.req.prompts[g.prompt], token_ids=g.ids, token_logprobs=g.logprobs)
            choices.append(ch)
        return self.answer(choices, self.usage_version())

    async def start(self, q: asyncio.Queue) -> AsyncIterator[str]:
        async def on_delta(g: CompletionChoice, delta: str, start: int) -> None:
            version = g.versions[-1] if g.versions else self.start_version
            ch = {"text": delta, "index": g.index, "finish_reason": None,
                  "logprobs": self.logprobs_block(g, start, len(g.ids), echo=False)}
            if self.req.return_token_ids:
                ch.update(token_ids=g.ids[start:], token_logprobs=g.logprobs[start:])
            await q.put(self.chunk([ch], version))

        await self.score_prompts()
        if self.req.echo:  # the prompt goes first, as its own chunk per choice
            for g in self.samples:
                yield self.chunk([{"text": self.req.texts[g.prompt], "index": g.index, "finish_reason": None,
                                   "logprobs": self.logprobs_block(g, 0, 0, echo=True)}], self.start_version)
        self.spawn(q, lambda g: self.run(g, on_delta))

    def finish_chunk(self, g: CompletionChoice) -> str:
        return self.chunk([{"text": "", "index": g.index, "logprobs": None, "finish_reason": g.finish_reason}],
                          g.versions[-1] if g.versions else self.start_version)


async def serve_completions(gw: Gateway, request: Request) -> Response:
    """POST /v1/completions."""
    t0 = time.perf_counter()
    tenant, body = await gw.accept(request)
    deadline = gw.deadline()
    max_len = gw.cfg.model.max_model_len
    req = parse_completion_request(body, gw.tok, len(gw.tok), max_len, gw.renderer.min_tokens)
    longest = max_len if req.max_tokens == 0 else max_len - 1  # room for one sampled token
    for i, ids in enumerate(req.prompts):
        if len(ids) > longest:
            raise APIError(400, f"This model's maximum context length is {max_len} tokens; your prompt"
                           f"{f' {i}' if len(req.prompts) > 1 else ''} uses {len(ids)}.", param="prompt",
                           code="context_length_exceeded")
    if req.echo and req.logprobs is not None and not can_score_prompts(gw.engine):
        raise bad_value("'echo' with 'logprobs' needs prompt logprobs, which this server's engine does not provide; "
                   "drop one of them.", "echo", code="unsupported_parameter")
    sid, _, done = gw.session_of(request, req, tenant)
    lease = await gw.admit(len(req.prompts) * req.best_of, deadline)
    c = Completion(gw, req, tenant=tenant, sid=sid, done=done, t0=t0, deadline=deadline, lease=lease)
    try:
        await c.begin_capture()
    except BaseException:
        c.close()
        raise
    return await c.respond(req.stream)
