"""Judgements and trainer cursors in the SQLite store.

A verdict is keyed by (turn, judge name): each judge configuration scores a turn once, and the
trainer reads the verdicts of its judge in the order they were stored, keeping the last judgement
row id it consumed as a named cursor in the `kv` table.
"""

from __future__ import annotations

import json
import sqlite3
from concurrent.futures import Future
from typing import Any

from clawloop.records import TURN_MAIN, Judgement, Turn
from clawloop.store.schema import JUDGEMENT_COLS, N_JUDGEMENT_COLS, TURN_COLS, row_to_judgement, row_to_turn
from clawloop.store.writer import SQLiteBase


class JudgementRows(SQLiteBase):
    """The `judgements` table and the trainer cursors: that half of the `Store` protocol."""

    # -- ops (run on the writer thread, each inside the batch's transaction) ---
    def _op_judgement(self, conn: sqlite3.Connection, a: dict[str, Any]) -> bool:
        j: Judgement = a["judgement"]
        cur = conn.execute(
            f"INSERT OR IGNORE INTO judgements ({JUDGEMENT_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (j.turn_id, j.judge, int(j.score), json.dumps(j.votes), j.hint, float(j.latency_s),
             int(j.malformed), j.created_at, None if j.reward is None else float(j.reward),
             None if j.hint_candidates is None else json.dumps(list(j.hint_candidates))),
        )
        return cur.rowcount == 1

    def _op_cursor(self, conn: sqlite3.Connection, a: dict[str, Any]) -> None:
        # A replayed cursor never moves one that was set after it back.
        keep = "MAX(CAST(value AS INTEGER), CAST(excluded.value AS INTEGER))" if a.get("replay") else "excluded.value"
        conn.execute(f"INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value={keep}",
                     (f"cursor:{a['name']}", str(int(a["value"]))))

    # -- judging ---------------------------------------------------------------
    def turns_to_judge(self, judge: str, limit: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[Turn]:
        """Main, trainable turns whose next state arrived (or session closed) and that
        `judge` has not scored yet, oldest first."""
        c = self._reader()
        rows = c.execute(
            f"SELECT {TURN_COLS} FROM turns t WHERE t.type=? AND t.trainable=1 "
            "AND (t.next_state IS NOT NULL OR t.final=1) "
            "AND NOT EXISTS (SELECT 1 FROM judgements j WHERE j.turn_id=t.id AND j.judge=?) "
            "ORDER BY t.id LIMIT ?",
            (TURN_MAIN, judge, limit + len(exclude)),
        ).fetchall()
        turns = [row_to_turn(r, self.chunks, c) for r in rows if r[0] not in exclude]
        return turns[:limit]

    def count_pending_judgement(self, judge: str) -> int:
        return self._reader().execute(
            "SELECT COUNT(*) FROM turns t WHERE t.type=? AND t.trainable=1 "
            "AND (t.next_state IS NOT NULL OR t.final=1) "
            "AND NOT EXISTS (SELECT 1 FROM judgements j WHERE j.turn_id=t.id AND j.judge=?)",
            (TURN_MAIN, judge),
        ).fetchone()[0]

    def save_judgement(self, j: Judgement) -> Future:
        """Store a verdict; a second verdict for the same (turn, judge) is ignored. Resolves to
        whether it was new (True when it was spilled: saved, re-imported on the next start)."""
        return self._submit("judgement", {"judgement": j})

    def get_judgement(self, turn_id: int, judge: str) -> Judgement | None:
        r = self._reader().execute(
            f"SELECT {JUDGEMENT_COLS} FROM judgements WHERE turn_id=? AND judge=?",
            (turn_id, judge),
        ).fetchone()
        return row_to_judgement(r) if r else None

    def judge_names(self) -> set[str]:
        return {r[0] for r in self._reader().execute("SELECT DISTINCT judge FROM judgements")}

    def judged_turns(self, judge: str, after_id: int, limit: int) -> list[tuple[int, Turn, Judgement]]:
        """(judgement row id, turn, judgement) with judgement id > after_id, in order.

        The trainer keeps the last id it consumed as its cursor (see get_cursor)."""
        c = self._reader()
        rows = c.execute(
            f"SELECT j.id, {', '.join('j.' + c.strip() for c in JUDGEMENT_COLS.split(','))}, "
            f"{', '.join('t.' + c.strip() for c in TURN_COLS.split(','))} "
            "FROM judgements j JOIN turns t ON t.id=j.turn_id "
            "WHERE j.judge=? AND j.id>? ORDER BY j.id LIMIT ?",
            (judge, after_id, limit),
        ).fetchall()
        n = 1 + N_JUDGEMENT_COLS
        return [(r[0], row_to_turn(r[n:], self.chunks, c), row_to_judgement(r[1:n])) for r in rows]

    # -- trainer cursors -------------------------------------------------------
    def get_cursor(self, name: str, default: int = 0) -> int:
        r = self._reader().execute("SELECT value FROM kv WHERE key=?", (f"cursor:{name}",)).fetchone()
        return int(r[0]) if r else default

    def set_cursor(self, name: str, value: int) -> Future:
        return self._submit("cursor", {"name": name, "value": int(value)})
