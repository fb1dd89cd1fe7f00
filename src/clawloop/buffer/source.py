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
"""

from __future__ import annotations

import logging
from typing import Any

import httpx
import torch

from clawloop.buffer.hooks import PROMPT_IDS_KEYS, RESPONSE_IDS_KEYS, RESPONSE_LOGPROBS_KEYS, first_key
from clawloop.losses.advantages import group_normalize
from clawloop.records import Sample

log = logging.getLogger(__name__)


class BufferSource:
    def __init__(self, url: str, tokenizer: Any = None, *, advantages: str = "group", std_normalize: bool = False,
                 eps: float = 1e-6, timeout_s: float = 120.0, task_type: str | None = None):
        if advantages not in ("group", "buffer"):
            raise ValueError(f"advantages must be 'group' or 'buffer', got {advantages!r}")
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
                                        "buffer/degenerate_groups": 0}

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
            for item, r, a in zip(members, raw, advs):
                sample, exact = self._sample(item)
                if not exact:
                    retok += 1
                sample.reward = r
                sample.advantages = [0.0] * sample.prompt_len + [a] * (len(sample.tokens) - sample.prompt_len)
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
