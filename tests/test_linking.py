"""Linking next states when requests overlap, fail and come back: concurrent
requests in one session, retries after a disconnect, sessions without
headers, a stream dropped before it starts, a session re-used after it
closed. Real gateways on loopback (a paced engine where timing matters) and
Capture on a real SQLite file."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import struct
import threading
import time

import openai
import pytest

from clawloop.engines.base import TokenEvent
from clawloop.gateway.capture import Capture
from clawloop.records import Turn
from clawloop.store import SQLiteStore

Q = [{"role": "user", "content": "What is 12+7?"}]


class PacedEngine:
    """The real tokenizer's ids for a fixed text, one every `delay_s`, `max_tokens` of them: how long
    a request runs is up to the test."""

    def __init__(self, tokenizer, delay_s=0.02, text="one two three four five six seven eight nine ten " * 10):
        self.tokenizer = tokenizer
        self.eos_token_ids = {tokenizer.eos_token_id}
        self.ids = tokenizer.encode(text, add_special_tokens=False)
        self.delay_s = delay_s
        self.policy_version = 0

    def stats(self):
        return {}

    async def generate(self, request):
        n = min(len(self.ids), request.params.max_tokens)
        for k in range(n):
            await asyncio.sleep(self.delay_s)
            yield TokenEvent(self.ids[k], -0.5, finish_reason="length" if k == n - 1 else None, policy_version=0)


def ask(client, messages, sid=None, **kw):
    kw.setdefault("max_tokens", 3)
    headers = {"X-Session-Id": sid} if sid else {}
    return client.chat.completions.create(model="m", messages=messages, extra_headers=headers, **kw)


def answer(r) -> dict:
    return {"role": "assistant", "content": r.choices[0].message.content}


def wait_for(cond, timeout=10.0):
    deadline = time.time() + timeout
    while not cond():
        assert time.time() < deadline, "timed out"
        time.sleep(0.01)


def by_index(g, sid):
    g.store.flush()
    return {t.index: t for t in g.store.session_turns(sid)}


def user(text):
    return {"role": "user", "content": text}


# ------------------------------------------------------------------ concurrent requests

def test_concurrent_requests_link_by_history_not_by_finish_order(make_gateway, engine):
    """A and B both answer turn 0 at once; B starts later and ends first; C continues B.
    C's message is B's next state (the old rule gave it to A, whichever finished last)."""
    g = make_gateway(engine=PacedEngine(engine.tokenizer))
    c = g.client()
    hist = Q + [answer(ask(c, Q, "cc"))]
    got = {}
    a = threading.Thread(target=lambda: got.setdefault("A", ask(c, hist + [user("A")], "cc", max_tokens=40)))
    a.start()
    wait_for(lambda: g.gw.capture.sessions["cc"].inflight == 1)
    rb = ask(c, hist + [user("B")], "cc", max_tokens=2)
    assert a.is_alive()  # B began after A and ended before it
    a.join()
    ask(c, hist + [user("B"), answer(rb), user("C")], "cc")
    t = by_index(g, "cc")
    assert t[0].next_state == {"role": "user", "content": "A"}  # the first to begin
    assert t[2].next_state == {"role": "user", "content": "C"}  # B: C's history ends with its answer
    assert t[1].next_state is None  # A: nobody answered it
    assert t[3].next_state is None


def _turn(slot, text, **kw):
    return Turn(session_id=slot.session_id, index=slot.index, type=slot.type, response_text=text,
                response_ids=[1], response_logprobs=[-0.1], **kw)


def test_rewritten_histories_link_by_begin_order_even_when_finishing_out_of_order(tmp_path):
    """Histories that never match (a client that compacts them): the previous main turn by index
    gets the next state, also when it is still generating (it gets it when stored)."""
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    s0 = cap.begin("s", "main", [user("q0")], False)
    cap.finish(s0, [_turn(s0, "a0")])
    sa = cap.begin("s", "main", [user("summary"), user("A")], False)
    sb = cap.begin("s", "main", [user("summary"), user("B")], False)  # A still running
    cap.finish(sb, [_turn(sb, "b")])
    cap.finish(sa, [_turn(sa, "a")])
    sc = cap.begin("s", "main", [user("summary 2"), user("C")], False)
    cap.finish(sc, [_turn(sc, "c")])
    store.flush()
    ns = {t.index: (t.next_state or {}).get("content") for t in store.session_turns("s")}
    assert ns == {0: "A", 1: "B", 2: "C", 3: None}
    store.close()


# ------------------------------------------------------------------ retries after a disconnect

def test_retry_after_client_timeout_is_not_the_answers_next_state(make_gateway, engine):
    """The client gave up on turn 1 (the server finished it anyway) and sent the same messages
    again: its question is not a reaction to an answer it never saw."""
    g = make_gateway(engine=PacedEngine(engine.tokenizer))
    c = g.client()
    m1 = Q + [answer(ask(c, Q, "rt")), user("and 3+4?")]
    with pytest.raises(openai.APITimeoutError):
        ask(g.client(timeout=0.15), m1, "rt", max_tokens=25)
    wait_for(lambda: [t.finish_reason != "pending" for t in by_index(g, "rt").values()] == [True, True])
    r2 = ask(c, m1, "rt")  # the retry
    ask(c, m1 + [answer(r2), user("thanks")], "rt")
    t = by_index(g, "rt")
    assert t[0].next_state["content"] == "and 3+4?"
    assert 1 not in t or t[1].next_state is None, "the retry was linked as the abandoned answer's next state"
    assert t[2].next_state["content"] == "thanks"


def test_retry_of_an_aborted_stream_is_not_linked(make_gateway, engine):
    g = make_gateway(engine=PacedEngine(engine.tokenizer))
    c = g.client()
    m1 = Q + [answer(ask(c, Q, "rs")), user("and 3+4?")]
    with ask(c, m1, "rs", max_tokens=40, stream=True) as stream:
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break  # the client goes away mid-answer, and retries at once
    r2 = ask(c, m1, "rs")
    ask(c, m1 + [answer(r2), user("thanks")], "rs")
    wait_for(lambda: g.gw.capture.sessions["rs"].inflight == 0)
    t = by_index(g, "rs")
    assert t[0].next_state["content"] == "and 3+4?"
    assert t[1].finish_reason == "abort" and not t[1].trainable and t[1].next_state is None
    assert t[2].next_state["content"] == "thanks"


# ------------------------------------------------------------------ sessions without headers

def test_headerless_openai_client_conversation_is_one_linked_session(gateway):
    c = gateway.client()  # the official client, no session header, no `user`
    msgs = [{"role": "system", "content": "You are terse."}, user("What is 12+7?")]
    for follow in ("just the number, please", "thanks! and 3+4?", None):
        r = c.chat.completions.create(model="m", messages=msgs, max_tokens=6)
        if follow:
            msgs += [{"role": "assistant", "content": r.choices[0].message.content}, user(follow)]
    gateway.store.flush()
    ((sid, turns),) = list(gateway.store.iter_sessions())
    assert sid.startswith("conv-") and [t.index for t in turns] == [0, 1, 2]
    assert [(t.next_state or {}).get("content") for t in turns] == ["just the number, please",
                                                                    "thanks! and 3+4?", None]
    assert {t.index for t in gateway.store.turns_to_judge("offline", 10)} == {0, 1}
    assert gateway.gw.capture.stats()["capture/sessions_continued_by_history"] == 2


def test_headerless_session_survives_a_restart(make_gateway, tmp_path):
    data = tmp_path / "keep"
    g = make_gateway(data_dir=data)
    r = ask(g.client(), Q)
    g.stop()
    g2 = make_gateway(data_dir=data)
    ask(g2.client(), Q + [answer(r), user("thank you")])
    g2.store.flush()
    ((sid, turns),) = list(g2.store.iter_sessions())
    assert [t.index for t in turns] == [0, 1] and turns[0].next_state["content"] == "thank you"


def test_explicit_session_wins_over_the_history(gateway):
    c = gateway.client()
    r = ask(c, Q, "named")
    ask(c, Q + [answer(r), user("and again")], "other")  # same history, but named: its own session
    ask(c, Q + [answer(r), user("header-less")])  # an explicit session's answers are not matched
    t = by_index(gateway, "named")
    assert t[0].next_state is None
    assert len(gateway.store.session_turns("other")) == 1
    assert sum(1 for _ in gateway.store.iter_sessions()) == 3


def _served_calls(slot, cap, args='{"city": "Paris", "unit": "C"}'):
    calls = [{"id": "call_abc", "type": "function", "function": {"name": "weather", "arguments": args}}]
    cap.finish(slot, [_turn(slot, "<tool_call>...</tool_call>", tool_calls=calls)])


def test_history_match_normalises_tool_calls_and_whitespace(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    q = [user("weather in Paris?")]
    s0 = cap.begin(None, "main", q, False)
    _served_calls(s0, cap)
    # the client echoes the call with its own id, arguments re-serialised, and sends two tool results
    echoed = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "weather",
                                                           "arguments": '{"unit":"C", "city":"Paris"}'}}]}
    s1 = cap.begin(None, "main", [{"role": "user", "content": " weather in Paris? "}, echoed,
                                  {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                                  {"role": "tool", "tool_call_id": "call_2", "content": "sunny"}], False)
    assert s1.session_id == s0.session_id and s1.index == 1
    store.flush()
    assert store.session_turns(s0.session_id)[0].next_state == {"role": "tool", "content": "sunny"}
    store.close()


def test_history_match_normalises_numbers_as_a_javascript_client_sends_them(tmp_path):
    """OpenClaw (JavaScript) echoes `2.0` as `2` and a 50-digit integer as its double, `1e+49`."""
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    big = "1" + "0" * 49
    s0 = cap.begin(None, "main", [user("add them")], False)
    _served_calls(s0, cap, args='{"a": 2.0, "b": %s, "c": 0.5, "ok": true}' % big)
    echoed = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "weather",
                                                     "arguments": '{"ok":true,"c":0.5,"b":1e+49,"a":2}'}}]}
    s1 = cap.begin(None, "main", [user("add them"), echoed, {"role": "tool", "content": "3"}], False)
    assert s1.session_id == s0.session_id
    # a different number is a different conversation
    other = dict(echoed, tool_calls=[{"function": {"name": "weather", "arguments": '{"ok":true,"c":0.5,"b":1e+49,"a":3}'}}])
    s2 = cap.begin(None, "main", [user("add them"), other, {"role": "tool", "content": "4"}], False)
    assert s2.session_id != s0.session_id
    store.close()


def test_empty_answer_left_out_of_the_history_gets_the_clients_nudge(tmp_path):
    """An answer that is only the end token: OpenClaw drops it and sends the same messages with
    "The previous attempt did not produce a user-visible answer ..." after them. That nudge is the
    empty turn's next state, in the same session; a plain retry (the same messages) links nothing."""
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    q = [{"role": "system", "content": "You are an agent."}, user("What is 12+7?")]
    s0 = cap.begin(None, "main", q, False)
    cap.finish(s0, [_turn(s0, "")])
    retry = cap.begin(None, "main", q, False)
    assert retry.session_id != s0.session_id
    cap.finish(retry, [_turn(retry, "19")])
    nudge = user("The previous attempt did not produce a user-visible answer. Continue.")
    s1 = cap.begin(None, "main", q + [nudge], False)
    assert s1.session_id == s0.session_id and s1.index == 1
    cap.finish(s1, [_turn(s1, "19")])
    store.flush()
    turns = store.session_turns(s0.session_id)
    assert turns[0].next_state == {"role": "user", "content": nudge["content"]}
    # a non-empty answer left out of the history does not link this way
    s2 = cap.begin(None, "main", [q[0], user("What is 3+4?")], False)
    cap.finish(s2, [_turn(s2, "7")])
    s3 = cap.begin(None, "main", [q[0], user("What is 3+4?"), user("and?")], False)
    assert s3.session_id != s2.session_id
    store.close()


