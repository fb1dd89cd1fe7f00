"""The LLM judge over real HTTP: a scripted OpenAI-compatible server on 127.0.0.1
stands in for the judge model (no real LLM judge runs here), so verdicts are
deterministic. It can also think: reasoning in `reasoning_content` or inline
`<think>` blocks, cut at the request's `max_tokens` (one word per token) the way
a real server cuts it. Also: retries when the server errors or hangs, bounded
retries when it only rambles, `judge-eval` against a URL, and the in-process
engine backend (`--judge self`)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time

import pytest
from conftest import ServerThread, run_cli
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from clawloop.judge import JudgeLoop, JudgeUnavailable
from clawloop.judge.llm import EngineChatBackend, HTTPChatBackend, LLMJudge, chat_completions_url
from clawloop.records import Turn
from clawloop.store import SQLiteStore


class Script:
    """What the fake judge answers. `verdicts` cycles per scoring call; hint calls get `hint_replies`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.fail_next = 0      # answer HTTP 500 to this many requests
        self.hang_next = 0      # sleep `hang_s` on this many requests
        self.hang_s = 3.0
        self.verdicts = ["\\boxed{1}"]
        self.hint_replies = ["\\boxed{-1}"]
        self.n_score = 0
        self.n_hint = 0
        self.think_words = 0     # > 0: every reply thinks this many words first
        self.think_style = "field"  # field: reasoning_content; inline: <think>...</think> in content

    def next(self, body: dict) -> tuple[str, object]:
        with self.lock:
            self.requests.append(body)
            if self.fail_next:
                self.fail_next -= 1
                return "fail", 500
            if self.hang_next:
                self.hang_next -= 1
                return "hang", self.hang_s
            prompt = body["messages"][-1]["content"]
            if "[HINT_START]" in prompt:
                reply = self.hint_replies[self.n_hint % len(self.hint_replies)]
                self.n_hint += 1
            else:
                reply = self.verdicts[self.n_score % len(self.verdicts)]
                self.n_score += 1
            return "reply", reply


def fake_judge_app(script: Script) -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "fake-judge", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        kind, arg = script.next(body)
        if kind == "fail":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=arg)
        if kind == "hang":
            await asyncio.sleep(arg)
            return JSONResponse({"error": {"message": "too late"}}, status_code=504)
        message, finish = {"role": "assistant", "content": arg}, "stop"
        if script.think_words:
            # a tentative verdict mid-thought: only a finished thought may be read
            words = ["hmm"] * (script.think_words // 2) + ["maybe", "\\boxed{1}?"] + ["hmm"] * (script.think_words // 2)
            answer = arg.split()
            if len(words) + len(answer) > body["max_tokens"]:  # cut while thinking, as a server does
                words, answer, finish = words[: body["max_tokens"]], [], "length"
            if script.think_style == "field":
                message = {"role": "assistant", "content": " ".join(answer) or None,
                           "reasoning_content": " ".join(words)}
            else:
                close = "</think>" if answer else ""
                message = {"role": "assistant", "content": f"<think>{' '.join(words)}{close}{' '.join(answer)}"}
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}]}

    return app


@pytest.fixture
def fake_judge():
    script = Script()
    server = ServerThread(fake_judge_app(script)).start()
    script.url = server.url + "/v1"
    yield script
    server.stop()


def _turn(content="Thanks, that worked!", role="user", id=1):
    return Turn(session_id="s", index=0, id=id, messages=[{"role": "user", "content": "What is 12+7?"}],
                response_text="The answer is 19.", next_state={"role": role, "content": content})


def _judge(url, **kw):
    kw.setdefault("hints", False)
    return LLMJudge(HTTPChatBackend(url, model=kw.pop("model", "m"), timeout_s=kw.pop("timeout_s", 10.0)),
                    name="url:m", **kw)


async def _judge_once(judge, turn):
    try:
        return await judge.judge(turn)
    finally:
        await judge.close()


def test_chat_completions_url():
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/openai/v1") == "http://h:1/openai/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"


