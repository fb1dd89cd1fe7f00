"""Rehearsal: the model's own right answers at start, replayed so that training on feedback does not
spend what the feedback never mentioned.

A persona's feedback is about one thing (the form of an answer) and every update moves the whole model:
on the tiny model each student update cost 0.01-0.03 of its sampled facts in every form, each teacher
update its sums (bench/RESULTS.md "Why the loop made the model worse" 8). Continual learning's answer is
rehearsal (replaying old data beside the new; InstructGPT's PPO-ptx mixes pretraining gradients into
RL for the same reason). What is replayed here is what the model could do when training started:

- At start, on the weights then served, the model answers a set of checked prompts (`checks`: the
  tiny model's built-in checks drawn on the corpus's own arithmetic, not the gate's held-out ones, and a
  user's `--regression-set`), `samples` replies each at T=1, fixed seeds. Replies the check passes are
  kept: right answers in the forms the model chose.
- Within each kept reply only the positions the model was **sure** of (its probability of the token it
  wrote at least `sure`) are held: the digits after "The answer is", the name of a capital, the rest of
  a word. Where it was choosing (the first token, which decides the form; "." or "!" at the end) it is
  left free, since that is what users' feedback may teach; with `choices` > 0 (`--rehearsal-choices`) it is
  held loosely: the tokens the model found plausible there (probability >= choices x its top token's:
  "The", "the", "THE" and "London" after "What is the capital of England?") are one bucket, so the form
  may move among them, while the implausible ones ("Rome") stay where they were; a student's training
  moved the tiny model to bare answers that named another question's fact. The base distribution is kept as its
  top-K (`topk` ids and logprobs, a tail bucket for the rest: `losses/topk.py`), so nothing but the
  policy runs per step and a real model's vocabulary costs K numbers a position.
- Each optimizer update adds `coef` x the reverse KL from the policy to those top-K distributions on
  `rows` replayed replies (taken in a fixed shuffled order, round after round), with its own token-mean:
  the method's objective and its numbers are untouched.

Stats: train/rehearsal_kl (before the update, the mean KL on the rows drawn), train/rehearsal_rows;
`Rehearsal.info` says what was built (rows, held positions, how long).
"""

from __future__ import annotations

import logging
import math
import random
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from clawloop.losses.topk import topk_distill_loss
from clawloop.trainer.batch import pad_rows
from clawloop.trainer.gate import Check, builtin_checks, is_tiny_model, load_regression_set, styled_checks
from clawloop.trainer.generation import generate_rows

log = logging.getLogger(__name__)

SEED = 2027
"""Seeds the built-in prompts (corpus arithmetic) and the replies; the gate's checks use another."""


@dataclass
class Row:
    tokens: list[int]
    """Prompt and reply ids."""
    positions: list[int]
    """Indices into `tokens[1:]` (the position predicting token i + 1) the model was sure of."""
    topk_ids: torch.Tensor
    """(n, K) long: the base distribution's K most likely ids at each of `positions`."""
    topk_lp: torch.Tensor
    """(n, K) float: their logprobs."""
    merged: torch.Tensor | None = None
    """(n, K) bool: at a choosing position, the tokens the model found plausible there (one bucket)."""


def rehearsal_checks(cfg: Any, model_path: str) -> list[Check]:
    """The prompts rehearsed under `cfg`: the tiny model's built-in checks drawn on corpus arithmetic (when
    `gate.builtin` allows them) and the user's `--regression-set`. Empty: nothing to rehearse."""
    g = cfg.gate
    checks: list[Check] = []
    if g.builtin == "on" or (g.builtin == "auto" and is_tiny_model(model_path)):
        checks += builtin_checks(g.builtin_checks, g.max_tokens, seed=SEED, heldout=False)
        if cfg.train.rehearsal_forms:
            checks += styled_checks(g.builtin_checks, g.max_tokens, seed=SEED)
    if g.regression_set:
        checks += load_regression_set(g.regression_set, g.max_tokens)
    return checks


