"""A generator's HTTP side: chat calls to the gateway, with retries and continuation, and writes to the buffer.

    client = GatewayClient(data, task_type="math")   # data: the /start_rollout payload
    answer = client.complete(messages)               # {"text", "prompt_ids", "response_ids", ...} | None
    client.send(item)                                # POST <remote_buffer_url>/buffer/write

The math generator and the agent rollout (`clawloop.envs.rollout`) are built on
it. Requests carry `X-Turn-Type: side` (generator traffic is not a user's
conversation, so the gateway does not capture it for training) and
`"return_token_ids": true` (clawloop's gateway then returns `prompt_token_ids`,
`policy_version` and per choice `token_ids` / `token_logprobs`).

- A failed call (connection error, 408/429/5xx) is retried with backoff
  (`max_retries`, default 3); other 4xx are not retried (None comes back).
- A response cut short (finish_reason "abort", or "length" with fewer tokens
  than asked for or with a policy_version that changed while it ran) is
  continued by `complete`: the partial answer is sent back as a final assistant
  message with `continue_final_message: true` / `add_generation_prompt: false`,
  and the pieces are joined. It stays token-exact only if the server's
  continuation prompt ids are exactly the first prompt ids plus the ids so far.

Payload keys read (slime's names; numbers may be strings): remote_engine_url,
remote_buffer_url, num_repeat_per_sample, max_tokens, sampling_params
{temperature, top_p, max_tokens, seed, stop}, num_process, num_epoch; clawloop
extras: model, api_key, max_retries, max_continuations, request_timeout_s, task_type.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from typing import Any

import httpx

RETRY_STATUS = {408, 409, 425, 429}


class GatewayClient:
    """The payload's settings, one HTTP client, counters and the newest policy version seen (thread-safe)."""

    def __init__(self, data: dict[str, Any], *, task_type: str):
        self.data = data
        base = str(data.get("remote_engine_url") or "http://127.0.0.1:8000/v1").rstrip("/")
        self.engine_url = base if base.endswith("/v1") else base + "/v1"
        self.buffer_url = str(data["remote_buffer_url"]).rstrip("/")
        self.group_size = int(data.get("num_repeat_per_sample", 1))
        params = dict(data.get("sampling_params") or {})
        self.max_tokens = int(params.pop("max_tokens", data.get("max_tokens", 256)))
        self.sampling = {k: params[k] for k in ("temperature", "top_p", "seed", "stop") if k in params}
        self.num_process = max(1, int(data.get("num_process", 8)))
        self.num_epoch = max(1, int(data.get("num_epoch", 1)))
        self.max_retries = int(data.get("max_retries", 3))
        self.max_continuations = int(data.get("max_continuations", 3))
        self.model = str(data.get("model") or "clawloop")
        self.task_type = str(data.get("task_type") or task_type)
        key = data.get("api_key") or os.environ.get("OPENCLAW_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.headers = {"X-Turn-Type": "side"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.client = httpx.Client(timeout=float(data.get("request_timeout_s", 600)))
        self.latest_version: int | None = None
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()

    def log(self, msg: str) -> None:
        print(f"[{self.task_type} generator] {msg}", file=sys.stderr, flush=True)

    # -- HTTP with retries ----------------------------------------------------------
    def _post(self, url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response | None:
        for attempt in range(self.max_retries + 1):
            try:
                r = self.client.post(url, json=body, headers=headers)
            except httpx.TransportError as e:
                why = f"{type(e).__name__}: {e}"
            else:
                if r.status_code == 200:
                    return r
                why = f"HTTP {r.status_code}: {r.text[:200]}"
                if r.status_code < 500 and r.status_code not in RETRY_STATUS:
                    self.log(f"{url} refused the request ({why}); not retrying")
                    self._count("http_refused")
                    return None
            if attempt < self.max_retries:
                self._count("retries")
                self.log(f"{url} failed ({why}); retry {attempt + 1}/{self.max_retries}")
                time.sleep(min(8.0, 0.5 * 2 ** attempt))
        self.log(f"{url} failed after {self.max_retries} retries")
        self._count("failed_calls")
        return None

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def _see_version(self, v: int | None) -> int | None:
        """Remember the newest policy version seen; return the one known before."""
        with self._lock:
            before = self.latest_version
            if v is not None and (before is None or v > before):
                self.latest_version = v
            return before

    # -- one answer -------------------------------------------------------------------
    def complete(self, messages: list[dict[str, Any]]) -> dict[str, Any] | None:
        """One answer, continued across cut-offs. None when the first call failed."""
        text = ""
        prompt_ids: list[int] | None = None
        resp_ids: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        exact = True
        remaining = self.max_tokens
        finish = None
        continuations = 0
        while True:
            body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": remaining,
                                    "stream": False, "return_token_ids": True, **self.sampling}
            if continuations:
                body["messages"] = messages + [{"role": "assistant", "content": text}]
                body["continue_final_message"] = True
                body["add_generation_prompt"] = False
            with self._lock:
                before = self.latest_version
            r = self._post(self.engine_url + "/chat/completions", body, self.headers)
            if r is None:
                if continuations == 0:
                    return None
                break  # keep what we have: a truncated answer is still an answer
            reply = r.json()
            choice = reply["choices"][0]
            piece = (choice.get("message") or {}).get("content") or ""
            ids, lps = choice.get("token_ids"), choice.get("token_logprobs")
            pids = reply.get("prompt_token_ids")
            v = reply.get("policy_version")
            if v is None and r.headers.get("x-policy-version", "").isdigit():
                v = int(r.headers["x-policy-version"])
            self._see_version(v)
            if continuations == 0:
                prompt_ids = pids
            elif pids is None or prompt_ids is None or list(pids) != list(prompt_ids) + resp_ids:
                exact = False  # the server did not continue the same token sequence
            if ids is None or lps is None or len(ids) != len(lps):
                exact = False
            text += piece
            resp_ids += list(ids or [])
            logprobs += [float(x) for x in (lps or [])]
            if v is not None:
                versions.append(int(v))
            n_tok = len(ids) if ids is not None else int((reply.get("usage") or {}).get("completion_tokens", 0))
            asked = remaining
            remaining -= n_tok
            finish = choice.get("finish_reason")
            changed = v is not None and before is not None and v != before
            cut = finish == "abort" or (finish == "length" and (changed or n_tok < asked))
            if not cut or remaining <= 0 or n_tok == 0 or continuations >= self.max_continuations:
                break
            continuations += 1
            self._count("continuations")
            self.log(f"response cut off (finish_reason={finish}, policy v{before}->v{v}, {n_tok}/{asked} tokens); "
                 "continuing")
        out = {"text": text, "finish_reason": finish, "policy_versions": versions, "continuations": continuations,
               "token_exact": exact and prompt_ids is not None}
        if out["token_exact"]:
            out.update(prompt_ids=list(prompt_ids), response_ids=resp_ids, response_logprobs=logprobs)
        return out

    def send(self, item: dict[str, Any]) -> bool:
        """Write one item to the buffer (counted as `written` or `write_failed`)."""
        ok = self._post(self.buffer_url + "/buffer/write", item) is not None
        self._count("written" if ok else "write_failed")
        return ok
