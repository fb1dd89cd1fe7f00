"""Read-only views of the SQLite store: pages of sessions (per tenant), the verdicts on a page of
turns, verdict counts per time bucket, and the store's totals.

Nothing here writes; the gateway's dashboard (`gateway/dashboard.py`) pages through these, and
`stats()` counts what `clawloop export` will write, while capture, the judge and the trainer write
beside them.
"""

from __future__ import annotations

from typing import Any

from clawloop.records import TURN_MAIN, Judgement, Turn
from clawloop.store.schema import JUDGEMENT_COLS, TURN_COLS, row_to_judgement, row_to_turn
from clawloop.store.writer import SQLiteBase


class BrowseRows(SQLiteBase):
    """Sessions, verdicts and counts as the dashboard pages them: that part of the `Store` protocol."""

    def list_sessions(self, limit: int, offset: int = 0, *, judge: str,
                      tenant: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """(how many sessions there are, one page of them, most recently seen first). `tenant`: only
        sessions with a turn of that tenant ("" for turns served without keys); None: all. Each row:
        session_id, created_at, last_seen, closed_at, closed_reason, tenant, turns (distinct indexes),
        rows (choices included), main_turns, judged, score_pos, score_zero, score_neg (verdicts of
        `judge`), last_version (the newest that served one of its turns)."""
        where, params = self._tenant_filter(tenant)
        c = self._reader()
        total = c.execute(f"SELECT COUNT(*) FROM sessions s {where}", params).fetchone()[0]
        rows = c.execute(f"SELECT session_id FROM sessions s {where} ORDER BY s.last_seen DESC, s.session_id "
                         "LIMIT ? OFFSET ?", (*params, max(0, int(limit)), max(0, int(offset)))).fetchall()
        return total, self._session_rows([r[0] for r in rows], judge)

    def session_summary(self, session_id: str, *, judge: str, tenant: str | None = None) -> dict[str, Any] | None:
        """One session's `list_sessions` row; None when it is unknown (or not `tenant`'s)."""
        where, params = self._tenant_filter(tenant)
        where = f"{where} AND s.session_id=?" if where else "WHERE s.session_id=?"
        r = self._reader().execute(f"SELECT session_id FROM sessions s {where}", (*params, session_id)).fetchone()
        rows = self._session_rows([r[0]], judge) if r else []
        return rows[0] if rows else None

    @staticmethod
    def _tenant_filter(tenant: str | None) -> tuple[str, tuple]:
        if tenant is None:
            return "", ()
        return ("WHERE EXISTS (SELECT 1 FROM turns t WHERE t.session_id=s.session_id AND COALESCE(t.tenant, '')=?)",
                (tenant,))

    def _session_rows(self, ids: list[str], judge: str) -> list[dict[str, Any]]:
        if not ids:
            return []
        c = self._reader()
        marks = ",".join("?" * len(ids))
        info = {r[0]: r for r in c.execute(
            f"SELECT session_id, created_at, last_seen, closed_at, closed_reason FROM sessions "
            f"WHERE session_id IN ({marks})", ids)}
        counts = {r[0]: r[1:] for r in c.execute(
            "SELECT t.session_id, COUNT(DISTINCT t.idx), COUNT(*), SUM(t.type=?), MAX(t.tenant), COUNT(j.score), "
            "SUM(j.score>0), SUM(j.score=0), SUM(j.score<0), MAX(t.policy_version) "
            "FROM turns t LEFT JOIN judgements j ON j.turn_id=t.id AND j.judge=? "  # one per turn: unique (turn, judge)
            f"WHERE t.session_id IN ({marks}) GROUP BY t.session_id", (TURN_MAIN, judge, *ids))}
        out = []
        for sid in ids:
            if sid not in info:
                continue
            _, created, seen, closed_at, reason = info[sid]
            turns, rows, main, tenant, judged, pos, zero, neg, version = counts.get(
                sid, (0, 0, 0, None, 0, 0, 0, 0, None))
            out.append({"session_id": sid, "created_at": created, "last_seen": seen, "closed_at": closed_at,
                        "closed_reason": reason, "tenant": tenant or "", "turns": turns, "rows": rows,
                        "main_turns": main or 0, "judged": judged or 0, "score_pos": pos or 0,
                        "score_zero": zero or 0, "score_neg": neg or 0, "last_version": version})
        return out

    def session_turns_page(self, session_id: str, limit: int, offset: int = 0, *,
                           tenant: str | None = None) -> list[Turn]:
        """Rows `offset`.. of a session's turns in order (index, then choice); `tenant`: only its turns."""
        extra, params = ("", ()) if tenant is None else (" AND COALESCE(tenant, '')=?", (tenant,))
        c = self._reader()
        rows = c.execute(
            f"SELECT {TURN_COLS} FROM turns WHERE session_id=?{extra} ORDER BY idx, choice_index LIMIT ? OFFSET ?",
            (session_id, *params, max(0, int(limit)), max(0, int(offset)))).fetchall()
        return [row_to_turn(r, self.chunks, c) for r in rows]

    def judgements_of(self, turn_ids: list[int]) -> dict[int, list[tuple[int, Judgement]]]:
        """Every judge's verdict on each of `turn_ids`: turn id -> [(judgement row id, judgement)], oldest
        first. The row id is what the trainer's cursor counts (see `judged_turns`)."""
        out: dict[int, list[tuple[int, Judgement]]] = {}
        ids = [int(t) for t in turn_ids]
        for start in range(0, len(ids), 500):  # SQLite caps bound parameters
            chunk = ids[start:start + 500]
            for r in self._reader().execute(
                    f"SELECT id, {JUDGEMENT_COLS} FROM judgements WHERE turn_id IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY id", chunk):
                out.setdefault(r[1], []).append((r[0], row_to_judgement(r[1:])))
        return out

    def judgement_counts(self, since: float, bucket_s: float, *, judge: str,
                         limit: int = 2000) -> list[dict[str, Any]]:
        """`judge`'s verdicts stored since `since` (unix time) per `bucket_s` window, oldest first: [{"t":
        window start, "pos", "zero", "neg"}], the newest `limit` windows (those without a verdict left out)."""
        bucket_s = max(1e-3, float(bucket_s))
        rows = self._reader().execute(
            "SELECT CAST(created_at / ? AS INTEGER) AS b, SUM(score>0), SUM(score=0), SUM(score<0) FROM judgements "
            "WHERE created_at>=? AND judge=? GROUP BY b ORDER BY b DESC LIMIT ?",
            (bucket_s, float(since), judge, max(1, int(limit)))).fetchall()
        return [{"t": b * bucket_s, "pos": pos, "zero": zero, "neg": neg} for b, pos, zero, neg in reversed(rows)]

    def stats(self) -> dict[str, int | float]:
        c = self._reader()
        turns, main, side = c.execute(
            "SELECT COUNT(*), SUM(type='main'), SUM(type='side') FROM turns"
        ).fetchone()
        judged = c.execute("SELECT COUNT(*) FROM judgements").fetchone()[0]
        sessions, open_ = c.execute(
            "SELECT COUNT(*), SUM(closed_at IS NULL) FROM sessions"
        ).fetchone()
        return {
            "turns": turns or 0, "main_turns": main or 0, "side_turns": side or 0,
            "judgements": judged or 0, "sessions": sessions or 0, "open_sessions": open_ or 0,
            **self.write_stats(),
        }
