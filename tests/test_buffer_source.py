"""Trainer side of the rollout buffer: items -> Samples, token-exact or re-tokenized,
with group-relative advantages that stay right for groups of unequal size."""

from __future__ import annotations

import math

import httpx
import pytest

from clawloop.buffer import BufferSource, BufferThread
from clawloop.config import load_config


class ByteTokenizer:
    def apply_chat_template(self, messages, tools=None, add_generation_prompt=False, tokenize=False):
        s = "".join(f"<|{m['role']}|>{m['content']}<|end|>" for m in messages)
        return s + ("<|assistant|>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return list(text.encode())


def tok_item(iid, reward, k, version=2, **extra):
    return {"instance_id": iid, "uid": f"{iid}-{k}", "reward": reward,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
            "prompt_ids": [10, 11, 12], "response_ids": [20 + k, 2], "response_logprobs": [-0.5, -0.25],
            "policy_version": version, **extra}


def adv_of(sample):
    vals = set(sample.advantages[sample.prompt_len:])
    assert len(vals) == 1 and set(sample.advantages[:sample.prompt_len]) <= {0.0}
    return vals.pop()


def test_token_exact_items_become_exact_samples():
    s = BufferSource("http://unused").to_samples([tok_item("a", 1.0, 0), tok_item("a", 0.0, 1)])
    assert [x.tokens for x in s] == [[10, 11, 12, 20, 2], [10, 11, 12, 21, 2]]
    assert s[0].loss_mask == [0, 0, 0, 1, 1] and s[0].prompt_len == 3
    assert s[0].rollout_logprobs == [0.0, 0.0, 0.0, -0.5, -0.25]
    assert s[0].policy_version == 2 and s[0].group_id == "a"
    assert s[0].messages == [{"role": "user", "content": "hi"}]
    assert [x.reward for x in s] == [1.0, 0.0] and [adv_of(x) for x in s] == [0.5, -0.5]


def test_gateway_field_names_are_accepted():
    it = {"instance_id": 1, "reward": 1.0, "messages": [], "prompt_token_ids": [1], "token_ids": [2, 3],
          "token_logprobs": [-1.0, -2.0], "extra_info": {"policy_version": 7}}
    s = BufferSource("http://unused").to_samples([it])[0]
    assert s.tokens == [1, 2, 3] and s.rollout_logprobs == [0.0, -1.0, -2.0] and s.policy_version == 7


def test_uneven_groups_use_their_own_means():
    items = [tok_item("three", r, k) for k, r in enumerate((1.0, 0.0, 0.0))] + \
            [tok_item("two", r, k) for k, r in enumerate((1.0, 0.0))] + \
            [tok_item("flat", 1.0, k) for k in range(2)]
    src = BufferSource("http://unused")
    s = src.to_samples(items)
    assert [adv_of(x) for x in s] == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.5, -0.5, 0.0, 0.0])
    assert src.stats["buffer/degenerate_groups"] == 1
    std = BufferSource("http://unused", std_normalize=True).to_samples(items[:3])
    sd = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)  # the unbiased (n - 1) std, as in the trainer
    assert [adv_of(x) for x in std] == pytest.approx([(2 / 3) / sd, -(1 / 3) / sd, -(1 / 3) / sd], rel=1e-4)


def test_group_advantages_are_the_trainers_group_normalize():
    """One rule for group advantages: the buffer's are losses.advantages.group_normalize's, exactly,
    float rewards included (0.3 stays 0.3, never its sign)."""
    import torch

    from clawloop.losses import group_normalize

    rewards = [0.3, 0.9, 0.0, 0.45]
    for std_normalize in (False, True):
        s = BufferSource("http://unused", std_normalize=std_normalize).to_samples(
            [tok_item("g", r, k) for k, r in enumerate(rewards)])
        want, _ = group_normalize(torch.tensor(rewards), [0] * 4, std_normalize=std_normalize)
        assert [adv_of(x) for x in s] == want.tolist()
        assert [x.reward for x in s] == rewards


def test_pad_copies_are_dropped_and_raw_rewards_used():
    """What the buffer's default hooks hand out for a stale 3-of-4 group: normalized,
    scaled, one item duplicated. The trainer recomputes from the 3 real items."""
    real = [tok_item("g", r, k, raw_reward=r) for k, r in enumerate((1.0, 0.0, 0.0))]
    normalized = [dict(it, reward=v) for it, v in zip(real, (1.41, -0.71, -0.71))]
    padded = normalized + [dict(normalized[0], pad_copy=True)]
    src = BufferSource("http://unused")
    s = src.to_samples(padded)
    assert len(s) == 3 and src.stats["buffer/pad_copies_dropped"] == 1
    assert [x.reward for x in s] == [1.0, 0.0, 0.0]
    assert [adv_of(x) for x in s] == pytest.approx([2 / 3, -1 / 3, -1 / 3])
    # "buffer" mode keeps slime's semantics: the hooks' reward is the advantage, copies included
    b = BufferSource("http://unused", advantages="buffer").to_samples(padded)
    assert len(b) == 4 and [adv_of(x) for x in b] == [1.41, -0.71, -0.71, 1.41] and b[0].reward == 1.0


def test_items_without_tokens_are_retokenized_and_counted(caplog):
    it = {"instance_id": 3, "reward": 1.0, "messages": [{"role": "user", "content": "What is 1+1?"},
                                                         {"role": "assistant", "content": "2"}]}
    src = BufferSource("http://unused", ByteTokenizer())
    with caplog.at_level("WARNING"):
        s = src.to_samples([it, dict(it, reward=0.0)])[0]
    assert src.stats["buffer/retokenized"] == 2 and "re-tokenized" in caplog.text
    assert bytes(s.tokens[:s.prompt_len]).decode() == "<|user|>What is 1+1?<|end|><|assistant|>"
    assert bytes(s.tokens[s.prompt_len:]).decode() == "2<|end|>"
    assert s.loss_mask == [0] * s.prompt_len + [1] * (len(s.tokens) - s.prompt_len)
    assert s.rollout_logprobs == [0.0] * len(s.tokens)  # the trainer's "no engine logprobs", never made up
    with pytest.raises(ValueError, match="no tokenizer"):
        BufferSource("http://unused").to_samples([it])


def test_pull_from_a_real_buffer(tmp_path):
    cfg = load_config({"data_dir": str(tmp_path)}, env={})
    cfg.buffer.port = 0
    cfg.train.n_samples_per_prompt = 2
    srv = BufferThread(cfg).start()
    try:
        src = BufferSource(srv.url)
        assert src.pull() == [] and src.stats["buffer/pulls"] == 1
        httpx.post(srv.url + "/buffer/write_batch", json=[tok_item(9, 1.0, 0), tok_item(9, 0.0, 1)]).raise_for_status()
        s = src.pull(batch_size=2)
        assert len(s) == 2 and [x.reward for x in s] == [1.0, 0.0] and [adv_of(x) for x in s] == [0.5, -0.5]
        assert src.last_meta_info["finished_groups"] == [9]
        assert src.pull() == []
    finally:
        srv.stop()
