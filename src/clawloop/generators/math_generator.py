"""Built-in `math` generator: sample answers to arithmetic problems, score them by rule.

Started by the rollout buffer (`POST /start_rollout {"task_type": "math", ...}`),
which calls `run_rollout(data)` in a child process. For every problem of the
input JSONL (`{"prompt": str} or {"messages": [...]}, "label": ..., "instance_id"?`;
the packaged `clawloop/data/math_problems.jsonl` when `input_file` is not given)
it asks the OpenAI-compatible server at `remote_engine_url` (clawloop's gateway
by default) for `num_repeat_per_sample` answers, scores each with
`score_answer` (the \\boxed{} content, else the last number, compared with the
label numerically) and posts one item per answer to
`<remote_buffer_url>/buffer/write`:

    {"uid", "instance_id", "task_type", "messages": prompt + [assistant answer],
     "reward": 1.0 | 0.0, "label", "extra_info": {...},
     "prompt_ids", "response_ids", "response_logprobs", "policy_version"}   # when the server returns ids

Requests carry `X-Turn-Type: side` (generator traffic is not a user's
conversation, so the gateway does not capture it for training) and
`"return_token_ids": true` (clawloop's gateway then returns `prompt_token_ids`,
`policy_version` and per choice `token_ids` / `token_logprobs`).

Robustness:
- A failed call (connection error, 408/429/5xx) is retried with backoff
  (`max_retries`, default 3); other 4xx are not retried and the sample is skipped.
- A response cut short (finish_reason "abort", or "length" with fewer tokens
  than asked for or with a policy_version that changed while it ran) is
  continued: the partial answer is sent back as a final assistant message with
  `continue_final_message: true` / `add_generation_prompt: false`, and the
  pieces are joined. The item stays token-exact only if the server's
  continuation prompt ids are exactly the first prompt ids plus the ids so far;
  otherwise the token fields are left out (the trainer re-tokenizes, counted)
  and `extra_info.token_exact` is false. `policy_version` is the oldest version
  that produced any of it; `extra_info.policy_versions` lists them all.

Payload keys read (slime's names; numbers may be strings): remote_engine_url,
remote_buffer_url, input_file, num_repeat_per_sample, max_tokens, sampling_params
{temperature, top_p, max_tokens}, num_process (concurrent requests), num_epoch,
skip_instance_ids; clawloop extras: model, api_key, max_retries, max_continuations,
request_timeout_s, custom_generate_function_path (`--custom-generate-function-path`:
answers come from that function instead of the gateway, see clawloop.buffer.custom).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx

TASK_TYPE = "math"
DEFAULT_INPUT_FILE = Path(__file__).resolve().parent.parent / "data" / "math_problems.jsonl"
RETRY_STATUS = {408, 409, 425, 429}

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")


# -- scoring ------------------------------------------------------------------------
def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(text: str | None) -> str | None:
    """The answer a response commits to: the last \\boxed{...}, else the last number."""
    if not text:
        return None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    nums = _NUMBER.findall(_DIGIT_COMMA.sub("", text))
    return nums[-1] if nums else None


def _to_number(s: str) -> float | None:
    s = _DIGIT_COMMA.sub("", s.strip().strip("$").replace(" ", ""))
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            return float(a) / float(b)
        return float(s)
    except (ValueError, ZeroDivisionError):
        return None


def score_answer(text: str | None, label: Any) -> float:
    """1.0 when the response's answer equals the label (numerically when both parse), else 0.0."""
    pred = extract_answer(text)
    if pred is None or label is None:
        return 0.0
    gold = str(label)
    gold = _last_boxed(gold) or gold
    a, b = _to_number(pred), _to_number(gold)
    if a is not None and b is not None:
        return 1.0 if math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9) else 0.0
    return 1.0 if pred.strip().lower() == gold.strip().lower() else 0.0


# -- rollout ------------------------------------------------------------------------
def _log(msg: str) -> None:
    print(f"[math generator] {msg}", file=sys.stderr, flush=True)


def read_problems(path: str | Path) -> list[dict[str, Any]]:
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if not line.strip():
                continue
            p = json.loads(line)
            if "messages" not in p and "prompt" not in p:
                raise ValueError(f"{path}:{i + 1}: a problem needs 'prompt' or 'messages'")
            p.setdefault("instance_id", i)
            out.append(p)
    return out


