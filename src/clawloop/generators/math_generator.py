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
`policy_version` and per choice `token_ids` / `token_logprobs`). The HTTP side
(retries, continuation) is `clawloop.generation.client.GatewayClient` and the
scoring `clawloop.generation.answers`: a library, so a copy of this file keeps
working and the agent tracks share them without importing a plugin file.

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

import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from clawloop.generation.answers import extract_answer, read_problems, score_answer
from clawloop.generation.client import RETRY_STATUS, GatewayClient

__all__ = ["DEFAULT_INPUT_FILE", "RETRY_STATUS", "TASK_TYPE", "MathRollout", "extract_answer", "read_problems",
           "run_rollout", "score_answer"]

TASK_TYPE = "math"
DEFAULT_INPUT_FILE = Path(__file__).resolve().parent.parent / "data" / "math_problems.jsonl"


class MathRollout(GatewayClient):
    """One run of the math generator (what run_rollout does), usable in-process."""

    def __init__(self, data: dict[str, Any]):
        super().__init__(data, task_type=TASK_TYPE)
        self.input_file = data.get("input_file") or str(DEFAULT_INPUT_FILE)
        self.generate_fn = None
        if data.get("custom_generate_function_path"):
            from clawloop.buffer.custom import GenerateFunction  # lazy: the buffer package's face loads its FastAPI service

            self.generate_fn = GenerateFunction(str(data["custom_generate_function_path"]))

    def generate(self, messages: list[dict[str, Any]], problem: dict[str, Any]) -> dict[str, Any] | None:
        """One answer from the `--custom-generate-function-path` function (a failure skips the sample)."""
        assert self.generate_fn is not None
        try:
            res = self.generate_fn(messages, label=problem.get("label"), data=self.data,
                                   sampling={"max_tokens": self.max_tokens, **self.sampling},
                                   metadata={"instance_id": problem["instance_id"]})
        except Exception as e:  # noqa: BLE001 - the user's function: log it, skip the sample
            self.log(f"custom generate {self.generate_fn.spec} failed: {type(e).__name__}: {e}")
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
        self.log(f"{len(problems)} problems from {self.input_file}, group size {self.group_size}, "
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
                        self.log(f"sample failed: {j.exception()!r}")
                self.log(f"epoch {epoch + 1}/{self.num_epoch} done: {dict(self.counts)}")
        self.client.close()
        return dict(self.counts)


def run_rollout(data: dict[str, Any]) -> dict[str, int]:
    """Entry point the rollout buffer calls with the /start_rollout payload."""
    return MathRollout(data).run()
