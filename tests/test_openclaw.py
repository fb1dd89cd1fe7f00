"""OpenClaw itself against a real `clawloop up` (issue #28): `make test-openclaw`, run by .ci/run.

A `clawloop up` child (the shipped tiny model, the offline judge, training on with a rollout batch of
2, the publish gate off so the version can move on the tiny model) on a free loopback port, and the
real `openclaw agent --local` CLI (installed by `make openclaw` under .venv/openclaw) in a home of its
own, driven through 3 sessions x 3 turns. OpenClaw sends no session header: its turns are tied
together by clawloop's header-less inference (each request's history ends with the answer served
before), which is what this checks works for OpenClaw's real traffic.

The lean profile (`integrations/openclaw/openclaw-lean.json`: minimal tools, no skills, no bootstrap
files, ~6 k prompt tokens) keeps the run to minutes on 2 cores; the default profile's ~28.7 k-token
prompt is measured in bench/openclaw_latency.py (it also shows why the default profile does not link
header-less: see README "Use it from OpenClaw").

Minutes, so marked `openclaw` and kept out of `make test`.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "integrations" / "openclaw"))
from openclaw_driver import OpenClaw, missing  # noqa: E402

from transformers import AutoTokenizer  # noqa: E402

from clawloop.config import Config  # noqa: E402
from clawloop.gateway.render import render_prompt  # noqa: E402
from clawloop.naming import model_path  # noqa: E402
from clawloop.store import open_store  # noqa: E402
from clawloop.users import Server  # noqa: E402

pytestmark = [pytest.mark.openclaw, pytest.mark.timeout(2400)]

# What a user says, turn by turn: the second and third messages are the next states of the first and
# second answers, one a thanks (the offline judge's +1) and one a correction (-1), so the judge has a
# signal to give and the trainer a batch to take.
SESSIONS = [
    ["What is 2+3?", "Thanks, that is right. What is 4+4?", "No, I meant 4*4, not 4+4."],
    ["Name a colour.", "No, that is wrong. I asked for a colour.", "Thanks! Now name a fruit."],
    ["What is 10-7?", "Great, thank you. What is 9+1?", "No, I meant 9-1."],
]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _assert_token_exact(turns: list, tok) -> None:
    """The stored prompt ids are the rendering of the stored messages and tools; the response ids
    decode to the stored text and each has its logprob."""
    for t in turns:
        assert t.finish_reason in ("stop", "length", "tool_calls"), t.finish_reason
        assert render_prompt(tok, t.messages, t.tools) == t.prompt_ids
        assert len(t.response_logprobs) == len(t.response_ids) > 0
        if not t.tool_calls:
            assert tok.decode(t.response_ids, skip_special_tokens=True) == t.response_text
        assert t.messages[0]["role"] == "system" and "OpenClaw" in t.messages[0]["content"]


def test_openclaw_sessions_are_captured_linked_judged_and_trained(tmp_path: Path) -> None:
    if missing():
        pytest.fail(f"OpenClaw is not installed ({missing()}); `make test-openclaw` installs it first")
    data = tmp_path / "data"
    server = Server(["--rollout-batch-size", "2", "--no-publish-gate", "--judge-poll-interval-s", "0.2"],
                    str(data))
    try:
        oc = OpenClaw(tmp_path / "openclaw", server.url, profile="lean")
        walls = []
        for s, messages in enumerate(SESSIONS):
            for m in messages:
                seconds, _ = oc.agent(f"oc-{s}", m)
                walls.append(seconds)
        # The third turn of each session has no next state until the session closes (idle timeout):
        # wait for the judge and the trainer on the six that have one.
        deadline = time.time() + 600
        while time.time() < deadline:
            metrics = httpx.get(server.url + "/metrics", timeout=10).text
            if _metric(metrics, "clawloop_engine_policy_version") >= 1 and \
                    _metric(metrics, "clawloop_judge_judged") >= 6:
                break
            time.sleep(2)
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        health = httpx.get(server.url + "/health", timeout=10).json()
    finally:
        server.stop()

    requests = _metric(metrics, "clawloop_requests_total")
    store = open_store(data / "clawloop.db")
    try:
        sessions = dict(store.iter_sessions())
        turns = [t for ts in sessions.values() for t in ts]
        judged = {t.id: store.get_judgement(t.id, "offline") for t in turns}
    finally:
        store.close()
    tok = AutoTokenizer.from_pretrained(model_path(Config()))

    # Every LLM call OpenClaw made is a stored turn, token-exact: the stored prompt ids are the
    # rendering of the stored messages and tools, the response ids decode to the stored text.
    assert len(turns) == requests == 9, (len(turns), requests)
    _assert_token_exact(turns, tok)
    # Main, all of them: the lean profile makes no background calls (no compaction, memory flush or
    # title call at ~6 k of a 32 k window); a side turn here would be one we failed to explain.
    assert {t.type for t in turns} == {"main"}
    # One clawloop session per OpenClaw session, its turns in order, each answer linked to the user's
    # next message (OpenClaw prefixes it with a timestamp).
    assert len(sessions) == 3, sorted(sessions)
    by_first = {}
    for sid, ts in sessions.items():
        ts = sorted(ts, key=lambda t: t.index)
        assert [t.index for t in ts] == [0, 1, 2], sid
        by_first[ts[0].messages[1]["content"]] = ts
    for messages in SESSIONS:
        ts = next(v for k, v in by_first.items() if messages[0] in k)
        for t, nxt in zip(ts, messages[1:]):
            assert t.next_state is not None and t.next_state["role"] == "user"
            assert t.next_state["content"].endswith(nxt), (t.next_state, nxt)
        for i, t in enumerate(ts):
            assert messages[i] in t.messages[-1]["content"]
    # The six linked turns are judged: the thanks +1, the corrections -1.
    linked = [t for t in turns if t.next_state is not None]
    assert len(linked) == 6
    scores = {t.next_state["content"].split("] ", 1)[-1]: judged[t.id].score for t in linked if judged[t.id]}
    assert len(scores) == 6, scores
    assert scores["Thanks, that is right. What is 4+4?"] == 1
    assert scores["No, I meant 4*4, not 4+4."] == -1
    # The policy version advanced: the trainer took the judged OpenClaw turns and published.
    assert health["policy_version"] >= 1, health
    print(json.dumps({"openclaw_wall_s": [round(w, 1) for w in walls],
                      "prompt_tokens": [len(t.prompt_ids) for t in sorted(turns, key=lambda t: t.id)],
                      "captured": len(turns), "requests": requests, "linked": len(linked),
                      "judged": len(scores), "tool_calls": sum(bool(t.tool_calls) for t in turns),
                      "policy_version": health["policy_version"]}))


def test_openclaw_anthropic_messages_provider(tmp_path: Path) -> None:
    """OpenClaw's `anthropic-messages` provider (Anthropic's SDK inside OpenClaw) against clawloop's
    POST /v1/messages: one session of 3 turns, captured token-exact on the same path as chat, linked
    header-less into one session, the two next states judged."""
    if missing():
        pytest.fail(f"OpenClaw is not installed ({missing()}); `make test-openclaw` installs it first")
    data = tmp_path / "data"
    server = Server(["--judge-poll-interval-s", "0.2"], str(data))
    try:
        oc = OpenClaw(tmp_path / "openclaw", server.url, profile="lean", api="anthropic-messages")
        messages = SESSIONS[0]
        for m in messages:
            oc.agent("oc-anthropic", m)
        deadline = time.time() + 120
        while time.time() < deadline and \
                _metric(httpx.get(server.url + "/metrics", timeout=10).text, "clawloop_judge_judged") < 2:
            time.sleep(1)
        requests = _metric(httpx.get(server.url + "/metrics", timeout=10).text, "clawloop_requests_total")
    finally:
        server.stop()
    store = open_store(data / "clawloop.db")
    try:
        sessions = dict(store.iter_sessions())
        turns = sorted((t for ts in sessions.values() for t in ts), key=lambda t: t.index)
        judged = [store.get_judgement(t.id, "offline") for t in turns]
    finally:
        store.close()
    assert len(turns) == requests == 3 and len(sessions) == 1, (len(turns), requests, sorted(sessions))
    _assert_token_exact(turns, AutoTokenizer.from_pretrained(model_path(Config())))
    assert {t.type for t in turns} == {"main"}
    for t, nxt in zip(turns, messages[1:]):
        assert t.next_state is not None and t.next_state["content"].endswith(nxt)
    assert [j.score if j else None for j in judged[:2]] == [1, -1], judged