class Rehearsal:
    """Rows built once (`build`), a loss per optimizer update (`loss`)."""

    def __init__(self, checks: list[Check], *, rows: int, coef: float, sure: float, samples: int = 2,
                 topk: int = 16, batch_size: int = 64, seed: int = SEED, choices: float = 0.0):
        if rows < 1 or coef < 0 or not 0.0 < sure <= 1.0 or samples < 1 or topk < 1:
            raise ValueError(f"rehearsal: rows >= 1, coef >= 0, 0 < sure <= 1, samples >= 1, topk >= 1; got "
                             f"{rows}, {coef}, {sure}, {samples}, {topk}")
        self.checks, self.n_rows, self.coef, self.sure = checks, rows, float(coef), float(sure)
        self.samples, self.topk, self.batch_size, self.seed = samples, topk, batch_size, seed
        if not 0.0 <= choices < 1.0:
            raise ValueError(f"rehearsal: choices must be in [0, 1), got {choices}")
        self.choices = float(choices)
        self.rows: list[Row] = []
        self.order: list[int] = []
        self.next = 0
        self.info: dict[str, float] = {}

    @classmethod
    def from_config(cls, cfg: Any, model_path: str) -> "Rehearsal | None":
        t = cfg.train
        if t.rehearsal_rows <= 0 or t.rehearsal_coef <= 0:
            return None
        checks = rehearsal_checks(cfg, model_path)
        if not checks:
            return None
        return cls(checks, rows=t.rehearsal_rows, coef=t.rehearsal_coef, sure=t.rehearsal_sure,
                   batch_size=cfg.gate.batch_size, choices=t.rehearsal_choices)

    def build(self, trainer: Any) -> None:
        """Answer the checks with the trainer's weights as they are now and keep the right replies' sure
        positions with their top-K."""
        t0 = time.perf_counter()
        model = trainer.model
        was = model.training
        model.eval()
        asked = [c for c in self.checks for _ in range(self.samples)]
        try:
            out = generate_rows(model, trainer.tokenizer, asked, batch_size=self.batch_size,
                                autocast_dtype=getattr(trainer, "autocast_dtype", None), temperature=1.0,
                                seed=self.seed)
            right = []
            for c, (text, prompt, reply) in zip(asked, out):
                try:
                    ok = float(c.score(text)) >= 1.0
                except Exception:  # noqa: BLE001 - a user's checker: its bug keeps the reply out
                    ok = False
                if ok and reply:
                    right.append((prompt, reply))
            self.rows = [r for r in (self._row(model, p, a) for p, a in right) if r is not None]
        finally:
            model.train(was)
        random.Random(self.seed).shuffle(order := list(range(len(self.rows))))
        self.order, self.next = order, 0
        held = sum(len(r.positions) for r in self.rows)
        choosing = sum(int(r.merged.any(-1).sum()) for r in self.rows if r.merged is not None)
        self.info = {"rehearsal/replies": float(len(asked)), "rehearsal/right": float(len(right)),
                     "rehearsal/rows": float(len(self.rows)), "rehearsal/held_positions": float(held),
                     "rehearsal/choosing_positions": float(choosing),
                     "rehearsal/build_s": time.perf_counter() - t0}
        if not self.rows:
            log.warning("rehearsal: none of %d replies at start was right with a sure token: nothing to rehearse",
                        len(asked))
        else:
            log.info("rehearsal: %d right replies of %d at start, %d sure positions held (%.1f s)", len(self.rows),
                     len(asked), held, self.info["rehearsal/build_s"])

    @torch.no_grad()
    def _row(self, model: torch.nn.Module, prompt: list[int], reply: list[int]) -> Row | None:
        device = next(model.parameters()).device
        tokens = prompt + reply
        logp = torch.log_softmax(model(input_ids=torch.tensor([tokens], device=device)).logits[0, :-1].float(),
                                 dim=-1)  # (L-1, V)
        first = len(prompt) - 1  # position predicting the first reply token
        targets = torch.tensor(tokens[1:], device=device)  # (L-1,)
        lp = logp.gather(-1, targets[:, None]).squeeze(-1)  # (L-1,)
        sure = [float(lp[i].exp()) >= self.sure for i in range(first, len(tokens) - 1)]
        positions = [i for i, s in zip(range(first, len(tokens) - 1), sure) if s or self.choices > 0]
        if not any(sure):
            return None
        top = logp[positions].topk(min(self.topk, logp.shape[-1]), dim=-1)  # (n, K)
        merged = None
        if self.choices > 0:  # where it chose: its plausible tokens one bucket (the form free, the rest held)
            choosing = torch.tensor([not s for s in sure], device=top.values.device)  # (n,)
            plausible = top.values >= top.values[:, :1] + math.log(self.choices)  # (n, K)
            merged = (plausible & choosing[:, None]).cpu()  # (n, K)
        return Row(tokens, positions, top.indices.cpu(), top.values.cpu(), merged)

    def draw(self) -> list[Row]:
        """The next `rows` rows in the shuffled order, starting over when it runs out."""
        picked = []
        for _ in range(min(self.n_rows, len(self.rows))):
            picked.append(self.rows[self.order[self.next]])
            self.next = (self.next + 1) % len(self.order)
        return picked

    def loss(self, model: torch.nn.Module, device: torch.device, pad_id: int,
             autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor | None, dict[str, float]]:
        """coef x the token-mean reverse KL to the base top-K on the next rows' sure positions (None: no rows)."""
        rows = self.draw()
        if not rows:
            return None, {}
        tokens = pad_rows([r.tokens for r in rows], pad_id, torch.long, device)  # (B, L)
        attn = pad_rows([[1] * len(r.tokens) for r in rows], 0, torch.long, device)  # (B, L)
        a = min(r.positions[0] for r in rows)
        e = max(r.positions[-1] for r in rows) + 1
        B, W, K = len(rows), e - a, rows[0].topk_ids.shape[-1]
        mask = torch.zeros((B, W), dtype=torch.long, device=device)  # (B, W)
        ids = torch.zeros((B, W, K), dtype=torch.long, device=device)  # (B, W, K)
        lps = torch.full((B, W, K), -30.0, dtype=torch.float32, device=device)  # (B, W, K)
        merged = torch.zeros((B, W, K), dtype=torch.bool, device=device) if self.choices > 0 else None
        for b, r in enumerate(rows):
            pos = torch.tensor(r.positions, device=device) - a  # (n,)
            mask[b, pos] = 1
            ids[b, pos] = r.topk_ids.to(device)
            lps[b, pos] = r.topk_lp.to(device)
            if merged is not None and r.merged is not None:
                merged[b, pos] = r.merged.to(device)
        ctx = torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype is not None else nullcontext()
        with ctx:
            logits = model(input_ids=tokens[:, :e + 1], attention_mask=attn[:, :e + 1]).logits[:, a:e]  # (B, W, V)
        if merged is None:
            kl, s = topk_distill_loss(logits.float(), ids, lps, mask, agg="token-mean")
        else:  # the choosing positions (~1 in 6) a mean of their own: beside the sure ones they would vanish
            choosing = merged.any(-1)  # (B, W)
            kl, s = topk_distill_loss(logits.float(), ids, lps, mask * ~choosing, agg="token-mean")
            if bool(choosing.any()):
                kc, sc = topk_distill_loss(logits.float(), ids, lps, mask * choosing, agg="token-mean", merged=merged)
                kl = kl + kc
                s = {"train/topk_kl": s["train/topk_kl"] + sc["train/topk_kl"]}
        return self.coef * kl, {"train/rehearsal_kl": s.get("train/topk_kl", float(kl.detach())),
                                "train/rehearsal_rows": float(B)}


