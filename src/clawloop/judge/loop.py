"""The judge loop: turns whose next state arrived -> a judge -> Judgements in the store.

    loop = JudgeLoop(store, make_judge(cfg, engine), cfg.judge)
    await loop.run(stop)            # `clawloop up` runs this beside the gateway

One feeder polls the store (`Store.turns_to_judge`, oldest first) into a
bounded queue; `num_workers` workers judge from it. The store is the queue of
record: nothing lives only in memory, so a restart picks up every turn not
yet judged, and a judgement is written with insert-or-ignore per (turn, judge
name), so each turn is judged exactly once per judge configuration.

Failures never drop a turn. Each attempt gets `timeout_s`; a failed attempt
(an exception, a timeout, or garbage: every vote malformed) is retried up to
`max_retries` times with exponential backoff; after that the turn cools down
(again with exponential backoff, per turn) and is fetched again later.
Meanwhile the feeder keeps feeding newer turns, and serving never waits on
any of this: store reads run in a thread, writes go to the store's writer.
A judge that is down is waited for without limit. A judge that answers but
never gives a verdict (a thinking model cut off at --judge-max-tokens, a
model that ignores the format) is not: after `max_malformed` such replies for
one turn it is stored as 0 with every vote malformed (`judge/gave_up`), and a
warning says why (`judge/replies_truncated` counts replies cut at the limit).

Metrics (`stats()`, namespaced `judge/`): judged, pending, failures,
score histogram, latency, malformed-vote rate, vote agreement, queue depth,
oldest pending age. When the last `COLLAPSE_WINDOW` rewards are more than
`COLLAPSE_ZERO_FRACTION` zeros, or all the same (continuous rewards too),
`judge/score_collapse` is 1 and a warning is logged: a constant score is a
dead learning signal.

How the loop is deployed (beside the gateway in `clawloop up`, alone on a
store with `clawloop judge`, with judge actors on Ray) is composed in
`clawloop.apps`; nothing here knows.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any, Callable

from clawloop.config import Config, ConfigError, JudgeConfig
from clawloop.judge.base import Judge, JudgeUnavailable
from clawloop.judge.voting import vote_agreement
from clawloop.naming import judge_name
from clawloop.records import Judgement, Turn
from clawloop.store import Store

log = logging.getLogger(__name__)

COLLAPSE_WINDOW = 50
"""Scores looked at for the collapse warning."""
COLLAPSE_ZERO_FRACTION = 0.9
"""More zeros than this fraction of the window is a collapse."""
RETRY_BASE_S = 0.5
"""First backoff between retries of one attempt; doubles each retry."""
RETRY_MAX_S = 30.0
COOLDOWN_BASE_S = 5.0
"""First wait before a turn whose attempt failed is fetched again; doubles per failed attempt."""
COOLDOWN_MAX_S = 300.0
PENDING_REFRESH_S = 5.0
"""How often the pending count is re-read from the store."""


def _judge_section(cfg: Any) -> Any:
    return getattr(cfg, "judge", cfg)


MODEL_KEYS = "--judge-model / JUDGE_MODEL_PATH / PRM_MODEL_PATH"


def make_judge(cfg: Config | JudgeConfig, engine: Any = None, *,
               frozen_engine: Callable[[Config], Any] | None = None) -> Judge:
    """The judge `cfg` asks for. `engine` is the served engine (`--judge self`); `frozen_engine(cfg)`
    builds the engine of `--judge frozen` (default `local_frozen_engine`; the composition layer passes
    one over judge actors under `--ray ... --judge-workers N`).

    `judge.model` is honoured or refused, never ignored: the model name sent to `--judge url`, the
    folder `--judge frozen` loads, `config['prm_model_path']` of a reward model factory; with the
    offline judge, `--judge self` or a `reward(turn)` plugin it is a ConfigError naming the key."""
    j = _judge_section(cfg)
    if j.custom_rm_path:
        from clawloop.judge.custom import CustomJudge

        return CustomJudge(j.custom_rm_path, cfg)
    if j.kind in ("offline", "self") and j.model:
        what = "the offline judge reads rules, no model" if j.kind == "offline" else \
            "--judge self judges with the served policy"
        raise ConfigError(f"judge.model: {MODEL_KEYS} is {j.model!r}, but {what}. To judge with that model: "
                          "--judge frozen (a local model folder), --judge url --judge-url URL (a served model of "
                          "that name), or --custom-rm-path with get_reward_model(config); else unset it")
    if j.kind == "offline":
        from clawloop.judge.offline import OfflineJudge

        return OfflineJudge(hints=j.hints)
    if j.kind == "none":
        raise ConfigError("judge.kind: none configures no judge")
    from clawloop.judge.llm import EngineChatBackend, HTTPChatBackend, LLMJudge

    backend: Any
    if j.kind == "url":
        if not j.url:
            raise ConfigError("judge.url: --judge url needs --judge-url")
        backend = HTTPChatBackend(j.url, j.model, j.api_key, j.timeout_s)
    elif j.kind == "self":
        if engine is None:
            raise ConfigError("judge.kind: --judge self needs the served engine (run it in `clawloop up`)")
        backend = EngineChatBackend(engine)
    elif j.kind == "frozen":
        if not hasattr(cfg, "model"):
            raise ConfigError("judge.kind: --judge frozen needs the full config (the base model path)")
        if j.model and not Path(j.model).expanduser().is_dir():
            raise ConfigError(f"judge.model: --judge frozen loads a local model folder, and {j.model!r} ({MODEL_KEYS}) "
                              "is not one. A model served elsewhere: --judge url --judge-url URL --judge-model NAME; "
                              "the policy's own base weights: unset it")
        backend = EngineChatBackend((frozen_engine or local_frozen_engine)(cfg), owns_engine=True)
    else:
        raise ConfigError(f"judge.kind: unknown judge {j.kind!r}")
    return LLMJudge(backend, name=judge_name(cfg), votes=j.majority_vote_n, threshold=j.majority_vote_threshold,
                    temperature=j.temperature, hints=j.hints, max_tokens=j.max_tokens)


def local_frozen_engine(cfg: Config) -> Any:
    """A frozen engine of the served backend (`--judge-model`, a local folder, else the base
    model) that no publish ever reaches: with vLLM a server of its own, one replica, no LoRA."""
    import copy

    from clawloop.engines import make_engine

    c = copy.deepcopy(cfg)
    if cfg.judge.model:
        c.model.path = str(Path(cfg.judge.model).expanduser())
    c.model.engine_urls, c.model.engine_replicas = [], 1
    c.train.use_lora, c.model.sleep_while_training = False, False
    c.data_dir = str(Path(cfg.data_dir) / "judge-engine")
    return make_engine(c)


class JudgeLoop:
    """Feeder + K workers between the store and a judge; see the module docstring."""

    def __init__(self, store: Store, judge: Judge, cfg: JudgeConfig, *, retry_base_s: float = RETRY_BASE_S,
                 cooldown_base_s: float = COOLDOWN_BASE_S, collapse_window: int = COLLAPSE_WINDOW):
        self.store = store
        self.judge = judge
        self.cfg = _judge_section(cfg)
        self.name = judge.name
        self.retry_base_s = retry_base_s
        self.cooldown_base_s = cooldown_base_s
        self._claimed: dict[int, float] = {}
        """Turn id -> time its next state arrived, for turns queued or being judged."""
        self._cooling: dict[int, float] = {}
        """Turn id -> when it may be fetched again, after a failed attempt."""
        self._failed: dict[int, tuple[int, float]] = {}
        """Turn id -> (failed attempts so far, time its next state arrived), until it is judged."""
        self._recent: set[int] = set()
        """Turns saved since the feeder's last store read began (that read may predate the commit)."""
        self._queue: asyncio.Queue[Turn] | None = None
        self._wake: asyncio.Event | None = None
        self._window: deque[float] = deque(maxlen=collapse_window)
        """The last rewards saved (`Judgement.value`: a continuous reward, else the score)."""
        self._collapse_warned_at = 0
        self._malformed: dict[int, int] = {}
        """Turn id -> replies without a valid verdict so far, until it is judged or given up."""
        # counters
        self.judged = 0
        self.duplicates = 0
        self.failures = 0
        self.garbage = 0
        self.gave_up = 0
        self.call_errors = 0
        self.hints = 0
        self.scores: Counter[int] = Counter()
        self.votes_total = 0
        self.votes_malformed = 0
        self.agreement_sum = 0.0
        self.agreement_n = 0
        self.latency_sum = 0.0
        self.last_latency = 0.0
        self.pending = 0
        self.collapsed = False
        self.inflight = 0

    # -- the loop ------------------------------------------------------------
    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Judge until `stop` is set (or the task is cancelled). Unfinished turns stay pending."""
        stop = stop or asyncio.Event()
        self._queue = asyncio.Queue(maxsize=max(1, self.cfg.queue_size))
        self._wake = asyncio.Event()
        workers = [asyncio.create_task(self._worker(i), name=f"clawloop-judge-{i}")
                   for i in range(self.cfg.num_workers)]
        log.info("judge loop: judge=%s workers=%d queue=%d", self.name, self.cfg.num_workers, self.cfg.queue_size)
        last_pending = 0.0
        try:
            while not stop.is_set():
                try:
                    await self._feed()
                    now = time.monotonic()
                    if now - last_pending >= PENDING_REFRESH_S:
                        last_pending = now
                        self.pending = await asyncio.to_thread(self.store.count_pending_judgement, self.name)
                except Exception:  # a busy or briefly unreadable store: try again next poll
                    log.exception("judge loop: reading the store failed")
                self._wake.clear()
                waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
                try:
                    await asyncio.wait(waiters, timeout=self.cfg.poll_interval_s,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waiters:
                        w.cancel()
        finally:
            for w in workers:
                w.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            self._claimed.clear()

    async def _feed(self) -> None:
        assert self._queue is not None
        free = self._queue.maxsize - self._queue.qsize()
        if free <= 0:
            return
        now = time.monotonic()
        for tid in [t for t, at in self._cooling.items() if at <= now]:
            del self._cooling[tid]
        saved_before = set(self._recent)
        exclude = frozenset(self._claimed) | frozenset(self._cooling) | frozenset(saved_before)
        turns = await asyncio.to_thread(self.store.turns_to_judge, self.name, free, exclude)
        self._recent -= saved_before  # committed before this read began: the read excluded them
        for t in turns:
            if t.id in self._claimed or t.id in self._cooling or t.id in self._recent:
                continue
            self._claimed[t.id] = t.next_state_at or t.created_at
            self._queue.put_nowait(t)

    async def _worker(self, i: int) -> None:
        assert self._queue is not None and self._wake is not None
        while True:
            turn = await self._queue.get()
            self.inflight += 1
            try:
                j = await self.judge_with_retries(turn)
                if j is None:
                    self._cool_down(turn)
                else:
                    await self._save(j)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in a judge or the store must not kill the worker
                log.exception("judge worker %d: turn %s failed", i, turn.id)
                self._cool_down(turn)
            finally:
                self.inflight -= 1
                self._claimed.pop(turn.id, None)
                self._queue.task_done()
                self._wake.set()

    async def judge_with_retries(self, turn: Turn) -> Judgement | None:
        """One attempt: up to 1 + max_retries calls with backoff. None when all failed."""
        delay = self.retry_base_s
        for attempt in range(1 + max(0, self.cfg.max_retries)):
            if attempt:
                await asyncio.sleep(min(delay, RETRY_MAX_S))
                delay *= 2
            try:
                j = await asyncio.wait_for(self.judge.judge(turn), timeout=self.cfg.timeout_s)
            except asyncio.TimeoutError:
                self.call_errors += 1
                log.warning("judge %s: turn %s timed out after %.1fs", self.name, turn.id, self.cfg.timeout_s)
                continue
            except JudgeUnavailable as e:
                self.call_errors += 1
                log.warning("judge %s: turn %s: %s", self.name, turn.id, e)
                continue
            j.turn_id = turn.id if turn.id is not None else -1
            j.judge = self.name
            if j.votes and all(v is None for v in j.votes):
                self.call_errors += 1
                self.garbage += 1
                n = self._malformed[turn.id] = self._malformed.get(turn.id, 0) + 1
                limit = self.cfg.max_malformed
                if limit and n >= limit:
                    return self._give_up(turn, j, n)
                self.votes_total += len(j.votes)
                self.votes_malformed += len(j.votes)
                log.warning("judge %s: turn %s: no valid vote in %d replies (malformed, %d of %s)%s", self.name,
                            turn.id, len(j.votes), n, limit or "unlimited", self._truncation_note())
                continue
            return j
        return None

    def _give_up(self, turn: Turn, j: Judgement, n: int) -> Judgement:
        """Store a turn whose judge only answers garbage as 0, every vote malformed, and say so."""
        self.gave_up += 1
        j.score, j.reward, j.hint, j.malformed = 0, None, None, len(j.votes)
        log.warning("JUDGE GAVE UP on turn %s after %d replies without a valid \\boxed{} verdict (judge=%s): "
                    "stored as 0, all votes malformed (judge/gave_up=%d).%s", turn.id, n, self.name, self.gave_up,
                    self._truncation_note() or " Check that the judge model follows the verdict format.")
        return j

    def _truncation_note(self) -> str:
        cut = self._judge_stats().get("judge/replies_truncated", 0.0)
        if not cut:
            return ""
        return (f" {cut:.0f} judge replies so far were cut at --judge-max-tokens={self.cfg.max_tokens} "
                "(finish_reason=length): a thinking judge needs more, raise --judge-max-tokens.")

    def _judge_stats(self) -> dict[str, float]:
        fn = getattr(self.judge, "stats", None)
        return fn() if callable(fn) else {}

    def _cool_down(self, turn: Turn) -> None:
        self.failures += 1
        n, arrived = self._failed.get(turn.id, (0, turn.next_state_at or turn.created_at))
        wait = min(COOLDOWN_MAX_S, self.cooldown_base_s * (2 ** n))
        self._failed[turn.id] = (n + 1, arrived)
        self._cooling[turn.id] = time.monotonic() + wait
        log.warning("judge %s: turn %s stays pending (failed attempt %d); retrying in %.0fs",
                    self.name, turn.id, n + 1, wait)

    async def _save(self, j: Judgement) -> None:
        # Shielded: cancelling the store's future mid-write would break its writer thread.
        inserted = await asyncio.shield(asyncio.wrap_future(self.store.save_judgement(j)))
        self._recent.add(j.turn_id)
        self._cooling.pop(j.turn_id, None)
        self._failed.pop(j.turn_id, None)
        self._malformed.pop(j.turn_id, None)
        if not inserted:
            self.duplicates += 1  # another judge process got there first
            return
        self.judged += 1
        self.pending = max(0, self.pending - 1)
        self.scores[j.score] += 1
        self.hints += j.hint is not None
        self.latency_sum += j.latency_s
        self.last_latency = j.latency_s
        self.votes_total += len(j.votes)
        self.votes_malformed += j.malformed
        agree = vote_agreement(j.votes, j.score)
        if agree is not None:
            self.agreement_sum += agree
            self.agreement_n += 1
        self._observe_score(j.value)

    def _observe_score(self, value: float) -> None:
        self._window.append(float(value))
        n = len(self._window)
        if n < (self._window.maxlen or 0):
            return
        zeros = sum(s == 0 for s in self._window) / n
        constant = max(self._window) - min(self._window) <= 1e-6
        self.collapsed = zeros > COLLAPSE_ZERO_FRACTION or constant
        if self.collapsed and self.judged - self._collapse_warned_at >= n:
            self._collapse_warned_at = self.judged
            what = f"{zeros:.0%} zeros" if zeros > COLLAPSE_ZERO_FRACTION else f"every reward {self._window[-1]:+.3g}"
            log.warning("JUDGE SCORES COLLAPSED: %s over the last %d judgements (judge=%s). There is no learning "
                        "signal. Check that next states carry real feedback (user replies, tool results), or use "
                        "more majority votes / another judge.", what, n, self.name)

    # -- metrics -------------------------------------------------------------
    def oldest_pending_age_s(self) -> float:
        known = list(self._claimed.values()) + [a for _, a in self._failed.values()]
        return max(0.0, time.time() - min(known)) if known else 0.0

    def stats(self) -> dict[str, float]:
        n = max(1, self.judged)
        window = list(self._window)
        return {
            "judge/judged": float(self.judged),
            "judge/pending": float(self.pending),
            "judge/failures": float(self.failures),
            "judge/call_errors": float(self.call_errors),
            "judge/garbage_replies": float(self.garbage),
            "judge/cooling": float(len(self._cooling)),
            "judge/failing_turns": float(len(self._failed)),
            "judge/inflight": float(self.inflight),
            "judge/queue_depth": float(self._queue.qsize() if self._queue is not None else 0),
            "judge/oldest_pending_age_s": self.oldest_pending_age_s(),
            "judge/score_pos": float(self.scores[1]),
            "judge/score_zero": float(self.scores[0]),
            "judge/score_neg": float(self.scores[-1]),
            "judge/hints": float(self.hints),
            "judge/latency_mean_s": self.latency_sum / n,
            "judge/latency_last_s": self.last_latency,
            "judge/malformed_vote_rate": self.votes_malformed / max(1, self.votes_total),
            "judge/vote_agreement": self.agreement_sum / max(1, self.agreement_n),
            "judge/window_zero_fraction": (sum(s == 0 for s in window) / len(window)) if window else 0.0,
            "judge/window_reward_mean": (sum(window) / len(window)) if window else 0.0,
            "judge/window_reward_std": _std(window),
            "judge/score_collapse": float(self.collapsed),
            "judge/gave_up": float(self.gave_up),
            **self._judge_stats(),
        }


def _std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return (sum((x - m) ** 2 for x in xs) / len(xs)) ** 0.5