def test_a_continuation_folded_into_the_answer_it_continued_still_links(tmp_path):
    """OpenClaw nudges after an answer with no visible text ("</tool_call>"), then keeps one assistant
    message, the two texts joined ("</tool_call>7"): the user's reply to it is the continuation's next state."""
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    q = [{"role": "system", "content": "You are an agent."}, user("What is 2+3?")]
    s0 = cap.begin(None, "main", q, False)
    cap.finish(s0, [_turn(s0, "</tool_call>")])
    nudge = user("The previous attempt did not produce a user-visible answer. Continue.")
    s1 = cap.begin(None, "main", q + [{"role": "assistant", "content": "</tool_call>"}, nudge], False)
    cap.finish(s1, [_turn(s1, "7")])
    s2 = cap.begin(None, "main", q + [{"role": "assistant", "content": "</tool_call>7"}, user("Thanks!")], False)
    assert s0.session_id == s1.session_id == s2.session_id and s2.index == 2
    cap.finish(s2, [_turn(s2, "ok")])
    store.flush()
    ns = {t.index: (t.next_state or {}).get("content") for t in store.session_turns(s0.session_id)}
    assert ns == {0: nudge["content"], 1: "Thanks!", 2: None}
    store.close()


def test_a_harness_context_block_after_the_reply_is_not_the_next_state(tmp_path):
    """OpenClaw's default profile sends its runtime context as a user message after the user's reply:
    the reply is the answered turn's next state (text or content parts)."""
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    s0 = cap.begin("oc", "main", Q, False)
    cap.finish(s0, [_turn(s0, "19")])
    block = "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nactive exec sessions: none\n<<<END_OPENCLAW_INTERNAL_CONTEXT>>>"
    s1 = cap.begin("oc", "main", Q + [{"role": "assistant", "content": "19"}, user("thanks! and 3+4?"),
                                      {"role": "user", "content": [{"type": "text", "text": block}]}], False)
    cap.finish(s1, [_turn(s1, "7")])
    store.flush()
    assert store.session_turns("oc")[0].next_state == {"role": "user", "content": "thanks! and 3+4?"}
    store.close()