def recover_step(trainer: Any, draws: int = 4) -> dict[str, float]:
    """One optimizer update of `trainer` on rehearsal alone (`draws` of its rows, no feedback): a recovery step,
    as CPO takes when its constraint cannot be met. The publish gate asks for it where every step in the
    feedback's direction, however short and however hard rehearsal is held, loses more than it allows (the
    served version at the tolerance's edge: 54 refusals in a row, each 0.012 below the served reading, RESULTS
    16); a step that only restores what the model could do moves the served weights back inside, and the
    feedback's steps have room again. A skipped step (no rehearsal) changes nothing."""
    if trainer.rehearsal is None:
        return {"train/skipped_step": 1.0}
    t0 = time.perf_counter()
    trainer.opt.zero_grad(set_to_none=True)
    got: list[dict[str, float]] = []
    for _ in range(max(1, draws)):
        rloss, rs = trainer.rehearsal.loss(trainer.model, trainer.device, trainer.pad_id, trainer.autocast_dtype)
        if rloss is None:
            break
        (rloss / max(1, draws)).backward()
        got.append(rs)
    if not got:
        trainer.opt.zero_grad(set_to_none=True)
        return {"train/skipped_step": 1.0}
    g = float(trainer._optimizer_step())
    trainer.step_count += 1
    trainer.version += 1
    stats = {"train/recovery_step": 1.0, "train/step": float(trainer.step_count),
             "train/policy_version": float(trainer.version), "train/grad_norm": g if math.isfinite(g) else -1.0,
             "train/lr": trainer.lr, "train/step_s": time.perf_counter() - t0,
             **{k: sum(r.get(k, 0.0) for r in got) / len(got) for k in ("train/rehearsal_kl", "train/rehearsal_rows")}}
    trainer.last = stats
    return stats
