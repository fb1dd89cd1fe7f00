"""The publish gate: a trained version is scored on a regression set before the engine serves it.

Online RL from user feedback can forget: a judge that rewards the wrong thing, a
burst of adversarial users or a learning rate too high, and the next version
answers worse than the one served. The gate sits between a train step and
`engine.publish`: the candidate weights are scored on a fixed set of checks
and published only when no group of checks lost more than `gate.tolerance`
against the score the served model had at start (the *baseline*).

Where it runs: in the trainer thread, on the trainer's own model (which holds
the candidate weights; under LoRA with its adapter on), before `_publish`.
Serving is never blocked: requests keep being answered by the last published
version meanwhile, and the engine kind (hf, vLLM, full weights or adapters)
does not matter. `gate.max_tokens` per reply, `gate.batch_size` checks per
`generate` call, prompts rendered by the gateway's own renderer.

What users see, not the greedy answer: each check is asked `gate.samples` times,
sampled at `gate.temperature` (clients' usual 1.0) with fixed seeds, the same
for the baseline and every candidate (common random numbers: where the weights
barely changed, the same draws give the same replies, so the comparison is
paired and its noise small). A greedy gate reads a model's surest answer: on
the tiny model it passed a version at 0.953 whose sampled answers had lost
0.11 of their right results (bench/RESULTS.md "Why the loop made the model
worse" 7c). `gate.samples 0`: greedy, one reply a check.

What it checks (`gate_checks`):
- the built-in set (`gate.builtin`, on by default for the embedded tiny model,
  whose corpus says what it can do): held-out arithmetic (right result, any
  answer style; the pairs never occur in its corpus), the corpus's facts (a
  student's training moved its answers to the bare form and lost facts there
  while the sums held: bench/RESULTS.md 8) and instruction following
  (asked for an answer style by an instruction in the system message, the user
  message or a hint, the reply is in that style). Other models have no such
  corpus, so `auto` leaves it off for them;
- the user's `--regression-set FILE` (JSONL, one check per line, see
  `load_regression_set` and examples/regression_set.jsonl): a prompt and one
  checker, an exact answer, a regex, or a function by path.
With neither (another model without --regression-set) the gate has nothing to
score: it says so once at start and in /health, and publishes unchecked.

Scores: per group (`arithmetic`, `instructions`, the file's `group` values,
default `user`), the mean of its checks (a check scores 1/0, or a function's
float in [0, 1]). A candidate is refused when any group's score is more than
`tolerance` (absolute) below that group's baseline. The baseline is measured
once, on the weights served at start, and kept in every checkpoint, so a
restart does not reset it to whatever it resumed.

Line search: the batch behind a refused candidate is trained again from the
last published weights at the backed-off rate (`gate.backoff`), up to
`gate.retries` times, as TRPO backtracks its step until the constraint holds:
at the tolerance's edge a full step is refused and a shorter one on the same
feedback passes, so that feedback is used rather than dropped (one train step
and one scoring a try, no user waits; needs `publish_interval` 1).

Holding harder (`gate.hold`, `--gate-hold 16`; 1: off): at the tolerance's edge every step in the
feedback's direction loses a little more than the served version, however short (a student's run: 41
candidates in a row at 1/8 of the rate, each 0.055 below on its round, the served version 0.047). Once the
backoff cannot shorten the step, each refusal doubles rehearsal's coefficient (up to `hold` times its own)
and the line search retries with it; a pass halves it back. A multiplier on the constraint that rises while
the constraint binds, as PPO-Lagrangian's (raised on refusals, not on an estimate of the cost).

Recovering (`stuck`, then the loop's `_recover`): where a refusal can change the step no more (the rate at
its shortest, rehearsal held at `hold`), every step in the feedback's direction loses more than the
tolerance allows (a student's run: 54 candidates in a row, each 0.910 against a served reading of 0.922 on a
round whose baseline was 0.969). The loop then trains one step on rehearsal alone from the served weights
(`Trainer.recover_step`), as CPO takes a recovery step when its constraint cannot be met, and reads it as
the next candidate: published if it passes (`gate/recoveries`, `gate/recovered`).

Confirmation (`gate.confirm`, `--gate-confirm`, on by default; with rotations): a candidate that passes its
round is read on the next round too before it is served, and passes there if it is within the tolerance
there or over the two rounds together (`held_to`'s rule for a harder draw). The line search keeps the first
candidate of a version that passes; where most of them lose more than the tolerance, that is the one whose
loss the round's questions happened to miss (bench/RESULTS.md "Why the loop made the model worse" 14). The
next round played no part in choosing it. Strict on the second round (s18, opt-in) it halved a student's
learning; read there only after publishing (`vet`, s20's first sweep) users were served a version before
its loss was found, and the evaluation measured such versions (RESULTS 16). With confirmation the reading
is the served version's on the round its successors are read on, so `vet` has nothing left to read.

On refusal the trainer is rolled back to the last published version: its
trainable weights, the AdamW state and its version counter (CPU copies taken
at every publish: megabytes under LoRA, the weights plus twice them for the
optimizer under full fine-tuning). Why roll back rather than keep training
from the refused weights: (1) users are safe either way, but from the refused
weights every later candidate starts from the damage and tends to be refused
too, so serving freezes while the trainer drifts further; from the last good
weights the next batch of feedback gets a fresh chance, so learning goes on;
(2) the served version produces the training data, and the PPO ratio and TIS
weights compare the trainer with it: after a rollback they are the same
weights again instead of an ever larger off-policy gap. The batch that produced
the refused version is consumed (its cursor committed) once its retries are spent.

Vetting (`vet`, the loop's call after each publish): the version just published is read on the round its
first candidate will be read on, so a version passed on a round that missed its loss is found before users
keep it for a version more, not only after a refusal (s19's students: other sums 0.08-0.09 down on versions
their rounds read 0.035-0.06 down). One reading a version (`gate/vetted`).

Falling back (`_fall_back`): the served weights are read on the candidate's round (`vet`). Where
they are beyond the tolerance there and, averaged with their drop on the round that passed them, over both
rounds too, the served version has lost what the model could do (a harder draw alone is `held_to`'s case).
Users must not keep it, and no candidate near it passes (a student's run stalled so: 34 refusals in a row,
RESULTS 14d). The gate publishes, as a new version number, the weights of the newest of the last
`FALLBACKS` (4) versions before it that passed against the baseline and read within the tolerance on this
round by the same rule, else the weights served at start; the trainer goes on from them with the AdamW
state it had. Costs: CPU copies of the start's weights and of those four (the weights alone: references
to snapshots already taken, no copy at a publish), and a reading per version tried when it happens
(`gate/fallbacks`). With one kept, a student's run found it beyond the tolerance too and fell back to the
start, losing 13 versions (RESULTS 15).

Visible: a warning per refusal, `gate/*` metrics in the trainer loop's stats
(so /metrics, the dashboard and `clawloop status` through /health).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from clawloop.config import Config, ConfigError
from clawloop.trainer.generation import BUILTIN_SEED, generate_replies, generate_rows  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

KEY = "gate.regression_set"
FLAG = "--regression-set"


@dataclass
class Check:
    """One regression prompt and how its reply is scored."""

    group: str
    messages: list[dict[str, Any]]
    score: Callable[[str], float]
    """reply -> score in [0, 1]."""
    max_tokens: int
    source: str
    """Where it comes from (`builtin:arithmetic:3`, `file.jsonl:7`), for messages and the set's fingerprint."""
    tools: list[dict[str, Any]] | None = None


