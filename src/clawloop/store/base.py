"""The `Store` protocol: what the gateway, judge, trainer, dashboard and export ask of a store.

Components take a `Store` and never name an implementation, so a second one (PostgreSQL, so that
several gateways share sessions, linking, cursors and tenants) is written against this page and
checked by `tests/test_store_protocol.py`. `SQLiteStore` (`store/sqlite.py`) is the embedded default;
`open_store` (`store/__init__.py`) is the one place that picks an implementation.

The contract every implementation keeps, whatever its engine:

- **Writes never block the caller.** A write returns a `Future` at once; it resolves when the write
  is durable (committed, or set aside to be re-applied on the next start: never dropped silently).
  `flush()` waits for every write enqueued before it.
- **Every write is idempotent**, so a replayed write changes nothing, and a turn is keyed by
  (session_id, index, choice_index).
- **Reads see committed writes** from this and other processes (`clawloop judge`/`train` beside
  `clawloop up`).
- **A verdict is keyed by (turn, judge name)**, and judgement row ids grow in the order verdicts
  are stored, so a trainer cursor (the last row id consumed) never skips one.
- `tenant`: "" for turns served without API keys; None in a filter means every tenant.

The Responses API's stored responses are not here: they live in their own small store beside the
gateway (`gateway/responses_store.py`), which only that endpoint reads.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Protocol, runtime_checkable

from clawloop.records import Judgement, Turn


@runtime_checkable
class Store(Protocol):
    """Durable turns, sessions, judgements and trainer cursors (see the module docstring)."""

    path: Path | None
    """The file the store lives in on this machine (capture keeps request images in a folder beside
    it); None for a store with no local file (a database server), where images are not kept."""

    # -- turns and sessions: capture's writes ----------------------------------
    def begin_turn(self, turn: Turn, key: str) -> Future:
        """Store the pending row of a request that just began (untrainable until `finish_turns`)."""
        ...

    def finish_turns(self, turns: list[Turn], key: str | None, prompt_stored: bool = False) -> Future:
        """Store a request's turns, one per choice; choice 0 completes the pending row `key`. Resolves to row ids."""
        ...

    def add_turn(self, turn: Turn) -> Future:
        """Store a whole turn at once (import, rollouts); resolves to its row id, None when set aside."""
        ...

    def abandon_turn(self, session_id: str, index: int, key: str) -> Future:
        """Drop the pending row of a request that ended without a turn."""
        ...

    def abort_pending(self) -> int:
        """Mark pending rows aborted (untrainable): those of requests whose gateway is gone (every pending
        row, for a store only one gateway serves). Capture calls it at start."""
        ...

    def set_next_state(self, session_id: str, index: int, next_state: dict[str, Any],
                       response_text: str | None = None) -> Future:
        """Attach a turn's next state (never over one it has); the choice whose text was echoed gets it."""
        ...

    def close_session(self, session_id: str, reason: str, last_main_index: int | None) -> Future:
        """Close a session and mark its last main turn final, so it is judged without a next state."""
        ...

    # -- turns and sessions: reads -----------------------------------------------
    def get_turn(self, turn_id: int) -> Turn | None:
        """One turn by row id; None when unknown."""
        ...

    def session_turns(self, session_id: str) -> list[Turn]:
        """A session's turns in order (index, then choice)."""
        ...

    def iter_sessions(self) -> Iterator[tuple[str, list[Turn]]]:
        """Every session with its turns, oldest session first (what `clawloop export` writes)."""
        ...

    def next_index(self, session_id: str) -> int:
        """The first turn index no stored row of the session uses."""
        ...

    def max_policy_version(self) -> int | None:
        """The newest policy version any stored turn was served with (None: no turn yet)."""
        ...

    def session_state(self) -> list[dict[str, Any]]:
        """Open sessions with their last and pending main turn indexes (capture's state after a restart)."""
        ...

    def recent_answers(self, sessions: int) -> list[tuple[str, int, str, list[dict[str, Any]], str,
                                                           list[dict[str, Any]] | None, bool]]:
        """The last main turn of the most recently seen sessions (capture rebuilds header-less linking)."""
        ...

    # -- judgements ---------------------------------------------------------------
    def turns_to_judge(self, judge: str, limit: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[Turn]:
        """Main trainable turns with a next state (or final) that `judge` has not scored, oldest first."""
        ...

    def count_pending_judgement(self, judge: str) -> int:
        """How many turns `turns_to_judge(judge, ...)` would still return."""
        ...

    def save_judgement(self, j: Judgement) -> Future:
        """Store a verdict once per (turn, judge); resolves to whether it was new."""
        ...

    def get_judgement(self, turn_id: int, judge: str) -> Judgement | None:
        """`judge`'s verdict on a turn; None when it has none."""
        ...

    def judge_names(self) -> set[str]:
        """The names verdicts are stored under (a trainer reading another name would find nothing)."""
        ...

    def judged_turns(self, judge: str, after_id: int, limit: int) -> list[tuple[int, Turn, Judgement]]:
        """(judgement row id, turn, verdict) of `judge` with row id > after_id, in row id order."""
        ...

    # -- trainer cursors ----------------------------------------------------------
    def get_cursor(self, name: str, default: int = 0) -> int:
        """A named cursor (the last judgement row id a trainer consumed); `default` when never set."""
        ...

    def set_cursor(self, name: str, value: int) -> Future:
        """Move a named cursor; a replayed older value never moves it back."""
        ...

    # -- dashboard and tenants (read-only) ---------------------------------------
    def list_sessions(self, limit: int, offset: int = 0, *, judge: str,
                      tenant: str | None = None) -> tuple[int, list[dict[str, Any]]]:
        """(session count, one page of session rows with `judge`'s verdict counts), most recently seen first."""
        ...

    def session_summary(self, session_id: str, *, judge: str, tenant: str | None = None) -> dict[str, Any] | None:
        """One session's `list_sessions` row; None when unknown or not `tenant`'s."""
        ...

    def session_turns_page(self, session_id: str, limit: int, offset: int = 0, *,
                           tenant: str | None = None) -> list[Turn]:
        """Rows `offset`.. of a session's turns in order; with `tenant`, only its turns."""
        ...

    def judgements_of(self, turn_ids: list[int]) -> dict[int, list[tuple[int, Judgement]]]:
        """Every judge's verdicts on each turn: turn id -> [(judgement row id, verdict)], oldest first."""
        ...

    def judgement_counts(self, since: float, bucket_s: float, *, judge: str,
                         limit: int = 2000) -> list[dict[str, Any]]:
        """`judge`'s verdicts since `since` per `bucket_s` window: [{"t", "pos", "zero", "neg"}], oldest first."""
        ...

    def stats(self) -> dict[str, int | float]:
        """Totals (turns, main/side turns, judgements, sessions, open sessions) and `write_stats()`."""
        ...

    # -- the write path -------------------------------------------------------------
    def flush(self, timeout: float | None = 30.0) -> None:
        """Block until every write enqueued before this call is durable."""
        ...

    def pending_writes(self) -> int:
        """Writes enqueued and not yet durable."""
        ...

    def overloaded(self) -> bool:
        """True while writes back up: the gateway answers 429 rather than queue more."""
        ...

    def write_stats(self) -> dict[str, float]:
        """The write path's counters (`capture/store_failures`, `capture/spilled`, ...), without a query."""
        ...

    def close(self) -> None:
        """Flush, then release the store; a second call does nothing."""
        ...


class StoreUnavailable(RuntimeError):
    """A store that must answer now (a shared store's `claim_turn`) cannot be reached."""


@dataclass
class TurnClaim:
    """What a shared store answers a request that begins (`SharedSessions.claim_turn`)."""

    session_id: str
    index: int
    continued: bool
    """The session was found by the answer the request's history ends with (no session id was sent)."""
    linked: bool
    """The request's last message became the next state of an earlier turn."""


@runtime_checkable
class SharedSessions(Protocol):
    """A store that several gateway processes share (PostgreSQL): what capture's linking state is, so that
    the requests of one session may reach any gateway. Capture (`gateway/linking.py`) uses these instead of
    its in-memory maps when the store has them; the linking rules are capture's (its module docstring), each
    applied here in one transaction under the session's row lock:

    - `claim_turn` reserves the session's next index, finds the session of a header-less request by the
      answer its history ends with, links the request's last message (rule 1: that answer's turn; rule 2:
      the previous main turn by index, also while it is still being generated, never an aborted, abandoned
      or already linked one, nor for a retry of the same request) and writes the pending row, before it
      returns. It raises `StoreUnavailable` when the store cannot be reached.
    - `finish_claimed` completes the rows and records the answers the client is about to see, so a request
      that continues the conversation finds them from any gateway; it does not return before both are
      committed (or, when the store is down, queued to be written like any write).
    - Sessions close by `close_shared` (X-Session-Done) or `close_idle_sessions` (no request on any gateway
      for the idle timeout, none running), either marking the last main turn final when it is stored and
      has no next state.
    """

    def claim_turn(self, turn: Turn, *, new_session_id: str | None, answer_keys: list[bytes],
                   request_hash: bytes | None, next_state: dict[str, Any] | None,
                   echoed: str | None) -> TurnClaim:
        """Reserve an index for `turn` (a pending row; `session_id` "" when the request named none: then the
        session of the first of `answer_keys` with an answer, else `new_session_id`), link `next_state`
        (rule 1: that answer's turn; else rule 2 with `echoed`, the history's last assistant text), store the
        row. `request_hash` tells a retry of the same request."""
        ...

    def finish_claimed(self, turns: list[Turn], key: str, prompt_stored: bool,
                       answers: list[tuple[bytes, str]]) -> None:
        """Complete a claimed request's rows and record its answers ((answer key, response text) per choice)."""
        ...

    def close_shared(self, session_id: str, reason: str) -> Future:
        """Close a session now (its last main turn final when stored without a next state)."""
        ...

    def close_idle_sessions(self, idle_before: float) -> Future:
        """Close every open session last seen before `idle_before` with no request running; resolves to how many."""
        ...

    def prune_answers(self, keep: int) -> Future:
        """Forget all but the `keep` most recent answers (what header-less sessions are found by)."""
        ...
