"""Capture: every served turn into the store, linked to what came next.

    slot = capture.begin(session_id, turn_type, messages, done, prompt_ids=ids, tools=tools)
    ...generate...
    capture.finish(slot, turns)        # or slot.release() when no turn came of it

`begin` reserves the turn's index in its session (turns are ordered by the
time their request began) and writes a *pending* row with the prompt and the
request, so a `kill -9` loses at most the answers being generated (a restart
marks such rows aborted). `finish` completes the row. A slot is released
exactly once, on every path: `finish`, `release()` (`abandon`), leaving a
`with slot:` block, or, for a caller that drops it, the sweeper once the slot
has been garbage-collected — so a stream cancelled before its first chunk
cannot pin its session open.

Which turn a main request's last message (the user's reply, a tool result)
is the `next_state` of — the linking rule, deterministic:

1. History. If the request's history (its messages before the trailing
   user/tool messages) ends with an answer this session was served — the hash
   of that turn's request messages plus its answer (content, or the tool
   calls' names and arguments; whitespace, tool-call ids, JSON key order and a
   thinking model's reasoning — `reasoning_content`, or `<think>…</think>`
   folded back into the content — do not count; numbers compare as a JSON
   client re-serialises them, `1.0` as `1`, an integer past 2^53 as its double) — that turn gets it, unless it
   has one already (a sibling request continuing the same turn, or a retry,
   links nothing). An empty answer (no text, no calls) that the client left
   out of its history counts too: its request's messages followed by the
   client's reaction (OpenClaw's "did not produce a user-visible answer")
   link to it; and when the client then folds the answer that continued it
   into the earlier one (one assistant message, the two texts joined), that
   joined message counts as the continuation's answer.
2. Otherwise (a client that rewrites its history, requests running at once
   whose histories cannot contain each other's answers): the previous main
   turn by index, even while it is still being generated (it gets the next
   state when it is stored) — unless it already has one, was aborted or
   abandoned (a retry after a disconnect is not a reaction to the answer
   the client never saw), or its request had exactly these messages (a retry).

Sessions. An explicit session (X-Session-Id, body `session_id`, `user`)
always wins. Without one, a main request is put in the session whose served
answer its history ends with (rule 1, looked up across sessions), else in a
new `conv-<hex>` session: an unmodified OpenAI client gets one session per
conversation. The system prompt's text does not count (an agent rebuilds it
per request: OpenClaw's carries the date). Limits: two identical
conversations collide (the most recent answer wins), also under different
system prompts; a client that edits or rewrites earlier history starts a new
session; a header-less side call that
replays the conversation (a title request) looks like a continuation — send
`X-Turn-Type: side` for those. The map holds the last `max_answers` answers
and is rebuilt at start from the store's `rebuild_sessions` most recent
sessions. Header-less side requests are one-turn sessions closed at once.

Sessions end on `X-Session-Done: 1` or after `session_idle_timeout_s`
without a request (a close while requests of the session run waits for
them); the last main turn without a next state is then marked final so the
judge still scores it, and the session's state is freed. A session reused
after it closed continues its numbering (memory, else the store).

Images. A request's image parts are stored as `{"type": "image_url",
"image_url": {"url": "clawloop-image://<sha256>.<ext>"}}` in its messages, and
`begin` writes each image's bytes, as the client sent them, once to
`<data dir>/images/<sha256>.<ext>` (beside the store's file; temp file + rename).
An agent that resends its earlier screenshots every turn costs one set lookup
per image after the first time; the token-exact prompt ids (placeholders
expanded) are stored as for any turn.

All row writes are enqueued on the store's writer thread; nothing here waits on
the disk but a new image's file write (page cache, no fsync). The state is
rebuilt from the store on restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import time
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from clawloop.gateway.protocol import APIError
from clawloop.gateway.parsers import strip_inline_reasoning
from clawloop.records import TURN_MAIN, TURN_SIDE, Turn
from clawloop.store import SharedSessions, Store, StoreUnavailable
from clawloop.store.base import TurnClaim

log = logging.getLogger(__name__)

IMAGES_DIR = "images"
"""Captured images' folder, beside the store's file (the data dir)."""
INFERRED_PREFIX = "conv-"
"""Session ids capture makes up for header-less conversations: `conv-` + 32 hex digits."""

_RUNNING, _STORED, _ABORTED, _ABANDONED = "running", "stored", "aborted", "abandoned"


def is_inferred(session_id: str) -> bool:
    return (session_id.startswith(INFERRED_PREFIX) and len(session_id) == len(INFERRED_PREFIX) + 32
            and all(c in "0123456789abcdef" for c in session_id[len(INFERRED_PREFIX):]))


# -- conversation hashing ---------------------------------------------------------
_EXACT_INT = 2 ** 53
"""Integers beyond this are not exact as doubles: a JavaScript client re-serialises them rounded."""


def _canon_number(v: Any) -> Any:
    """Numbers as any JSON client would send them back: `1.0` and `1` alike (JavaScript writes `1`),
    an integer a double cannot hold as that double (OpenClaw turned a 50-digit integer into `1e+49`)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, int):
        return v if -_EXACT_INT <= v <= _EXACT_INT else float(v)
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")):
            return repr(v)
        if v.is_integer() and abs(v) <= _EXACT_INT:
            return int(v)
        return v
    if isinstance(v, dict):
        return {k: _canon_number(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_canon_number(x) for x in v]
    return v


def _canon_args(args: Any) -> str:
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return args.strip()
    return json.dumps(_canon_number(args), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canon(m: dict[str, Any]) -> bytes:
    """A message as the conversation hash sees it: role and stripped content; for an assistant
    message with tool calls, the calls' names and arguments only (ids are made up per response); for a
    system (developer) message its role alone: an agent rebuilds it per request (OpenClaw's carries the
    date, so a conversation across midnight would otherwise start a new session)."""
    role = m.get("role") or ""
    calls = m.get("tool_calls") if role == "assistant" else None
    if role in ("system", "developer"):
        return f"{role}\x00".encode()
    if calls:
        role = "assistant/calls"
        fns = [c.get("function") or {} for c in calls]
        body = json.dumps([[f.get("name"), _canon_args(f.get("arguments"))] for f in fns],
                          separators=(",", ":"), ensure_ascii=False)
    else:
        body = m.get("content") or ""
        if not isinstance(body, str):
            body = json.dumps(body, sort_keys=True)
        elif role == "assistant":  # reasoning a client folded back into the content is not the answer
            body = strip_inline_reasoning(body)
        body = body.strip()
    b = body.encode("utf-8", "surrogatepass")
    return f"{role}\x00{len(b)}\x00".encode() + b


def _seed(session_id: str | None, tenant: str | None) -> Any:
    """Hashes start from the explicit session (rule 1 stays inside it) or, for header-less
    requests, from the tenant (one tenant's conversation never continues another's)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"s\x00" + session_id.encode("utf-8", "surrogatepass") if session_id is not None
             else b"c\x00" + (tenant or "").encode("utf-8", "surrogatepass"))
    return h


def _answer_key(hasher: Any, turn: Turn) -> bytes:
    h = hasher.copy()
    h.update(_canon({"role": "assistant", "content": turn.response_text, "tool_calls": turn.tool_calls}))
    return h.digest()


INJECTED_CONTEXT_MARKERS = ("<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>",)
"""Openings of messages an agent harness adds after the user's own (OpenClaw's default profile puts
its runtime context, active exec sessions and subagents, in a user message after the reply): the
reply, not that block, is the answered turn's next state."""


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _reaction(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The request's last trailing message that the user or a tool wrote: the next state."""
    for m in reversed(messages):
        if m.get("role") not in ("user", "tool"):
            break
        if not _text(m.get("content")).lstrip().startswith(INJECTED_CONTEXT_MARKERS):
            return m
    return messages[-1]


def _dropped_key(request: bytes) -> bytes:
    """The key of an empty answer (no text, no calls) that a client leaves out of its history: it
    sends the same messages again with its reaction after them (OpenClaw: "The previous attempt
    did not produce a user-visible answer ...")."""
    return hashlib.blake2b(b"dropped-empty\x00" + request, digest_size=16).digest()


def _is_empty(turn: Turn) -> bool:
    return not (turn.response_text or "").strip() and not turn.tool_calls


def _trailing(messages: list[dict[str, Any]]) -> int:
    """How many messages at the end are the user's or tools' (what the request adds to its history)."""
    k = 0
    for m in reversed(messages):
        if m.get("role") not in ("user", "tool"):
            break
        k += 1
    return k


# -- state ------------------------------------------------------------------------
@dataclass(eq=False)
class _MainTurn:
    """One main request of a session, from its begin until it has its next state."""

    index: int
    request: bytes | None
    """Hash of its request messages (a retry sends the same); None when rebuilt from the store."""
    state: str = _RUNNING
    linked: bool = False
    """A next state was given to it (stored, or held until it is stored)."""
    held: tuple[dict[str, Any], str | None] | None = None
    """(next state, echoed text) that arrived while it was still being generated."""


@dataclass(eq=False)
class _Answer:
    session_id: str
    index: int
    text: str
    """The choice's response text (which choice a continuation picked, when n > 1)."""
    turn: _MainTurn


@dataclass(eq=False)
class _Run:
    """A begun request, until its slot is released."""

    index: int
    key: str
    close_after: bool
    anonymous: bool
    main: _MainTurn | None
    prompt_ids: list[int] | None = None
    """The prompt ids the pending row has (the end need not write the same again)."""
    ref: Any = None
    ended: bool = False
    merge: tuple[Any, str] | None = None
    """(hasher before the history's last answer, that answer's text) when the request continues an
    answer (`_merged_key`)."""


@dataclass
class _Session:
    next_index: int = 0
    last_main: _MainTurn | None = None
    """The main turn with the highest index (rule 2's previous main turn)."""
    last_seen: float = 0.0
    running: dict[int, _Run] = field(default_factory=dict)
    closing: str | None = None
    """A close that waits for the running requests (the reason)."""

    @property
    def inflight(self) -> int:
        return len(self.running)


@dataclass(eq=False)
class TurnSlot:
    """What a request needs to store its turn once the response is complete.

    Release it exactly once: `Capture.finish(slot, turns)`, or `slot.release()` when the request
    ended without a turn (also what leaving `with slot:` does); a second release is a no-op. A
    slot dropped unreleased is released by the sweeper after it is garbage-collected."""

    session_id: str
    index: int
    type: str
    close_after: bool
    anonymous: bool
    key: str = ""
    """The pending row's request key."""
    _capture: Any = field(default=None, repr=False)
    _run: _Run | None = field(default=None, repr=False)
    _hasher: Any = field(default=None, repr=False)

    @property
    def released(self) -> bool:
        return self._run is None or self._run.ended

    def release(self) -> None:
        """End the request without a turn (no-op once finished or released)."""
        if self._capture is not None:
            self._capture.abandon(self)

    def __enter__(self) -> "TurnSlot":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


@dataclass
class _SharedPlan:
    """A request about to begin over a shared store (`Capture.begin`): what its claim sends and what this
    process records once it returns."""
    session_id: str | None
    turn_type: str
    messages: list[dict[str, Any]]
    done: bool
    keys: list[bytes]
    hasher: Any
    request: bytes
    k: int
    prompt_ids: list[int] | None
    tools: list[dict[str, Any]] | None
    tenant: str | None
    now: float
    key: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def main(self) -> bool:
        return self.turn_type == TURN_MAIN

    @property
    def anonymous(self) -> bool:
        return self.session_id is None and not self.main

    def __post_init__(self) -> None:
        self.new_sid = None if self.session_id is not None else \
            (f"anon-{uuid.uuid4().hex}" if self.anonymous else f"{INFERRED_PREFIX}{uuid.uuid4().hex}")
        self.next_state = self.echoed = None
        if self.main and self.k:
            last = _reaction(self.messages)
            self.next_state = {"role": last["role"], "content": last["content"]}
            self.echoed = next((m.get("content") for m in reversed(self.messages) if m["role"] == "assistant"), None)
        self.pending = Turn(session_id=self.session_id or "", index=0, type=self.turn_type, messages=self.messages,
                            tools=self.tools, prompt_ids=self.prompt_ids if self.prompt_ids is not None else [],
                            finish_reason="pending", policy_version=-1, trainable=False, request_id=self.key,
                            tenant=self.tenant or "", created_at=self.now)


class Capture:
    def __init__(self, store: Store, idle_timeout_s: float = 600.0, sweep_interval_s: float = 5.0, *,
                 max_answers: int = 65536, rebuild_sessions: int = 1000, max_closed: int = 100_000,
                 images_dir: str | Path | None = None):
        self.store = store
        if images_dir is None and store.path is not None:
            images_dir = Path(store.path).parent / IMAGES_DIR
        self.images_dir = Path(images_dir) if images_dir is not None else None
        """Where images are written (None: a store without a folder; images are then not kept)."""
        self._images_known: set[str] = set()
        self.images_stored = 0
        self.idle_timeout_s = idle_timeout_s
        self.sweep_interval_s = sweep_interval_s
        self.max_answers = max_answers
        self.max_closed = max_closed
        self.sessions: dict[str, _Session] = {}
        self._answers: OrderedDict[bytes, _Answer] = OrderedDict()
        """Hash of (request messages + served answer) -> the turn, for rule 1 and header-less sessions."""
        self._closed: OrderedDict[str, int] = OrderedDict()
        """Next index of recently closed sessions (their rows may still be queued for the writer)."""
        self.turns_captured = 0
        self.sessions_closed = 0
        self.linked = 0
        self.inferred_new = 0
        self.inferred_continued = 0
        self.reaped = 0
        self.shared: SharedSessions | None = store if isinstance(store, SharedSessions) else None
        """A store several gateways share: linking state lives there, not in the maps above (`_begin_shared`)."""
        self.aborted_at_start = store.abort_pending()
        if self.aborted_at_start:
            log.warning("capture: %d turn(s) were being generated when the last run ended; stored as aborted",
                        self.aborted_at_start)
        records: dict[tuple[str, int], _MainTurn] = {}
        for s in store.session_state():
            sess = self.sessions[s["session_id"]] = _Session(
                next_index=(s["last_index"] + 1) if s["last_index"] is not None else 0,
                last_seen=s["last_seen"])
            if s["last_main_index"] is not None:
                rec = _MainTurn(s["last_main_index"], None, _STORED, linked=s["pending_main_index"] is None)
                sess.last_main = records[(s["session_id"], rec.index)] = rec
        for sid, idx, tenant, messages, text, calls, linked in store.recent_answers(rebuild_sessions):
            rec = records.setdefault((sid, idx), _MainTurn(idx, None, _STORED, linked=linked))
            h = _seed(None, tenant) if is_inferred(sid) else _seed(sid, None)
            for m in messages:
                h.update(_canon(m))
            self._remember(_answer_key(h, Turn(sid, idx, response_text=text, tool_calls=calls)),
                           _Answer(sid, idx, text, rec))

    # -- request path ----------------------------------------------------
    def _history(self, session_id: str | None, turn_type: str, messages: list[dict[str, Any]],
                 tenant: str | None) -> tuple[Any, bytes, int, _Answer | None, Any, list[bytes]]:
        """What a main request's history says (side requests: nothing): (hasher over it, its digest, the
        number of trailing messages after the last answer, the answer it continues if this process knows
        it, a folded continuation's (hasher, text), the answer keys a shared store looks up in order)."""
        hasher = entry = merge = None
        request = b""
        shared_keys: list[bytes] = []
        k = _trailing(messages) if turn_type == TURN_MAIN else 0
        if turn_type != TURN_MAIN:
            return hasher, request, k, entry, merge, shared_keys
        hasher = _seed(session_id, tenant)
        cut = len(messages) - k
        prefix = None
        within: list[bytes] = []  # digests of the history ending inside the trailing messages
        for i, m in enumerate(messages):
            if i == cut:
                prefix = hasher.digest()
            elif i > cut:
                within.append(hasher.digest())
            if i == cut - 1 and k and m.get("role") == "assistant" and not m.get("tool_calls") \
                    and isinstance(m.get("content"), str):
                merge = (hasher.copy(), m["content"])
            hasher.update(_canon(m))
        request = hasher.digest()
        if self.shared is not None:  # the keys rule 1 looks up, in order (the same as below, in the store)
            shared_keys = [prefix] if k and cut > 0 and messages[cut - 1].get("role") == "assistant" else []
            shared_keys += [_dropped_key(d) for d in reversed(within)]
            return hasher, request, k, entry, merge, shared_keys
        if k and cut > 0 and messages[cut - 1].get("role") == "assistant":
            entry = self._answers.get(prefix)
            if entry is not None:
                self._answers.move_to_end(prefix)
        # rule 1 for an empty answer the client dropped: the history is that turn's request
        for d in reversed(within) if entry is None else ():
            entry = self._answers.get(_dropped_key(d))
            if entry is not None:
                break
        return hasher, request, k, entry, merge, shared_keys

    async def begin_async(self, session_id: str | None, turn_type: str, messages: list[dict[str, Any]], done: bool,
                          *, prompt_ids: list[int] | None = None, tools: list[dict[str, Any]] | None = None,
                          tenant: str | None = None, images: list[Any] | None = None) -> TurnSlot:
        """`begin` for the event loop: over a shared store its transaction (a few round trips, a session row
        lock another gateway may hold) runs on a worker thread, so the loop goes on streaming meanwhile."""
        if self.shared is None:
            return self.begin(session_id, turn_type, messages, done, prompt_ids=prompt_ids, tools=tools,
                              tenant=tenant, images=images)
        if images:
            self.save_images(images)
        hasher, request, k, _, _, shared_keys = self._history(session_id, turn_type, messages, tenant)
        plan = _SharedPlan(session_id, turn_type, messages, done, shared_keys, hasher, request, k,
                           prompt_ids, tools, tenant, time.time())
        fut = asyncio.ensure_future(asyncio.to_thread(self._shared_claim, plan))
        try:
            claim = await asyncio.shield(fut)
        except asyncio.CancelledError:  # the client left: a row the store reserved is not left pending
            fut.add_done_callback(lambda f: self._unclaim(plan, f))
            raise
        return self._shared_claimed(plan, claim)

    def _unclaim(self, plan: _SharedPlan, fut: Any) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return
        claim = fut.result()
        try:
            self.store.abandon_turn(claim.session_id, claim.index, plan.key)
        except Exception:
            log.exception("capture: could not drop the pending row of a request whose client left")

    def begin(self, session_id: str | None, turn_type: str, messages: list[dict[str, Any]], done: bool, *,
              prompt_ids: list[int] | None = None, tools: list[dict[str, Any]] | None = None,
              tenant: str | None = None, images: list[Any] | None = None) -> TurnSlot:
        """Reserve the turn's index, link the next state it carries (see the module docstring) and
        write its pending row. `session_id=None`: inferred from the history (main) or a one-turn
        session (side). `prompt_ids`/`tools`/`tenant` go into the pending row, so a crash mid-answer
        keeps the request. `images` (`protocol.ImageInput`s: `filename`, `data`) are the ones the
        messages' `clawloop-image://` parts refer to; each is written once (`save_images`)."""
        if images:
            self.save_images(images)
        now = time.time()
        main = turn_type == TURN_MAIN
        hasher, request, k, entry, merge, shared_keys = self._history(session_id, turn_type, messages, tenant)
        if self.shared is not None:  # several gateways: the store reserves, finds the session and links
            plan = _SharedPlan(session_id, turn_type, messages, done, shared_keys, hasher, request, k,
                               prompt_ids, tools, tenant, now)
            return self._shared_claimed(plan, self._shared_claim(plan))
        sid, anonymous, fresh = session_id, False, False
        if sid is None:
            if not main:
                sid, anonymous, fresh = f"anon-{uuid.uuid4().hex}", True, True
            elif entry is not None:
                sid = entry.session_id
                self.inferred_continued += 1
            else:
                sid, fresh = f"{INFERRED_PREFIX}{uuid.uuid4().hex}", True
                self.inferred_new += 1
        s = self.sessions.get(sid) or self._open(sid, fresh)
        s.last_seen = now
        s.closing = None  # a request after X-Session-Done continues the session
        index = s.next_index
        s.next_index += 1
        rec = None
        if main:
            if k:
                self._link(sid, s, entry, messages, request)
            rec = s.last_main = _MainTurn(index, request)
        run = _Run(index, uuid.uuid4().hex, close_after=done or anonymous, anonymous=anonymous, main=rec,
                   prompt_ids=prompt_ids, merge=merge if main else None)
        slot = TurnSlot(sid, index, turn_type, run.close_after, anonymous, run.key, self, run, hasher)
        run.ref = weakref.ref(slot)
        s.running[index] = run
        self.store.begin_turn(Turn(session_id=sid, index=index, type=turn_type, messages=messages, tools=tools,
                                   prompt_ids=prompt_ids if prompt_ids is not None else [],
                                   finish_reason="pending", policy_version=-1, trainable=False,
                                   request_id=run.key, tenant=tenant or "", created_at=now), run.key)
        return slot

    def save_images(self, images: list[Any]) -> None:
        """Write each image not written yet to `images_dir/<filename>` (content-addressed: a name is
        always the same bytes), atomically: a temp file, then a rename."""
        if self.images_dir is None:
            return
        for im in images:
            name = im.filename
            if name in self._images_known:
                continue
            path = self.images_dir / name
            if not path.exists():
                self.images_dir.mkdir(parents=True, exist_ok=True)
                tmp = self.images_dir / f".{name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
                try:
                    tmp.write_bytes(im.data)
                    os.replace(tmp, path)
                except OSError:
                    log.exception("capture: could not write image %s", path)
                    tmp.unlink(missing_ok=True)
                    continue
                self.images_stored += 1
            self._images_known.add(name)
            if len(self._images_known) > 100_000:
                self._images_known.clear()

    def _open(self, sid: str, fresh: bool) -> _Session:
        """State for a session not in memory; a reused id continues its numbering, never overwrites."""
        nxt = 0
        if not fresh:
            nxt = max(self._closed.pop(sid, 0), self.store.next_index(sid))
        s = self.sessions[sid] = _Session(next_index=nxt)
        return s

    def _link(self, sid: str, s: _Session, entry: _Answer | None, messages: list[dict[str, Any]],
              request: bytes) -> None:
        last = _reaction(messages)
        ns = {"role": last["role"], "content": last["content"]}
        if entry is not None:  # rule 1: the turn whose answer the history ends with
            target, echoed = entry.turn, entry.text
        else:  # rule 2: the previous main turn by index
            target = s.last_main
            if target is None or target.request == request:
                return
            echoed = next((m.get("content") for m in reversed(messages) if m["role"] == "assistant"), None)
        if target.linked or target.state in (_ABORTED, _ABANDONED):
            return
        target.linked = True
        if target.state == _RUNNING:
            target.held = (ns, echoed)
        else:
            self.store.set_next_state(sid, target.index, ns, response_text=echoed)
            self.linked += 1

    def finish(self, slot: TurnSlot, turns: list[Turn]) -> None:
        """Store the turn (one row per choice) and close the session if asked. Releases the slot."""
        run = slot._run
        if run is None or run.ended:
            return
        if self.shared is not None:
            return self._finish_shared(slot, run, turns)
        s = self._end(slot.session_id, run)
        rec = run.main
        if rec is not None:
            if turns and turns[0].trainable:
                rec.state = _STORED
                if rec.held is not None:
                    ns, echoed = rec.held
                    rec.held = None
                    pick = next((t for t in turns if echoed is not None and t.response_text == echoed), turns[0])
                    pick.next_state, pick.next_state_at = ns, time.time()
                    self.linked += 1
                if slot._hasher is not None:
                    for t in turns:
                        self._remember(_answer_key(slot._hasher, t), _Answer(slot.session_id, slot.index,
                                                                             t.response_text, rec))
                    if rec.request is not None and any(_is_empty(t) for t in turns):
                        self._remember(_dropped_key(rec.request), _Answer(slot.session_id, slot.index, "", rec))
                    if run.merge is not None:  # a client that folds a continuation into the answer it continued
                        base, before = run.merge
                        for t in turns:
                            if not t.tool_calls:
                                h = base.copy()
                                h.update(_canon({"role": "assistant", "content": before + t.response_text}))
                                self._remember(h.digest(), _Answer(slot.session_id, slot.index, t.response_text, rec))
            else:
                rec.state, rec.held = (_ABORTED if turns else _ABANDONED), None
        if turns:
            same = run.prompt_ids is not None and turns[0].prompt_ids == run.prompt_ids
            self.store.finish_turns(turns, run.key, prompt_stored=same)
            self.turns_captured += len(turns)
        else:
            self.store.abandon_turn(slot.session_id, run.index, run.key)
        self._after_end(slot.session_id, s, run)

    def abandon(self, slot: TurnSlot) -> None:
        """The request ended before producing a turn: drop its pending row, release the slot."""
        self.finish(slot, [])

    def _end(self, sid: str, run: _Run) -> _Session | None:
        run.ended = True
        s = self.sessions.get(sid)
        if s is not None:
            s.running.pop(run.index, None)
            s.last_seen = time.time()
        return s

    def _after_end(self, sid: str, s: _Session | None, run: _Run) -> None:
        if run.close_after:
            self.close(sid, "no_session_id" if run.anonymous else "done")
        elif s is not None and s.closing and not s.running:
            self.close(sid, s.closing)

    def _remember(self, key: bytes, answer: _Answer) -> None:
        self._answers[key] = answer
        self._answers.move_to_end(key)
        if len(self._answers) > self.max_answers:
            self._answers.popitem(last=False)

    def close(self, session_id: str, reason: str) -> None:
        s = self.sessions.get(session_id)
        if s is None:
            return
        if s.running:  # its running requests come first; the last of them closes it
            s.closing = reason
            return
        del self.sessions[session_id]
        if self.shared is not None:  # the store knows the last main turn, whichever gateway served it
            self.shared.close_shared(session_id, reason)
            self.sessions_closed += 1
            return
        rec = s.last_main
        final = rec.index if rec is not None and rec.state == _STORED and not rec.linked else None
        self.store.close_session(session_id, reason, final)
        self.sessions_closed += 1
        if not session_id.startswith("anon-"):
            self._closed[session_id] = s.next_index
            if len(self._closed) > self.max_closed:
                self._closed.popitem(last=False)

    # -- background ----------------------------------------------------------
    def reap(self) -> int:
        """Release the slots whose requests dropped them unreleased (garbage-collected)."""
        n = 0
        for sid, s in list(self.sessions.items()):
            for run in [r for r in s.running.values() if r.ref() is None and not r.ended]:
                n += 1
                log.warning("capture: turn %d of session %r was dropped without release; released", run.index, sid)
                if run.main is not None:
                    run.main.state, run.main.held = _ABANDONED, None
                cur = self._end(sid, run)
                self.store.abandon_turn(sid, run.index, run.key)
                self._after_end(sid, cur, run)
        self.reaped += n
        return n

    def sweep(self, now: float | None = None) -> int:
        self.reap()
        now = time.time() if now is None else now
        if self.shared is not None:
            return self._sweep_shared(now)
        idle = [sid for sid, s in self.sessions.items()
                if not s.running and now - s.last_seen >= self.idle_timeout_s]
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

    # -- several gateways, one store (`SharedSessions`) ------------------------------
    def _shared_claim(self, plan: _SharedPlan) -> TurnClaim:
        """`begin` over a shared store, the store's half: the index, the session of a header-less request
        and the link come from one transaction (`store/pg_linking.py`), so they are right whichever
        gateway served the session's earlier requests. Touches nothing of this process (any thread)."""
        try:
            return self.shared.claim_turn(plan.pending, new_session_id=plan.new_sid, answer_keys=plan.keys,
                                          request_hash=plan.request if plan.main else None,
                                          next_state=plan.next_state, echoed=plan.echoed)
        except StoreUnavailable as e:
            log.error("capture: %s", e)
            raise APIError(503, "The session store cannot be reached; retry shortly.", code="store_unavailable",
                           headers={"Retry-After": "2"}) from None

    def _shared_claimed(self, plan: _SharedPlan, claim: TurnClaim) -> TurnSlot:
        """`begin` over a shared store, this process's half (event loop): memory keeps only its running
        requests."""
        sid, index = claim.session_id, claim.index
        if plan.session_id is None and plan.main:
            if claim.continued:
                self.inferred_continued += 1
            else:
                self.inferred_new += 1
        self.linked += int(claim.linked)
        s = self.sessions.get(sid)
        if s is None:
            s = self.sessions[sid] = _Session(next_index=index + 1)
        s.last_seen = plan.now
        s.closing = None
        rec = _MainTurn(index, plan.request) if plan.main else None
        run = _Run(index, plan.key, close_after=plan.done or plan.anonymous, anonymous=plan.anonymous, main=rec,
                   prompt_ids=plan.prompt_ids)
        slot = TurnSlot(sid, index, plan.turn_type, run.close_after, plan.anonymous, plan.key, self, run, plan.hasher)
        run.ref = weakref.ref(slot)
        s.running[index] = run
        return slot

    def _finish_shared(self, slot: TurnSlot, run: _Run, turns: list[Turn]) -> None:
        """`finish` over a shared store: the rows and the answers the client is about to see are committed
        before this returns, so the client's next request finds them at any gateway."""
        s = self._end(slot.session_id, run)
        try:
            self._shared_commit(slot, run, turns)()
        finally:
            self._after_end(slot.session_id, s, run)

    def _shared_commit(self, slot: TurnSlot, run: _Run, turns: list[Turn]) -> Callable[[], None]:
        """The store call that ends `run` over a shared store (touches nothing of this process: any thread)."""
        if not turns:
            return lambda: self.store.abandon_turn(slot.session_id, run.index, run.key)
        answers: list[tuple[bytes, str]] = []
        if run.main is not None and turns[0].trainable and slot._hasher is not None:
            answers = [(_answer_key(slot._hasher, t), t.response_text) for t in turns]
            if any(_is_empty(t) for t in turns):
                answers.append((_dropped_key(run.main.request), ""))
        same = run.prompt_ids is not None and turns[0].prompt_ids == run.prompt_ids
        self.turns_captured += len(turns)
        return lambda: self.shared.finish_claimed(turns, run.key, same, answers)

    async def finish_async(self, slot: TurnSlot, turns: list[Turn]) -> None:
        """`finish` for the event loop: over a shared store its commit runs on a worker thread (the reply
        still waits for it, so the client's next request finds it at any gateway)."""
        run = slot._run
        if self.shared is None or run is None or run.ended:
            return self.finish(slot, turns)
        s = self._end(slot.session_id, run)
        fut = asyncio.ensure_future(asyncio.to_thread(self._shared_commit(slot, run, turns)))
        try:
            await asyncio.shield(fut)
        except asyncio.CancelledError:  # the client left: the session closes (if asked) once the commit is in
            fut.add_done_callback(lambda f: self._after_end(slot.session_id, s, run))
            raise
        except BaseException:
            self._after_end(slot.session_id, s, run)
            raise
        self._after_end(slot.session_id, s, run)

    def _sweep_shared(self, now: float) -> int:
        """Idle sessions are closed by the store (no request on any gateway for the idle timeout, none
        running); this process forgets the ones it holds without running requests."""
        for sid in [sid for sid, s in self.sessions.items()
                    if not s.running and now - s.last_seen >= self.idle_timeout_s]:
            del self.sessions[sid]
        closed = self.shared.close_idle_sessions(now - self.idle_timeout_s)
        closed.add_done_callback(self._count_closed)
        self.shared.prune_answers(self.max_answers)
        return 0

    def _count_closed(self, fut: Any) -> None:
        if not fut.cancelled() and fut.exception() is None and fut.result():
            self.sessions_closed += int(fut.result())

    def stats(self) -> dict[str, float]:
        return {
            "capture/open_sessions": float(len(self.sessions)),
            "capture/turns_captured": float(self.turns_captured),
            "capture/sessions_closed": float(self.sessions_closed),
            "capture/next_states_linked": float(self.linked),
            "capture/sessions_inferred": float(self.inferred_new),
            "capture/sessions_continued_by_history": float(self.inferred_continued),
            "capture/slots_reaped": float(self.reaped),
            "capture/aborted_at_start": float(self.aborted_at_start),
            "capture/images_stored": float(self.images_stored),
            "capture/store_pending_writes": float(self.store.pending_writes()),
            **self.store.write_stats(),
        }


__all__ = ["Capture", "TurnSlot", "TURN_MAIN", "TURN_SIDE", "INFERRED_PREFIX", "is_inferred"]
