"""The training loop: judged turns (or rollout-buffer groups) in, steps and
publishes out, on its own thread so serving is never blocked by it.

Batching: the store is read from a cursor (judgement ids, in order); samples
with no learning signal (score 0 and no hint, or the wrong signal for the
method) are skipped and counted, they never fill a batch slot. Reading stops
once `rollout_batch_size` samples with a signal are waiting, so at most one
batch (plus one read) waits in memory. A step runs on the oldest waiting
batch. After every `publish_interval` steps the engine gets the new weights
as version + 1 (the LoRA adapter alone where the engine hot-loads adapters,
else the merged full weights); checkpoints every `save_interval` steps and at
shutdown.

Exactly once across restarts: the cursor that is saved (in the store and in
every checkpoint) is the *committed* one: every judgement at or before it was
trained on or skipped; the samples read but still waiting are after it, so a
restart reads them again. A rollout buffer hands a group out only once, so
its waiting samples are written into the checkpoint instead and restored on
resume.

Staleness reference: the version the engine serves; without an engine
(`clawloop train`) the newest policy version among everything read so far.
The trainer's own version counter is never used: it numbers the weights this
trainer produced, not the ones that produced its data (a standalone trainer
on turns served at v0 would otherwise drop every batch after `max_staleness`
steps).

Colocated (`--colocate`): the engine and the trainer share one GPU, so an
engine that can sleep (vLLM: `sleep()` frees its weights and KV cache,
`wake_up()` brings them back) sleeps through each train step and wakes before
the publish; requests that arrive meanwhile wait, none is refused.

Publish gate (`gate.py`, `gate=`): before each publish the candidate is scored
on the regression set on this thread, while the engine keeps serving the last
published version; a refused candidate is not published and the trainer is
rolled back to the last published weights, and its batch is trained again at
the gate's shortened rate up to `gate.retries` times before it is dropped.

Loud failures: a warning (and `train/*` metrics) when nearly every judged turn
carries no signal, when samples are dropped as stale, and when a publish did
not advance the served version; a warning and `gate/*` metrics per refused
version.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import os
import sys
import threading
import time
from collections import OrderedDict, deque
from pathlib import Path
from typing import Any

import torch

from clawloop.config import Config
from clawloop.engines.base import AcceptsLora, Engine, HoldsWeights
from clawloop.records import Judgement, Sample, Turn
from clawloop.store import Store
from clawloop.trainer.checkpoint import (
    load_checkpoint,
    load_pending_samples,
    resolve_checkpoint,
    save_checkpoint,
    weights_fingerprint,
)
from clawloop.trainer.core import Trainer
from clawloop.trainer.gate import PublishGate
from clawloop.trainer.hints import hint_candidates

log = logging.getLogger(__name__)

CURSOR = "trainer"


def lower_priority(nice: int, device_type: str) -> int:
    """Give the calling thread (the trainer's) CPU priority `nice` (-1: 10 when `device_type` is cpu, else
    0: a GPU, or actors computing elsewhere), so that
    serving threads and an engine on the same cores run first: on a small machine a train step then
    takes the CPU serving leaves. Linux's nice is per thread and inherited by the threads this one
    starts; it is never raised again (that needs CAP_SYS_NICE). Returns the value in effect."""
    want = (10 if device_type == "cpu" else 0) if nice < 0 else nice
    if not want or not hasattr(os, "setpriority") or not sys.platform.startswith("linux"):
        return 0
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        if want > now:
            os.setpriority(os.PRIO_PROCESS, tid, want)
        return max(want, now)
    except OSError as e:
        log.warning("trainer: could not set its thread's nice to %d (%s)", want, e)
        return 0


def has_signal(s: Sample, method: str, negative_weight: float = 1.0) -> bool:
    """Whether `s` can teach `method` anything: non-zero advantages, a non-zero finite reward (RL), or a
    hint and the conversation to put it in (OPD). With `train.negative_weight` 0 an ungrouped -1 (the
    lowest verdict: no baseline lifts it above 0) carries no RL signal."""
    if s.advantages is not None:
        return any(a != 0 for a in s.advantages)
    r = float(s.reward) if s.reward is not None else math.nan
    rl = (method in ("binary", "combine") and math.isfinite(r) and r != 0.0 and s.rl_weight != 0
          and not (r <= -1.0 and negative_weight == 0 and s.group_id is None))
    opd = method in ("opd", "combine") and (bool(s.messages) and bool(hint_candidates(s))
                                             or bool(s.teacher_logprobs))
    return rl or opd


def engine_can_sleep(engine: Any) -> bool:
    """True for an engine with async `sleep()` and `wake_up()` (vLLM's sleep mode)."""
    return all(inspect.iscoroutinefunction(getattr(engine, name, None)) for name in ("sleep", "wake_up"))


class TrainerLoop:
    def __init__(self, cfg: Config, trainer: Trainer, store: Store | None, engine: Engine | None, judge_name: str,
                 *, loop: asyncio.AbstractEventLoop | None = None, buffer_source: Any | None = None,
                 gate: PublishGate | None = None):
        self.cfg = cfg
        self.tc = cfg.train
        self.trainer = trainer
        self.store = store
        self.engine = engine
        self.judge_name = judge_name
        self.loop = loop
        self.buffer = buffer_source
        self.gate = gate
        """Scores each candidate before it is published (None: every version is published)."""
        self.save_dir = Path(self.tc.save_dir or Path(cfg.data_dir) / "checkpoints")
        self.cursor = store.get_cursor(CURSOR) if store is not None else 0
        """Committed: every judgement id <= cursor was trained on or skipped (what is saved)."""
        self.read_cursor = self._saved_cursor = self.cursor
        """The last judgement id read (samples after `cursor` may be waiting in `pending`)."""
        self.pending: list[Sample] = []
        self.pending_ids: list[int] = []
        """The judgement id of each waiting store sample, aligned with `pending`."""
        self.newest_version = 0
        """The newest policy version among the samples read: the staleness reference without an engine."""
        self.stop_event = threading.Event()
        self.thread: threading.Thread | None = None
        self.nice = 0  # the trainer thread's nice value once it runs (train.nice)
        self.consumed = False  # the last run_once took a batch (trained, or dropped as stale)
        self.busy = False
        """A batch is being trained, gated or published (a client waiting for the next version can tell
        a step under way from a trainer still waiting for samples: /health's `train`)."""
        if engine is not None and 0 < self.tc.max_staleness < self.tc.publish_interval:
            log.warning("train.publish_interval %d > train.max_staleness %d: each publish moves the served version "
                        "%d ahead, so every turn served before it and not yet trained on is dropped as stale "
                        "(train/stale_dropped); raise --max-staleness to at least the publish interval",
                        self.tc.publish_interval, self.tc.max_staleness, self.tc.publish_interval)
        self.error: BaseException | None = None
        self.window: deque[int] = deque(maxlen=64)  # 1 = had signal, per judged turn
        self.counts = {"judged_seen": 0, "skipped_no_signal": 0, "truncated": 0, "publishes": 0,
                       "publish_failures": 0, "steps": 0, "checkpoints": 0, "engine_sleeps": 0,
                       "stale_dropped": 0, "skipped_steps": 0, "retry_answers": 0}
        # each judged turn's verdict sign by (session, index), so an answer given after a correction (the
        # previous turn judged negative; judged before it, so read before it) gets `train.retry_weight`
        self.verdicts: OrderedDict[tuple[str, int], float] = OrderedDict()
        self.last_step_at = 0.0
        self.last_publish_s = 0.0
        self._warned_dead = 0.0
        self.resumed_from: str | None = None
        self.last_sleep_s = 0.0
        self.sleeps = cfg.model.sleep_while_training and engine_can_sleep(engine)
        if cfg.model.sleep_while_training and engine is not None and not self.sleeps:
            log.warning("model.sleep_while_training: this engine (%s) has no async sleep()/wake_up(); it keeps its "
                        "memory while the trainer steps", type(engine).__name__)

    # -- resume -------------------------------------------------------------
    def resume(self) -> None:
        path = resolve_checkpoint(self.tc.resume_from_checkpoint, self.save_dir)
        if path is None:
            return
        state = load_checkpoint(self.trainer, path)
        self.cursor = self.read_cursor = int(state.get("cursor", 0))
        self.pending, self.pending_ids = [], []
        self.newest_version = int(state.get("newest_version", 0))
        if self.buffer is not None:
            self.pending = load_pending_samples(path)
        if self.gate is not None:
            self.gate.restore(state.get("gate"))
        self._saved_cursor = -1
        self._save_cursor()
        self.resumed_from = str(path)
        log.info("resumed from %s: step %d, policy v%d, cursor %d", path, self.trainer.step_count,
                 self.trainer.version, self.cursor)

    def publish_resumed(self) -> None:
        """Serve the resumed weights and check the engine really does."""
        if self.resumed_from is None or self.engine is None:
            return
        self._publish()
        served = self.engine.policy_version
        ok = served == self.trainer.version
        if isinstance(self.engine, HoldsWeights):
            ok = ok and abs(weights_fingerprint(self.engine.state_dict())
                            - weights_fingerprint(self.trainer.served_state_dict())) < 1e-3
        if not ok:
            raise RuntimeError(f"resume: the engine serves v{served}, not the resumed v{self.trainer.version} "
                               f"from {self.resumed_from}")
        log.info("resume checked: engine serves the resumed weights as v%d", served)

    # -- thread ---------------------------------------------------------------
    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="clawloop-trainer", daemon=True)
        self.thread.start()

    def stop(self, checkpoint: bool = True) -> None:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=600)
        if checkpoint and self.trainer.step_count > 0:
            self.checkpoint()

    def _run(self) -> None:
        if self.tc.threads:
            torch.set_num_threads(self.tc.threads)
        # a trainer that computes here has a device; a Ray group's actors compute in their own processes,
        # so this thread only coordinates them and keeps its priority unless train.nice says otherwise
        device = getattr(getattr(self.trainer, "device", None), "type", None)
        try:
            self.nice = lower_priority(self.tc.nice, device or "elsewhere")
        except Exception:  # a priority is never worth the trainer thread
            log.exception("trainer: setting its thread's priority failed")
        while not self.stop_event.is_set():
            try:
                did = self.run_once()
            except Exception as e:  # keep serving; report, back off, retry
                self.error = e
                log.exception("trainer step failed")
                did = False
                self.stop_event.wait(5.0)
            if not did and not self.consumed:  # a backlog of stale batches is read on without a pause
                self.stop_event.wait(0.5)

    # -- one iteration ---------------------------------------------------------
    def fetch(self) -> None:
        """Read until a batch is waiting (or there is nothing more to read)."""
        want = self.tc.rollout_batch_size
        if self.buffer is not None:
            if len(self.pending) < want:
                for s in self.buffer.pull(want - len(self.pending)):
                    self._consider(s, None)
            return
        while len(self.pending) < want:
            rows = self.store.judged_turns(self.judge_name, self.read_cursor, want)
            if not rows:
                return
            for jid, turn, judgement in rows:
                self.read_cursor = jid
                self.counts["judged_seen"] += 1
                if turn.finish_reason == "length":
                    self.counts["truncated"] += 1
                if not turn.response_ids:
                    self.counts["skipped_no_signal"] += 1
                    continue
                self._consider(self._sample(turn, judgement), jid)
            if not self.pending:  # everything read was skipped: all of it is consumed
                self.cursor = self.read_cursor

    def _sample(self, turn: Turn, judgement: Judgement) -> Sample:
        s = Sample.from_turn(turn, judgement)
        self.verdicts[(turn.session_id, turn.index)] = judgement.value
        while len(self.verdicts) > 100_000:
            self.verdicts.popitem(last=False)
        if self.verdicts.get((turn.session_id, turn.index - 1), 0.0) < 0:
            s.rl_weight = self.tc.retry_weight
            self.counts["retry_answers"] += 1
        return s

    def _consider(self, s: Sample, jid: int | None) -> None:
        self.newest_version = max(self.newest_version, max(s.response_versions, default=s.policy_version))
        self.trainer.observe_reward(s)
        sig = has_signal(s, self.tc.method, self.tc.negative_weight)
        self.window.append(1 if sig else 0)
        if sig:
            self.pending.append(s)
            if jid is not None:
                self.pending_ids.append(jid)
        else:
            self.counts["skipped_no_signal"] += 1
        self._check_dead_signal()

    def take_batch(self) -> list[Sample]:
        """The oldest `rollout_batch_size` waiting samples; the committed cursor moves to just before the
        oldest sample still waiting (or to the read position when none is)."""
        n = self.tc.rollout_batch_size
        batch, self.pending = self.pending[:n], self.pending[n:]
        self.pending_ids = self.pending_ids[n:]
        self.cursor = self.pending_ids[0] - 1 if self.pending_ids else self.read_cursor
        return batch

    def _check_dead_signal(self) -> None:
        if len(self.window) >= 32 and sum(self.window) == 0 and time.time() - self._warned_dead > 60:
            self._warned_dead = time.time()
            log.warning("dead learning signal: the last %d judged turns all had score 0 and no hint "
                        "(train/no_signal_frac=1.0): check the judge and that next states carry feedback",
                        len(self.window))

    def run_once(self) -> bool:
        """Fetch, and step if a batch is ready. Returns True if a step ran; `consumed` says whether a
        batch was taken (a batch dropped as stale is consumed without a step: read on at once)."""
        self.consumed = False
        self.fetch()
        if len(self.pending) < self.tc.rollout_batch_size:
            self._save_cursor()  # skipped rows are consumed too
            return False
        self.busy = True
        try:
            batch = self.take_batch()
            self.consumed = True
            served = self.engine.policy_version if self.engine is not None else self.newest_version
            stats = self.train_step(batch, served)
            self.counts["stale_dropped"] += int(stats.get("train/stale_dropped", 0))
            self._save_cursor()  # the batch is consumed, trained or dropped as stale
            if stats.get("train/skipped_step"):
                self.counts["skipped_steps"] += 1
                return False
            self.counts["steps"] += 1
            self.last_step_at = time.time()
            if self.engine is not None and self.trainer.step_count % max(1, self.tc.publish_interval) == 0:
                self.publish_weights(batch, served)
            if self.tc.save_interval and self.trainer.step_count % self.tc.save_interval == 0:
                self.checkpoint()
            return True
        finally:
            self.busy = False

    def _save_cursor(self) -> None:
        if self.store is not None and self.cursor != self._saved_cursor:
            self.store.set_cursor(CURSOR, self.cursor)
            self._saved_cursor = self.cursor

    def train_step(self, batch: list[Sample], served: int | None) -> dict[str, float]:
        """One trainer step; a colocated engine sleeps through it and is woken up whatever happens."""
        if not self.sleeps:
            return self.trainer.step(batch, served_version=served)
        t0 = time.perf_counter()
        try:
            self._await_engine(self.engine.sleep())
            self.counts["engine_sleeps"] += 1
            return self.trainer.step(batch, served_version=served)
        finally:
            try:
                if self.trainer.device.type == "cuda":  # the step's cached activation blocks go back to vLLM
                    torch.cuda.empty_cache()
                self._await_engine(self.engine.wake_up())
            finally:
                self.last_sleep_s = time.perf_counter() - t0

    def _await_engine(self, coro: Any, timeout: float = 300) -> Any:
        """Run an engine coroutine on the serving event loop (or a private one without it) and wait."""
        if self.loop is not None:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout)
        return asyncio.run(coro)

    def publish_payload(self) -> Any:
        """What `engine.publish` gets: the LoRA adapter when the engine takes adapters, else the
        merged full weights."""
        if self.trainer.use_lora and isinstance(self.engine, AcceptsLora) and self.engine.accepts_lora_adapters:
            return self.trainer.lora_adapter()
        return self.trainer.served_state_dict()

    def publish_weights(self, batch: list[Sample] | None = None, served: int | None = None) -> bool:
        """Publish the trainer's weights if the gate admits them (a refused candidate is rolled back to
        the last published weights by the gate); returns whether they were published. With the `batch`
        that made them (and publishing after every step), a refused candidate's batch is trained again
        from the rolled-back weights at the gate's shortened rate while `gate.can_retry` (its line search)."""
        if self.gate is not None:
            tries = 0
            while not self.gate.check(self.trainer):
                if self.stop_event.is_set():  # stopping: the next start reads on from the cursor
                    return False
                if self.gate.stuck:  # no step in the feedback's direction passes: one that only restores skills
                    if not self._recover():
                        return False
                    tries = 0
                    break
                if batch is None or self.tc.publish_interval != 1 or not self.gate.can_retry(tries):
                    return False
                tries += 1
                self.gate.retried()
                stats = self.train_step(batch, served)
                if stats.get("train/skipped_step"):
                    return False
            if tries:
                self.gate.counts["passed_on_retry"] += 1
        self._publish()
        if self.gate is not None:
            self.gate.keep(self.trainer)
            if self.gate.vet(self.trainer):  # the version just served reads beyond the tolerance on the next round
                self._publish()
                self.gate.keep(self.trainer)
        return True

    def _recover(self) -> bool:
        """A recovery step from the served weights (rehearsal alone) read by the gate as the next candidate;
        True: it passed (the caller publishes it). A refused one is rolled back like any other."""
        # at the shortest step's rate: AdamW moves every weight by about the rate whatever the gradient's size,
        # and at the full rate (5e-3 in tests/test_gate.py) a step on rehearsal alone from the start lost the sums
        if self.sleeps:
            self._await_engine(self.engine.sleep())
        try:
            stats = self.trainer.recover_step()
        finally:
            if self.sleeps:
                self._await_engine(self.engine.wake_up())
        if stats.get("train/skipped_step"):
            return False
        self.gate.counts["recoveries"] += 1
        log.warning("publish gate: every step in the feedback's direction is refused at the shortest step and "
                    "rehearsal held %.0fx: trying a recovery step (rehearsal alone) as v%d", self.gate.hold_scale,
                    self.trainer.version)
        if not self.gate.check(self.trainer):
            return False
        self.gate.counts["recovered"] += 1
        return True

    def _publish(self) -> None:
        t0 = time.perf_counter()
        version = self.trainer.version
        before = self.engine.policy_version
        try:
            self._await_engine(self.engine.publish(self.publish_payload(), version))
        except Exception:
            self.counts["publish_failures"] += 1
            raise
        self.last_publish_s = time.perf_counter() - t0
        self.counts["publishes"] += 1
        if self.engine.policy_version != version or (version != before and self.engine.policy_version == before):
            log.warning("publish of v%d did not advance the served version (still v%d)", version,
                        self.engine.policy_version)

    def checkpoint(self) -> Path:
        p = save_checkpoint(self.trainer, self.save_dir, cursor=self.cursor,
                            extra={"newest_version": self.newest_version,
                                   **({"gate": self.gate.state()} if self.gate is not None else {})},
                            pending=self.pending if self.buffer is not None else None)
        self.counts["checkpoints"] += 1
        return p

    def stats(self) -> dict[str, float]:
        out = {f"train/{k}": float(v) for k, v in self.counts.items()}
        out["train/pending_samples"] = float(len(self.pending))
        out["train/batch_size"] = float(self.tc.rollout_batch_size)
        out["train/busy"] = float(self.busy)
        out["train/policy_version"] = float(self.trainer.version)
        out["train/step"] = float(self.trainer.step_count)
        out["train/no_signal_frac"] = 1.0 - (sum(self.window) / len(self.window)) if self.window else 0.0
        seen = max(self.counts["judged_seen"], 1)
        out["train/truncation_rate"] = self.counts["truncated"] / seen
        out["train/last_publish_s"] = self.last_publish_s
        out["train/nice"] = float(self.nice)
        if self.sleeps:
            out["train/last_engine_sleep_s"] = self.last_sleep_s
        out["train/tokens_trained"] = float(self.trainer.tokens_trained)
        for k, v in self.trainer.last.items():
            out.setdefault(k, v)
        if self.store is not None:
            out["train/cursor"] = float(self.cursor)
            out["train/read_cursor"] = float(self.read_cursor)
        if self.gate is not None:
            out.update(self.gate.stats())
        if getattr(self.trainer, "rehearsal", None) is not None:  # not on a Ray trainer group
            out.update(self.trainer.rehearsal.info)
        return out
