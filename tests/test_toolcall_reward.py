"""The tool-call track's shaped reward (`reward: shaped`), on hand-made trajectories run through the real
environment (the calculator in a plain subprocess), against numbers worked out by hand; and why the
reference's outcome reward alone teaches a model that cannot copy operands to drop the tool."""

from __future__ import annotations

import json
from difflib import SequenceMatcher

import pytest

from clawloop.envs.base import EnvOptions, Task, assistant_tool_call
from clawloop.envs.toolcall import REWARD_MODES, RewardShaping, ToolCallEnv, call_score
from clawloop.eval import CALCULATOR

TASK = Task("t", "toolcall", "What is 52+60?", {"label": "112"})


@pytest.fixture
def run(tmp_path):
    tools = tmp_path / "calculator.json"
    tools.write_text(json.dumps(CALCULATOR))
    opts = EnvOptions(max_steps=4, sandbox="none", allow_unsandboxed=True, tools_config=str(tools),
                      work_dir=str(tmp_path))

    def _run(*messages: dict, shaping: RewardShaping) -> tuple[float, list[float], dict]:
        """Step the env through `messages`, evaluate, shape: (reward, step rewards, details)."""
        env = ToolCallEnv(TASK, opts)
        env.reset()
        infos = []
        for m in messages:
            res = env.step(m)
            infos.append(res.info)
            if res.done:
                break
        ev = env.evaluate()
        env.close()
        reward, steps, _ = shaping(ev.reward, ev.details, infos)
        return reward, steps, ev.details

    return _run


def call(expr: str) -> dict:
    return assistant_tool_call("calculator", {"expression": expr})


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def test_call_score_by_hand():
    assert call_score("52+60", "112", "112", "52+60") == 1.0
    assert call_score("60 + 52", "112", "112", "52+60") == 1.0  # any call whose result is the answer
    # near calls: difflib ratio 2M/T, M matched characters, T both lengths
    assert call_score("52+6", "58", "112", "52+60") == pytest.approx(2 * 4 / 9)
    assert call_score("59+5", "64", "112", "52+60") == pytest.approx(2 * 2 / 9)  # "5", "+"
    assert call_score("52+60", None, "112", "52+60") == 0.99  # the expression, but the call failed: never 1
    # the bare answer passed in is not a correct call: only its closeness to the reference ("2")
    assert call_score("112", "112", "112", "52+60") == pytest.approx(2 * 1 / 8)
    assert call_score("7*16", "112", "112", None) == 1.0  # no reference: only a correct call scores
    assert call_score("7*15", "105", "112", None) == 0.0
    assert SequenceMatcher(None, "52+6", "52+60").ratio() == pytest.approx(8 / 9)


def test_shaped_reward_by_hand(run):
    shaped = RewardShaping("shaped", call_coef=1.0, use_coef=0.5)
    # the tool used right: a correct call, its result in the answer: 1 + 1 * 1 + 0.5
    r, steps, d = run(call("52+60"), say("The answer is 112."), shaping=shaped)
    assert (d["call_score"], d["exact_call"], d["answer_from_tool"]) == (1.0, True, True)
    assert r == pytest.approx(2.5) and steps == pytest.approx([1 + 1.0, 1 + 0.5])
    # the tool dropped, answer right: the outcome alone
    r, steps, d = run(say("112"), shaping=shaped)
    assert r == 1.0 and steps == [1.0] and (d["call_score"], d["answer_from_tool"]) == (0.0, False)
    # a near call (a digit lost), its wrong result copied: failure -1.05 (one call), + 8/9 + 0.5
    r, steps, d = run(call("52+6"), say("The answer is 58."), shaping=shaped)
    assert r == pytest.approx(-1.05 + 8 / 9 + 0.5) and steps == pytest.approx([-1.05 + 8 / 9, -1.05 + 0.5])
    # a correct call whose result is ignored for a wrong answer: -1.05 + 1
    r, steps, d = run(call("52+60"), say("The answer is 102."), shaping=shaped)
    assert r == pytest.approx(-0.05) and not d["answer_from_tool"]
    # the tool dropped, answer wrong: the reference's -1.1 (no calls)
    r, steps, d = run(say("102"), shaping=shaped)
    assert r == pytest.approx(-1.1)
    # a malformed call scores 0, the episode runs out of steps without an answer: no use term
    bad = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "{52+60"}}]}
    r, steps, d = run(bad, bad, bad, bad, shaping=shaped)
    assert d["call_score"] == 0.0 and r == pytest.approx(-0.9) and steps == pytest.approx([-0.9] * 4)
    # a retry: the mean over calls, (4/9 + 1) / 2, so calling again never beats calling right at once
    r, steps, d = run(call("59+5"), call("52+60"), say("The answer is 112."), shaping=shaped)
    assert d["call_score"] == pytest.approx((4 / 9 + 1) / 2) and d["exact_call"]
    assert r == pytest.approx(1 + (4 / 9 + 1) / 2 + 0.5) and r < 2.5 and steps == pytest.approx([1 + 4 / 9, 2.0, 1.5])
    # calling until max_steps without answering: -0.9 (four calls) + 4/9, below answering after one near call
    spam, _, _ = run(call("59+5"), call("59+5"), call("59+5"), call("59+5"), shaping=shaped)
    answered, _, _ = run(call("59+5"), say("The answer is 64."), shaping=shaped)
    assert spam == pytest.approx(-0.9 + 4 / 9) and answered == pytest.approx(-1.05 + 4 / 9 + 0.5) and answered > spam
    # outcome: the environment's reward on every step, untouched
    r, steps, _ = run(call("52+60"), say("The answer is 112."), shaping=RewardShaping("outcome"))
    assert r == 1.0 and steps == [1.0, 1.0]