def test_a_system_prompt_rebuilt_per_request_keeps_the_session(tmp_path):
    """OpenClaw's system prompt carries the date ("Current date: 2026-11-27"): a conversation that goes on
    past midnight is still one session, the reply after midnight the earlier answer's next state. (It was
    stored as two sessions on 2026-11-27, RESULTS "Why the loop made the model worse" 10.)"""
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    day = lambda d: {"role": "system", "content": f"You are an agent.\n## Temporal Context\nCurrent date: {d}"}  # noqa: E731
    s0 = cap.begin(None, "main", [day("2026-11-27"), user("What is 12+7?")], False)
    cap.finish(s0, [_turn(s0, "19")])
    s1 = cap.begin(None, "main", [day("2026-11-28"), user("What is 12+7?"), {"role": "assistant", "content": "19"},
                                  user("thanks! and 3+4?")], False)
    assert s1.session_id == s0.session_id and s1.index == 1
    cap.finish(s1, [_turn(s1, "7")])
    # the history still counts: another question under the same system prompt is another conversation
    s2 = cap.begin(None, "main", [day("2026-11-28"), user("What is 5+5?"), {"role": "assistant", "content": "19"},
                                  user("thanks")], False)
    assert s2.session_id != s0.session_id
    store.flush()
    assert store.session_turns(s0.session_id)[0].next_state == {"role": "user", "content": "thanks! and 3+4?"}
    store.close()


