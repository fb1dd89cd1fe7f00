"""The SQLite store's tables, the columns added since, and the row <-> record conversions.

Everything that knows the column order lives here, so the write ops (`turns.py`, `judgements.py`) and
the reads (`browse.py`) agree on it by construction. A store file written by an older clawloop is
brought up to date by `migrate` when it is opened.

Two row formats of `turns` live side by side. Rows written since prompts are stored once
(`chunks.py`) keep the prompt as `prompt_ref` + `prompt_tail`, the messages as `messages_ref` and the
tools as `tools_ref`, and leave `prompt_ids` and `messages` empty ('': an older clawloop reading the
file fails on them rather than reading a wrong prompt). Rows from before (`prompt_tail` NULL) are
read as they were written; nothing is rewritten on open.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from clawloop.records import Judgement, Turn
from clawloop.store.chunks import SCHEMA as CHUNKS_SCHEMA
from clawloop.store.chunks import Chunks

SCHEMA = CHUNKS_SCHEMA + """
CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    choice_index INTEGER NOT NULL DEFAULT 0,
    type TEXT NOT NULL,
    messages TEXT NOT NULL,
    tools TEXT,
    prompt_ids TEXT NOT NULL,
    response_ids TEXT NOT NULL,
    response_logprobs TEXT NOT NULL,
    response_text TEXT NOT NULL,
    tool_calls TEXT,
    finish_reason TEXT NOT NULL,
    policy_version INTEGER NOT NULL,
    next_state TEXT,
    final INTEGER NOT NULL DEFAULT 0,
    trainable INTEGER NOT NULL DEFAULT 1,
    request_id TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    next_state_at REAL,
    response_versions TEXT,
    tenant TEXT,
    sampling TEXT,
    prompt_ref BLOB,
    prompt_tail BLOB,
    messages_ref BLOB,
    tools_ref BLOB,
    UNIQUE (session_id, idx, choice_index)
);
CREATE INDEX IF NOT EXISTS turns_session ON turns (session_id, idx);
CREATE INDEX IF NOT EXISTS turns_ready ON turns (type, trainable, final, next_state_at);
CREATE INDEX IF NOT EXISTS turns_pending ON turns (finish_reason) WHERE finish_reason = 'pending';
CREATE TABLE IF NOT EXISTS judgements (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    turn_id INTEGER NOT NULL REFERENCES turns(id),
    judge TEXT NOT NULL,
    score INTEGER NOT NULL,
    votes TEXT NOT NULL,
    hint TEXT,
    latency_s REAL NOT NULL,
    malformed INTEGER NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (turn_id, judge)
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    last_seen REAL NOT NULL,
    closed_at REAL,
    closed_reason TEXT
);
CREATE TABLE IF NOT EXISTS kv (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
"""

# Columns added after a store file may already exist: (table, column, type). A file written by an
# older clawloop gets them with ALTER TABLE when it is opened; their old rows read as NULL.
MIGRATIONS = (
    ("turns", "response_versions", "TEXT"),
    ("turns", "tenant", "TEXT"),
    ("turns", "sampling", "TEXT"),
    ("judgements", "reward", "REAL"),  # a judge's continuous reward (Judgement.reward); NULL: the score
    ("judgements", "hints", "TEXT"),  # JSON list, Judgement.hint_candidates; NULL: `hint` is the only one
    # prompts stored once (chunks.py): NULL prompt_tail marks a row from before, read from prompt_ids/messages
    ("turns", "prompt_ref", "BLOB"),
    ("turns", "prompt_tail", "BLOB"),
    ("turns", "messages_ref", "BLOB"),
    ("turns", "tools_ref", "BLOB"),
    ("turns", "reasoning", "TEXT"),  # JSON {"text", "end"}: Turn.reasoning, Turn.reasoning_end; NULL: none
)
# Indexes over migrated columns would go here; the partial pending index only needs finish_reason.

PENDING = "pending"
"""`finish_reason` of a turn whose request began and whose response is not stored yet."""
ABORT = "abort"

TURN_COLS = (
    "id, session_id, idx, choice_index, type, messages, tools, prompt_ids, response_ids, "
    "response_logprobs, response_text, tool_calls, finish_reason, policy_version, next_state, "
    "final, trainable, request_id, created_at, next_state_at, response_versions, tenant, sampling, "
    "prompt_ref, prompt_tail, messages_ref, tools_ref, reasoning"
)
INSERT_TURN = (f"INSERT INTO turns ({TURN_COLS.removeprefix('id, ')}) "
               f"VALUES ({','.join('?' * (len(TURN_COLS.split(',')) - 1))})")
# What a turn's end writes over its pending row (everything the begin did not know). The row is found
# by its request key (also once a restart marked it aborted: a spilled end replayed later completes it),
# or, replaying the same end twice, by the turn's own request id.
FINISH_TURN = (
    "UPDATE turns SET tools=?, tools_ref=?, prompt_ids=COALESCE(?, prompt_ids), "
    "prompt_ref=CASE WHEN ? THEN prompt_ref ELSE ? END, prompt_tail=CASE WHEN ? THEN prompt_tail ELSE ? END, "
    "response_ids=?, response_logprobs=?, "
    "response_text=?, tool_calls=?, finish_reason=?, policy_version=?, next_state=COALESCE(?, next_state), "
    "next_state_at=COALESCE(?, next_state_at), final=MAX(final, ?), trainable=?, request_id=?, created_at=?, "
    "response_versions=?, tenant=?, sampling=?, reasoning=? "
    "WHERE session_id=? AND idx=? AND choice_index=? "
    "AND ((finish_reason IN ('pending', 'abort') AND request_id=?) OR (request_id<>'' AND request_id=?)) RETURNING id"
)

def dumps(x: Any) -> str | None:
    return None if x is None else json.dumps(x, separators=(",", ":"))


def loads(s: str | None) -> Any:
    return None if s is None else json.loads(s)


def row_to_turn(r: sqlite3.Row | tuple, store: Chunks, conn: sqlite3.Connection) -> Turn:
    """A `TURN_COLS` row as a Turn; `store` reads the pieces a row of the stored-once format names."""
    (id_, sid, idx, choice, typ, msgs, tools, pids, rids, rlps, text, tcs, fin, ver, ns,
     final, trainable, req, created, ns_at, rvers, tenant, sampling, pref, ptail, mref, tref, reasoning) = r
    think = loads(reasoning) or {}
    return Turn(
        id=id_, session_id=sid, index=idx, choice_index=choice, type=typ,
        messages=json.loads(msgs) if mref is None else store.messages(conn, mref),
        tools=loads(tools) if tref is None else store.tools(conn, tref),
        prompt_ids=json.loads(pids) if ptail is None else store.ids(conn, pref, ptail),
        response_ids=json.loads(rids), response_logprobs=json.loads(rlps),
        response_text=text, tool_calls=loads(tcs), finish_reason=fin, policy_version=ver,
        next_state=loads(ns), final=bool(final), trainable=bool(trainable), request_id=req,
        created_at=created, next_state_at=ns_at, response_versions=loads(rvers),
        tenant=tenant or "", sampling=loads(sampling), reasoning=think.get("text"), reasoning_end=think.get("end"),
    )


def put_prompt(t: Turn, store: Chunks, conn: sqlite3.Connection) -> tuple[bytes | None, bytes]:
    """Store the turn's prompt ids once (their pieces); (prompt_ref, prompt_tail) for its row."""
    return store.put_ids(conn, list(t.prompt_ids))


def put_tools(t: Turn, store: Chunks, conn: sqlite3.Connection) -> tuple[str | None, bytes | None]:
    """(tools, tools_ref) for the turn's row: a non-empty tool list is stored once, by reference."""
    if not t.tools:
        return dumps(t.tools), None
    return None, store.put_tools(conn, dumps(t.tools))


def turn_values(t: Turn, store: Chunks, conn: sqlite3.Connection) -> tuple:
    """INSERT_TURN's values for `t`, in the stored-once format (its pieces written first)."""
    pref, ptail = put_prompt(t, store, conn)
    mref = store.put_messages(conn, t.messages)
    tools, tref = put_tools(t, store, conn)
    return (
        t.session_id, t.index, t.choice_index, t.type, json.dumps(t.messages) if mref is None else "", tools,
        "", dumps(list(t.response_ids)), dumps(list(t.response_logprobs)),
        t.response_text, dumps(t.tool_calls), t.finish_reason, int(t.policy_version), dumps(t.next_state),
        int(t.final), int(t.trainable), t.request_id, t.created_at, t.next_state_at, versions_json(t),
        t.tenant or None, dumps(t.sampling), pref, ptail, mref, tref, reasoning_json(t),
    )


def reasoning_json(t: Turn) -> str | None:
    if t.reasoning is None and t.reasoning_end is None:
        return None
    return dumps({"text": t.reasoning, "end": t.reasoning_end})


def versions_json(t: Turn) -> str | None:
    return dumps(None if t.response_versions is None else [int(v) for v in t.response_versions])


def migrate(conn: sqlite3.Connection) -> None:
    """Add the MIGRATIONS columns a store file lacks. Two processes may open one old file at once
    (`clawloop up` and `clawloop train`): the loser of that race finds the column there and moves on."""
    for table, column, typ in MIGRATIONS:
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column in have:
            continue
        try:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {typ}")
        except sqlite3.OperationalError as e:
            if "duplicate column" not in str(e).lower():
                raise


JUDGEMENT_COLS = "turn_id, judge, score, votes, hint, latency_s, malformed, created_at, reward, hints"
N_JUDGEMENT_COLS = len(JUDGEMENT_COLS.split(","))


def row_to_judgement(r: tuple) -> Judgement:
    turn_id, judge, score, votes, hint, latency, malformed, created, reward, hints = r
    return Judgement(turn_id=turn_id, judge=judge, score=score, votes=json.loads(votes),
                     hint=hint, latency_s=latency, malformed=malformed, created_at=created,
                     reward=None if reward is None else float(reward),
                     hint_candidates=None if hints is None else json.loads(hints))