# -- the built-in set (the tiny model) -------------------------------------------------------------
def is_tiny_model(model_path: str | Path) -> bool:
    """Whether `model_path` is a build of the embedded tiny model (its build_info.json names it)."""
    info = Path(model_path) / "build_info.json"
    try:
        return str(json.loads(info.read_text()).get("name", "")).startswith("tiny-chat")
    except (OSError, ValueError, AttributeError):
        return False


def builtin_checks(n: int, max_tokens: int, seed: int = BUILTIN_SEED, *, heldout: bool = True) -> list[Check]:
    """`n` arithmetic checks (the reply holds the right result, any style), the corpus's facts (at most
    `n`; there is no held-out fact: the model knows what its corpus told it) and `n` instruction checks
    (the reply is in the style an instruction asked for; every style and placement in turn). `heldout`
    False: the arithmetic is the corpus's own pairs (what `trainer/rehearsal.py` replays)."""
    from clawloop.tinymodel import corpus

    ask = corpus.heldout_questions if heldout else corpus.corpus_questions
    questions = ask(4 * n, seed=seed)  # add, add, sub, fact, ...
    arith = [q for q in questions if q["skill"] != "fact"][:n]
    out = [Check("arithmetic", [{"role": "user", "content": q["question"]}], _answer_is(q["answer"]), max_tokens,
                 f"builtin:arithmetic:{i}") for i, q in enumerate(arith)]
    out += [Check("facts", [{"role": "user", "content": q}], _answer_is(a), max_tokens, f"builtin:facts:{i}")
            for i, (q, a) in enumerate(corpus.FACTS[:n])]
    rng = random.Random(f"gate-{seed}")
    for i, q in enumerate(questions[:n]):
        style = corpus.STYLES[i % len(corpus.STYLES)]
        placement = corpus.PLACEMENTS[i % len(corpus.PLACEMENTS)]  # 5 styles x 4 placements: all 20 pairs
        msgs = corpus.instruct(q["question"], corpus.style_instruction(style, rng), placement)
        out.append(Check("instructions", msgs, _fits(style), max_tokens, f"builtin:instructions:{i}"))
    return out