def test_identical_headerless_conversations_most_recent_wins(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    first = cap.begin(None, "main", Q, False)
    cap.finish(first, [_turn(first, "19")])
    second = cap.begin(None, "main", Q, False)  # another user, same question, same answer
    cap.finish(second, [_turn(second, "19")])
    assert first.session_id != second.session_id
    nxt = cap.begin(None, "main", Q + [{"role": "assistant", "content": "19"}, user("thanks")], False)
    assert nxt.session_id == second.session_id
    other_tenant = cap.begin(None, "main", Q + [{"role": "assistant", "content": "19"}, user("hi")], False,
                             tenant="bob")
    assert other_tenant.session_id not in (first.session_id, second.session_id)
    store.close()


# ------------------------------------------------------------------ slots are always released

def test_stream_dropped_before_it_starts_releases_its_slot(make_gateway):
    """A server on ASGI 2.4 raises at the first send when the client is gone: the response body
    (where the stream would release its slot) never runs. The slot is still released, and the
    session closes and its last turn is judged."""
    from clawloop.gateway import create_app

    g = make_gateway()
    ask(g.client(), Q, "drop")
    app = create_app(g.cfg, g.gw.engine, g.store, manage_engine=False)  # the same store, driven by hand
    cap = app.state.gateway.capture
    body = json.dumps({"model": "m", "messages": Q, "stream": True, "max_tokens": 5}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                         (b"x-session-id", b"drop"), (b"x-turn-type", b"side")]}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        raise OSError("client went away")

    async def drive():
        try:
            await app(scope, receive, send)
        except Exception:
            pass

    # Log records with tracebacks keep the request's frames (and its slot) alive while a handler
    # holds them, as pytest's log capture does; a server's handlers format them and let go.
    logging.disable(logging.CRITICAL)
    try:
        asyncio.run(drive())
    finally:
        logging.disable(logging.NOTSET)
    gc.collect()
    assert cap.sweep(now=time.time() + 3600) == 1, "the dropped request pinned its session open"
    assert "drop" not in cap.sessions and cap.stats()["capture/slots_reaped"] <= 1
    g.store.flush()
    (t,) = g.store.session_turns("drop")  # the dropped side request left no row
    assert t.final and t.id in {x.id for x in g.store.turns_to_judge("offline", 50)}


