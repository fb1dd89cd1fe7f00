"""OpenClaw's DEFAULT profile with clawloop's plugin against a real `clawloop up` (issue #28): `make test-openclaw`.

The default profile (`integrations/openclaw/openclaw.json`: all tools and skills, a ~29 k-token prompt
in a 32 k window) does not link header-less: from the second turn OpenClaw flushes memory and compacts
(a summary replaces the early turns), and it adds an "internal context" message after the user's. With
the plugin (`integrations/openclaw/plugin/`, installed by its README's recipe: `openclaw plugins install
--link`, then `hooks.allowConversationAccess`) every call carries `X-Session-Id: openclaw-<session>` and
`X-Turn-Type`. This checks, on 3 OpenClaw sessions x 2 turns, interleaved (s0 t1, s1 t1, s2 t1, s0 t2,
...): every call captured token-exact, one clawloop session per OpenClaw session, the memory flushes and
compaction summaries `side` and the turns `main` (told apart here by their content, not by the plugin's
rule), each answer's next state the user's next message, judged (a thanks +1, a correction -1), and the
policy version advancing.

Why 2 turns: a default turn is ~40 s (the first) to ~55 s (later ones: a memory flush of ~16 k tokens,
a compaction summary and the ~29 k-token turn) of OpenClaw and model time on 2 quiet cores, so 3 x 2
is ~5 minutes; the second turn already runs the flush, the summary and the link across the compaction,
which a third would repeat. Sequential, not at once: three 29 k-token prompts at once took clawloop's
hf engine to 9 GB.
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
from test_openclaw import SESSIONS, _assert_token_exact, _metric  # noqa: E402

from transformers import AutoTokenizer  # noqa: E402

from clawloop.config import Config  # noqa: E402
from clawloop.naming import model_path  # noqa: E402
from clawloop.store import open_store  # noqa: E402
from clawloop.users import Server  # noqa: E402

pytestmark = [pytest.mark.openclaw, pytest.mark.timeout(2400)]


def _background(turn) -> str | None:
    """Which of OpenClaw's background calls a stored turn is, from what it asked; None for the agent's turn."""
    system = str(turn.messages[0]["content"])
    if system.startswith("You are a context summarization assistant"):
        return "compaction summary"
    if any("Pre-compaction memory flush" in str(m["content"]) for m in turn.messages if m["role"] == "user"):
        return "memory flush"
    return None


TURNS = 2
DELEGATING_TOOLS = {"openclaw", "tool_call", "sessions_spawn", "sessions_send"}
"""OpenClaw's tools that can run a model turn in another session than the caller's."""
CONVERSATIONS = [messages[:TURNS] for messages in SESSIONS]


def test_openclaw_default_profile_with_plugin_links_sessions(tmp_path: Path) -> None:
    if missing():
        pytest.fail(f"OpenClaw is not installed ({missing()}); `make test-openclaw` installs it first")
    data = tmp_path / "data"
    # A session idle for 10 minutes (the default) is closed and its last answer loses its next state; on
    # a loaded machine two other sessions' turns can take that long, so the test gives it an hour.
    server = Server(["--rollout-batch-size", "2", "--no-publish-gate", "--judge-poll-interval-s", "0.2",
                     "--capture-session-idle-timeout-s", "3600"], str(data))
    try:
        oc = OpenClaw(tmp_path / "openclaw", server.url, profile="default")
        oc.install_plugin()
        t0 = time.time()
        walls: list[list[float]] = [[] for _ in CONVERSATIONS]
        for turn in range(TURNS):
            for s, messages in enumerate(CONVERSATIONS):
                walls[s].append(oc.agent(f"oc-{s}", messages[turn])[0])
        openclaw_s = time.time() - t0
        # The last turn of each session has no next state until the session closes (idle timeout):
        # wait for the judge and the trainer on the ones that have one.
        want = len(CONVERSATIONS) * (TURNS - 1)
        deadline = time.time() + 600
        while time.time() < deadline:
            metrics = httpx.get(server.url + "/metrics", timeout=10).text
            if _metric(metrics, "clawloop_engine_policy_version") >= 1 and \
                    _metric(metrics, "clawloop_judge_judged") >= want:
                break
            time.sleep(2)
        metrics = httpx.get(server.url + "/metrics", timeout=10).text
        health = httpx.get(server.url + "/health", timeout=10).json()
    finally:
        server.stop()

    requests = _metric(metrics, "clawloop_requests_total")
    store = open_store(data / "clawloop.db")
    try:
        sessions = {sid: sorted(ts, key=lambda t: t.index) for sid, ts in store.iter_sessions()}
        turns = [t for ts in sessions.values() for t in ts]
        judged = {t.id: store.get_judgement(t.id, "offline") for t in turns}
    finally:
        store.close()

    # Every call OpenClaw made is a stored turn, token-exact (the background calls too).
    # At least one call per message, plus a memory flush and a compaction summary per session (below).
    assert len(turns) == requests >= len(CONVERSATIONS) * (TURNS + 2), (len(turns), requests)
    _assert_token_exact(turns, AutoTokenizer.from_pretrained(model_path(Config())))
    # One clawloop session per OpenClaw session, named by the plugin, its turns numbered in order. The tiny
    # model calls OpenClaw's tools at random on this prompt (read, exec, ls, ...); a call of a tool that
    # runs a model turn of its own (`openclaw` delegates to "a separate model turn", `tool_call` reaches
    # any tool) starts an OpenClaw session of OpenClaw's own id, which the plugin names too (CI saw two).
    # Such sessions are allowed only after such a call, and none carries a message of the conversations.
    ours = {f"openclaw-oc-{s}" for s in range(len(CONVERSATIONS))}
    assert ours <= set(sessions), sorted(sessions)
    others = {sid: ts for sid, ts in sessions.items() if sid not in ours}
    delegated = [c["function"]["name"] for sid in ours for t in sessions[sid] for c in (t.tool_calls or [])
                 if c["function"]["name"] in DELEGATING_TOOLS]
    assert not others or delegated, (sorted(others), "no turn called a tool that starts a session")
    for sid, ts in others.items():
        assert sid.startswith("openclaw-") and not any(m in str(t.messages) for t in ts for ms in CONVERSATIONS
                                                        for m in ms), (sid, [t.messages for t in ts])
    for s, messages in enumerate(CONVERSATIONS):
        ts = sessions[f"openclaw-oc-{s}"]
        assert [t.index for t in ts] == list(range(len(ts)))
        # main vs side: OpenClaw's memory flushes and compaction summaries side, every other call main;
        # from the second turn on the default prompt makes OpenClaw run both.
        kinds = [_background(t) for t in ts]
        assert [t.type for t in ts] == ["side" if k else "main" for k in kinds], list(zip(kinds, [t.type for t in ts]))
        assert {"memory flush", "compaction summary"} <= set(kinds), kinds
        main = [t for t in ts if t.type == "main"]
        for m in messages:
            assert any(m in str(t.messages) for t in main), m
        # Each answer's next state is the user's next message (OpenClaw prefixes a timestamp), on the main
        # turn that answered the message before; side turns take none.
        assert all(t.next_state is None for t in ts if t.type == "side")
        for said, nxt in zip(messages, messages[1:]):
            linked_to = [t for t in main if t.next_state and nxt in str(t.next_state["content"])]
            assert len(linked_to) == 1, (nxt, [t.next_state for t in ts])
            assert linked_to[0].next_state["role"] == "user"
            assert any(said in str(m["content"]) for m in linked_to[0].messages)
    # The linked turns are judged: the thanks +1, the corrections -1.
    linked = [t for t in turns if t.next_state is not None]
    assert len(linked) >= want and all(judged[t.id] for t in linked), [(t.next_state, judged[t.id]) for t in linked]
    replies = [nxt for messages in CONVERSATIONS for nxt in messages[1:]]
    scores = {nxt: judged[t.id].score for t in linked for nxt in replies if nxt in str(t.next_state["content"])}
    assert scores["Thanks, that is right. What is 4+4?"] == 1, scores
    assert scores["No, that is wrong. I asked for a colour."] == -1, scores
    # The policy version advanced: the trainer took the judged main turns and published.
    assert health["policy_version"] >= 1, health
    print(json.dumps({"openclaw_wall_s": [[round(w, 1) for w in ws] for ws in walls],
                      "openclaw_total_s": round(openclaw_s, 1), "captured": len(turns), "requests": requests,
                      "sessions": len(sessions), "delegated": delegated, "other_sessions": sorted(others), "types": {sid: [t.type for t in ts] for sid, ts in sessions.items()},
                      "prompt_tokens": {sid: [len(t.prompt_ids) for t in ts] for sid, ts in sessions.items()},
                      "linked": len(linked), "judged": sum(bool(j) for j in judged.values()),
                      "scores": scores, "policy_version": health["policy_version"]}))