class MathRollout:
    """One run of the math generator (what run_rollout does), usable in-process."""

    def __init__(self, data: dict[str, Any]):
        self.data = data
        base = str(data.get("remote_engine_url") or "http://127.0.0.1:8000/v1").rstrip("/")
        self.engine_url = base if base.endswith("/v1") else base + "/v1"
        self.buffer_url = str(data["remote_buffer_url"]).rstrip("/")
        self.input_file = data.get("input_file") or str(DEFAULT_INPUT_FILE)
        self.group_size = int(data.get("num_repeat_per_sample", 1))
        params = dict(data.get("sampling_params") or {})
        self.max_tokens = int(params.pop("max_tokens", data.get("max_tokens", 256)))
        self.sampling = {k: params[k] for k in ("temperature", "top_p", "seed", "stop") if k in params}
        self.num_process = max(1, int(data.get("num_process", 8)))
        self.num_epoch = max(1, int(data.get("num_epoch", 1)))
        self.max_retries = int(data.get("max_retries", 3))
        self.max_continuations = int(data.get("max_continuations", 3))
        self.model = str(data.get("model") or "clawloop")
        self.task_type = str(data.get("task_type") or TASK_TYPE)
        key = data.get("api_key") or os.environ.get("OPENCLAW_API_KEY") or os.environ.get("OPENAI_API_KEY")
        self.headers = {"X-Turn-Type": "side"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"
        self.client = httpx.Client(timeout=float(data.get("request_timeout_s", 600)))
        self.latest_version: int | None = None
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.generate_fn = None
        if data.get("custom_generate_function_path"):
            from clawloop.buffer.custom import GenerateFunction

            self.generate_fn = GenerateFunction(str(data["custom_generate_function_path"]))

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
                    _log(f"{url} refused the request ({why}); not retrying")
                    self._count("http_refused")
                    return None
            if attempt < self.max_retries:
                self._count("retries")
                _log(f"{url} failed ({why}); retry {attempt + 1}/{self.max_retries}")
                time.sleep(min(8.0, 0.5 * 2 ** attempt))
        _log(f"{url} failed after {self.max_retries} retries")
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
            _log(f"response cut off (finish_reason={finish}, policy v{before}->v{v}, {n_tok}/{asked} tokens); "
                 "continuing")
        out = {"text": text, "finish_reason": finish, "policy_versions": versions, "continuations": continuations,
               "token_exact": exact and prompt_ids is not None}
        if out["token_exact"]:
            out.update(prompt_ids=list(prompt_ids), response_ids=resp_ids, response_logprobs=logprobs)
        return out

    def generate(self, messages: list[dict[str, Any]], problem: dict[str, Any]) -> dict[str, Any] | None:
        """One answer from the `--custom-generate-function-path` function (a failure skips the sample)."""
        assert self.generate_fn is not None
        try:
            res = self.generate_fn(messages, label=problem.get("label"), data=self.data,
                                   sampling={"max_tokens": self.max_tokens, **self.sampling},
                                   metadata={"instance_id": problem["instance_id"]})
        except Exception as e:  # noqa: BLE001 - the user's function: log it, skip the sample
            _log(f"custom generate {self.generate_fn.spec} failed: {type(e).__name__}: {e}")
            self._count("failed_calls")
            return None
        for v in res["policy_versions"]:
            self._see_version(v)
        return {**res, "continuations": 0}

    def make_item(self, problem: dict[str, Any]) -> dict[str, Any] | None:
        messages = problem.get("messages") or [{"role": "user", "content": problem["prompt"]}]
        res = self.complete(messages) if self.generate_fn is None else self.generate(messages, problem)
        if res is None:
            return None
        label = problem.get("label")
        item: dict[str, Any] = {
            "uid": str(uuid.uuid4()),
            "instance_id": problem["instance_id"],
            "task_type": self.task_type,
            "messages": messages + [{"role": "assistant", "content": res["text"]}],
            "reward": score_answer(res["text"], label),
            "label": label,
            "extra_info": {
                "finish_reason": res["finish_reason"], "policy_versions": res["policy_versions"],
                "continuations": res["continuations"], "token_exact": res["token_exact"],
                "pred": extract_answer(res["text"]), "label": label, "timestamp": str(time.time()),
                "round_number": 1, "max_tokens": self.max_tokens, **self.sampling,
            },
        }
        if res["token_exact"]:
            item["prompt_ids"] = res["prompt_ids"]
            item["response_ids"] = res["response_ids"]
            item["response_logprobs"] = res["response_logprobs"]
            item["policy_version"] = min(res["policy_versions"]) if res["policy_versions"] else 0
        return item

    def send(self, item: dict[str, Any]) -> bool:
        ok = self._post(self.buffer_url + "/buffer/write", item) is not None
        self._count("written" if ok else "write_failed")
        return ok

    def rollout_one(self, problem: dict[str, Any]) -> None:
        item = self.make_item(problem)
        if item is None:
            self._count("failed_samples")
            return
        self._count("correct", int(item["reward"] > 0))
        self.send(item)

    def run(self) -> dict[str, int]:
        problems = read_problems(self.input_file)
        skip = Counter(str(i) for i in (self.data.get("skip_instance_ids") or []))
        _log(f"{len(problems)} problems from {self.input_file}, group size {self.group_size}, "
             f"{self.num_epoch} epoch(s), engine {self.engine_url}, buffer {self.buffer_url}")
        with ThreadPoolExecutor(self.num_process, thread_name_prefix="math-rollout") as pool:
            for epoch in range(self.num_epoch):
                jobs = []
                for p in problems:
                    if skip[str(p["instance_id"])] > 0:  # a finished group from before a restart
                        skip[str(p["instance_id"])] -= 1
                        self._count("skipped_groups")
                        continue
                    jobs += [pool.submit(self.rollout_one, p) for _ in range(self.group_size)]
                wait(jobs)
                for j in jobs:
                    if j.exception() is not None:
                        self._count("errors")
                        _log(f"sample failed: {j.exception()!r}")
                _log(f"epoch {epoch + 1}/{self.num_epoch} done: {dict(self.counts)}")
        self.client.close()
        return dict(self.counts)


def run_rollout(data: dict[str, Any]) -> dict[str, int]:
    """Entry point the rollout buffer calls with the /start_rollout payload."""
    return MathRollout(data).run()