def test_client_that_disconnects_at_once_leaves_nothing_running(make_gateway, engine):
    g = make_gateway(engine=PacedEngine(engine.tokenizer), capture__session_idle_timeout_s="0.3",
                     capture__sweep_interval_s="0.1")
    ask(g.client(), Q, "gone")
    body = json.dumps({"model": "m", "messages": Q, "stream": True, "max_tokens": 30})
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", g.server.port))
        s.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   f"X-Session-Id: gone\r\nX-Turn-Type: side\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # reset, before the first chunk
    wait_for(lambda: "gone" not in g.gw.capture.sessions)
    g.store.flush()
    turns = g.store.session_turns("gone")
    assert turns[0].final and all(t.finish_reason != "pending" for t in turns)


def test_release_is_idempotent_and_a_context(tmp_path):
    store = SQLiteStore(tmp_path / "c.db")
    cap = Capture(store)
    with cap.begin("s", "main", Q, False) as slot:
        assert cap.sessions["s"].inflight == 1
    assert cap.sessions["s"].inflight == 0 and slot.released
    slot.release()
    cap.abandon(slot)
    cap.finish(slot, [_turn(slot, "late")])  # ignored: the slot was released
    other = cap.begin("s", "main", Q, False)
    cap.finish(other, [_turn(other, "19")])
    cap.finish(other, [_turn(other, "19")])
    assert cap.sessions["s"].inflight == 0
    store.flush()
    assert [(t.index, t.response_text) for t in store.session_turns("s")] == [(1, "19")]
    store.close()


# ------------------------------------------------------------------ closing and re-opening

def test_session_done_mid_flight_then_reused_loses_no_turn(make_gateway, engine):
    g = make_gateway(engine=PacedEngine(engine.tokenizer))
    c = g.client()
    hist = Q + [answer(ask(c, Q, "dm"))]
    long = threading.Thread(target=lambda: ask(c, hist + [user("long")], "dm", max_tokens=40))
    long.start()
    wait_for(lambda: g.gw.capture.sessions["dm"].inflight == 1)
    c.chat.completions.create(model="m", messages=hist + [user("bye")], max_tokens=2,
                              extra_headers={"X-Session-Id": "dm", "X-Session-Done": "1"})
    long.join()
    wait_for(lambda: "dm" not in g.gw.capture.sessions)  # closed once the long one ended
    ask(c, [user("again")], "dm")
    t = by_index(g, "dm")
    assert sorted(t) == [0, 1, 2, 3]
    assert [t[i].messages[-1]["content"] for i in range(4)] == ["What is 12+7?", "long", "bye", "again"]
    assert t[2].final and g.store.write_stats()["capture/store_reindexed"] == 0


def test_session_reused_after_close_and_restart_continues_numbering(tmp_path):
    path = tmp_path / "c.db"
    store = SQLiteStore(path)
    cap = Capture(store)
    s0 = cap.begin("x", "main", Q, True)
    cap.finish(s0, [_turn(s0, "19")])
    store.close()
    store = SQLiteStore(path)
    cap = Capture(store)
    assert "x" not in cap.sessions
    s1 = cap.begin("x", "main", [user("hello again")], False)
    assert s1.index == 1
    cap.finish(s1, [_turn(s1, "hi")])
    store.flush()
    assert [t.index for t in store.session_turns("x")] == [0, 1]
    store.close()
