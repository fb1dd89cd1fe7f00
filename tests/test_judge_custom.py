"""Custom reward plugins (`--custom-rm-path`): loading, signature contract, return values."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest

from clawloop.config import ConfigError
from clawloop.judge import JudgeUnavailable, make_judge
from clawloop.judge.custom import CustomJudge
from clawloop.records import Turn

PLUGIN = textwrap.dedent('''
    from clawloop.records import Judgement

    def reward(turn):
        return 0.7 if "thanks" in (turn.next_state or {}).get("content", "") else -2.5

    async def async_reward(turn):
        return Judgement(turn_id=0, score=-1, votes=[-1, -1], hint="Answer in French.")

    def zero(turn):
        return 0

    def two_args(args, sample):
        return 1.0

    def no_args():
        return 1.0

    def keyword_only(*, turn):
        return 1.0

    def with_default(turn, scale=1.0):
        return scale

    def returns_none(turn):
        return None

    def returns_nan(turn):
        return float("nan")

    NOT_CALLABLE = 3
''')


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "my_rm.py"
    path.write_text(PLUGIN)
    return path


def _turn(content="thanks!"):
    return Turn(session_id="s", index=0, id=11, response_text="hi", next_state={"role": "user", "content": content})


def _run(judge, turn):
    return asyncio.run(judge.judge(turn))


def test_file_path_default_name_and_float_sign(plugin):
    j = CustomJudge(str(plugin))  # no ":fn" -> `reward`
    assert j.name == f"custom:{plugin}"
    good, bad = _run(j, _turn("thanks!")), _run(j, _turn("wrong"))
    assert (good.score, good.votes, good.turn_id, good.judge) == (1, [1], 11, j.name)
    assert bad.score == -1
    assert _run(CustomJudge(f"{plugin}:zero"), _turn()).score == 0


def test_async_function_returning_judgement(plugin):
    j = CustomJudge(f"{plugin}:async_reward")
    out = _run(j, _turn())
    assert (out.score, out.votes, out.hint, out.turn_id, out.judge) == (-1, [-1, -1], "Answer in French.", 11, j.name)


@pytest.mark.parametrize("fn", ["two_args", "no_args", "keyword_only"])
def test_wrong_signature_fails_at_start_showing_the_expected_one(plugin, fn):
    with pytest.raises(ConfigError) as e:
        CustomJudge(f"{plugin}:{fn}")
    msg = str(e.value)
    assert "def reward(turn: clawloop.records.Turn) -> float | clawloop.records.Judgement" in msg
    assert fn in msg


def test_optional_extra_parameters_are_fine(plugin):
    assert _run(CustomJudge(f"{plugin}:with_default"), _turn()).score == 1


@pytest.mark.parametrize("spec, needle", [
    ("{plugin}:missing", "no function 'missing'"),
    ("{plugin}:NOT_CALLABLE", "not callable"),
    ("/nonexistent/rm.py:reward", "no such file"),
    ("no_such_pkg_xyz.mod:reward", "no module"),
])
def test_load_errors_are_config_errors(plugin, spec, needle):
    with pytest.raises(ConfigError, match=needle):
        CustomJudge(spec.format(plugin=plugin))


@pytest.mark.parametrize("fn", ["returns_none", "returns_nan"])
def test_non_numeric_return_leaves_turn_pending(plugin, fn):
    with pytest.raises(JudgeUnavailable, match="expected"):
        _run(CustomJudge(f"{plugin}:{fn}"), _turn())


def test_dotted_module_paths(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin.parent))
    sys.modules.pop("my_rm", None)
    assert _run(CustomJudge("my_rm:reward"), _turn()).score == 1
    assert _run(CustomJudge("my_rm.zero"), _turn()).score == 0       # slime style: last name is the function
    assert _run(CustomJudge("my_rm"), _turn("meh")).score == -1       # module alone: `reward`


def test_make_judge_prefers_custom_rm(plugin):
    from clawloop.config import load_config

    cfg = load_config({"judge__custom_rm_path": f"{plugin}:reward"}, env={})
    j = make_judge(cfg)
    assert isinstance(j, CustomJudge) and j.name == f"custom:{plugin}:reward"
    bad = load_config({"judge__custom_rm_path": f"{plugin}:two_args"}, env={})
    with pytest.raises(ConfigError):
        make_judge(bad)

