"""The five optional generator hooks and their defaults, with slime's signatures.

A generator file may define any of these; the buffer uses the default below
for each one it does not define. They run when the trainer reads
(`POST /get_rollout_data`), on one finished group at a time, in this order:

    is_valid_group((instance_id, items), min_valid_group_size, task_type) -> (is_valid, is_finished)
    filter_item(item, task_type) -> bool                   # per item; False drops it
    normalize_group_data((instance_id, items), epsilon=1e-8, algo="grpo") -> (instance_id, items)
    pad_group_data((instance_id, items), group_size) -> (instance_id, items)
    get_group_data_meta_info({instance_id: items}) -> dict  # once per read, on the handed-out groups

A group is an `(instance_id, items)` tuple; an item is the JSON object the
generator posted to `/buffer/write`. Hooks may change items in place.

Where the defaults depart from slime's `default_func.py`:
- Rewards are not required to lie in [0, 1]: clawloop's rewards are often
  -1/0/+1. `filter_item` rejects only what cannot be trained on (a reward that
  is not a finite number, messages that are not a list, token fields that do
  not line up).
- `normalize_group_data` treats every degenerate group (all rewards equal, so
  std < epsilon) the same way: every normalized reward is 0.0, which is what
  "reward minus group mean" gives. slime left all-zero groups untouched and set
  other constant groups to 0; the result is the same.
- `pad_group_data` handles any shortfall (slime asserted at most half the group
  was missing), and marks the copies it adds with `"pad_copy": true` so a
  trainer that does its own group statistics (clawloop's `BufferSource`) can
  drop them.
"""

from __future__ import annotations

import copy
import math
from typing import Any

Item = dict[str, Any]
Group = tuple[Any, list[Item]]

HOOK_NAMES = ("normalize_group_data", "pad_group_data", "is_valid_group", "get_group_data_meta_info", "filter_item")

# Token fields an item may carry (clawloop's names first, then the gateway's reply names).
PROMPT_IDS_KEYS = ("prompt_ids", "prompt_token_ids")
RESPONSE_IDS_KEYS = ("response_ids", "token_ids")
RESPONSE_LOGPROBS_KEYS = ("response_logprobs", "token_logprobs")


def is_number(x: Any) -> bool:
    """A finite int or float (bools are not rewards)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def first_key(item: Item, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if item.get(k) is not None:
            return item[k]
    return None


def default_is_valid_group(group_data: Group, min_valid_group_size: int, task_type: str) -> tuple[bool, bool]:
    """Finished when it has `min_valid_group_size` items; valid when finished and
    its rewards are not all equal (a constant group carries no GRPO signal).

    The buffer passes the full group size for a complete group, and the reduced
    size `ceil(min_group_ratio * group_size)` for a stale one."""
    _, items = group_data
    is_finished = len(items) >= min_valid_group_size
    rewards = [item["reward"] for item in items]
    return is_finished and len(set(rewards)) > 1, is_finished


def default_filter_item(item: Item, task_type: str) -> bool:
    """Keep an item unless it cannot be trained on: a reward that is not a finite
    number, `messages` that is not a list, or token fields that do not line up
    (response ids without logprobs of the same length, ids that are not ints)."""
    if "instance_id" not in item or not is_number(item.get("reward")):
        return False
    if "messages" in item and not isinstance(item["messages"], list):
        return False
    resp = first_key(item, RESPONSE_IDS_KEYS)
    if resp is not None:
        prompt = first_key(item, PROMPT_IDS_KEYS)
        lps = first_key(item, RESPONSE_LOGPROBS_KEYS)
        if not isinstance(resp, list) or not isinstance(prompt, list):
            return False
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt + resp):
            return False
        if lps is not None and (not isinstance(lps, list) or len(lps) != len(resp)):
            return False
    elif "messages" not in item:
        return False  # neither text nor tokens: nothing to train on
    return True


def default_normalize_group_data(group: Group, epsilon: float = 1e-8, algo: str = "grpo") -> Group:
    """GRPO reward normalization inside one group: reward <- (reward - mean) / (std + epsilon),
    population std. The raw value is kept as `raw_reward`. A degenerate group
    (std < epsilon) is not divided: every reward becomes 0.0."""
    if algo != "grpo":
        raise ValueError(f"normalize_group_data: only algo='grpo' is supported, got {algo!r}")
    instance_id, items = group
    rewards = [float(item["reward"]) for item in items]
    if not rewards:
        return instance_id, items
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    for item, r in zip(items, rewards):
        item["raw_reward"] = item.get("raw_reward", r)
        item["reward"] = 0.0 if std < epsilon else (r - mean) / (std + epsilon)
    return instance_id, items


def default_pad_group_data(batch: Group, group_size: int) -> Group:
    """Pad a short group (n < group_size items) to group_size without changing its weight.

    Each of the n items gets c copies in all (c = group_size // n, or one more for
    the first group_size % n items), and each copy carries reward * group_size / (n * c).
    So every original item's copies sum to reward * group_size / n: a trainer that
    averages over the group_size items sees exactly the n-item group averaged
    over n. With at most half the group missing this is slime's scheme (scale by
    group_size / n, halve the reward of each duplicated item and of its copy).
    Added copies carry `"pad_copy": true`."""
    instance_id, items = batch
    n = len(items)
    if n == 0 or n >= group_size:
        return instance_id, items
    base, extra = divmod(group_size, n)
    out: list[Item] = []
    copies: list[Item] = []
    for i, item in enumerate(items):
        c = base + (1 if i < extra else 0)
        item["reward"] = float(item["reward"]) * group_size / (n * c)
        out.append(item)
        for _ in range(c - 1):
            dup = copy.deepcopy(item)
            dup["pad_copy"] = True
            copies.append(dup)
    return instance_id, out + copies


def default_get_group_data_meta_info(temp_data: dict[Any, list[Item]]) -> dict[str, Any]:
    """Counts and reward statistics of the groups handed out in one read:
    total_samples, num_groups, avg_group_size, avg_reward, reward_std (sample
    std, n - 1), reward_min, reward_max. Rewards are the raw ones (before
    normalization)."""
    rewards = [float(it.get("raw_reward", it["reward"])) for items in temp_data.values() for it in items]
    n_groups = len(temp_data)
    if not rewards:
        return {"total_samples": 0, "num_groups": n_groups, "avg_group_size": 0, "avg_reward": 0,
                "reward_std": 0, "reward_min": 0, "reward_max": 0}
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5 if len(rewards) > 1 else 0.0
    return {"total_samples": len(rewards), "num_groups": n_groups, "avg_group_size": len(rewards) / max(n_groups, 1),
            "avg_reward": mean, "reward_std": std, "reward_min": min(rewards), "reward_max": max(rewards)}


DEFAULT_HOOKS = {
    "normalize_group_data": default_normalize_group_data,
    "pad_group_data": default_pad_group_data,
    "is_valid_group": default_is_valid_group,
    "get_group_data_meta_info": default_get_group_data_meta_info,
    "filter_item": default_filter_item,
}

# Positional arguments the buffer passes to each hook (the contract a custom hook must accept).
HOOK_ARITY = {
    "normalize_group_data": 1,
    "pad_group_data": 2,
    "is_valid_group": 3,
    "get_group_data_meta_info": 1,
    "filter_item": 2,
}


def validity(result: Any) -> bool:
    """`is_valid_group` returns (is_valid, is_finished) in slime; its oldest
    version returned a bare bool. Accept both; only is_valid decides."""
    if isinstance(result, tuple):
        return bool(result[0])
    return bool(result)