def styled_checks(n: int, max_tokens: int, seed: int = BUILTIN_SEED) -> list[Check]:
    """`n` of the corpus's own sums and facts, each asked in a style (every style and placement in turn),
    passed only when the reply is right and in that style: what rehearsal replays so that the content is
    held in every form, the bare one included, whose first token is the content itself."""
    from clawloop.tinymodel import corpus

    qs = corpus.corpus_questions(n, seed=seed)
    rng = random.Random(f"styled-{seed}")
    out = []
    for i, q in enumerate(qs):
        style = corpus.STYLES[i % len(corpus.STYLES)]
        placement = corpus.PLACEMENTS[(i // len(corpus.STYLES)) % len(corpus.PLACEMENTS)]
        msgs = corpus.instruct(q["question"], corpus.style_instruction(style, rng), placement)
        right, fits = _answer_is(q["answer"]), _fits(style)
        out.append(Check("styled", msgs, lambda r, right=right, fits=fits: right(r) * fits(r), max_tokens,
                         f"builtin:styled:{i}"))
    return out


def _answer_is(answer: str) -> Callable[[str], float]:
    from clawloop.tinymodel.corpus import extract_answer

    return lambda reply: float(extract_answer(reply) == answer.lower())


def _fits(style: str) -> Callable[[str], float]:
    from clawloop.tinymodel.corpus import fits_style

    return lambda reply: float(fits_style(reply, style))


# -- the user's set ---------------------------------------------------------------------------------
CHECKERS = ("answer", "regex", "check")


def load_regression_set(path: str | Path, max_tokens: int) -> list[Check]:
    """The checks of a JSONL file, one object per line (blank lines skipped):

        {"prompt": "What is 12+7?", "answer": "19"}                   the reply, stripped, is exactly this
        {"messages": [...], "regex": "(?i)\\\\bparis\\\\b"}             re.search finds it in the reply
        {"prompt": "...", "check": "checks.py:polite"}                fn(reply, case) -> bool | float in [0, 1]

    The prompt is `prompt` (a user message, after an optional `system`) or `messages`; optional
    `tools`, `group` (default "user": the tolerance applies per group), `max_tokens`. `check` is a
    function by path, as every plugin flag takes it (`file.py:fn`, `pkg.module:fn`); `fn(reply)` works
    too, and `case` is the line's object. Anything wrong is a ConfigError naming gate.regression_set
    and the line."""
    from clawloop.plugins import PluginError, accepts, describe, load_callable

    p = Path(path)
    try:
        lines = p.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{KEY}: cannot read {str(p)!r} ({FLAG}): {e.strerror or e}") from None
    out: list[Check] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{KEY}: {p}:{n}"
        try:
            case = json.loads(line)
        except ValueError as e:
            raise ConfigError(f"{where}: not a JSON object: {e}") from None
        if not isinstance(case, dict):
            raise ConfigError(f"{where}: not a JSON object")
        if "messages" in case:
            msgs = case["messages"]
            if not (isinstance(msgs, list) and msgs and all(isinstance(m, dict) and "role" in m for m in msgs)):
                raise ConfigError(f"{where}: messages must be a non-empty list of {{role, content}} objects")
        elif isinstance(case.get("prompt"), str):
            msgs = ([{"role": "system", "content": str(case["system"])}] if case.get("system") else [])
            msgs.append({"role": "user", "content": case["prompt"]})
        else:
            raise ConfigError(f"{where}: give the prompt as \"prompt\" (a string) or \"messages\"")
        given = [k for k in CHECKERS if k in case]
        if len(given) != 1:
            raise ConfigError(f"{where}: give exactly one checker of {', '.join(CHECKERS)}, got "
                              f"{', '.join(given) or 'none'}")
        kind = given[0]
        if kind == "answer":
            want = str(case["answer"]).strip()
            score: Callable[[str], float] = lambda reply, want=want: float(reply.strip() == want)
        elif kind == "regex":
            try:
                rx = re.compile(str(case["regex"]))
            except re.error as e:
                raise ConfigError(f"{where}: regex {case['regex']!r} does not compile: {e}") from None
            score = lambda reply, rx=rx: float(rx.search(reply) is not None)
        else:
            what = f"{FLAG} ({where}) check"
            fn = load_callable(str(case["check"]), what=what)
            if accepts(fn, 2):
                score = _function_score(fn, case, two=True)
            elif accepts(fn, 1):
                score = _function_score(fn, case, two=False)
            else:
                raise PluginError(f"{what}: {describe(fn)} does not match fn(reply, case) or fn(reply)")
        mt = case.get("max_tokens", max_tokens)
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise ConfigError(f"{where}: max_tokens must be a positive integer, got {mt!r}")
        tools = case.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise ConfigError(f"{where}: tools must be a list of tool definitions")
        out.append(Check(str(case.get("group", "user")), msgs, score, mt, f"{p.name}:{n}:{kind}", tools))
    if not out:
        raise ConfigError(f"{KEY}: {p} holds no checks")
    return out


def _function_score(fn: Callable[..., Any], case: dict[str, Any], *, two: bool) -> Callable[[str], float]:
    def score(reply: str) -> float:
        v = fn(reply, case) if two else fn(reply)
        v = float(v)
        if not math.isfinite(v):
            raise ValueError(f"returned {v}")
        return min(1.0, max(0.0, v))

    return score


def gate_checks(cfg: Config, model_path: str | Path) -> list[Check] | None:
    """What the gate scores under `cfg` (None: the gate is off). Loaded at startup, so a bad file or
    checker stops `clawloop up` before it serves."""
    g = cfg.gate
    if not g.enabled:
        return None
    checks: list[Check] = []
    if g.builtin == "on" or (g.builtin == "auto" and is_tiny_model(model_path)):
        checks += builtin_checks(g.builtin_checks * max(1, g.rotations), g.max_tokens)
    if g.regression_set:
        checks += load_regression_set(g.regression_set, g.max_tokens)
    return checks


# -- scoring ----------------------------------------------------------------------------------------
def rounds(checks: list[Check], per_group: int) -> list[list[Check]]:
    """The checks read for each published version, in turn: every group's next `per_group` checks (wrapping),
    a group of at most `per_group` whole every time; as many rounds as the largest group needs. `per_group`
    0: one round of every check. Why: the line search keeps the first candidate of a batch that passes, and
    over a run that selects weights that happen to answer the gate's own questions; read on the same 64 sums
    every time, a tiny-model run kept 0.93 of them while fresh held-out sums fell from 0.96 to 0.86. Every
    candidate of one version is read on the same round: read on the next round at every try, a candidate
    refused on seven passed on the eighth, the most lenient (bench/RESULTS.md "Why the loop made the model
    worse" 9)."""
    groups: dict[str, list[Check]] = {}
    for c in checks:
        groups.setdefault(c.group, []).append(c)
    if per_group <= 0 or all(len(g) <= per_group for g in groups.values()):
        return [list(checks)] if checks else []
    n = max(math.ceil(len(g) / per_group) for g in groups.values())
    return [[g[(r * per_group + i) % len(g)] for g in groups.values() for i in range(min(per_group, len(g)))]
            for r in range(n)]


def score_checks(checks: list[Check], replies: list[str]) -> dict[str, float]:
    """The mean score per group; a checker that raises scores 0 (and is logged)."""
    per: dict[str, list[float]] = {}
    for c, reply in zip(checks, replies):
        try:
            s = float(c.score(reply))
        except Exception as e:  # a user's checker: its bug fails the check, on every version alike
            log.warning("publish gate: check %s raised %s: %s (scored 0)", c.source, type(e).__name__, e)
            s = 0.0
        per.setdefault(c.group, []).append(s)
    return {g: sum(v) / len(v) for g, v in per.items()}


def set_fingerprint(checks: list[Check], samples: int = 0, temperature: float = 0.0, per_group: int = 0) -> str:
    """Names one regression set (prompts, limits, sources) and how it is asked: a saved baseline is reused
    only for the same."""
    h = hashlib.sha256()
    if samples:
        h.update(json.dumps(["sampled", samples, temperature]).encode())
    if per_group:
        h.update(json.dumps(["rounds", per_group]).encode())
    for c in checks:
        h.update(json.dumps([c.group, c.source, c.messages, c.tools, c.max_tokens], sort_keys=True,
                            default=str).encode())
    return h.hexdigest()[:16]


# -- rollback ---------------------------------------------------------------------------------------
def _cpu_copy(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", copy=True)
    if isinstance(x, dict):
        return {k: _cpu_copy(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_cpu_copy(v) for v in x)
    return x


class Snapshot:
    """The trainer at its last published version: trainable weights (and offloaded masters), AdamW
    state and version counter, as CPU copies."""

    def __init__(self, trainer: Any):
        with torch.no_grad():
            self.params = [p.detach().to("cpu", copy=True) for p in trainer.params]
            masters = getattr(trainer, "masters", None)
            self.masters = None if masters is None else [m.detach().to("cpu", copy=True) for m in masters]
        self.opt_state = _cpu_copy(trainer.opt.state_dict())
        self.eps_state = list(getattr(trainer, "eps_state", []))
        self.version = int(trainer.version)

    def restore(self, trainer: Any) -> None:
        self.weights().restore(trainer)
        # a copy: load_state_dict may keep the tensors it is given, and AdamW updates its state in place
        trainer.opt.load_state_dict(_cpu_copy(self.opt_state))
        trainer.opt.zero_grad(set_to_none=True)
        if self.eps_state:
            trainer.eps_state[:] = self.eps_state
        trainer.version = self.version

    def weights(self) -> "Weights":
        """Its weights alone (the same CPU tensors: a snapshot is never written to)."""
        return Weights(self.version, self.params, self.masters)


@dataclass
class Weights:
    """An earlier published version's trainable weights (and offloaded masters), kept to fall back to."""

    version: int
    params: list[torch.Tensor]
    masters: list[torch.Tensor] | None

    def restore(self, trainer: Any) -> None:
        """Into the trainer's weights; its AdamW state (the served version's) stays."""
        with torch.no_grad():
            for p, s in zip(trainer.params, self.params):
                p.copy_(s)
            if self.masters is not None:
                for m, s in zip(trainer.masters, self.masters):
                    m.copy_(s)


# -- the gate ---------------------------------------------------------------------------------------
@dataclass
class Verdict:
    version: int
    scores: dict[str, float]
    passed: bool
    seconds: float
    worst: str = ""
    """The group that lost most against its baseline."""
    held_to: dict[str, float] | None = None
    """The baseline on the round of checks this candidate was read on."""


MIN_LR_SCALE = 1 / 8
"""The gate's backoff never takes the learning rate under this share of the configured one."""
FALLBACKS = 4
"""Earlier good versions whose weights the gate keeps to fall back to (besides the start's): with one, a
student's run found it beyond the tolerance too and fell back to the start, its 13 versions lost."""
STALLED_AFTER = 10
MIN_SLACK = 0.01
"""Least a candidate may read below the served version on a round held to it (`held_to`): below this, one or
two of 256 sampled replies turning out otherwise decide (a student's run: the served v13 0.910, slack 0.001,
each of 19 recovery steps 0.906: refused, RESULTS 16)."""
"""Refusals in a row (the last at the shortest step) after which the gate says training has stalled."""


class PublishGate:
    """Scores candidates on `checks` against the baseline; rolls a refused one back (module docstring)."""

    def __init__(self, checks: list[Check], tolerance: float, *, batch_size: int = 64, backoff: float = 1.0,
                 samples: int = 0, temperature: float = 1.0, retries: int = 0, per_group: int = 0,
                 confirm: bool = False, hold: float = 1.0):
        if not 0.0 < backoff <= 1.0:
            raise ValueError(f"gate backoff must be in (0, 1], got {backoff}")
        if samples < 0 or retries < 0 or temperature <= 0:
            raise ValueError(f"gate samples and retries must be >= 0 and temperature > 0, got {samples}, {retries}, "
                             f"{temperature}")
        self.checks = checks
        self.rounds = rounds(checks, per_group)
        """The checks each decision reads, in turn (`rounds`): fresh questions for each candidate."""
        self.samples, self.temperature = int(samples), float(temperature)
        """Replies sampled per check at `temperature` (fixed seeds); 0: one greedy reply."""
        self.retries = int(retries)
        self.confirm = bool(confirm)
        """A candidate that passes its round is read on the next round too and must pass there (`check`)."""
        """Times a refused candidate's batch is trained again at the backed-off rate (`can_retry`)."""
        self.tolerance = float(tolerance)
        self.batch_size = batch_size
        self.backoff = float(backoff)
        """On a refusal the trainer's learning rate is multiplied by this (down to MIN_LR_SCALE of its own), a
        passed candidate divides it back (up to the configured rate); 1: off."""
        self.lr_scale = 1.0
        self.shortened = False
        """Whether the last refusal changed the step: shorter, or rehearsal held harder (else a retry is the same)."""
        self.base_lr: float | None = None
        if hold < 1.0:
            raise ValueError(f"gate hold must be >= 1 (1: off), got {hold}")
        self.hold = float(hold)
        """Most rehearsal's coefficient is raised to, as a multiple of its own (`_set_hold`)."""
        self.hold_scale = 1.0
        self.base_coef: float | None = None
        self.fingerprint = set_fingerprint(checks, self.samples, self.temperature, per_group)
        self.baseline: dict[str, float] = {}
        """Per group, the start's score over every round (what /health and the metrics show)."""
        self.baselines: list[dict[str, float]] = []
        """Per round, the start's score on that round's checks: what a candidate read on them is held to."""
        self.snapshot: Snapshot | None = None
        self.last: Verdict | None = None
        self.counts = {"candidates": 0, "passed": 0, "refused": 0, "consecutive_refusals": 0, "retries": 0,
                       "passed_on_retry": 0, "passed_on_served": 0, "confirmations": 0, "refused_on_confirmation": 0,
                       "fallbacks": 0, "vetted": 0, "recoveries": 0, "recovered": 0, "near_served": 0}
        self.served: dict[tuple[int, int], dict[str, float]] = {}
        """(served version, round) -> the served version's own score on that round, read after a refusal
        there (`check`): a round that the served version itself fails holds a candidate to it instead."""
        self.passed_drops: dict[int, dict[str, float]] = {0: {}}
        self.round_drops: dict[int, dict[int, dict[str, float]]] = {}
        """Version -> round -> its drop there, for the rounds it was read on when it passed (`_own`)."""
        """Version -> its drop below the baseline per group on the round it passed (the start: none)."""
        self.baseline_s = self.last_snapshot_s = self.last_rollback_s = 0.0
        self._failed: set[str] = set()
        self._slack: dict[str, float] = {}
        """Per `_failed` group, the tolerance the served version left unused over its two rounds: what a
        candidate may lose below the served reading there."""
        self.start: Weights | None = None
        """The weights the baseline was measured on (when it was measured in this process, not restored)."""
        self.clean: list[Weights] = []
        """The last FALLBACKS versions before the served one that passed against the baseline, oldest first:
        where serving falls back (newest first, then the start)."""
        self.lost: set[int] = set()
        self.origin: dict[int, int] = {}
        """A fallback's version -> the version whose weights it published (`_fall_back`)."""
        self.judged: set[tuple[int, int]] = set()
        """(served version, round) pairs whose reading `_fall_back` has weighed (once each)."""
        """Versions found beyond the tolerance on a later round (`check`): never fallen back to."""
        self._fresh = False

    @classmethod
    def from_config(cls, cfg: Config, checks: list[Check]) -> "PublishGate":
        g = cfg.gate
        return cls(checks, g.tolerance, batch_size=g.batch_size, backoff=g.backoff, samples=g.samples,
                   temperature=g.temperature, retries=g.retries, per_group=g.builtin_checks if g.rotations > 1 else 0,
                   confirm=g.confirm, hold=g.hold)

    def _set_lr_scale(self, trainer: Any, scale: float) -> None:
        """The trainer's AdamW learning rate at `scale` times the configured one (rollback restores the
        optimizer state, and with it the rate of the snapshot: set after it)."""
        if self.base_lr is None:
            self.base_lr = float(trainer.lr)
        self.lr_scale = min(1.0, max(MIN_LR_SCALE, scale))
        trainer.lr = self.base_lr * self.lr_scale
        for g in trainer.opt.param_groups:
            g["lr"] = trainer.lr

    def _set_hold(self, trainer: Any, scale: float) -> bool:
        """Rehearsal's coefficient at `scale` times its own (1 to `hold`): a multiplier on what keeps the
        model's skills, raised while the constraint binds (PPO-Lagrangian's, on refusals rather than a cost
        estimate). At the tolerance's edge a step in the feedback's direction loses more however short it is
        (a student's run: 41 candidates in a row at 1/8 of the rate, each 0.055 below on its round, the
        served version 0.047): the line search can only shorten it, this turns it towards what was lost."""
        rehearsal = getattr(trainer, "rehearsal", None)
        if rehearsal is None:  # nothing rehearsed (--rehearsal-rows 0): nothing to weigh
            return False
        if self.base_coef is None:
            self.base_coef = float(rehearsal.coef)
        self.hold_scale = min(self.hold, max(1.0, scale))
        rehearsal.coef = self.base_coef * self.hold_scale
        return True

    @property
    def active(self) -> bool:
        """False when there is nothing to check: every version is published unchecked."""
        return bool(self.checks)

    def score(self, trainer: Any, checks: list[Check] | None = None) -> dict[str, float]:
        """The trainer model's score per group on `checks` (default: all), as it is now (eval mode for the
        check, restored after). The same checks in the same order draw the same random numbers."""
        model = trainer.model
        was_training = model.training
        model.eval()
        checks = self.checks if checks is None else checks
        asked = [c for c in checks for _ in range(max(1, self.samples))]  # each check's samples in a row
        try:
            replies = generate_replies(model, trainer.tokenizer, asked, batch_size=self.batch_size,
                                       autocast_dtype=getattr(trainer, "autocast_dtype", None),
                                       temperature=self.temperature if self.samples else 0.0)
        finally:
            model.train(was_training)
        return score_checks(asked, replies)

    def can_retry(self, tries: int) -> bool:
        """Whether the batch of the candidate just refused is trained again (its `tries`-th retry): retries
        are on, left, and the backoff can still shorten the step."""
        return tries < self.retries and self.shortened

    def retried(self) -> None:
        self.counts["retries"] += 1

    @property
    def stuck(self) -> bool:
        """The last refusal could not change the step (the rate at its shortest, rehearsal held at `hold`, or
        nothing to hold): every step in the feedback's direction loses more than the tolerance allows. The loop
        then tries a recovery step (`Trainer.recover_step`: rehearsal alone) as the next candidate."""
        return self.counts["consecutive_refusals"] > 0 and not self.shortened

    # -- the loop's calls --------------------------------------------------------
    def restore(self, saved: dict[str, Any] | None) -> None:
        """Take the baseline a checkpoint kept (only if it was measured on this same set)."""
        if saved and saved.get("fingerprint") == self.fingerprint and saved.get("baseline") and \
                len(saved.get("baselines") or []) == len(self.rounds):
            self.baselines = [{str(k): float(v) for k, v in b.items()} for b in saved["baselines"]]
            self.baseline = {str(k): float(v) for k, v in saved["baseline"].items()}
            log.info("publish gate: baseline from the checkpoint: %s", _fmt(self.baseline))

    def begin(self, trainer: Any, model_name: str = "") -> None:
        """At start, on the weights served: measure the baseline (unless a checkpoint gave it) and take
        the first rollback point."""
        if not self.active:
            log.warning("publish gate: nothing to check for %s (the built-in checks are the tiny model's; pass "
                        "%s FILE, see examples/regression_set.jsonl): versions are published unchecked",
                        model_name or "this model", FLAG)
            return
        self.base_lr = float(trainer.lr)
        if not self.baselines:
            t0 = time.perf_counter()
            self.baselines = [self.score(trainer, r) for r in self.rounds]
            self.baseline = {g: sum(b[g] for b in self.baselines) / len(self.baselines) for g in self.baselines[0]}
            self.baseline_s = time.perf_counter() - t0
            self._fresh = True
            self.passed_drops[int(trainer.version)] = {}
            log.info("publish gate: baseline of v%d on %d checks in %d round(s) of %d: %s (%.2f s); tolerance %.3f",
                     trainer.version, len(self.checks), len(self.rounds), len(self.rounds[0]), _fmt(self.baseline),
                     self.baseline_s, self.tolerance)
        self.keep(trainer)

    def _read(self, trainer: Any, turn: int, served_version: int) -> tuple[dict[str, float], dict[str, float], bool, str]:
        """The candidate's scores on round `turn`, what they are held to there, whether they pass, the worst group."""
        scores = self.score(trainer, self.rounds[turn])
        held_to = self.held_to(turn, self.served.get((served_version, turn)), self._own(served_version, turn))
        drops = {g: held_to.get(g, 0.0) - s for g, s in scores.items()}
        allowed = {g: self._slack.get(g, 0.0) if g in self._failed else self.tolerance for g in drops}
        worst = max(drops, key=lambda g: drops[g] - allowed[g])
        return scores, held_to, all(d <= allowed[g] + 1e-9 for g, d in drops.items()), worst

    def check(self, trainer: Any) -> bool:
        """Score the trainer's candidate; True: publish it. False: it was refused and the trainer is back
        at the last published version."""
        if not self.active:
            return True
        t0 = time.perf_counter()
        # Fresh questions for each published version, the same for every candidate of one: a set read at every
        # decision is learnt, and a candidate read on a new round at every try passes on the first lenient one.
        turn = (self.counts["passed"] + self.counts["fallbacks"]) % len(self.rounds)
        served_version = self.snapshot.version if self.snapshot is not None else -1
        scores, held_to, passed, worst = self._read(trainer, turn, served_version)
        read = {turn: scores}
        near = not passed and self.confirm and len(self.rounds) > 1 and self._near(turn, served_version, scores)
        if (passed or near) and self.confirm and len(self.rounds) > 1:
            # The candidates of one version are all read on one round, and the first that passes is kept: where
            # most of them lose more than the tolerance, the one kept is the one whose loss that round's questions
            # missed (a student's run: 72 refused, 5 passed, and other sums lost 0.07 on a version its round read
            # at 0.02: RESULTS 14). The next round's questions played no part in that choice: it must pass them too.
            first_turn, first = turn, scores
            turn = (turn + 1) % len(self.rounds)
            self.counts["confirmations"] += 1
            scores, held_to, passed, worst = self._read(trainer, turn, served_version)
            read[turn] = scores
            # within the tolerance there, or over the two rounds together (a harder draw: held_to's rule), against
            # the baseline: passed against a served version's reading alone, one beyond over its two rounds would
            # be fallen back from at its successors' first refusal (and nothing near it passes there meanwhile)
            passed = self._within(turn, scores, {g: self.baselines[first_turn].get(g, 0.0) - v for g, v in first.items()})
            self.counts["refused_on_confirmation"] += not passed
            self.counts["near_served"] += near
        self.last = Verdict(int(trainer.version), scores, passed, time.perf_counter() - t0, worst, held_to)
        self.counts["candidates"] += 1
        if passed:
            self.counts["passed"] += 1
            self.counts["passed_on_served"] += bool(self._failed)
            # its drop per group, over the rounds it was read on (what `held_to` weighs a harder round against)
            self.round_drops[int(trainer.version)] = {
                t: {g: self.baselines[t].get(g, 0.0) - sc[g] for g in sc} for t, sc in read.items()}
            self.passed_drops[int(trainer.version)] = {
                g: sum(self.baselines[t].get(g, 0.0) - sc[g] for t, sc in read.items()) / len(read) for g in scores}
            self.counts["consecutive_refusals"] = 0
            for t, sc in list(read.items())[1:]:  # read on the next round already (confirmation): `vet` needs no more
                self.served[(int(trainer.version), t)] = sc
            if self.backoff < 1.0 and self.lr_scale < 1.0:
                self._set_lr_scale(trainer, self.lr_scale / self.backoff)
            if self.hold_scale > 1.0:
                self._set_hold(trainer, self.hold_scale / 2)
            log.info("publish gate: v%d passed: %s (baseline %s%s%s)", trainer.version, _fmt(scores), _fmt(held_to),
                     f"; in {', '.join(sorted(self._failed))} the served v{served_version}'s own reading, which this "
                     f"round puts beyond the tolerance" if self._failed else "",
                     ("; confirmed on a second round" + (f" (its first within {MIN_SLACK} of the served v{served_version}"
                                                         f"'s reading there)" if near else "")) if len(read) > 1 else "")
            return True
        self.counts["refused"] += 1
        self.counts["consecutive_refusals"] += 1
        candidate, step = trainer.version, trainer.step_count
        self.roll_back(trainer)
        first = (served_version, turn) not in self.served
        if first:  # the served weights are back: how do they read here?
            self.served[(served_version, turn)] = self.score(trainer, self.rounds[turn])
        if len(read) > 1:  # the confirming round judges against the baseline (`_within`), whatever `_read` held it to
            base = self.baselines[turn]
            worst = max(scores, key=lambda g: base.get(g, 0.0) - scores[g])
            against, value, tol = "baseline", base.get(worst, 0.0), self.tolerance
        else:
            against = f"the served v{served_version}" if worst in self._failed else "baseline"
            value = held_to.get(worst, 0.0)
            tol = self._slack.get(worst, 0.0) if worst in self._failed else self.tolerance
        log.warning("publish gate: refused candidate v%d (step %d): %s %.3f vs %s %.3f (tolerance %.3f)%s; "
                    "still serving v%d (%d refused in a row)", candidate, step, worst, scores[worst], against, value,
                    tol, " on the confirming round, nor within it over the two rounds" if len(read) > 1 else "",
                    trainer.version, self.counts["consecutive_refusals"])
        # once per version and round, whoever read it (a refusal here, or its confirmation: a version confirmed on a
        # round by a harder round's exception can be beyond over its two rounds, and nothing near it passes there)
        if (served_version, turn) not in self.judged and self._fall_back(trainer, turn, served_version, t0):
            return True
        before = self.lr_scale
        if self.backoff < 1.0:  # a step that lost what the model could do was too long: retry with a shorter one
            self._set_lr_scale(trainer, self.lr_scale * self.backoff)
        self.shortened = self.lr_scale < before
        if not self.shortened and self.hold_scale < self.hold:  # the shortest step still loses: weigh that more
            self.shortened = self._set_hold(trainer, self.hold_scale * 2)  # a retry held harder is another step
        if self.counts["consecutive_refusals"] % STALLED_AFTER == 0 and not self.shortened:
            log.warning("publish gate: %d candidates refused in a row, the last at the shortest step (1/%d of --lr): "
                        "the feedback asks for what this model cannot learn without losing %s; serving stays at "
                        "v%d. Check the judge and the feedback, or trade the two with --regression-tolerance "
                        "(gate/consecutive_refusals)", self.counts["consecutive_refusals"], round(1 / MIN_LR_SCALE),
                        worst, trainer.version)
        return False

    def _near(self, turn: int, version: int, scores: dict[str, float]) -> bool:
        """Whether a candidate beyond the tolerance on its round still goes on to its confirming round: where it is
        beyond, it reads within MIN_SLACK of the served version's own reading there, which is within the tolerance
        over its rounds. At the tolerance's edge the served version passed by one reply, and every candidate near
        it, at the shortest step and held hardest, read one reply lower on the same questions (65 refusals in a row
        in a run, 124 in another: RESULTS 16, 17): the line search can find nothing there. Such a candidate is no
        worse than what users have; the confirming round's two-round rule against the baseline then decides."""
        served = self.served.get((version, turn))
        own = self._own(version, turn)
        if served is None or own is None or not self._within(turn, served, own):
            return False
        base = self.baselines[turn]
        return all(base.get(g, 0.0) - v <= self.tolerance + 1e-9 or v >= served.get(g, math.inf) - MIN_SLACK - 1e-9
                   for g, v in scores.items())

    def _own(self, version: int, turn: int) -> dict[str, float] | None:
        """What a version's reading on round `turn` is averaged with (`held_to`, `_within`): its drop on the other
        rounds it passed on. A version confirmed on this very round was accepted there by that rule against its
        first round alone; averaged with its own two-round mean the same reading counted twice, and its
        successors were held to the baseline on the round that had passed it (RESULTS 16: 0.902 served, every
        candidate 0.906-0.914 refused against 0.919)."""
        rounds = {t: d for t, d in self.round_drops.get(version, {}).items() if t != turn}
        if not rounds:
            return self.passed_drops.get(version)
        return {g: sum(d.get(g, 0.0) for d in rounds.values()) / len(rounds) for g in next(iter(rounds.values()))}

    def _within(self, turn: int, scores: dict[str, float], own: dict[str, float] | None) -> bool:
        """Whether a version reading `scores` on round `turn` is within the tolerance by `held_to`'s rule: in
        every group, its drop there or, where that is beyond, averaged with its drop on its own round (`own`)."""
        base = self.baselines[turn]
        return all(base.get(g, 0.0) - v <= self.tolerance + 1e-9 or (
            own is not None and (base.get(g, 0.0) - v + own.get(g, 0.0)) / 2 <= self.tolerance + 1e-9)
            for g, v in scores.items())

    def vet(self, trainer: Any) -> bool:
        """Just after a publish (the trainer holds the weights now served): read them on the round their first
        candidate will be read on. A version is passed on one round; where most of its candidates lose more
        than the tolerance, the one kept is the one whose loss that round missed (students' runs: other sums
        0.08-0.09 down on versions their rounds read 0.035-0.06 down, RESULTS 15), and until a refusal it was
        never read again. Read here, a served version beyond the tolerance over its two rounds is replaced
        (`_fall_back`) before any user keeps it for a version more; a harder round holds candidates to it
        (`held_to`) from their first try. One reading a version. True: the trainer holds other weights, to
        be published (not vetted again: they were just read on this round)."""
        if not self.active or not self.rounds:
            return False
        version = int(trainer.version)
        own = self.passed_drops.get(version)
        turn = (self.counts["passed"] + self.counts["fallbacks"]) % len(self.rounds)
        if not own or (version, turn) in self.served:  # the start (the baseline itself), unknown, or read already
            return False
        t0 = time.perf_counter()
        self.served[(version, turn)] = scores = self.score(trainer, self.rounds[turn])
        self.counts["vetted"] += 1
        log.info("publish gate: v%d read on its next round: %s (baseline %s)", version, _fmt(scores),
                 _fmt(self.baselines[turn]))
        return self._fall_back(trainer, turn, version, t0, vetted=True)

    def _fall_back(self, trainer: Any, turn: int, served_version: int, t0: float, vetted: bool = False) -> bool:
        """The served version reads beyond the tolerance on round `turn`, and over its two rounds too: a real
        loss, which the round that passed it did not show. Users must not keep it (the gate's promise), and no
        candidate near it passes (a student's run stalled so for 34 refusals: RESULTS 14d). Publish, as a new
        version, the newest of the last FALLBACKS before it that passed against the baseline and are within the
        tolerance by the same rule here, else the weights served at start; train on from there. True: the
        trainer holds them."""
        self.judged.add((served_version, turn))
        own = self._own(served_version, turn)
        if own is None or self._within(turn, self.served[(served_version, turn)], own):
            return False
        self.lost.update({served_version, self.origin.get(served_version, served_version)})
        start = self.start.version if self.start is not None else None
        for w in (*reversed(self.clean), self.start):  # the start is what the baseline was read on: within
            if w is None or ({w.version, self.origin.get(w.version, w.version)} & self.lost and w.version != start):
                continue
            w.restore(trainer)
            scores = self.score(trainer, self.rounds[turn])
            before = self._own(w.version, turn)
            if not self._within(turn, scores, before) and w.version != start:
                self.lost.add(w.version)
                continue
            trainer.version = served_version + 1
            # the same weights as w's: found beyond, they are w's loss too (else a fallback published them again)
            self.origin[trainer.version] = self.origin.get(w.version, w.version)
            # its drop per group over the rounds it has been read on (what `held_to` weighs later rounds against)
            self.passed_drops[trainer.version] = {
                g: ((before or {}).get(g, self.baselines[turn].get(g, 0.0) - v) + self.baselines[turn].get(g, 0.0) - v)
                / 2 for g, v in scores.items()}
            self.counts["fallbacks"] += 1
            self.counts["consecutive_refusals"] = 0
            self.last = Verdict(int(trainer.version), scores, True, time.perf_counter() - t0, "",
                                dict(self.baselines[turn]))
            served = self.served[(served_version, turn)]
            worst = max(served, key=lambda g: self.baselines[turn].get(g, 0.0) - served[g])
            log.warning("publish gate: the served v%d reads %s %.3f on %s vs baseline %.3f, %.3f below it over "
                        "its two rounds (tolerance %.3f): serving falls back to v%d's weights (%s here) as v%d, and "
                        "the trainer goes on from them", served_version, worst, served[worst],
                        "its next round (vetted once published)" if vetted else "this round",
                        self.baselines[turn].get(worst, 0.0), (self.baselines[turn].get(worst, 0.0) - served[worst]
                                                               + own.get(worst, 0.0)) / 2, self.tolerance,
                        w.version, _fmt(scores), trainer.version)
            return True
        self.roll_back(trainer)
        return False

    def held_to(self, turn: int, served: dict[str, float] | None,
                own: dict[str, float] | None = None) -> dict[str, float]:
        """What a candidate read on round `turn` is held to: the round's baseline, except in the groups where
        the served version itself reads beyond the tolerance on it (`served`, known after a first refusal
        there) while, averaged with its drop on the round it passed (`own`), it is within the tolerance: a
        harder draw, not a loss. That round cannot tell a candidate from the served weights, and refusing
        every candidate there would keep serving them for good; in those groups a candidate may read below the
        served version by no more than the tolerance it left unused over its two rounds (`_failed` names them,
        `_slack` holds that). With none (s19: held to the served reading exactly), a student's run stalled for
        93 refusals, each 0.012-0.016 below it (RESULTS 15e). Where the two rounds together put the served
        version beyond the tolerance, the baseline holds (a real loss is not ratcheted on)."""
        base = self.baselines[turn]
        if own is None:  # how the served version read on its own round is not known (a restart): no exception
            self._failed, self._slack = set(), {}
            return base
        two = {g: (base.get(g, 0.0) - v + own.get(g, 0.0)) / 2 for g, v in (served or {}).items()}
        self._failed = {g for g, v in (served or {}).items() if base.get(g, 0.0) - v > self.tolerance + 1e-9
                        and two[g] <= self.tolerance + 1e-9}
        self._slack = {g: max(MIN_SLACK, self.tolerance - two[g]) for g in self._failed}
        if not self._failed:
            return base
        return {g: (served[g] if g in self._failed else v) for g, v in base.items()}

    def keep(self, trainer: Any) -> None:
        """The trainer's weights are published: they are the rollback point now."""
        if not self.active:
            return
        t0 = time.perf_counter()
        old, self.snapshot = self.snapshot, Snapshot(trainer)
        self.last_snapshot_s = time.perf_counter() - t0
        if self._fresh and self.start is None:  # the weights the baseline was measured on
            self.start = self.snapshot.weights()
        elif old is not None and old.version not in self.lost and all(
                d <= self.tolerance + 1e-9 for d in self.passed_drops.get(old.version, {"": math.inf}).values()):
            self.clean = [*self.clean, old.weights()][-FALLBACKS:]  # the version just replaced passed the baseline

    def roll_back(self, trainer: Any) -> None:
        if self.snapshot is None:
            raise RuntimeError("publish gate: no rollback point (begin() was not called)")
        t0 = time.perf_counter()
        self.snapshot.restore(trainer)
        self.last_rollback_s = time.perf_counter() - t0

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the baseline and the set it was measured on."""
        return {"fingerprint": self.fingerprint, "baseline": dict(self.baseline),
                "baselines": [dict(b) for b in self.baselines]}

    def stats(self) -> dict[str, float]:
        out = {"gate/size": float(len(self.rounds[0]) if self.rounds else 0), "gate/pool": float(len(self.checks)),
               "gate/rounds": float(len(self.rounds)), "gate/tolerance": self.tolerance, "gate/lr_scale": self.lr_scale,
               "gate/hold_scale": self.hold_scale,
               **{f"gate/{k}": float(v) for k, v in self.counts.items()}}
        if not self.active:
            return out
        if self.baseline:
            out["gate/baseline"] = _mean(self.baseline)
            out.update({f"gate/baseline/{g}": v for g, v in self.baseline.items()})
            out["gate/baseline_s"] = self.baseline_s
        if self.last is not None:
            out["gate/score"] = _mean(self.last.scores)
            out.update({f"gate/score/{g}": v for g, v in self.last.scores.items()})
            out["gate/last_checked_version"] = float(self.last.version)
            out["gate/last_passed"] = float(self.last.passed)
            out["gate/last_check_s"] = self.last.seconds
            out["gate/last_snapshot_s"] = self.last_snapshot_s
            out["gate/last_rollback_s"] = self.last_rollback_s
        return out


def _mean(scores: dict[str, float]) -> float:
    """The groups' mean (each group counts once, whatever its size)."""
    return sum(scores.values()) / len(scores) if scores else 0.0


def _fmt(scores: dict[str, float]) -> str:
    return ", ".join(f"{g} {v:.3f}" for g, v in sorted(scores.items()))
