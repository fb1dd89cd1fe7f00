"""Custom reward plugins (`--custom-rm-path`): clawloop's `reward(turn)`, the OpenClaw-RL README's
`get_reward_model(config)` (a real sequence classifier built from the test model, scoring continuously),
and slime's `reward_func(args, sample)`; signature errors; continuous rewards stored as floats in a
real SQLite file (also one written before the column existed) and carried to the trainer's Sample."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import textwrap
from pathlib import Path

import pytest

from clawloop.config import ConfigError, load_config
from clawloop.judge import JudgeLoop, JudgeUnavailable, make_judge
from clawloop.judge.custom import CustomJudge
from clawloop.plugins import PluginError
from clawloop.records import Judgement, Sample, Turn
from clawloop.store import SQLiteStore

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "plugins"

PLUGIN = textwrap.dedent('''
    from clawloop.records import Judgement

    def reward(turn):
        return 0.7 if "thanks" in (turn.next_state or {}).get("content", "") else -2.5

    async def async_reward(turn):
        return Judgement(turn_id=0, score=-1, votes=[-1, -1], hint="Answer in French.")

    def zero(turn):
        return 0

    def slime_style(args, sample):
        return {"score": 0.25 if sample.metadata["next_state"]["content"] == "thanks!" else -0.5}

    def three_args(a, b, c):
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

    class NoScore:
        pass

    def get_reward_model(config):
        if config["prm_model_path"] == "explode":
            raise OSError("no such model")
        return NoScore()

    NOT_CALLABLE = 3
''')


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "my_rm.py"
    path.write_text(PLUGIN)
    return path


def _turn(content="thanks!", id=11):
    return Turn(session_id="s", index=0, id=id, messages=[{"role": "user", "content": "What is 12+7?"}],
                response_text="19", next_state={"role": "user", "content": content})


def _run(judge, turn):
    return asyncio.run(judge.judge(turn))


def test_turn_reward_keeps_the_float_and_its_sign(plugin):
    j = CustomJudge(str(plugin))  # no ":fn" -> `reward`
    assert j.name == f"custom:{plugin}" and j.kind == "turn"
    good, bad = _run(j, _turn("thanks!")), _run(j, _turn("wrong"))
    assert (good.score, good.reward, good.value, good.votes, good.turn_id, good.judge) == (1, 0.7, 0.7, [1], 11, j.name)
    assert (bad.score, bad.reward) == (-1, -2.5)
    z = _run(CustomJudge(f"{plugin}:zero"), _turn())
    assert (z.score, z.reward, z.value) == (0, None, 0.0)


def test_async_function_returning_judgement(plugin):
    j = CustomJudge(f"{plugin}:async_reward")
    out = _run(j, _turn())
    assert (out.score, out.votes, out.hint, out.turn_id, out.judge) == (-1, [-1, -1], "Answer in French.", 11, j.name)


def test_slime_signature_and_dict_reward(plugin):
    j = CustomJudge(f"{plugin}:slime_style")
    assert j.kind == "slime"
    assert (_run(j, _turn()).reward, _run(j, _turn("no")).reward) == (0.25, -0.5)


def test_slime_example_file_scores_a_mixed_reply_with_a_fraction():
    j = CustomJudge(f"{EXAMPLES / 'slime_reward.py'}:reward_func")
    mixed = _run(j, _turn("thanks, but it is wrong again"))  # 1 praise, 2 complaints
    assert (mixed.score, mixed.reward) == (-1, pytest.approx(-1 / 3))
    assert _run(j, _turn("perfect, thanks!")).value == 1.0


@pytest.mark.parametrize("fn", ["three_args", "no_args", "keyword_only"])
def test_wrong_signature_fails_at_start_showing_the_three_accepted(plugin, fn):
    with pytest.raises(ConfigError) as e:
        CustomJudge(f"{plugin}:{fn}")
    msg = str(e.value)
    assert "--custom-rm-path" in msg and fn in msg
    assert "def reward(turn: clawloop.records.Turn)" in msg and "get_reward_model(config)" in msg
    assert "reward_func(args, sample" in msg


def test_optional_extra_parameters_are_fine(plugin):
    assert _run(CustomJudge(f"{plugin}:with_default"), _turn()).score == 1


@pytest.mark.parametrize("spec, needle", [
    ("{plugin}:missing", "has no attribute 'missing'; callables defined there: .*reward"),
    ("{plugin}:NOT_CALLABLE", "is a int, not a function"),
    ("/nonexistent/rm.py:reward", "no such file"),
    ("no_such_pkg_xyz.mod:reward", "cannot import module 'no_such_pkg_xyz.mod'"),
])
def test_load_errors_are_config_errors_naming_the_flag(plugin, spec, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        CustomJudge(spec.format(plugin=plugin))
    assert "--custom-rm-path" in str(e.value)


@pytest.mark.parametrize("fn", ["returns_none", "returns_nan"])
def test_non_numeric_return_leaves_turn_pending(plugin, fn):
    with pytest.raises(JudgeUnavailable, match="expected a finite number"):
        _run(CustomJudge(f"{plugin}:{fn}"), _turn())


def test_dotted_module_paths(plugin, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin.parent))
    sys.modules.pop("my_rm", None)
    assert _run(CustomJudge("my_rm:reward"), _turn()).score == 1
    assert _run(CustomJudge("my_rm.zero"), _turn()).score == 0       # slime style: last name is the function
    assert _run(CustomJudge("my_rm"), _turn("meh")).score == -1       # module alone: `reward`


def test_dotted_module_from_the_working_directory(plugin, monkeypatch):
    """slime launches with its working directory importable; `my_rm.slime_style` works from there."""
    monkeypatch.chdir(plugin.parent)
    sys.modules.pop("my_rm", None)
    assert _run(CustomJudge("my_rm.slime_style"), _turn()).reward == 0.25


def test_reward_model_factory_errors(plugin, tmp_path):
    cfg = load_config({"judge__custom_rm_path": f"{plugin}:get_reward_model"}, env={"PRM_MODEL_PATH": "explode"})
    with pytest.raises(ConfigError, match=r"get_reward_model\(config\) failed: OSError: no such model.*PRM_MODEL_PATH"):
        make_judge(cfg)
    cfg = load_config({"judge__custom_rm_path": f"{plugin}:get_reward_model"}, env={"PRM_MODEL_PATH": "m"})
    with pytest.raises(PluginError, match=r"returned NoScore, which has no score\(prompt, response, next_state\)"):
        make_judge(cfg)


def test_a_model_path_the_turn_plugin_cannot_receive_is_refused(plugin):
    cfg = load_config({"judge__custom_rm_path": f"{plugin}:reward"}, env={"PRM_MODEL_PATH": "/models/prm"})
    with pytest.raises(ConfigError, match=r"judge\.model: .*PRM_MODEL_PATH.*get_reward_model"):
        make_judge(cfg)


def test_make_judge_prefers_custom_rm(plugin):
    cfg = load_config({"judge__custom_rm_path": f"{plugin}:reward"}, env={})
    j = make_judge(cfg)
    assert isinstance(j, CustomJudge) and j.name == f"custom:{plugin}:reward"
    with pytest.raises(ConfigError):
        make_judge(load_config({"judge__custom_rm_path": f"{plugin}:three_args"}, env={}))


def test_prm_example_with_a_real_classifier_scores_continuously_into_the_store(random_model_dir, tmp_path):
    """The OpenClaw-RL README's shape unchanged: get_reward_model(config) loads a sequence classifier from
    PRM_MODEL_PATH (here the random test model with a fresh 2-class head); its probabilities are stored as
    floats and reach the Sample the trainer eats."""
    cfg = load_config({"data_dir": str(tmp_path), "judge__custom_rm_path": str(EXAMPLES / "prm_reward.py")},
                      env={"PRM_MODEL_PATH": str(random_model_dir)})
    judge = make_judge(cfg)
    assert judge.kind == "factory"
    store = SQLiteStore(tmp_path / "clawloop.db")
    try:
        tids = [store.add_turn(Turn(session_id=f"s{i}", index=0, messages=[{"role": "user", "content": f"q{i}"}],
                                    response_text=f"answer {i}", next_state={"role": "user", "content": c},
                                    next_state_at=1.0)).result(10)
                for i, c in enumerate(["thanks!", "no, that is wrong"])]
        loop = JudgeLoop(store, judge, cfg.judge)

        async def scenario():
            stop = asyncio.Event()
            task = asyncio.create_task(loop.run(stop))
            while any(store.get_judgement(t, judge.name) is None for t in tids):
                await asyncio.sleep(0.02)
            stop.set()
            await task

        asyncio.run(asyncio.wait_for(scenario(), 60))
        rows = store.judged_turns(judge.name, 0, 10)
        values = [j.value for _, _, j in rows]
        assert all(0.0 < v < 1.0 for v in values) and values[0] != values[1]  # probabilities, not signs
        assert all(j.score == 1 and j.reward == v for (_, _, j), v in zip(rows, values))
        assert [Sample.from_turn(t, j).reward for _, t, j in rows] == values
        assert loop.stats()["judge/window_reward_mean"] == pytest.approx(sum(values) / 2)
    finally:
        store.close()


def test_reward_column_is_added_to_a_store_written_before_it(tmp_path):
    """A store file from before `judgements.reward`: opened, it gets the column; old rows read as the score."""
    path = tmp_path / "clawloop.db"
    s = SQLiteStore(path)
    tid = s.add_turn(_turn(id=None)).result(10)
    assert s.save_judgement(Judgement(turn_id=tid, score=-1, votes=[-1], judge="old")).result(10)
    s.close()
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE judgements DROP COLUMN reward")
    con.commit()
    con.close()
    s = SQLiteStore(path)
    try:
        old = s.get_judgement(tid, "old")
        assert (old.score, old.reward, old.value) == (-1, None, -1.0)
        assert s.save_judgement(Judgement(turn_id=tid, score=1, votes=[1], judge="new", reward=0.3)).result(10)
        assert s.get_judgement(tid, "new").value == 0.3
        assert {r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(judgements)")} >= {"reward"}
    finally:
        s.close()
