"""The judge loop against a real SQLite store: every turn judged exactly once,
failures (errors, garbage, hangs) leave turns pending and retried, pending
turns survive a restart, a collapsed score distribution is flagged."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter

import pytest

from clawloop.config import ConfigError, load_config
from clawloop.apps.judge import judge_service, run_judge
from clawloop.judge import JudgeLoop, JudgeUnavailable, OfflineJudge, judge_name, make_judge
from clawloop.records import Judgement, Turn
from clawloop.store import SQLiteStore, Store
from conftest import run_cli


def _cfg(tmp_path=None, **judge):
    cfg = load_config({"data_dir": str(tmp_path or ".")}, env={})
    j = cfg.judge
    j.num_workers, j.queue_size, j.poll_interval_s, j.timeout_s, j.max_retries = 3, 4, 0.02, 2.0, 1
    for k, v in judge.items():
        setattr(j, k, v)
    return cfg


_sessions = iter(range(10**9))


def _add_turns(store: Store, n: int, content: str = "Thanks!", **kw) -> list[int]:
    futs = [store.add_turn(Turn(session_id=f"s{next(_sessions)}", index=0,
                                messages=[{"role": "user", "content": f"q{i}?"}], response_text=f"a{i}",
                                next_state={"role": "user", "content": content}, next_state_at=time.time(), **kw))
            for i in range(n)]
    return [f.result(10) for f in futs]


class Scripted:
    """A judge whose behaviour per call is scripted; counts calls per turn."""

    name = "scripted"

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.calls: Counter[int] = Counter()

    async def judge(self, turn: Turn) -> Judgement:
        self.calls[turn.id] += 1
        return await self.behaviour(turn, self.calls[turn.id])

    async def close(self) -> None:
        pass


async def _ok(turn, n):
    return Judgement(turn_id=turn.id, score=1, votes=[1], judge="ignored")


async def _run_until(loop: JudgeLoop, cond, timeout: float = 15.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(loop.run(stop))
    try:
        deadline = time.monotonic() + timeout
        while not cond():
            if task.done():
                task.result()
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out; stats={loop.stats()}")
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


@pytest.fixture
def store(tmp_path):
    s = SQLiteStore(tmp_path / "clawloop.db")
    yield s
    s.close()


def test_every_turn_judged_exactly_once(store):
    ids = _add_turns(store, 12)
    judge = Scripted(_ok)
    loop = JudgeLoop(store, judge, _cfg().judge)  # queue of 4 < 12 turns: the feeder refills from the store
    asyncio.run(_run_until(loop, lambda: store.count_pending_judgement("scripted") == 0))
    assert sorted(judge.calls) == ids and set(judge.calls.values()) == {1}
    for tid in ids:
        j = store.get_judgement(tid, "scripted")
        assert (j.score, j.votes, j.judge) == (1, [1], "scripted")  # the loop names it by the judge
    s = loop.stats()
    assert s["judge/judged"] == 12 and s["judge/score_pos"] == 12 and s["judge/failures"] == 0
    # A second run finds nothing to do.
    again = Scripted(_ok)
    asyncio.run(_run_until(JudgeLoop(store, again, _cfg().judge), lambda: True))
    assert not again.calls


def test_judge_down_leaves_turns_pending_then_judges_them_once(store):
    ids = _add_turns(store, 5)
    state = {"down": True}

    async def flaky(turn, n):
        if state["down"]:
            raise JudgeUnavailable("connection refused")
        return Judgement(turn_id=turn.id, score=-1, votes=[-1])

    judge = Scripted(flaky)
    loop = JudgeLoop(store, judge, _cfg().judge, retry_base_s=0.01, cooldown_base_s=0.05)

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        while loop.failures < 2 * len(ids):  # every turn failed at least one whole attempt (most two)
            await asyncio.sleep(0.02)
        assert store.count_pending_judgement("scripted") == len(ids)
        assert all(store.get_judgement(t, "scripted") is None for t in ids)
        s = loop.stats()
        assert s["judge/cooling"] > 0 and s["judge/failing_turns"] == len(ids)
        assert s["judge/oldest_pending_age_s"] > 0
        state["down"] = False
        deadline = time.monotonic() + 15
        while store.count_pending_judgement("scripted"):
            assert time.monotonic() < deadline, loop.stats()
            await asyncio.sleep(0.02)
        stop.set()
        await task

    asyncio.run(scenario())
    assert all(store.get_judgement(t, "scripted").score == -1 for t in ids)
    assert all(n >= 2 for n in judge.calls.values())     # retried ...
    assert loop.stats()["judge/judged"] == len(ids)       # ... and saved once each


def test_garbage_replies_are_not_stored(store):
    (tid,) = _add_turns(store, 1)

    async def garbage_twice(turn, n):
        if n <= 3:
            return Judgement(turn_id=turn.id, score=0, votes=[None, None, None], malformed=3)
        return Judgement(turn_id=turn.id, score=1, votes=[1, None, 1], malformed=1)

    loop = JudgeLoop(store, Scripted(garbage_twice), _cfg().judge, retry_base_s=0.01, cooldown_base_s=0.05)
    asyncio.run(_run_until(loop, lambda: store.get_judgement(tid, "scripted") is not None))
    j = store.get_judgement(tid, "scripted")
    assert (j.score, j.votes, j.malformed) == (1, [1, None, 1], 1)
    s = loop.stats()
    assert s["judge/garbage_replies"] == 3 and s["judge/malformed_vote_rate"] == pytest.approx(10 / 12)


def test_hanging_judge_times_out_and_is_retried(store):
    (tid,) = _add_turns(store, 1)

    async def hang_first(turn, n):
        if n == 1:
            await asyncio.sleep(30)
        return Judgement(turn_id=turn.id, score=0, votes=[0])

    loop = JudgeLoop(store, Scripted(hang_first), _cfg(timeout_s=0.1).judge, retry_base_s=0.01)
    t0 = time.monotonic()
    asyncio.run(_run_until(loop, lambda: store.get_judgement(tid, "scripted") is not None))
    assert time.monotonic() - t0 < 10
    assert loop.stats()["judge/call_errors"] == 1


def test_pending_turns_survive_a_restart(tmp_path):
    path = tmp_path / "clawloop.db"
    store = SQLiteStore(path)
    ids = _add_turns(store, 4, content="no, I meant the other file")

    async def down(turn, n):
        raise JudgeUnavailable("down")

    class Down(Scripted):
        name = "offline"

    loop = JudgeLoop(store, Down(down), _cfg().judge, retry_base_s=0.01, cooldown_base_s=10)
    asyncio.run(_run_until(loop, lambda: loop.failures >= len(ids)))
    store.close()

    store = SQLiteStore(path)  # a new process: nothing but the file
    assert store.count_pending_judgement("offline") == len(ids)
    loop = JudgeLoop(store, OfflineJudge(), _cfg().judge)
    asyncio.run(_run_until(loop, lambda: store.count_pending_judgement("offline") == 0))
    store.close()

    store = SQLiteStore(path)
    for tid in ids:
        j = store.get_judgement(tid, "offline")
        assert j.score == -1 and j.hint and "other file" in j.hint
    counting = Down(_ok)
    asyncio.run(_run_until(JudgeLoop(store, counting, _cfg().judge), lambda: True))
    assert not counting.calls
    store.close()


def test_final_turn_without_next_state_is_judged_zero(store):
    tid = store.add_turn(Turn(session_id="s", index=0, response_text="bye", final=True)).result(10)
    loop = JudgeLoop(store, OfflineJudge(), _cfg().judge)
    asyncio.run(_run_until(loop, lambda: store.get_judgement(tid, "offline") is not None))
    assert store.get_judgement(tid, "offline").score == 0


def test_constant_scores_raise_a_collapse_warning(store, caplog):
    _add_turns(store, 8, content="ok")  # the offline judge scores "ok" 0
    loop = JudgeLoop(store, OfflineJudge(), _cfg().judge, collapse_window=5)
    with caplog.at_level(logging.WARNING, logger="clawloop.judge.loop"):
        asyncio.run(_run_until(loop, lambda: store.count_pending_judgement("offline") == 0))
    s = loop.stats()
    assert s["judge/score_collapse"] == 1.0 and s["judge/window_zero_fraction"] == 1.0
    assert any("COLLAPSED" in r.getMessage() for r in caplog.records)


def test_mixed_scores_do_not_collapse(store):
    _add_turns(store, 3, content="ok")
    _add_turns(store, 3, content="Thanks!")
    _add_turns(store, 3, content="wrong, try again")
    loop = JudgeLoop(store, OfflineJudge(), _cfg().judge, collapse_window=9)
    asyncio.run(_run_until(loop, lambda: store.count_pending_judgement("offline") == 0))
    s = loop.stats()
    assert s["judge/score_collapse"] == 0.0
    assert (s["judge/score_pos"], s["judge/score_zero"], s["judge/score_neg"]) == (3, 3, 3)


def test_constant_continuous_rewards_collapse_too(store, caplog):
    """A reward model that scores everything 0.5 (the OpenClaw-RL troubleshooting case) is as dead a
    signal as constant signs: flagged, with the value in the warning."""
    _add_turns(store, 6)

    async def half(turn, n):
        return Judgement(turn_id=turn.id, score=1, votes=[1], reward=0.5)

    loop = JudgeLoop(store, Scripted(half), _cfg().judge, collapse_window=5)
    with caplog.at_level(logging.WARNING, logger="clawloop.judge.loop"):
        asyncio.run(_run_until(loop, lambda: store.count_pending_judgement("scripted") == 0))
    s = loop.stats()
    assert s["judge/score_collapse"] == 1.0 and s["judge/window_reward_mean"] == 0.5
    assert s["judge/window_reward_std"] == 0.0 and "every reward +0.5" in caplog.text


def test_judge_model_is_honoured_or_refused(random_model_dir, tmp_path):
    """judge.model (--judge-model, JUDGE_MODEL_PATH, PRM_MODEL_PATH) is never accepted and ignored."""
    with pytest.raises(ConfigError, match=r"judge\.model: .*PRM_MODEL_PATH is '/models/prm', but the offline judge"):
        make_judge(load_config({}, env={"PRM_MODEL_PATH": "/models/prm"}))
    with pytest.raises(ConfigError, match=r"judge\.model: .*--judge self judges with the served policy"):
        make_judge(load_config({"judge__kind": "self", "judge__model": "/models/j"}, env={}))
    with pytest.raises(ConfigError, match=r"judge\.model: --judge frozen loads a local model folder, and 'org/judge'"):
        make_judge(load_config({"judge__kind": "frozen", "judge__model": "org/judge"}, env={}))
    with pytest.raises(ConfigError, match="JUDGE_MODEL_PATH='a' and PRM_MODEL_PATH='b' differ"):
        load_config({}, env={"JUDGE_MODEL_PATH": "a", "PRM_MODEL_PATH": "b"})
    cfg = load_config({"judge__kind": "frozen", "data_dir": str(tmp_path), "model__device": "cpu",
                       "model__path": "/unused/policy"}, env={"PRM_MODEL_PATH": str(random_model_dir)})
    frozen = make_judge(cfg)  # a local folder: the frozen judge serves that model, not the policy
    assert frozen.backend.engine.model_path == str(random_model_dir) and frozen.max_tokens == cfg.judge.max_tokens
    r = run_cli("judge-eval", env={"PRM_MODEL_PATH": "/models/prm"})
    assert r.returncode == 2 and "config error: judge.model:" in r.stderr and "PRM_MODEL_PATH" in r.stderr


def test_judge_names_and_factory(tmp_path):
    assert judge_name(_cfg()) == "offline"
    assert isinstance(make_judge(_cfg()), OfflineJudge)
    url = load_config({"judge__url": "http://127.0.0.1:9/v1", "judge__model": "qwen"}, env={})
    assert url.judge.kind == "url" and judge_name(url) == "url:qwen" == make_judge(url).name
    assert judge_name(load_config({"judge__url": "http://127.0.0.1:9/v1"}, env={})) == "url:127.0.0.1:9"
    with pytest.raises(ConfigError, match="served engine"):
        make_judge(load_config({"judge__kind": "self"}, env={}))
    with pytest.raises(ConfigError):
        make_judge(load_config({"judge__kind": "none"}, env={}))
    votes = load_config({}, env={"MAJORITY_VOTE_N": "5", "MAJORITY_VOTE_THRESHOLD": "0.6",
                                 "JUDGE_MODEL_PATH": "judge-m", "CLAWLOOP_JUDGE_URL": "http://127.0.0.1:9"})
    j = make_judge(votes)
    assert (j.votes, j.threshold, j.name) == (5, 0.6, "url:judge-m")


def test_judge_service_runs_the_loop_beside_serving(store):
    ids = _add_turns(store, 2)
    cfg = _cfg()
    service = judge_service(cfg, None, store)
    assert isinstance(service.loop, JudgeLoop) and service.stats() == service.loop.stats()

    async def scenario():
        task = asyncio.create_task(service.run())  # the gateway cancels it at shutdown
        while store.count_pending_judgement("offline"):
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert [store.get_judgement(t, "offline").score for t in ids] == [1, 1]


def test_run_judge_on_a_data_dir(tmp_path):
    cfg = _cfg(tmp_path / "data")
    with pytest.raises(ConfigError, match="no store"):
        asyncio.run(run_judge(cfg, asyncio.Event()))
    store = SQLiteStore(tmp_path / "data" / "clawloop.db")
    ids = _add_turns(store, 3, content="Traceback (most recent call last):\nValueError: bad")
    store.close()

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(run_judge(cfg, stop))
        probe = SQLiteStore(tmp_path / "data" / "clawloop.db")
        try:
            while probe.count_pending_judgement("offline"):
                assert not task.done(), task.exception()  # a judge that died fails here, not by hanging
                await asyncio.sleep(0.05)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
            probe.close()

    asyncio.run(scenario())
    store = SQLiteStore(tmp_path / "data" / "clawloop.db")
    assert [store.get_judgement(t, "offline").score for t in ids] == [-1, -1, -1]
    store.close()


def test_up_judges_every_captured_main_turn(random_model_dir, tmp_path):
    """`clawloop up` wiring (judge on, trainer off): the offline judge scores the turns the
    gateway captures, including a session's last turn (closed with X-Session-Done)."""
    import httpx
    from conftest import ServerThread, make_cfg

    from clawloop.apps.serve import build_app
    from clawloop.tinymodel.corpus import style_instruction

    cfg = make_cfg(random_model_dir, tmp_path / "data", model__device="cpu", judge__poll_interval_s="0.05")
    app, parts = build_app(cfg, judge=True, train=False)
    server = ServerThread(app).start()
    store, loop = parts.store, parts.judge
    try:
        msgs = [{"role": "user", "content": "What is 12+7?"}]
        with httpx.Client(base_url=server.url, timeout=60) as c:
            r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4},
                       headers={"X-Session-Id": "u1"})
            msgs += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                     {"role": "user", "content": "just the number, please"}]
            c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 4},
                   headers={"X-Session-Id": "u1", "X-Session-Done": "1"}).raise_for_status()
        deadline = time.monotonic() + 30
        while True:
            store.flush()
            turns = store.session_turns("u1")
            # the loop counts a verdict once its write has returned: the store can show it a moment before
            if len(turns) == 2 and all(store.get_judgement(t.id, "offline") for t in turns) \
                    and loop.stats()["judge/judged"] >= 2:
                break
            assert time.monotonic() < deadline, loop.stats()
            time.sleep(0.05)
        first, last = (store.get_judgement(t.id, "offline") for t in turns)
        assert first.score == -1 and first.hint == style_instruction("bare")
        assert last.score == 0 and turns[1].final
        assert loop.stats()["judge/judged"] == 2
    finally:
        server.stop()
        store.close()
