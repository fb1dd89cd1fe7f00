"""The LLM judge: any OpenAI-compatible endpoint, or an engine in this process.

Per turn it makes `votes` scoring calls (prompt: `prompts.score_messages`)
and, with hints on, `votes` hint calls (`prompts.hint_messages`), all at
once. Each scoring reply's verdict is its last `\\boxed{}`; the votes are
combined by `voting.majority_vote`:

    valid = votes that parsed (1, -1 or 0); the most common valid verdict wins
    if it is not tied and has at least `threshold * len(valid)` votes; else 0.
    No valid vote -> 0, and every vote counts as malformed.

The hint is the longest `[HINT_START]...[HINT_END]` text over 10 characters
among hint replies that end in `\\boxed{1}` (`voting.select_hint`).

Thinking judges: a reply's `reasoning_content` (vLLM, SGLang) or `reasoning`
(OpenRouter-style) field is read as well as `content`, `<think>...</think>`
blocks inline in `content` are taken apart, and the verdict comes from the
answer, else from the reasoning (`voting.judged_text`). Replies may be
`max_tokens` long (`--judge-max-tokens`, default 4096: thinking models need
thousands); a reply cut at that limit (finish_reason "length") that gave no
verdict is counted in `judge/replies_truncated`, and its reasoning is not read
(it never finished).

Failures: an HTTP error, a refused connection, or a reply that is not a chat
completion raises `JudgeUnavailable`; the judge loop retries and, failing
that, leaves the turn pending. A Judgement whose votes are all malformed is
returned as is (score 0, malformed = N) and the loop treats it as garbage:
retried later, up to `judge.max_malformed` replies, then stored as 0.

Backends:
- `HTTPChatBackend(url, model, api_key)`: POST {url}/chat/completions (a
  `/v1` is added when the URL has no path); with no model name, the first id
  of GET /models is used.
- `EngineChatBackend(engine)`: renders the messages with the engine's chat
  template and samples in-process (`--judge self` on the served engine,
  `--judge frozen` on a frozen copy of the base model that the judge owns).

Images: a next state whose content holds image parts with data URLs (a GUI
step's screenshot, as the step PRM passes it) is shown to a judge that takes
images: the prompt's user message gets the images after its text. A backend
says so with `takes_images`: an engine that serves images (the hf engine on a
Qwen-VL model) True, a text one False; an HTTP endpoint is not known until
asked (None): the first prompt with images goes as it is, and a 400 answer
that refuses the image part (`unsupported_content`, `image_*` codes) sets it
False and the same prompt goes again as text, as do later ones.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol
from urllib.parse import urlparse

from clawloop.judge.base import JudgeUnavailable, response_of
from clawloop.judge.prompts import hint_messages, image_urls, score_messages
from clawloop.judge.voting import (
    BOX,
    judged_text,
    majority_vote,
    parse_boxed,
    parse_hint,
    select_hint,
    split_thinking,
    usable_hints,
)
from clawloop.naming import url_judge_name
from clawloop.records import Judgement, Turn

MAX_REPLY_TOKENS = 4096
"""Longest judge reply by default, in tokens (reasoning plus the boxed verdict); `judge.max_tokens`."""


class ChatBackend(Protocol):
    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        """The assistant text of one chat completion; raise JudgeUnavailable on failure."""
        ...

    async def close(self) -> None: ...


def chat_completions_url(url: str) -> str:
    """`http://h:p` -> `http://h:p/v1/chat/completions`; `.../v1` -> `.../v1/chat/completions`."""
    u = url.rstrip("/")
    if u.endswith("/chat/completions"):
        return u
    if not urlparse(u).path:
        u += "/v1"
    return u + "/chat/completions"


class HTTPChatBackend:
    """OpenAI-compatible chat completions over httpx (no client-side retries: the loop retries)."""

    takes_images: bool | None = None
    """Whether the endpoint's model takes image parts; None until a prompt with images was sent."""

    def __init__(self, url: str, model: str = "", api_key: str = "", timeout_s: float = 60.0):
        import httpx

        self.url = chat_completions_url(url)
        self.model = model
        self.replies = 0
        self.truncated = 0
        """Replies cut at max_tokens (finish_reason "length") without an answer that holds a verdict."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), headers=headers)
        self._httpx = httpx

    async def _resolve_model(self) -> str:
        if self.model:
            return self.model
        models_url = self.url.removesuffix("/chat/completions") + "/models"
        try:
            r = await self._client.get(models_url)
            r.raise_for_status()
            self.model = str(r.json()["data"][0]["id"])
        except (self._httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeUnavailable(f"judge at {models_url}: no model name given and /models failed: {e}") from e
        return self.model

    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        body = {"model": await self._resolve_model(), "messages": messages, "temperature": temperature,
                "max_tokens": max_tokens}
        try:
            r = await self._client.post(self.url, json=body)
        except self._httpx.HTTPError as e:
            raise JudgeUnavailable(f"judge at {self.url}: {type(e).__name__}: {e}") from e
        if _has_images(messages) and self.takes_images is None:
            if r.status_code == 400 and _refuses_images(r):  # a text model: the same prompt, as text
                self.takes_images = False
                return await self.complete(_text_only(messages), temperature=temperature, max_tokens=max_tokens)
            if r.status_code < 400:
                self.takes_images = True
        if r.status_code >= 400:
            raise JudgeUnavailable(f"judge at {self.url}: HTTP {r.status_code}: {r.text[:200]}")
        try:
            choice = r.json()["choices"][0]
            message = choice["message"]
            content = message.get("content")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise JudgeUnavailable(f"judge at {self.url}: not a chat completion: {r.text[:200]!r}") from e
        content = content if isinstance(content, str) else ""
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        reasoning = reasoning if isinstance(reasoning, str) else ""
        self.replies += 1
        if choice.get("finish_reason") == "length" and BOX not in split_thinking(content)[0]:
            self.truncated += 1
            reasoning = ""  # cut off while thinking: whatever it was about to conclude is unknown
            content = split_thinking(content)[0]
        return judged_text(content, reasoning)

    def stats(self) -> dict[str, float]:
        return {"judge/replies": float(self.replies), "judge/replies_truncated": float(self.truncated)}

    async def close(self) -> None:
        await self._client.aclose()


class EngineChatBackend:
    """Chat completions on a clawloop Engine, in-process (no HTTP)."""

    def __init__(self, engine: Any, *, owns_engine: bool = False):
        self.engine = engine
        self.takes_images = bool(getattr(engine, "supports_images", False))
        """The engine serves a model that takes images (the hf engine on a Qwen-VL model)."""
        self.owns_engine = owns_engine
        self._started = not owns_engine
        self._lock = asyncio.Lock()
        self.replies = 0
        self.truncated = 0

    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str:
        from clawloop.engines.base import GenerationRequest, SamplingParams

        if not self._started:
            async with self._lock:
                if not self._started:
                    await self.engine.start()
                    self._started = True
        tok = self.engine.tokenizer
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompt_ids = list(tok.encode(text, add_special_tokens=False))
        multimodal = None
        if _has_images(messages):
            if not self.takes_images:
                raise JudgeUnavailable("judge engine: the prompt has images and the judge model takes text only")
            prompt_ids, multimodal = await asyncio.to_thread(self.engine.prepare_images, prompt_ids,
                                                             _image_bytes(messages))
        limit = getattr(self.engine, "max_model_len", None)
        if limit is not None:
            room = limit - len(prompt_ids) - 1
            if room < min(8, max_tokens):
                raise JudgeUnavailable(f"judge prompt of {len(prompt_ids)} tokens does not fit max_model_len={limit}")
            max_tokens = min(max_tokens, room)
        ids: list[int] = []
        try:
            async for ev in self.engine.generate(GenerationRequest(
                    prompt_ids=prompt_ids, params=SamplingParams(temperature=temperature, max_tokens=max_tokens),
                    multimodal=multimodal)):
                if ev.token_id is not None:
                    ids.append(ev.token_id)
        except RuntimeError as e:  # engine stopped or a failed step
            raise JudgeUnavailable(f"judge engine: {e}") from e
        text = tok.decode(ids, skip_special_tokens=True)
        self.replies += 1
        if len(ids) >= max_tokens and BOX not in split_thinking(text)[0]:
            self.truncated += 1
            text = split_thinking(text)[0]
        return judged_text(text)

    def stats(self) -> dict[str, float]:
        return {"judge/replies": float(self.replies), "judge/replies_truncated": float(self.truncated)}

    async def close(self) -> None:
        if self.owns_engine and self._started:
            await self.engine.stop()
            self._started = False


class LLMJudge:
    """Majority-voted next-state judge over a chat backend; see the module docstring."""

    def __init__(self, backend: ChatBackend, *, name: str, votes: int = 1, threshold: float = 0.5,
                 temperature: float = 0.6, hints: bool = True, max_tokens: int = MAX_REPLY_TOKENS):
        if votes < 1:
            raise ValueError("votes must be >= 1")
        self.backend = backend
        self.name = name
        self.votes = votes
        self.threshold = threshold
        self.temperature = temperature
        self.hints = hints
        self.max_tokens = max_tokens

    async def judge(self, turn: Turn) -> Judgement:
        t0 = time.perf_counter()
        turn_id = turn.id if turn.id is not None else -1
        if not turn.next_state:  # session closed after this turn: nothing to read
            return Judgement(turn_id=turn_id, score=0, votes=[], judge=self.name, latency_s=0.0)
        response = response_of(turn)
        # the next state's screenshot, for a judge that takes images (or may: an endpoint not asked yet)
        shots = image_urls(turn.next_state.get("content")) if getattr(self.backend, "takes_images", False) \
            is not False else []
        prompts = [score_messages(turn.messages, response, turn.next_state, shots)] * self.votes
        if self.hints:
            prompts += [hint_messages(turn.messages, response, turn.next_state, shots)] * self.votes
        replies = await asyncio.gather(
            *(self.backend.complete(p, temperature=self.temperature, max_tokens=self.max_tokens) for p in prompts),
            return_exceptions=True)
        for r in replies:
            if isinstance(r, BaseException):
                if isinstance(r, JudgeUnavailable):
                    raise r
                raise JudgeUnavailable(f"{type(r).__name__}: {r}") from r
        votes = [parse_boxed(r) for r in replies[: self.votes]]
        hint_votes = [(parse_boxed(r), parse_hint(r)) for r in replies[self.votes:]] if self.hints else []
        hint = select_hint(hint_votes) if self.hints else None
        candidates = usable_hints(hint_votes)  # all of them, for the trainer's --hint-selection overlap
        return Judgement(turn_id=turn_id, score=majority_vote(votes, self.threshold), votes=votes, hint=hint,
                         hint_candidates=candidates if len(candidates) > 1 else None,
                         judge=self.name, latency_s=time.perf_counter() - t0,
                         malformed=sum(v is None for v in votes))

    def stats(self) -> dict[str, float]:
        fn = getattr(self.backend, "stats", None)
        return fn() if callable(fn) else {}

    async def close(self) -> None:
        await self.backend.close()


def _has_images(messages: list[dict[str, Any]]) -> bool:
    return any(image_urls(m.get("content")) for m in messages)


def _image_bytes(messages: list[dict[str, Any]]) -> list[bytes]:
    """The images of the messages' image parts, decoded, in order (what the chat template renders)."""
    from clawloop.gateway.protocol import APIError, parse_image_part

    out = []
    for m in messages:
        for u in image_urls(m.get("content")):
            try:
                out.append(parse_image_part({"image_url": {"url": u}}, "judge prompt").data)
            except APIError as e:
                raise JudgeUnavailable(f"judge prompt: {e.message}") from None
    return out


def _text_only(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages with their image parts taken out (content as text)."""
    from clawloop.judge.prompts import IMAGES_NOTE

    return [{**m, "content": "".join(p.get("text", "") for p in m["content"] if p.get("type") == "text")
             .removesuffix(IMAGES_NOTE)} if image_urls(m.get("content")) else m for m in messages]


def _refuses_images(r: Any) -> bool:
    """An OpenAI-shaped 400 about the request's image parts (clawloop's gateway on a text model answers
    `unsupported_content`; others name the image)."""
    try:
        err = r.json().get("error") or {}
    except ValueError:
        return "image" in r.text.lower()
    code, msg = str(err.get("code") or ""), str(err.get("message") or "")
    return code == "unsupported_content" or code.startswith("image") or code.startswith("invalid_image") \
        or "image" in msg.lower()


__all__ = ["ChatBackend", "EngineChatBackend", "HTTPChatBackend", "LLMJudge", "MAX_REPLY_TOKENS",
           "chat_completions_url", "url_judge_name"]
