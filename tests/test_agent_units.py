"""Pure parts of the agent tracks: the step_wise estimator against hand-worked numbers, step items
into Samples, the env config's aliases, the tool-call reward shaping and tools config, the offline PRM."""

from __future__ import annotations

import json
import math

import pytest
import torch

from clawloop.buffer.source import BufferSource
from clawloop.losses.advantages import step_wise_advantages


def test_step_wise_by_hand():
    # bucket "s0": rewards 2, 0, 1 -> mean 1, unbiased std 1 -> 1, -1, 0
    # bucket "s1": rewards 1, 1 -> constant: dropped; bucket "s2": a single step -> dropped
    r = torch.tensor([2.0, 0.0, 1.0, 1.0, 1.0, 5.0])
    adv, keep, stats = step_wise_advantages(r, ["s0", "s0", "s0", "s1", "s1", "s2"], eps=0.0)
    assert keep.tolist() == [True, True, True, False, False, False]
    assert adv[:3].tolist() == pytest.approx([1.0, -1.0, 0.0])
    assert stats == {"train/step_buckets": 3.0, "train/step_buckets_dropped": 2.0, "train/steps_dropped": 3.0}


def _item(iid, reward, steps):
    """A multi-step buffer item as the agent rollout writes it (token ids made up, aligned)."""
    out = []
    for k, sr in enumerate(steps):
        out.append({"step": k, "prompt_messages": 1 + 2 * k, "prompt_ids": [1, 2, 3 + k], "response_ids": [7, 8],
                    "response_logprobs": [-0.5, -0.25], "policy_version": 3, "step_reward": sr})
    msgs = [{"role": "user", "content": "q"}]
    for k in range(len(steps)):
        msgs += [{"role": "assistant", "content": f"a{k}"}, {"role": "tool", "tool_call_id": "c", "content": "o"}]
    return {"instance_id": iid, "reward": reward, "raw_reward": reward, "messages": msgs, "steps": out}


def test_steps_become_samples_grpo_and_step_wise():
    items = [_item("t", 1.5, [2.0, 1.0]), _item("t", -1.0, [-1.0]), _item("t", 0.0, [1.0, -1.0, 0.0])]
    src = BufferSource("http://unused")
    samples = src.to_samples(items)
    assert len(samples) == 6 and src.stats["buffer/steps"] == 6
    s = samples[0]
    assert s.tokens == [1, 2, 3, 7, 8] and s.loss_mask == [0, 0, 0, 1, 1] and s.prompt_len == 3
    assert s.rollout_logprobs == [0.0, 0.0, 0.0, -0.5, -0.25] and s.policy_version == 3
    assert s.messages == [{"role": "user", "content": "q"}]  # the step's prompt messages
    # grpo: every step carries its trajectory's group advantage (rewards 1.5, -1, 0: mean 1/6)
    assert [x.advantages[-1] for x in samples] == pytest.approx([4 / 3, 4 / 3, -7 / 6, -1 / 6, -1 / 6, -1 / 6])
    sw = BufferSource("http://unused", estimator="step_wise")
    got = sw.to_samples(items)
    # step 0: 2, -1, 1 (kept, z-normalised); step 1: 1, -1 (kept); step 2: one step only (dropped)
    assert len(got) == 5 and sw.stats["buffer/steps_dropped"] == 1
    m0, sd0 = 2 / 3, math.sqrt(((2 - 2 / 3) ** 2 + (-1 - 2 / 3) ** 2 + (1 - 2 / 3) ** 2) / 2)
    step0 = [x.advantages[-1] for x in got if x.tokens[2] == 3]
    assert step0 == pytest.approx([(v - m0) / (sd0 + 1e-6) for v in (2, -1, 1)], rel=1e-5)
    assert [x.reward for x in got if x.tokens[2] == 4] == [1.0, -1.0]


def test_env_aliases_resolve_like_every_key(tmp_path):
    from clawloop.config import ConfigError, load_config

    tools = tmp_path / "tools.json"
    tools.write_text("[]")
    cfg = load_config({}, env={"ENV_TYPE": "swe", "MAX_STEPS": "7", "PARALLEL_ENVS": "3",
                               "TOOLS_CONFIG": str(tools), "SWE_BENCH_PATH": str(tmp_path)})
    e = cfg.env
    assert (e.track, e.max_steps, e.parallel_envs, e.tools_config, e.task_dir) == \
        ("swe", 7, 3, str(tools), str(tmp_path))
    flags = load_config({"env__max_steps": "9"}, env={"MAX_STEPS": "7"})  # a flag beats the env var
    assert flags.env.max_steps == 9
    for env, key in (({"ENV_TYPE": "gui2"}, "env.track"), ({"MAX_STEPS": "0"}, "env.max_steps"),
                     ({"TOOLS_CONFIG": str(tmp_path / "nope.json")}, "env.tools_config"),
                     ({"SWE_BENCH_PATH": str(tmp_path / "nope")}, "env.task_dir")):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config({}, env=env)
    with pytest.raises(ConfigError, match="allow-unsandboxed"):
        load_config({"env__sandbox": "none"}, env={})
    cfg = load_config({"train__advantage_estimator": "step_wise"}, env={})
    assert cfg.train.advantage_estimator == "step_wise"


def test_toolcall_reward_shaping_and_tools_config(tmp_path):
    from clawloop.envs.toolcall import load_tools_config, reward_of

    assert reward_of("so \\boxed{19}", "19", 0) == (1.0, True)
    assert reward_of("20", "19", 0) == (pytest.approx(-1.1), False)  # min(-0.6, -1 + (0-2)/2*0.1)
    assert reward_of("20", "19", 4)[0] == pytest.approx(-0.9)
    assert reward_of("20", "19", 20)[0] == -0.6
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"system": "be brief", "tools": [
        {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "upper", "parameters": {"type": "object"}},
         "command": "python3 -c 'import json,sys; print(json.load(sys.stdin)[\"s\"].upper())'"}]}))
    tools, system, commands = load_tools_config(str(p))
    assert [t["function"]["name"] for t in tools] == ["calculator", "upper"] and system == "be brief"
    assert "command" not in tools[1] and "upper" in commands
    p.write_text(json.dumps([{"type": "function", "function": {"name": "mystery"}}]))
    with pytest.raises(ValueError, match="mystery.*command"):
        load_tools_config(str(p))


def test_offline_step_prm():
    from clawloop.envs.prm import offline_step_score

    a = {"role": "assistant", "content": ""}
    assert offline_step_score(a, [], {}) == 0
    assert offline_step_score(a, [{"role": "tool", "content": "42"}], {"calls": [{"returncode": 0}]}) == 1
    assert offline_step_score(a, [{"role": "tool", "content": "error: NameError"}], {"calls": [{"returncode": 1}]}) == -1
    assert offline_step_score(a, [{"role": "user", "content": "<returncode>2</returncode>\n<output>\nno\n</output>"}],
                              {}) == -1
    assert offline_step_score(a, [{"role": "user", "content": "<returncode>0</returncode>\n<output>\nok\n</output>"}],
                              {}) == 1
