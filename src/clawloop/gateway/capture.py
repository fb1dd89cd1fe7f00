"""Capture: every served turn into the store, linked to what came next.

Per session we keep only what linking needs: the next turn index, the index
of the last main turn still waiting for its next state, and when the session
was last seen. A main request's last message (the user's reply or a tool
result) is the previous main turn's `next_state`. Sessions end on
`X-Session-Done: 1` or after `session_idle_timeout_s` without a request; the
last main turn is then marked final so the judge still scores it, and the
session's state is freed.

All writes are enqueued on the store's writer thread; nothing here waits on
the disk. The state is rebuilt from the store on restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any

from clawloop.records import TURN_MAIN, TURN_SIDE, Turn
from clawloop.store import Store

log = logging.getLogger(__name__)


@dataclass
class _Session:
    next_index: int = 0
    pending_main: int | None = None
    """Index of the last main turn, whose next state has not arrived yet."""
    last_main: int | None = None
    last_seen: float = 0.0
    inflight: int = 0


@dataclass
class TurnSlot:
    """What a request needs to store its turn once the response is complete."""

    session_id: str
    index: int
    type: str
    close_after: bool
    anonymous: bool


class Capture:
    def __init__(self, store: Store, idle_timeout_s: float = 600.0, sweep_interval_s: float = 5.0):
        self.store = store
        self.idle_timeout_s = idle_timeout_s
        self.sweep_interval_s = sweep_interval_s
        self.sessions: dict[str, _Session] = {}
        self.turns_captured = 0
        self.sessions_closed = 0
        self.linked = 0
        for s in store.session_state():
            self.sessions[s["session_id"]] = _Session(
                next_index=(s["last_index"] + 1) if s["last_index"] is not None else 0,
                pending_main=s["pending_main_index"],
                last_main=s["last_main_index"],
                last_seen=s["last_seen"],
            )

    # -- request path ----------------------------------------------------
    def begin(self, session_id: str | None, turn_type: str, messages: list[dict[str, Any]],
              done: bool) -> TurnSlot:
        """Reserve the turn's index and link the previous main turn's next state."""
        anonymous = session_id is None
        sid = session_id or f"anon-{uuid.uuid4().hex}"
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = _Session()
        s.last_seen = time.time()
        s.inflight += 1
        index = s.next_index
        s.next_index += 1
        if turn_type == TURN_MAIN and s.pending_main is not None:
            last = messages[-1]
            if last["role"] in ("user", "tool"):
                echoed = next((m.get("content") for m in reversed(messages)
                               if m["role"] == "assistant"), None)
                self.store.set_next_state(sid, s.pending_main, {"role": last["role"], "content": last["content"]},
                                          response_text=echoed)
                self.linked += 1
                s.pending_main = None
        return TurnSlot(sid, index, turn_type, close_after=done or anonymous, anonymous=anonymous)

    def finish(self, slot: TurnSlot, turns: list[Turn]) -> None:
        """Store the turn (one row per choice) and close the session if asked."""
        for t in turns:
            self.store.add_turn(t)
        self.turns_captured += len(turns)
        s = self.sessions.get(slot.session_id)
        if s is None:  # closed by the sweeper while this request ran; reopen
            s = self.sessions[slot.session_id] = _Session(next_index=slot.index + 1)
        s.inflight = max(0, s.inflight - 1)
        s.last_seen = time.time()
        if slot.type == TURN_MAIN and turns and turns[0].trainable:
            s.pending_main = slot.index
            s.last_main = slot.index
        if slot.close_after:
            self.close(slot.session_id, "done" if not slot.anonymous else "no_session_id")

    def abandon(self, slot: TurnSlot) -> None:
        """The request failed before producing a turn."""
        s = self.sessions.get(slot.session_id)
        if s is not None:
            s.inflight = max(0, s.inflight - 1)
            if slot.anonymous:
                del self.sessions[slot.session_id]

    def close(self, session_id: str, reason: str) -> None:
        s = self.sessions.pop(session_id, None)
        if s is None:
            return
        self.store.close_session(session_id, reason, s.pending_main)
        self.sessions_closed += 1

    # -- background ----------------------------------------------------------
    def sweep(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        idle = [sid for sid, s in self.sessions.items()
                if s.inflight == 0 and now - s.last_seen >= self.idle_timeout_s]
        for sid in idle:
            self.close(sid, "idle")
        return len(idle)

    async def run_sweeper(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                n = self.sweep()
                if n:
                    log.info("closed %d idle session(s)", n)
            except Exception:
                log.exception("idle-session sweep failed")

    def stats(self) -> dict[str, float]:
        return {
            "capture/open_sessions": float(len(self.sessions)),
            "capture/turns_captured": float(self.turns_captured),
            "capture/sessions_closed": float(self.sessions_closed),
            "capture/next_states_linked": float(self.linked),
            "capture/store_pending_writes": float(self.store.pending_writes()),
        }


__all__ = ["Capture", "TurnSlot", "TURN_MAIN", "TURN_SIDE"]
