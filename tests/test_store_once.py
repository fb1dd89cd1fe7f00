"""Long prompts stored once (issue #28 item 3): the turns of one conversation share their prompt's
prefix, their earlier messages and their tools, and the store keeps each once (`store/chunks.py`).

What must hold: a store file does not grow with the conversation (bytes per turn stay flat on a long
agent prompt), every read returns the Turns that were written, `clawloop export` writes the same bytes
as from a file of the format before, old files keep working beside new rows, and a missing piece fails
loudly instead of handing back a shortened prompt. Real SQLite files throughout."""

from __future__ import annotations

import json
import random
import sqlite3

import pytest

from clawloop.records import Judgement, Turn
from clawloop.store import SQLiteStore
from clawloop.store.chunks import CHUNK
from clawloop.trajectories import export_sessions

SYSTEM_IDS = 5000  # an agent's long system prompt + tool schemas (OpenClaw's default: 28 k; smaller here)
TOOLS = [{"type": "function", "function": {"name": f"tool_{k}", "description": "does a thing " * 20,
                                           "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
         for k in range(12)]


def conversation(sid: str, turns: int, seed: int = 0, system: str | None = None) -> list[Turn]:
    """An agent-like session: every turn resends the system prompt, the tools and every earlier turn."""
    rng = random.Random(seed)
    system = system or "You are an agent. " * 2000
    prompt = [rng.randrange(1, 150_000) for _ in range(SYSTEM_IDS)]
    messages = [{"role": "system", "content": system}]
    out = []
    for i in range(turns):
        user = {"role": "user", "content": f"step {i}: " + "do the next thing " * rng.randrange(5, 40)}
        messages = messages + [user]
        prompt = prompt + [rng.randrange(1, 150_000) for _ in range(rng.randrange(20, 400))]
        resp = [rng.randrange(1, 150_000) for _ in range(rng.randrange(5, 120))]
        out.append(Turn(session_id=sid, index=i, messages=list(messages), tools=TOOLS, prompt_ids=list(prompt),
                        response_ids=resp, response_logprobs=[-rng.random() for _ in resp], response_text=f"answer {i}",
                        tool_calls=[{"id": f"c{i}", "type": "function",
                                     "function": {"name": "tool_1", "arguments": "{}"}}] if i % 3 == 0 else None, policy_version=i // 4, request_id=f"{sid}-{i}",
                        next_state={"role": "user", "content": f"ok {i}"}, sampling={"temperature": 1.0},
                        created_at=1000.0 + i))
        messages = messages + [{"role": "assistant", "content": f"answer {i}"}]
        prompt = prompt + resp
    return out


def capture(store: SQLiteStore, turns: list[Turn], sizes: list[int] | None = None) -> None:
    """Write turns as capture does: a pending row when the request begins, the response when it ends."""
    for t in turns:
        pending = Turn(session_id=t.session_id, index=t.index, messages=t.messages, tools=t.tools,
                       prompt_ids=t.prompt_ids, finish_reason="pending", trainable=False, request_id=t.request_id)
        store.begin_turn(pending, t.request_id)
        store.finish_turns([t], t.request_id, prompt_stored=True)
        if sizes is not None:
            store.flush()
            sizes.append(file_bytes(store))
    store.flush()


def file_bytes(store: SQLiteStore) -> int:
    """Pages in use (the WAL folded in): what the rows take, not what the file happens to reserve."""
    c = store._reader()
    c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    pages, free, size = (c.execute(f"PRAGMA {p}").fetchone()[0] for p in ("page_count", "freelist_count", "page_size"))
    return (pages - free) * size


def same(a: Turn, b: Turn) -> bool:
    da, db = a.to_dict(), b.to_dict()
    da.pop("id"), db.pop("id")
    return da == db


def test_bytes_per_turn_do_not_grow_with_the_conversation(tmp_path):
    store = SQLiteStore(tmp_path / "clawloop.db")
    turns = conversation("s", 20)
    sizes: list[int] = []
    try:
        capture(store, turns, sizes)
        growth = [b - a for a, b in zip(sizes, sizes[1:])]
        # a turn adds its new ids, messages and response (~ < 3 KB here) and one partial piece, never
        # its prompt again (~20-30 KB of ids alone, as JSON ~6 bytes each, by the last turns)
        late_prompt = len(json.dumps(turns[-1].prompt_ids))
        assert max(growth[-5:]) < late_prompt / 4, (growth, late_prompt)
        assert sum(growth[-5:]) / 5 < 2 * sum(growth[1:6]) / 5 + 8192, growth  # flat, not rising with the turn
        assert sizes[-1] < 3 * sizes[0], sizes  # 20 turns take less than three times the first one
        got = store.session_turns("s")
        assert len(got) == 20 and all(same(g, t) for g, t in zip(got, turns))
        for t in turns:
            assert same(store.get_turn(t.id), t)
    finally:
        store.close()


def test_every_read_returns_the_turns_that_were_written(tmp_path):
    """get_turn, session_turns, judged_turns, turns_to_judge, iter_sessions, the dashboard's page and
    capture's rebuild all read the same Turns back, across sessions that share a system prompt."""
    store = SQLiteStore(tmp_path / "clawloop.db")
    a, b = conversation("a", 6, seed=1), conversation("b", 4, seed=2)
    short = Turn(session_id="c", index=0, messages=[], prompt_ids=[7] * (CHUNK - 1), response_ids=[1],
                 response_logprobs=[-0.5], tools=[], next_state={"role": "user", "content": "x"})
    exact = Turn(session_id="d", index=0, messages=[{"role": "user", "content": "hi"}], prompt_ids=[9] * (2 * CHUNK),
                 response_ids=[1], response_logprobs=[-0.5], next_state={"role": "user", "content": "x"})
    try:
        capture(store, a + b)
        store.add_turn(short).result()
        store.add_turn(exact).result()
        written = a + b + [short, exact]
        by_id = {t.id: t for t in written}
        assert all(same(store.get_turn(i), t) for i, t in by_id.items())
        assert all(same(x, y) for x, y in zip(store.session_turns_page("a", 3, 2), a[2:5]))
        assert {t.id for t in store.turns_to_judge("j", 100)} == set(by_id)
        assert all(same(t, by_id[t.id]) for t in store.turns_to_judge("j", 100))
        for t in written:
            store.save_judgement(Judgement(turn_id=t.id, score=1, judge="j"))
        store.flush()
        rows = store.judged_turns("j", 0, 100)
        assert len(rows) == len(written) and all(same(t, by_id[t.id]) for _, t, _ in rows)
        assert [sid for sid, _ in store.iter_sessions()] == ["a", "b", "c", "d"]
        answers = {r[0]: r[3] for r in store.recent_answers(10)}
        assert answers["a"] == a[-1].messages and answers["d"] == exact.messages
    finally:
        store.close()


def legacy_copy(src_turns: list[Turn], path) -> None:
    """The same turns in a file of the format before prompts were stored once, written as that code wrote
    its rows (JSON columns; `messages` with json.dumps' default separators, the others compact)."""
    store = SQLiteStore(path)  # the schema; the rows go in by hand below
    store.close()

    def compact(x):
        return None if x is None else json.dumps(x, separators=(",", ":"))

    conn = sqlite3.connect(path)
    for t in src_turns:
        conn.execute(
            "INSERT INTO turns (session_id, idx, choice_index, type, messages, tools, prompt_ids, response_ids, "
            "response_logprobs, response_text, tool_calls, finish_reason, policy_version, next_state, final, "
            "trainable, request_id, created_at, next_state_at, response_versions, tenant, sampling) "
            "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (t.session_id, t.index, t.choice_index, t.type, json.dumps(t.messages), compact(t.tools),
             compact(t.prompt_ids), compact(t.response_ids), compact(t.response_logprobs), t.response_text,
             compact(t.tool_calls), t.finish_reason, t.policy_version, compact(t.next_state), int(t.final),
             int(t.trainable), t.request_id, t.created_at, t.next_state_at, None, t.tenant or None,
             compact(t.sampling)))
        conn.execute("INSERT OR IGNORE INTO sessions (session_id, created_at, last_seen) VALUES (?, 0, 0)",
                     (t.session_id,))
    conn.commit()
    conn.close()


def test_export_is_byte_for_byte_what_the_format_before_exported(tmp_path):
    turns = conversation("s", 8, seed=3) + conversation("t", 3, seed=4)
    (tmp_path / "new").mkdir()
    (tmp_path / "old").mkdir()
    store = SQLiteStore(tmp_path / "new" / "clawloop.db")
    try:
        capture(store, turns)
    finally:
        store.close()
    legacy_copy(turns, tmp_path / "old" / "clawloop.db")
    raw = sqlite3.connect(tmp_path / "new" / "clawloop.db")
    assert raw.execute("SELECT COUNT(*) FROM turns WHERE prompt_tail IS NULL").fetchone()[0] == 0  # all stored once
    legacy = sqlite3.connect(tmp_path / "old" / "clawloop.db")
    assert legacy.execute("SELECT COUNT(*) FROM turns WHERE prompt_tail IS NOT NULL").fetchone()[0] == 0
    assert export_sessions(tmp_path / "new", str(tmp_path / "new.jsonl")) == 2
    assert export_sessions(tmp_path / "old", str(tmp_path / "old.jsonl")) == 2
    new, old = (tmp_path / "new.jsonl").read_bytes(), (tmp_path / "old.jsonl").read_bytes()
    assert new == old and len(new) > 100_000
    assert json.loads(new.splitlines()[0])["turns"][7]["prompt_ids"] == turns[7].prompt_ids


def test_an_old_file_keeps_working_beside_new_rows(tmp_path):
    """A file whose rows were written before (no chunks table, no ref columns) opens, reads as it was, and
    takes new rows of the same session in the new format."""
    path = tmp_path / "clawloop.db"
    turns = conversation("s", 6, seed=5)
    legacy_copy(turns[:3], path)
    conn = sqlite3.connect(path)  # back to the schema before: the table and columns this change added gone
    conn.execute("DROP TABLE chunks")
    for col in ("prompt_ref", "prompt_tail", "messages_ref", "tools_ref"):
        conn.execute(f"ALTER TABLE turns DROP COLUMN {col}")
    conn.commit()
    conn.close()
    store = SQLiteStore(path)
    try:
        capture(store, turns[3:])
        got = store.session_turns("s")
        assert len(got) == 6 and all(same(g, t) for g, t in zip(got, turns))
        kinds = store._reader().execute("SELECT prompt_tail IS NULL FROM turns ORDER BY idx").fetchall()
        assert [k[0] for k in kinds] == [1, 1, 1, 0, 0, 0]
    finally:
        store.close()


def test_a_missing_piece_fails_loudly(tmp_path):
    store = SQLiteStore(tmp_path / "clawloop.db")
    t = conversation("s", 1, seed=6)[0]
    try:
        tid = store.add_turn(t).result()
        conn = sqlite3.connect(tmp_path / "clawloop.db")
        # the first piece: int32 ids (some are >= 65 536) and their width byte
        root = conn.execute("SELECT key FROM chunks WHERE parent IS NULL AND length(data) = ?",
                            (CHUNK * 4 + 1,)).fetchone()[0]
        conn.execute("DELETE FROM chunks WHERE key=?", (root,))
        conn.commit()
        conn.close()
        fresh = SQLiteStore(tmp_path / "clawloop.db")  # no cached chain
        try:
            with pytest.raises(LookupError, match="incomplete"):
                fresh.get_turn(tid)
        finally:
            fresh.close()
    finally:
        store.close()


def test_finish_without_the_pending_prompt_writes_it(tmp_path):
    """An end whose pending row lacks the prompt (`prompt_stored=False`) writes it; a pending row's prompt is
    kept when the end says it is there."""
    store = SQLiteStore(tmp_path / "clawloop.db")
    t = conversation("s", 2, seed=7)[1]
    try:
        store.begin_turn(Turn(session_id="s", index=1, messages=t.messages, prompt_ids=[1, 2, 3],
                              finish_reason="pending", trainable=False, request_id=t.request_id), t.request_id)
        store.finish_turns([t], t.request_id, prompt_stored=False).result()
        assert same(store.session_turns("s")[0], t)
    finally:
        store.close()