def test_partial_credit_off_pays_only_correct_calls(run):
    """`reward_call_partial: 0`: a near call earns nothing for its closeness; a correct one the same as before."""
    exact = RewardShaping.from_data({"reward": "shaped", "reward_call_partial": 0})
    assert exact.partial == 0.0
    r, steps, _ = run(call("52+6"), say("The answer is 58."), shaping=exact)
    assert r == pytest.approx(-1.05 + 0.5) and steps == pytest.approx([-1.05, -1.05 + 0.5])
    r, steps, _ = run(call("52+60"), say("The answer is 112."), shaping=exact)
    assert r == pytest.approx(2.5) and steps == pytest.approx([2.0, 1.5])
    r, _, _ = run(call("59+5"), call("52+60"), say("The answer is 112."), shaping=exact)
    assert r == pytest.approx(1 + 0.5 + 0.5)  # the mean over calls, (0 + 1) / 2


def test_shaped_reward_prefers_using_the_tool_outcome_does_not(run):
    """What the tiny model taught GRPO (bench/RESULTS.md): right answers come from answering directly,
    calls carry wrong operands. A reward that keeps the tool must rank (1) a right answer through a
    correct call above a right answer without the tool, and (2) a failed near call clearly above a
    failed answer without the tool. The reference's outcome reward ranks (1) equal and (2) 0.05 apart."""
    def prefers_tool(shaping: RewardShaping) -> bool:
        with_tool = run(call("52+60"), say("The answer is 112."), shaping=shaping)[0]
        without = run(say("112"), shaping=shaping)[0]
        near = run(call("59+5"), say("The answer is 64."), shaping=shaping)[0]
        dropped_wrong = run(say("102"), shaping=shaping)[0]
        return with_tool > without and near - dropped_wrong > 0.5

    assert prefers_tool(RewardShaping("shaped"))
    assert not prefers_tool(RewardShaping("outcome"))


def test_reward_shaping_from_payload():
    assert RewardShaping.from_data({}) == RewardShaping("outcome", 1.0, 0.5)
    assert RewardShaping.from_data({"reward": "shaped", "reward_call_coef": "2", "reward_use_coef": 0}) == \
        RewardShaping("shaped", 2.0, 0.0)
    assert REWARD_MODES == ("outcome", "shaped")
    with pytest.raises(ValueError, match="reward must be one of outcome, shaped"):
        RewardShaping.from_data({"reward": "dense"})


def test_step_credit_blames_the_call_not_the_faithful_answer(run):
    """`reward_credit: step`: each step its own check. An answer that reports a wrong call's result is
    faithful (1 + 0.5), the call takes the blame (0 with partial credit off); under `outcome` credit the
    same answer step is -1.05 + 0.5, below an answer that ignores the tool and guesses right (1.0): RL
    on it teaches the answer to stop trusting the tool (bench/RESULTS.md)."""
    step = RewardShaping.from_data({"reward": "shaped", "reward_call_partial": 0, "reward_credit": "step"})
    outcome = RewardShaping.from_data({"reward": "shaped", "reward_call_partial": 0})
    assert (step.credit, outcome.credit) == ("step", "outcome")
    wrong_call_faithful = run(call("52+6"), say("The answer is 58."), shaping=step)
    assert wrong_call_faithful[1] == pytest.approx([0.0, 1.5])
    wrong_call_ignored = run(call("52+6"), say("The answer is 112."), shaping=step)
    assert wrong_call_ignored[1] == pytest.approx([0.0, 1.0])  # right, but not through the tool
    right = run(call("52+60"), say("The answer is 112."), shaping=step)
    assert right[1] == pytest.approx([1.0, 1.5])
    right_ignored = run(call("52+60"), say("The answer is 102."), shaping=step)
    assert right_ignored[1] == pytest.approx([1.0, -1.05])  # the call did its job, the answer did not
    no_tool = run(say("112"), shaping=step)
    assert no_tool[1] == [1.0]
    # the trajectory's reward is the same under both credits; only the steps' shares differ
    assert wrong_call_faithful[0] == run(call("52+6"), say("The answer is 58."), shaping=outcome)[0]
    # under outcome credit the faithful answer ranks below ignoring the tool: the inversion `step` removes
    out_faithful = run(call("52+6"), say("The answer is 58."), shaping=outcome)[1][1]
    out_ignored = run(call("52+6"), say("The answer is 112."), shaping=outcome)[1][1]
    assert out_faithful < out_ignored and wrong_call_faithful[1][1] > wrong_call_ignored[1][1]
    with pytest.raises(ValueError, match="reward_credit must be one of outcome, step"):
        RewardShaping.from_data({"reward": "shaped", "reward_credit": "trajectory"})
