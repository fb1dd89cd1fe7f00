"""Turns and sessions in the SQLite store: what capture writes, and the reads that export a session,
rebuild capture after a restart, and continue version numbering.

A turn is written twice: a `pending` row when its request begins (the prompt
and the request, `finish_reason='pending'`, untrainable) and the response
when it ends. A `kill -9` therefore loses at most the tokens of the answers
being generated; `abort_pending()` (run by capture at start) marks such rows
`abort`, still untrainable, rather than dropping them.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from concurrent.futures import Future
from typing import Any, Iterator

from clawloop.records import TURN_MAIN, Turn
from clawloop.store.schema import (ABORT, FINISH_TURN, INSERT_TURN, PENDING, TURN_COLS, dumps, loads, put_prompt,
                                   put_tools, reasoning_json, row_to_turn, turn_values,
                                   versions_json)
from clawloop.store.writer import SQLiteBase

log = logging.getLogger(__name__)


class TurnRows(SQLiteBase):
    """The `turns` and `sessions` tables: the turn/session half of the `Store` protocol."""

    # -- ops (run on the writer thread, each inside the batch's transaction) ---
    def _touch_session(self, conn: sqlite3.Connection, session_id: str) -> None:
        now = time.time()
        conn.execute(
            "INSERT INTO sessions (session_id, created_at, last_seen) VALUES (?, ?, ?) "
            "ON CONFLICT(session_id) DO UPDATE SET last_seen=excluded.last_seen, closed_at=NULL, closed_reason=NULL",
            (session_id, now, now),
        )

    def _op_begin(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int | None:
        t: Turn = a["turn"]
        self._touch_session(conn, t.session_id)
        cur = conn.execute(INSERT_TURN + " ON CONFLICT(session_id, idx, choice_index) DO NOTHING",
                           turn_values(t, self.chunks, conn))
        if cur.rowcount == 0 and not a.get("replay"):
            log.warning("store: turn %d of session %r is taken; this request's row waits for its end",
                        t.index, t.session_id)
        return cur.lastrowid if cur.rowcount else None

    def _op_finish(self, conn: sqlite3.Connection, a: dict[str, Any]) -> list[int]:
        turns: list[Turn] = a["turns"]
        key = a.get("key") or ""
        if turns:
            self._touch_session(conn, turns[0].session_id)
        return [self._store_turn(conn, t, key if t.choice_index == 0 else "", a.get("prompt_stored", False))
                for t in turns]

    def _op_add(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        t: Turn = a["turn"]
        self._touch_session(conn, t.session_id)
        return self._store_turn(conn, t, "")

    def _store_turn(self, conn: sqlite3.Connection, t: Turn, key: str, prompt_stored: bool = False) -> int:
        """Complete the turn's pending row (or re-apply the same request: idempotent), else insert it.
        A row of another request at the same index (capture state out of step with the file) never
        drops this turn: it goes to the session's next free index, with a warning."""
        if key or t.request_id:
            pref, ptail = (None, None) if prompt_stored else put_prompt(t, self.chunks, conn)
            tools, tref = put_tools(t, self.chunks, conn)
            row = conn.execute(FINISH_TURN, (  # the prompt ids the pending row has are not written again
                tools, tref, None if prompt_stored else "", int(prompt_stored), pref, int(prompt_stored), ptail,
                dumps(list(t.response_ids)),
                dumps(list(t.response_logprobs)), t.response_text, dumps(t.tool_calls), t.finish_reason,
                int(t.policy_version), dumps(t.next_state), t.next_state_at, int(t.final), int(t.trainable),
                t.request_id, t.created_at, versions_json(t), t.tenant or None, dumps(t.sampling), reasoning_json(t),
                t.session_id, t.index, t.choice_index, key or None, t.request_id,  # None: matches no row
            )).fetchall()
            if row:
                t.id = row[0][0]
                return t.id
        values = turn_values(t, self.chunks, conn)
        try:
            cur = conn.execute(INSERT_TURN, values)
        except sqlite3.IntegrityError:
            nxt = conn.execute("SELECT COALESCE(MAX(idx), -1) + 1 FROM turns WHERE session_id=?",
                               (t.session_id,)).fetchone()[0]
            log.warning("store: turn %d of session %r is taken by another request; stored as turn %d",
                        t.index, t.session_id, nxt)
            self.reindexed += 1
            t.index = nxt
            cur = conn.execute(INSERT_TURN, (values[0], nxt) + values[2:])
        t.id = cur.lastrowid
        return t.id

    def _op_abandon(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        n = conn.execute("DELETE FROM turns WHERE session_id=? AND idx=? AND finish_reason='pending' AND request_id=?",
                         (a["session_id"], a["index"], a["key"])).rowcount
        conn.execute("DELETE FROM sessions WHERE session_id=? AND NOT EXISTS "
                     "(SELECT 1 FROM turns WHERE session_id=?)", (a["session_id"], a["session_id"]))
        return n

    def _missing(self, conn: sqlite3.Connection, session_id: str, index: int) -> bool:
        return conn.execute("SELECT 1 FROM turns WHERE session_id=? AND idx=? LIMIT 1",
                            (session_id, index)).fetchone() is None

    def _op_next_state(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        now = time.time()
        payload = json.dumps(a["next_state"])
        sid, index, text = a["session_id"], a["index"], a.get("response_text")
        n = 0
        if text is not None:
            n = conn.execute(
                "UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                "AND response_text=? AND next_state IS NULL",
                (payload, now, sid, index, text),
            ).rowcount
        if n == 0:
            n = conn.execute(
                "UPDATE turns SET next_state=?, next_state_at=? WHERE session_id=? AND idx=? "
                "AND choice_index=0 AND next_state IS NULL",
                (payload, now, sid, index),
            ).rowcount
        if n == 0 and self._missing(conn, sid, index):
            raise LookupError(f"turn {index} of session {sid!r} is not stored (spilled?)")
        return n

    def _op_close(self, conn: sqlite3.Connection, a: dict[str, Any]) -> None:
        sid, last = a["session_id"], a.get("last_main_index")
        conn.execute("UPDATE sessions SET closed_at=?, closed_reason=? WHERE session_id=?",
                     (time.time(), a["reason"], sid))
        if last is not None:
            n = conn.execute("UPDATE turns SET final=1 WHERE session_id=? AND idx=?", (sid, last)).rowcount
            if n == 0:
                raise LookupError(f"turn {last} of session {sid!r} is not stored (spilled?)")

    def _op_abort_pending(self, conn: sqlite3.Connection, a: dict[str, Any]) -> int:
        return conn.execute("UPDATE turns SET finish_reason=?, trainable=0 WHERE finish_reason=?",
                            (ABORT, PENDING)).rowcount

    # -- writes (enqueued; the future resolves once committed or spilled) -----
    def add_turn(self, turn: Turn) -> Future:
        """Enqueue a whole turn; the future resolves to its row id (None when it was spilled)."""
        return self._submit("add", {"turn": turn})

    def begin_turn(self, turn: Turn, key: str) -> Future:
        """Enqueue the pending row of a request that just began (`turn`: its prompt and request,
        `finish_reason='pending'`, untrainable, `request_id=key`). `finish_turns` completes it."""
        return self._submit("begin", {"turn": turn})

    def finish_turns(self, turns: list[Turn], key: str | None, prompt_stored: bool = False) -> Future:
        """Enqueue a request's turns (one per choice); choice 0 completes the pending row `key`
        (`prompt_stored`: that row has the same prompt ids already)."""
        return self._submit("finish", {"turns": turns, "key": key, "prompt_stored": prompt_stored})

    def abandon_turn(self, session_id: str, index: int, key: str) -> Future:
        """Drop the pending row of a request that ended without a turn."""
        return self._submit("abandon", {"session_id": session_id, "index": index, "key": key})

    def abort_pending(self) -> int:
        """Mark every pending row `abort` (untrainable): requests in flight when the last process died.
        Only the process that serves this store may call it, at start (capture does)."""
        return self._submit("abort_pending", {}).result(60) or 0

    def set_next_state(self, session_id: str, index: int, next_state: dict[str, Any],
                       response_text: str | None = None) -> Future:
        """Attach the next state to turn `index` of a session (never over one it has).

        With n > 1 choices, the one whose text the client echoed back
        (`response_text`) gets it; if none matches, choice 0 does.
        """
        return self._submit("next_state", {"session_id": session_id, "index": index, "next_state": next_state,
                                           "response_text": response_text})

    def close_session(self, session_id: str, reason: str, last_main_index: int | None) -> Future:
        """Mark a session closed and its last main turn final (judge it without next state)."""
        return self._submit("close", {"session_id": session_id, "reason": reason,
                                      "last_main_index": last_main_index})

    # -- reads ---------------------------------------------------------------
    def get_turn(self, turn_id: int) -> Turn | None:
        c = self._reader()
        r = c.execute(f"SELECT {TURN_COLS} FROM turns WHERE id=?", (turn_id,)).fetchone()
        return row_to_turn(r, self.chunks, c) if r else None

    def session_turns(self, session_id: str) -> list[Turn]:
        c = self._reader()
        rows = c.execute(
            f"SELECT {TURN_COLS} FROM turns WHERE session_id=? ORDER BY idx, choice_index",
            (session_id,),
        ).fetchall()
        return [row_to_turn(r, self.chunks, c) for r in rows]

    def iter_sessions(self) -> Iterator[tuple[str, list[Turn]]]:
        """Every session with its turns, oldest session first."""
        ids = [r[0] for r in self._reader().execute(
            "SELECT session_id, MIN(id) AS first FROM turns GROUP BY session_id ORDER BY first"
        ).fetchall()]
        for sid in ids:
            yield sid, self.session_turns(sid)

    def next_index(self, session_id: str) -> int:
        """The first turn index no stored row of the session uses."""
        r = self._reader().execute("SELECT MAX(idx) FROM turns WHERE session_id=?", (session_id,)).fetchone()
        return 0 if r[0] is None else r[0] + 1

    def max_policy_version(self) -> int | None:
        """The newest policy version any stored turn was served with (None: no turn yet). A run that
        starts from the base weights without resuming continues numbering after it, so a version
        names one set of weights per store."""
        c = self._reader()
        top = c.execute("SELECT MAX(policy_version) FROM turns").fetchone()[0]
        mixed = c.execute("SELECT MAX(CAST(j.value AS INTEGER)) FROM turns t, json_each(t.response_versions) j "
                          "WHERE t.response_versions IS NOT NULL").fetchone()[0]
        vs = [v for v in (top, mixed) if v is not None and v >= 0]
        return max(vs) if vs else None

    def session_state(self) -> list[dict[str, Any]]:
        """Open sessions with their last turn index, last main turn index, and that
        index again as `pending_main_index` if the turn still waits for its next
        state (to rebuild capture state on restart)."""
        rows = self._reader().execute(
            "SELECT s.session_id, s.last_seen, "
            "(SELECT MAX(idx) FROM turns t WHERE t.session_id=s.session_id), "
            "(SELECT MAX(idx) FROM turns t WHERE t.session_id=s.session_id AND t.type=? AND t.trainable=1) "
            "FROM sessions s WHERE s.closed_at IS NULL",
            (TURN_MAIN,),
        ).fetchall()
        out = []
        for sid, ls, li, lm in rows:
            pending = None
            if lm is not None:
                waiting = self._reader().execute(
                    "SELECT COUNT(*) FROM turns WHERE session_id=? AND idx=? AND next_state IS NULL",
                    (sid, lm)).fetchone()[0]
                pending = lm if waiting else None
            out.append({"session_id": sid, "last_seen": ls, "last_index": li, "last_main_index": lm,
                        "pending_main_index": pending})
        return out

    def recent_answers(self, sessions: int) -> list[tuple[str, int, str, list[dict[str, Any]], str,
                                                           list[dict[str, Any]] | None, bool]]:
        """The last trainable main turn of the `sessions` most recently seen sessions, oldest first:
        (session_id, index, tenant, request messages, response_text, tool_calls, has next state) per choice.
        Capture rebuilds its conversation map from these (header-less sessions survive a restart)."""
        c = self._reader()
        sids = [r[0] for r in c.execute("SELECT session_id FROM sessions ORDER BY last_seen DESC LIMIT ?",
                                        (sessions,)).fetchall()]
        out = []
        for sid in reversed(sids):
            rows = c.execute(
                "SELECT idx, tenant, messages, messages_ref, response_text, tool_calls, next_state IS NOT NULL "
                "FROM turns "
                "WHERE session_id=? AND idx=(SELECT MAX(idx) FROM turns WHERE session_id=? AND type=? "
                "AND trainable=1) ORDER BY choice_index", (sid, sid, TURN_MAIN)).fetchall()
            for idx, tenant, msgs, mref, text, tcs, linked in rows:
                msgs = json.loads(msgs) if mref is None else self.chunks.messages(c, mref)
                out.append((sid, idx, tenant or "", msgs, text, loads(tcs), bool(linked)))
        return out
