"""The PostgreSQL store put together, and what several gateways share to link a session's turns.

Capture's linking rules (`gateway/capture.py`) need, for each request that begins: the session's next index,
the session of the answer a header-less request's history ends with, the session's previous main turn and
whether it may take a next state. One gateway keeps these in memory; several keep them here, and each
request that begins reads and updates them in ONE transaction under the session's row lock
(`SELECT ... FOR UPDATE` on `sessions`), so two gateways that receive requests of one session at once
serialise on it and see each other's turns:

    claim_turn      answers[key] -> session; sessions.next_index++ ; link (rule 1 / rule 2) ; pending row
    finish_claimed  the rows completed + answers[key] = (session, index, text), committed before the reply

Lock order is always `sessions` row, then `turns` rows (claim, finish, close), so these transactions do not
deadlock each other; a deadlock with a batch of the writer thread is retried like a serialization failure.
Both run on linking connections of their own (a pool of `LINK_CONNECTIONS` per process, so a claim waiting on
one session's row lock does not hold up the others) with `synchronous_commit = off` (commits are visible at
once; a server crash may lose the last few, as SQLite's `synchronous=NORMAL` may), on the caller's thread:
capture calls them from a worker thread (`Capture.begin_async`/`finish_async`), off the event loop.

What one gateway holds in memory and this keeps instead: `_Session.next_index` (sessions.next_index),
`last_main` (sessions.last_main, the highest main index begun), the request hash of a turn (turns.request_hash),
`linked`/`held` (a next state on the row; one that arrives while its turn is generated is written on the
pending row and kept by the finish, or dropped when the turn ends untrainable), the answer map (the
`answers` table, most recent answer per key wins, pruned to the newest `max_answers`). With n > 1 choices, a
next state held for a running turn goes to choice 0 (one gateway picks the echoed choice at finish).
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future
from typing import Any

from clawloop.records import TURN_MAIN, Turn
from clawloop.store.base import StoreUnavailable, TurnClaim
from clawloop.store.browse import BrowseRows
from clawloop.store.judgements import JudgementRows
from clawloop.store.postgres import INSERT_PG_TURN, PgConnection, PgRows, redact
from clawloop.store.schema import PENDING, turn_values
from clawloop.store.turns import TurnRows

log = logging.getLogger(__name__)


class SharedSessionRows(PgRows):
    """The `SharedSessions` half of the PostgreSQL store (see the module docstring)."""

    def _in_link_tx(self, fn: Any, *args: Any) -> Any:
        """Run `fn(conn, *args)` in one transaction on a linking connection (a pool of `LINK_CONNECTIONS`:
        a claim that waits on one session's row lock holds one, the other sessions' go on); a deadlock or
        serialization failure is retried, a lost connection once more on a fresh one; still failing:
        StoreUnavailable."""
        err: BaseException | None = None
        with self._link_slots:
            for attempt in range(4):
                if attempt:
                    time.sleep(0.01 * 2 ** attempt)
                conn = None
                try:
                    conn = self._take_link()
                    conn.execute("BEGIN")
                    out = fn(conn, *args)
                    conn.execute("COMMIT")
                    self._give_link(conn)
                    return out
                except self.DATABASE_ERRORS as e:
                    err = e
                    self._drop_link(conn)
                except BaseException:
                    self._drop_link(conn)
                    raise
        raise StoreUnavailable(f"store {redact(self.url)}: {err}")

    def _take_link(self) -> PgConnection:
        with self._link_mutex:
            while self._link_idle:
                conn = self._link_idle.pop()
                if not conn.broken:
                    return conn
                self._link_open.remove(conn)
                conn.close()
        conn = PgConnection(self.url, synchronous_commit=False)
        with self._link_mutex:
            self._link_open.append(conn)
        return conn

    def _give_link(self, conn: PgConnection) -> None:
        with self._link_mutex:
            self._link_idle.append(conn)

    def _drop_link(self, conn: PgConnection | None) -> None:
        """After a failed transaction: roll back and keep the connection, or close it if that fails too."""
        if conn is None:
            return
        try:
            conn.rollback()
            self._give_link(conn)
        except Exception:
            with self._link_mutex:
                if conn in self._link_open:
                    self._link_open.remove(conn)
            conn.close()

    # -- a request begins ------------------------------------------------------------
    def claim_turn(self, turn: Turn, *, new_session_id: str | None, answer_keys: list[bytes],
                   request_hash: bytes | None, next_state: dict[str, Any] | None,
                   echoed: str | None) -> TurnClaim:
        return self._in_link_tx(self._claim, turn, new_session_id, answer_keys, request_hash, next_state, echoed)

    def _claim(self, conn: PgConnection, turn: Turn, new_sid: str | None, answer_keys: list[bytes],
               request_hash: bytes | None, next_state: dict[str, Any] | None, echoed: str | None) -> TurnClaim:
        entry = None
        if answer_keys:  # the first key (in capture's order) that has an answer
            found = {bytes(r[0]): r[1:] for r in conn.execute(
                "SELECT key, session_id, idx, text FROM answers WHERE key = ANY(?)", (list(answer_keys),)).fetchall()}
            entry = next((found[k] for k in answer_keys if k in found), None)
        sid, continued = turn.session_id, False
        if not sid:
            if entry is not None:
                sid, continued = entry[0], True
            else:
                sid = new_sid or ""
        if entry is not None and entry[0] != sid:
            entry = None
        now = time.time()
        conn.execute("INSERT INTO sessions (session_id, created_at, last_seen, next_index) VALUES (?, ?, ?, 0) "
                     "ON CONFLICT (session_id) DO NOTHING", (sid, now, now))
        nxt, last_main = conn.execute("SELECT next_index, last_main FROM sessions WHERE session_id=? FOR UPDATE",
                                      (sid,)).fetchone()
        main = turn.type == TURN_MAIN
        linked = False
        if main and next_state is not None:
            linked = self._link_next_state(conn, sid, entry, last_main, request_hash, next_state, echoed)
        turn.session_id, turn.index = sid, nxt
        values = turn_values(turn, self.chunks, conn)
        while True:  # an index a stored row took outside this path (an import) moves this turn past it
            row = conn.execute(
                INSERT_PG_TURN + " ON CONFLICT (session_id, idx, choice_index) DO NOTHING RETURNING id",
                (values[0], turn.index) + values[2:] + (request_hash, self.owner)).fetchone()
            if row is not None:
                break
            turn.index = conn.execute("SELECT MAX(idx) + 1 FROM turns WHERE session_id=?", (sid,)).fetchone()[0]
        turn.id = row[0]
        conn.execute("UPDATE sessions SET next_index=?, last_seen=?, closed_at=NULL, closed_reason=NULL, "
                     "last_main=CASE WHEN ?::boolean THEN ? ELSE last_main END WHERE session_id=?",
                     (turn.index + 1, now, main, turn.index, sid))
        return TurnClaim(sid, turn.index, continued, linked)

    def _link_next_state(self, conn: PgConnection, sid: str, entry: tuple | None, last_main: int | None,
                         request_hash: bytes | None, next_state: dict[str, Any], echoed: str | None) -> bool:
        """Rule 1 (the answer's turn) or rule 2 (the previous main turn); see `gateway/capture.py`."""
        if entry is not None:
            index, echo = entry[1], entry[2]
        elif last_main is not None:
            index, echo = last_main, echoed
        else:
            return False
        rows = conn.execute("SELECT choice_index, finish_reason, trainable, next_state IS NOT NULL, request_hash "
                            "FROM turns WHERE session_id=? AND idx=? ORDER BY choice_index FOR UPDATE",
                            (sid, index)).fetchall()
        if not rows:
            return False  # abandoned: the request that held the index ended without a turn
        choice0 = rows[0]
        if entry is None and request_hash is not None and choice0[4] is not None and bytes(choice0[4]) == request_hash:
            return False  # a retry of the same request reacts to nothing
        if any(r[3] for r in rows):
            return False  # linked already (a sibling request, or a retry)
        running = choice0[1] == PENDING
        if not running and (choice0[1] == "abort" or not choice0[2]):
            return False  # aborted: the client never saw that answer
        payload, now = json.dumps(next_state), time.time()
        n = 0
        if not running and echo is not None:
            n = conn.execute("UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                             "AND response_text=? AND next_state IS NULL", (payload, now, sid, index, echo)).rowcount
        if n == 0:
            n = conn.execute("UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                             "AND choice_index=0 AND next_state IS NULL", (payload, now, sid, index)).rowcount
        return n > 0

    # -- a request ends ------------------------------------------------------------------
    def finish_claimed(self, turns: list[Turn], key: str, prompt_stored: bool,
                       answers: list[tuple[bytes, str]]) -> None:
        if not turns:
            return
        try:
            self._in_link_tx(self._finish, turns, key, prompt_stored, answers)
        except Exception as e:  # never lost, never a failed reply: queued like any write (retried, spilled)
            if self._say("finish-claimed"):
                log.warning("store: finishing turn %d of %r failed (%s); it goes through the write queue",
                            turns[0].index, turns[0].session_id, e)
            self.finish_turns(turns, key, prompt_stored)
            if answers:
                self._submit("answers", self._answers_args(turns[0], answers))

    def _finish(self, conn: PgConnection, turns: list[Turn], key: str, prompt_stored: bool,
                answers: list[tuple[bytes, str]]) -> None:
        self._touch_session(conn, turns[0].session_id, turns[0].index + 1)  # sessions row first: lock order
        for t in turns:
            self._store_turn(conn, t, key if t.choice_index == 0 else "", prompt_stored)
        if answers:
            self._op_answers(conn, self._answers_args(turns[0], answers))

    @staticmethod
    def _answers_args(t: Turn, answers: list[tuple[bytes, str]]) -> dict[str, Any]:
        return {"session_id": t.session_id, "index": t.index, "answers": [[k.hex(), text] for k, text in answers]}

    def _op_answers(self, conn: Any, a: dict[str, Any]) -> None:
        now = time.time()
        conn.executemany(
            "INSERT INTO answers (key, session_id, idx, text, seen) VALUES (?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE "
            "SET session_id=EXCLUDED.session_id, idx=EXCLUDED.idx, text=EXCLUDED.text, seen=EXCLUDED.seen",
            [(bytes.fromhex(k), a["session_id"], a["index"], text, now) for k, text in a["answers"]])

    # -- sessions end ------------------------------------------------------------------------
    def close_shared(self, session_id: str, reason: str) -> Future:
        return self._submit("close_shared", {"session_id": session_id, "reason": reason})

    def close_idle_sessions(self, idle_before: float) -> Future:
        return self._submit("close_idle", {"before": float(idle_before)})

    def prune_answers(self, keep: int) -> Future:
        return self._submit("prune_answers", {"keep": int(keep)})

    def _close_one(self, conn: Any, sid: str, reason: str, last_main: int | None) -> None:
        conn.execute("UPDATE sessions SET closed_at=?, closed_reason=? WHERE session_id=?", (time.time(), reason, sid))
        if last_main is not None:  # final: judged without a next state (stored, trainable, not linked)
            conn.execute("UPDATE turns SET final=1 WHERE session_id=? AND idx=? AND finish_reason<>? AND trainable=1 "
                         "AND NOT EXISTS (SELECT 1 FROM turns u WHERE u.session_id=? AND u.idx=? "
                         "AND u.next_state IS NOT NULL)", (sid, last_main, PENDING, sid, last_main))

    def _op_close_shared(self, conn: Any, a: dict[str, Any]) -> int:
        row = conn.execute("SELECT last_main FROM sessions WHERE session_id=? FOR UPDATE", (a["session_id"],)).fetchone()
        if row is None:
            return 0
        self._close_one(conn, a["session_id"], a["reason"], row[0])
        return 1

    def _op_close_idle(self, conn: Any, a: dict[str, Any]) -> int:
        rows = conn.execute(
            "SELECT session_id, last_main FROM sessions s WHERE closed_at IS NULL AND last_seen < ? "
            "AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.session_id=s.session_id AND t.finish_reason=?) "
            "ORDER BY session_id FOR UPDATE SKIP LOCKED", (a["before"], PENDING)).fetchall()
        for sid, last_main in rows:
            self._close_one(conn, sid, "idle", last_main)
        return len(rows)

    def _op_prune_answers(self, conn: Any, a: dict[str, Any]) -> int:
        return conn.execute("DELETE FROM answers WHERE seen < (SELECT seen FROM answers ORDER BY seen DESC "
                            "OFFSET ? LIMIT 1)", (max(0, a["keep"]),)).rowcount


class PostgresStore(SharedSessionRows, TurnRows, JudgementRows, BrowseRows):
    """The `Store` protocol (and `SharedSessions`) on a PostgreSQL server at `url`. `spill_path`: where
    writes go while the server cannot take them (a local file; `DATA_DIR/spill.jsonl`); the other arguments
    are `SQLiteStore`'s."""


__all__ = ["PostgresStore"]