def test_single_vote_over_http_and_the_prompt_it_sends(fake_judge):
    fake_judge.verdicts = ["The tool failed. \\boxed{-1}"]
    j = asyncio.run(_judge_once(_judge(fake_judge.url, temperature=0.3),
                                _turn('{"error": "city not found"}', role="tool")))
    assert (j.score, j.votes, j.malformed, j.hint, j.turn_id) == (-1, [-1], 0, None, 1)
    (body,) = fake_judge.requests
    assert body["model"] == "m" and body["temperature"] == 0.3
    prompt = body["messages"][-1]["content"]
    assert "Next state (role: tool)" in prompt and "city not found" in prompt and "The answer is 19." in prompt
    assert "\\boxed{1}" in prompt and "\\boxed{-1}" in prompt and "\\boxed{0}" in prompt


@pytest.mark.parametrize("verdicts, threshold, score, malformed", [
    (["\\boxed{1}", "\\boxed{1}", "\\boxed{-1}"], 0.5, 1, 0),
    (["\\boxed{1}", "\\boxed{-1}", "no verdict here"], 0.5, 0, 1),       # tie among valid votes
    (["\\boxed{-1}", "\\boxed{-1}", "\\boxed{1}"], 0.8, 0, 0),          # 2/3 below the threshold
    (["\\boxed{0}", "\\boxed{5}", "\\boxed{-1} \\boxed{1}"], 0.5, 0, 1),  # out of range; last box counts
])
def test_majority_vote_over_http(fake_judge, verdicts, threshold, score, malformed):
    fake_judge.verdicts = verdicts
    j = asyncio.run(_judge_once(_judge(fake_judge.url, votes=3, threshold=threshold), _turn()))
    assert (j.score, j.malformed, len(j.votes)) == (score, malformed, 3)
    assert len(fake_judge.requests) == 3


def test_hint_votes_keep_the_longest_positive_hint(fake_judge):
    fake_judge.verdicts = ["\\boxed{-1}"]
    fake_judge.hint_replies = [
        "[HINT_START]Answer with just the number.[HINT_END] \\boxed{1}",
        "[HINT_START]Give only the number, without any sentence around it.[HINT_END] \\boxed{-1}",
        "[HINT_START]Short.[HINT_END] \\boxed{1}",
    ]
    j = asyncio.run(_judge_once(_judge(fake_judge.url, votes=3, hints=True), _turn("just the number, please")))
    assert j.score == -1 and j.hint == "Answer with just the number."
    hint_prompts = [b for b in fake_judge.requests if "[HINT_START]" in b["messages"][-1]["content"]]
    assert len(hint_prompts) == 3 and len(fake_judge.requests) == 6


def test_model_name_from_models_endpoint(fake_judge):
    j = asyncio.run(_judge_once(_judge(fake_judge.url, model=""), _turn()))
    assert j.score == 1 and fake_judge.requests[0]["model"] == "fake-judge"


def test_http_error_raises_unavailable(fake_judge):
    fake_judge.fail_next = 1
    with pytest.raises(JudgeUnavailable, match="HTTP 500"):
        asyncio.run(_judge_once(_judge(fake_judge.url), _turn()))


def test_refused_connection_raises_unavailable():
    from conftest import free_port

    with pytest.raises(JudgeUnavailable):
        asyncio.run(_judge_once(_judge(f"http://127.0.0.1:{free_port()}/v1"), _turn()))


def test_no_next_state_means_no_call(fake_judge):
    t = _turn()
    t.next_state, t.final = None, True
    j = asyncio.run(_judge_once(_judge(fake_judge.url), t))
    assert (j.score, j.votes) == (0, []) and not fake_judge.requests


def _loop_cfg(**kw):
    from clawloop.config import load_config

    cfg = load_config({}, env={}).judge
    cfg.num_workers, cfg.poll_interval_s, cfg.max_retries, cfg.timeout_s = 2, 0.02, 2, 5.0
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg


