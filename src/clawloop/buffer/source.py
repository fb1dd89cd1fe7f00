"""Trainer side of the rollout buffer: pull finished groups, turn items into Samples.

    source = BufferSource("http://127.0.0.1:8889", tokenizer)
    samples = source.pull()          # [] when nothing is ready
    source.stats                     # buffer/items, buffer/retokenized, ...

Token-exact when an item carries token ids (`prompt_ids`, `response_ids`,
`response_logprobs`, `policy_version`; the gateway's reply names
`prompt_token_ids`, `token_ids`, `token_logprobs` are accepted too): tokens =
prompt + response, loss mask 0 on the prompt and 1 on the response, the
engine's logprobs on the response. Otherwise the item's `messages` are
rendered with the tokenizer's chat template: the last assistant message is
the response, everything before it the prompt (earlier assistant turns do not
train). Such items are counted in `buffer/retokenized` and logged; their
rollout logprobs are all 0.0, which the trainer reads as "no engine logprobs"
(it then uses its own recomputed ones), never a made-up number.

Advantages (`advantages="group"`, the default): per group (instance_id), the
pad copies the buffer added are dropped (`pad_copy`, or a repeated `uid`), and
each item gets raw reward - group mean, divided by the group std when
`std_normalize`: exactly `losses.advantages.group_normalize`, the trainer's
own rule (unbiased n - 1 std; a degenerate group gets exactly 0). Groups may
have any size: the mean is over the items the group really has. Rewards are
floats and stay floats (a generator's 0.3 is 0.3, never its sign).
`advantages="buffer"` instead uses each item's `reward` as the buffer's hooks
left it (normalized and padded, slime's semantics), pad copies included.
`Sample.reward` is always the raw reward; `Sample.advantages` holds the
advantage on every response token and 0 on the prompt.

Multi-step items (the agent tracks' generators, `clawloop.envs.rollout`) carry
`steps`, each with its own prompt ids, response ids, logprobs and policy
version: every step becomes its own Sample (OpenClaw-RL's dynamic history).
`estimator="grpo"` gives each step its trajectory's group advantage (as above);
`estimator="step_wise"` uses each step's `step_reward` (outcome +
prm_step_coef · step PRM), z-normalised within its (instance_id, step index)
bucket, and drops the steps of constant buckets
(`losses.advantages.step_wise_advantages`). A one-step item is one bucket
entry at step 0.
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import torch

from clawloop.buffer.hooks import PROMPT_IDS_KEYS, RESPONSE_IDS_KEYS, RESPONSE_LOGPROBS_KEYS, first_key
from clawloop.losses.advantages import group_normalize, step_wise_advantages
from clawloop.records import Sample

log = logging.getLogger(__name__)


class BufferSource:
    def __init__(self, url: str, tokenizer: Any = None, *, advantages: str = "group", std_normalize: bool = False,
                 eps: float = 1e-6, timeout_s: float = 120.0, task_type: str | None = None,
                 estimator: str = "grpo"):
        if advantages not in ("group", "buffer"):
            raise ValueError(f"advantages must be 'group' or 'buffer', got {advantages!r}")
        if estimator not in ("grpo", "step_wise"):
            raise ValueError(f"estimator must be 'grpo' or 'step_wise', got {estimator!r}")
        self.estimator = estimator
        self.url = url.rstrip("/")
        self.tokenizer = tokenizer
        self.advantages = advantages
        self.std_normalize = std_normalize
        self.eps = eps
        self.task_type = task_type
        self._client = httpx.Client(timeout=timeout_s)
        self.last_meta_info: dict[str, Any] = {}
        self.stats: dict[str, float] = {"buffer/pulls": 0, "buffer/items": 0, "buffer/groups": 0,
                                        "buffer/retokenized": 0, "buffer/pad_copies_dropped": 0,
                                        "buffer/degenerate_groups": 0, "buffer/steps": 0,
                                        "buffer/steps_dropped": 0}

    def close(self) -> None:
        self._client.close()

    def pull(self, batch_size: int | None = None) -> list[Sample]:
        """Take every finished group from the buffer (whole groups until at least
        `batch_size` items, when given) and return their Samples."""
        body: dict[str, Any] = {}
        if batch_size:
            body["batch_size"] = int(batch_size)
        if self.task_type:
            body["task_type"] = self.task_type
        r = self._client.post(self.url + "/get_rollout_data", json=body)
        r.raise_for_status()
        reply = r.json()
        self.stats["buffer/pulls"] += 1
        data = reply.get("data") or {}
        self.last_meta_info = data.get("meta_info") or {}
        if not reply.get("success"):
            return []
        return self.to_samples(data.get("data") or [])

    def to_samples(self, items: list[dict[str, Any]]) -> list[Sample]:
        groups: dict[str, list[dict[str, Any]]] = {}
        for item in items:
            groups.setdefault(str(item["instance_id"]), []).append(item)
        samples: list[Sample] = []
        retok = 0
        for gid, members in groups.items():
            if self.advantages == "group":
                members = self._unique(members)
                raw = [_raw_reward(it) for it in members]
                advs = self._group_advantages(raw)
            else:
                raw = [_raw_reward(it) for it in members]
                advs = [float(it["reward"]) for it in members]
            if self.estimator == "step_wise":
                made = self._step_wise(members)
            else:
                made = []
                for item, r, a in zip(members, raw, advs):
                    for sample, exact, _, _ in self._samples_of(item):
                        sample.reward = r
                        sample.advantages = [0.0] * sample.prompt_len + [a] * (len(sample.tokens) - sample.prompt_len)
                        made.append((sample, exact))
            for sample, exact in made:
                if not exact:
                    retok += 1
                sample.group_id = gid
                samples.append(sample)
        self.stats["buffer/items"] += len(samples)
        self.stats["buffer/groups"] += len(groups)
        if retok:
            self.stats["buffer/retokenized"] += retok
            log.warning("buffer: %d of %d items carried no token ids and were re-tokenized from messages "
                        "(no engine logprobs); use a token-returning engine (clawloop's gateway with "
                        "return_token_ids) for exact tokens", retok, len(samples))
        return samples

    def _unique(self, members: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out, seen = [], set()
        for it in members:
            uid = it.get("uid")
            if it.get("pad_copy") or (uid is not None and uid in seen):
                self.stats["buffer/pad_copies_dropped"] += 1
                continue
            if uid is not None:
                seen.add(uid)
            out.append(it)
        return out

    def _group_advantages(self, rewards: list[float]) -> list[float]:
        adv, stats = group_normalize(torch.tensor(rewards, dtype=torch.float32), [0] * len(rewards),
                                     std_normalize=self.std_normalize, eps=self.eps)  # (n,) one group
        self.stats["buffer/degenerate_groups"] += int(stats["train/degenerate_groups"])
        return adv.tolist()

    def _samples_of(self, item: dict[str, Any]) -> list[tuple[Sample, bool, int, float]]:
        """(sample, token-exact, step index, step reward) per step of a multi-step item, else one."""
        steps = item.get("steps")
        if not isinstance(steps, list) or not steps:
            sample, exact = self._sample(item)
            return [(sample, exact, 0, _raw_reward(item))]
        out = []
        messages = item.get("messages") or []
        for k, st in enumerate(steps):
            n = int(st.get("prompt_messages", 0))
            sub = {"messages": messages[: n + 1] if n else [], "tools": item.get("tools"),
                   "instance_id": item.get("instance_id"), "policy_version": st.get("policy_version"),
                   "prompt_ids": st.get("prompt_ids"), "response_ids": st.get("response_ids"),
                   "response_logprobs": st.get("response_logprobs")}
            sample, exact = self._sample(sub)
            out.append((sample, exact, int(st.get("step", k)), float(st.get("step_reward", _raw_reward(item)))))
        self.stats["buffer/steps"] += len(out)
        return out

    def _step_wise(self, members: list[dict[str, Any]]) -> list[tuple[Sample, bool]]:
        """Every step of the group's trajectories, advantage z-normalised per step index; constant
        buckets dropped."""
        made = [m for item in members for m in self._samples_of(item)]
        if not made:
            return []
        rewards = torch.tensor([r for _, _, _, r in made], dtype=torch.float32)  # (n,)
        adv, keep, stats = step_wise_advantages(rewards, [k for _, _, k, _ in made], eps=self.eps)
        self.stats["buffer/steps_dropped"] += int(stats["train/steps_dropped"])
        out = []
        for (s, exact, _, r), a, k in zip(made, adv.tolist(), keep.tolist()):
            if k:
                s.reward = r
                s.advantages = [0.0] * s.prompt_len + [a] * (len(s.tokens) - s.prompt_len)
                out.append((s, exact))
        return out

    def _sample(self, item: dict[str, Any]) -> tuple[Sample, bool]:
        messages = item.get("messages") or []
        prompt_messages = messages[:-1] if messages and messages[-1].get("role") == "assistant" else messages
        version = item.get("policy_version")
        if version is None:
            version = (item.get("extra_info") or {}).get("policy_version", 0)
        prompt = first_key(item, PROMPT_IDS_KEYS)
        resp = first_key(item, RESPONSE_IDS_KEYS)
        lps = first_key(item, RESPONSE_LOGPROBS_KEYS)
        exact = isinstance(prompt, list) and isinstance(resp, list) and isinstance(lps, list) and len(lps) == len(resp)
        if exact:
            p, r, lp = list(prompt), list(resp), [float(x) for x in lps]
        else:
            p, r = self._retokenize(messages, prompt_messages, item)
            lp = [0.0] * len(r)  # all zeros: the trainer's "no engine logprobs"
        sample = Sample(
            tokens=p + r,
            loss_mask=[0] * len(p) + [1] * len(r),
            rollout_logprobs=[0.0] * len(p) + lp,
            prompt_len=len(p),
            policy_version=int(version or 0),
            messages=prompt_messages,
            tools=item.get("tools"),
        )
        return sample, exact

    def _retokenize(self, messages: list[dict[str, Any]], prompt_messages: list[dict[str, Any]],
                    item: dict[str, Any]) -> tuple[list[int], list[int]]:
        if self.tokenizer is None:
            raise ValueError(f"buffer item {item.get('instance_id')!r} has no token ids and BufferSource has no "
                             "tokenizer to render its messages; pass the model's tokenizer")
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError(f"buffer item {item.get('instance_id')!r} has no token ids and its messages do not end "
                             "with an assistant message")
        tools = item.get("tools")
        prompt_text = self.tokenizer.apply_chat_template(prompt_messages, tools=tools, add_generation_prompt=True,
                                                         tokenize=False)
        full_text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        p = list(self.tokenizer.encode(prompt_text, add_special_tokens=False))
        if full_text.startswith(prompt_text):
            r = list(self.tokenizer.encode(full_text[len(prompt_text):], add_special_tokens=False))
        else:  # a template that rewrites earlier turns: fall back to the bare answer text
            r = list(self.tokenizer.encode(messages[-1].get("content") or "", add_special_tokens=False))
        return p, r


def _raw_reward(item: dict[str, Any]) -> float:
    v = item.get("raw_reward", item["reward"])
    return float(v)