def test_loop_retries_through_server_errors_and_hangs(fake_judge, tmp_path):
    store = SQLiteStore(tmp_path / "clawloop.db")
    ids = [store.add_turn(Turn(session_id=f"s{i}", index=0, messages=[{"role": "user", "content": "hi"}],
                               response_text="hello", next_state={"role": "user", "content": "no, wrong"}))
           .result(10) for i in range(3)]
    fake_judge.verdicts = ["\\boxed{-1}"]
    fake_judge.fail_next, fake_judge.hang_next, fake_judge.hang_s = 4, 2, 2.0
    judge = _judge(fake_judge.url, timeout_s=0.3)
    loop = JudgeLoop(store, judge, _loop_cfg(timeout_s=0.3), retry_base_s=0.01, cooldown_base_s=0.05)

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        deadline = time.monotonic() + 20
        while store.count_pending_judgement("url:m"):
            assert time.monotonic() < deadline, loop.stats()
            await asyncio.sleep(0.05)
        stop.set()
        await task
        await judge.close()

    asyncio.run(scenario())
    assert [store.get_judgement(t, "url:m").score for t in ids] == [-1, -1, -1]
    s = loop.stats()
    assert s["judge/call_errors"] >= 6 and s["judge/judged"] == 3
    store.close()


def test_loop_keeps_turns_pending_while_judge_only_rambles(fake_judge, tmp_path):
    store = SQLiteStore(tmp_path / "clawloop.db")
    tid = store.add_turn(Turn(session_id="s", index=0, response_text="x",
                              next_state={"role": "user", "content": "thanks"})).result(10)
    fake_judge.verdicts = ["I am not sure what to say."]
    judge = _judge(fake_judge.url, votes=2)
    loop = JudgeLoop(store, judge, _loop_cfg(max_retries=0), retry_base_s=0.01, cooldown_base_s=0.05)

    async def scenario():
        stop = asyncio.Event()
        task = asyncio.create_task(loop.run(stop))
        while loop.stats()["judge/garbage_replies"] < 3:
            await asyncio.sleep(0.02)
        assert store.get_judgement(tid, "url:m") is None           # garbage is never stored as a zero
        fake_judge.verdicts = ["\\boxed{1}"]
        while store.get_judgement(tid, "url:m") is None:
            await asyncio.sleep(0.02)
        stop.set()
        await task
        await judge.close()

    asyncio.run(scenario())
    assert store.get_judgement(tid, "url:m").score == 1
    assert loop.stats()["judge/malformed_vote_rate"] > 0.5
    store.close()


def test_judge_eval_cli_against_a_url(fake_judge, tmp_path):
    data = tmp_path / "set.jsonl"
    rows = [("Thanks!", 1), ("wrong", -1), ("great", 1), ("hmm", 0)]
    data.write_text("".join(json.dumps({"response": "r", "next_state": {"role": "user", "content": c},
                                        "label": lab}) + "\n" for c, lab in rows))
    fake_judge.verdicts = ["\\boxed{1}"]  # always +1: right on 2 of 4
    r = run_cli("judge-eval", "--data", str(data), "--judge", fake_judge.url, "--judge-model", "m",
                "--no-judge-hints")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1] == "accuracy=0.500 n=4"
    assert lines[0] == "judge=url:m" and "label" in lines[1]


def test_judge_eval_cli_offline_on_packaged_set():
    r = run_cli("judge-eval")
    assert r.returncode == 0, r.stderr
    m = re.fullmatch(r"accuracy=(\d\.\d{3}) n=(\d+)", r.stdout.strip().splitlines()[-1])
    assert m and float(m.group(1)) >= 0.9 and int(m.group(2)) >= 200


def test_engine_backend_generates_in_process(engine):
    """`--judge self`: the served engine answers judge prompts without HTTP. The random
    test model writes no verdict, so its votes are malformed (and the loop keeps turns pending).
    The judge prompt (about 570 tokens of the tiny tokenizer) fits its context."""
    backend = EngineChatBackend(engine)
    text = asyncio.run(backend.complete([{"role": "user", "content": "Verdict?"}], temperature=1.0, max_tokens=4))
    assert isinstance(text, str)

    judge = LLMJudge(backend, name="self", votes=2, hints=False, max_tokens=4)
    j = asyncio.run(judge.judge(_turn()))
    assert len(j.votes) == 2 and j.malformed == sum(v is None for v in j.votes)
    assert j.judge == "self" and j.score in (-1, 0, 1)


def test_frozen_judge_loads_its_own_engine(random_model_dir, tmp_path):
    """`--judge frozen`: a separate, frozen HFEngine of the base model, started lazily, stopped on close."""
    from clawloop.config import load_config
    from clawloop.judge import make_judge

    cfg = load_config({"model__path": str(random_model_dir), "data_dir": str(tmp_path), "model__device": "cpu",
                       "judge__kind": "frozen", "judge__hints": "false"}, env={})
    judge = make_judge(cfg)
    assert judge.name == "frozen" and isinstance(judge.backend, EngineChatBackend) and judge.backend.owns_engine
    judge.max_tokens = 4
    j = asyncio.run(_judge_once(judge, _turn()))
    assert len(j.votes) == 1 and not judge.backend._started


# -- thinking judges ---------------------------------------------------------------------------


@pytest.mark.parametrize("style, verdict, expect", [
    ("field", "The user corrects it. \\boxed{-1}", -1),    # reasoning_content + answer
    ("inline", "The user corrects it. \\boxed{-1}", -1),   # <think>...</think> answer
    ("field", "", None),                                    # no answer: the finished reasoning has only "maybe 1?"
])
def test_thinking_judge_reads_the_answer_not_the_musing(fake_judge, style, verdict, expect):
    fake_judge.verdicts, fake_judge.think_words, fake_judge.think_style = [verdict], 40, style
    j = asyncio.run(_judge_once(_judge(fake_judge.url, max_tokens=4096), _turn("no, that's wrong")))
    if expect is None:  # a verdict given only while thinking still counts when the thought finished
        assert j.votes == [1]
    else:
        assert (j.score, j.votes, j.malformed) == (expect, [expect], 0)


def test_thinking_judge_cut_at_max_tokens_is_bounded_then_more_tokens_fixes_it(fake_judge, tmp_path, caplog):
    """A judge that thinks for 1000 tokens under the old 512 cap never answers: its replies are counted
    as truncated, the turn is retried `max_malformed` times, then stored as 0 with a warning that names
    --judge-max-tokens. The configured limit (PRM_MAX_NEW_TOKENS, as OpenClaw-RL's scripts set it) is
    what the server is asked for, and with it the verdict arrives."""
    from clawloop.config import load_config
    from clawloop.judge import make_judge

    fake_judge.verdicts, fake_judge.think_words = ["\\boxed{-1}"], 1000
    store = SQLiteStore(tmp_path / "clawloop.db")
    try:
        results = {}
        for limit in ("512", "2048"):
            tid = store.add_turn(Turn(session_id=f"s{limit}", index=0, messages=[{"role": "user", "content": "hi"}],
                                      response_text="hello", next_state={"role": "user", "content": "no, wrong"},
                                      next_state_at=time.time())).result(10)
            cfg = load_config({"judge__url": fake_judge.url, "judge__model": "m", "judge__hints": "false"},
                              env={"PRM_MAX_NEW_TOKENS": limit})
            judge = make_judge(cfg)
            loop = JudgeLoop(store, judge, _loop_cfg(max_retries=1, max_malformed=3, max_tokens=int(limit)),
                             retry_base_s=0.01, cooldown_base_s=0.02)

            async def scenario():
                stop = asyncio.Event()
                task = asyncio.create_task(loop.run(stop))
                while store.get_judgement(tid, judge.name) is None:
                    await asyncio.sleep(0.02)
                stop.set()
                await task
                await judge.close()

            with caplog.at_level("WARNING", logger="clawloop.judge.loop"):
                asyncio.run(asyncio.wait_for(scenario(), 30))
            results[limit] = (store.get_judgement(tid, judge.name), loop.stats())
        cut, cut_stats = results["512"]
        assert (cut.score, cut.votes, cut.malformed) == (0, [None], 1)
        assert cut_stats["judge/gave_up"] == 1 and cut_stats["judge/replies_truncated"] == 3
        assert "JUDGE GAVE UP" in caplog.text and "--judge-max-tokens=512" in caplog.text
        ok, ok_stats = results["2048"]
        assert (ok.score, ok.votes) == (-1, [-1]) and ok_stats["judge/gave_up"] == 0
        assert {b["max_tokens"] for b in fake_judge.requests} == {512, 2048}
    finally:
        store.close()
