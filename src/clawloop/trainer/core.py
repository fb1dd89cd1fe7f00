"""The trainer: samples in, one optimizer step, new weights out.

One code path for full fine-tuning and LoRA: the only difference is which
parameters the optimizer sees and how the served weights are produced
(LoRA deltas are merged into a copy, never into the trained modules).

A step:
1. drop samples more than `max_staleness` versions older than the served policy;
2. cut the batch into micro-batches under a token budget; the aggregation
   denominator is computed over the whole step, so gradient accumulation equals
   one big batch;
3. per micro-batch: forward with grad; old logprobs = these logprobs detached
   (one update per batch, so PPO's ratio starts at 1 and the clip guards the
   update); truncated IS weights from old vs the engine's logprobs; advantages
   from the judge score and/or teacher-minus-old; PPO-clipped loss (+ KL, entropy);
4. clip gradients, AdamW step.

The OPD teacher sees the same conversation with the judge's hint appended to
the last user message, and scores the student's *sampled* response tokens:
the teacher sequence is teacher_prompt_ids + the same response ids.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from clawloop.losses import (
    aggregation_denominator,
    combined_advantages,
    entropy_bonus,
    kl_loss,
    load_custom_loss,
    ppo_clip_loss,
    staleness_filter,
    staleness_histogram,
    tis_weights,
)
from clawloop.records import Sample

log = logging.getLogger(__name__)

HINT_PREFIX = "\n\nHint: "


def teacher_messages(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """The conversation with the hint appended to the last user message (or, if
    there is none, as a system message at the front)."""
    msgs = [dict(m) for m in messages]
    for m in reversed(msgs):
        if m.get("role") == "user":
            m["content"] = (m.get("content") or "") + HINT_PREFIX + hint
            return msgs
    return [{"role": "system", "content": "Hint: " + hint}] + msgs


@dataclass
class _Batch:
    tokens: torch.Tensor  # (B, L) right-padded
    attn: torch.Tensor  # (B, L)
    mask: torch.Tensor  # (B, L-1) loss mask on the *predicted* positions
    engine_lp: torch.Tensor  # (B, L-1)
    has_engine_lp: torch.Tensor  # (B,)
    scores: torch.Tensor  # (B,) nan where no score
    teacher_lp: torch.Tensor | None  # (B, L-1) nan rows where no teacher
    adv: torch.Tensor | None  # (B, L-1) precomputed advantages (rollout-buffer groups)
    ref_lp: torch.Tensor | None  # (B, L-1)


def _pad(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
    L = max(len(r) for r in rows)
    out = torch.full((len(rows), L), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out


def token_logprobs(model: torch.nn.Module, tokens: torch.Tensor, attn: torch.Tensor,
                   want_logits: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for t in 0..L-2: (B, L-1)."""
    out = model(input_ids=tokens, attention_mask=attn, use_cache=False)
    logits = out.logits[:, :-1, :].float()  # (B, L-1, V)
    lp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (B, L-1)
    return lp, (logits if want_logits else None)


class Trainer:
    """Owns the trained model, the optimizer, the frozen reference/teacher, and
    the policy version of the weights it produces."""

    def __init__(self, cfg: Any, model_path: str, *, tokenizer: Any = None, device: str = "cpu"):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t = cfg.train
        self.cfg = cfg
        self.tc = t
        self.model_path = str(model_path)
        self.device = torch.device(device)
        torch.manual_seed(t.seed)
        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(self.model_path)
        base = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32).to(self.device)
        self.use_lora = bool(t.use_lora)
        needs_frozen = (t.method in ("opd", "combine") and t.teacher == "frozen") or t.kl_coef > 0
        self.frozen = None
        if needs_frozen:
            self.frozen = copy.deepcopy(base).eval().requires_grad_(False)
        if self.use_lora:
            from peft import LoraConfig, get_peft_model

            lcfg = LoraConfig(r=t.lora_rank, lora_alpha=t.lora_alpha, lora_dropout=t.lora_dropout,
                              target_modules=list(t.lora_target_modules), task_type="CAUSAL_LM")
            self.model = get_peft_model(base, lcfg)
        else:
            self.model = base
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        kw = dict(lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay)
        try:  # one fused kernel instead of a per-parameter loop (CPU and CUDA, torch >= 2.4)
            self.opt = torch.optim.AdamW(self.params, fused=True, **kw)
        except (RuntimeError, TypeError):
            self.opt = torch.optim.AdamW(self.params, **kw)
        self.custom_loss = load_custom_loss(t.custom_loss_function_path) if t.custom_loss_function_path else None
        self.step_count = 0
        self.version = 0
        self.tokens_trained = 0
        self.last: dict[str, float] = {}

    # -- weights ---------------------------------------------------------------
    def served_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights as the engine serves them: a detached copy; LoRA deltas merged."""
        with torch.no_grad():
            if not self.use_lora:
                return {k: v.detach().clone() for k, v in self.model.state_dict().items()}
            from peft.tuners.lora import LoraLayer

            inner = self.model.base_model.model
            sd = {}
            deltas = {}
            for name, mod in inner.named_modules():
                if isinstance(mod, LoraLayer) and hasattr(mod, "get_delta_weight"):
                    deltas[name + ".weight"] = mod.get_delta_weight("default")
            for k, v in inner.state_dict().items():
                if "lora_" in k:
                    continue
                k2 = k.replace(".base_layer.", ".")
                sd[k2] = v.detach().clone()
                if k2 in deltas:
                    sd[k2] += deltas[k2].to(sd[k2].dtype)
            return sd

    # -- samples ---------------------------------------------------------------
    def teacher_logprobs_for(self, samples: list[Sample]) -> list[list[float] | None]:
        """Teacher logprobs of each sample's response tokens (aligned with tokens), None without a hint."""
        from clawloop.gateway.render import render_prompt

        teacher = self.frozen if self.tc.teacher == "frozen" else self.model
        rows, idx = [], []
        for i, s in enumerate(samples):
            if not s.hint or not s.messages:
                continue
            tp = render_prompt(self.tokenizer, teacher_messages(s.messages, s.hint), s.tools)
            rows.append((tp, s.response_ids))
            idx.append(i)
        out: list[list[float] | None] = [None] * len(samples)
        if not rows:
            return out
        with torch.no_grad():
            seqs = [tp + list(r) for tp, r in rows]
            tokens = _pad(seqs, self.tokenizer.pad_token_id or 0, torch.long).to(self.device)
            attn = _pad([[1] * len(x) for x in seqs], 0, torch.long).to(self.device)
            was = teacher.training
            teacher.eval()
            lp, _ = token_logprobs(teacher, tokens, attn)  # (B, L-1)
            teacher.train(was)
        for j, (tp, resp) in enumerate(rows):
            s = samples[idx[j]]
            n = len(resp)
            resp_lp = lp[j, len(tp) - 1: len(tp) - 1 + n].tolist()
            out[idx[j]] = [0.0] * s.prompt_len + resp_lp
        return out

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        budget = max(1, self.tc.micro_batch_tokens)
        batches, cur, longest = [], [], 0
        for s in sorted(samples, key=lambda s: len(s.tokens)):
            L = max(longest, len(s.tokens))
            if cur and L * (len(cur) + 1) > budget:
                batches.append(cur)
                cur, L = [], len(s.tokens)
            cur.append(s)
            longest = L
        if cur:
            batches.append(cur)
        return batches

    def _tensorize(self, samples: list[Sample], teacher: list[list[float] | None] | None,
                   ref: bool) -> _Batch:
        pad = self.tokenizer.pad_token_id or 0
        tokens = _pad([s.tokens for s in samples], pad, torch.long).to(self.device)
        attn = _pad([[1] * len(s.tokens) for s in samples], 0, torch.long).to(self.device)
        mask = _pad([s.loss_mask[1:] for s in samples], 0, torch.long).to(self.device)
        has_engine = torch.tensor([any(x != 0.0 for x in s.rollout_logprobs) for s in samples])
        engine_lp = _pad([s.rollout_logprobs[1:] for s in samples], 0.0, torch.float32).to(self.device)
        scores = torch.tensor([float("nan") if s.reward is None else float(s.reward) for s in samples])
        tl = None
        if teacher is not None and any(t is not None for t in teacher):
            tl = _pad([(t[1:] if t is not None else [float("nan")] * (len(s.tokens) - 1))
                       for s, t in zip(samples, teacher)], float("nan"), torch.float32).to(self.device)
        adv = None
        if any(s.advantages is not None for s in samples):
            adv = _pad([(s.advantages[1:] if s.advantages is not None else [0.0] * (len(s.tokens) - 1))
                        for s in samples], 0.0, torch.float32).to(self.device)
        ref_lp = None
        if ref and self.frozen is not None:
            with torch.no_grad():
                ref_lp, _ = token_logprobs(self.frozen, tokens, attn)
        return _Batch(tokens, attn, mask, engine_lp, has_engine, scores, tl, adv, ref_lp)

    # -- the step ------------------------------------------------------------
    def step(self, samples: list[Sample], served_version: int | None = None) -> dict[str, float]:
        """One optimizer step on `samples`; returns stats (train/...)."""
        t0 = time.perf_counter()
        t = self.tc
        current = self.version if served_version is None else served_version
        keep, dropped = staleness_filter([s.policy_version for s in samples], current, t.max_staleness)
        hist = staleness_histogram([s.policy_version for s in samples], current) if samples else {}
        samples = [s for s, k in zip(samples, keep.tolist()) if k]
        stats: dict[str, float] = {"train/stale_dropped": float(dropped)}
        for k, n in hist.items():
            stats[f"train/staleness_{k}"] = float(n)
        if not samples:
            stats["train/skipped_step"] = 1.0
            return stats
        use_rl = t.method in ("binary", "combine")
        use_opd = t.method in ("opd", "combine")
        teacher = self.teacher_logprobs_for(samples) if use_opd else None
        batches = self._micro_batches(samples)
        if teacher is not None:
            by_id = {id(s): tl for s, tl in zip(samples, teacher)}
        tensors = [self._tensorize(mb, [by_id[id(s)] for s in mb] if teacher is not None else None,
                                   ref=t.kl_coef > 0) for mb in batches]
        denom = sum(aggregation_denominator(b.mask, t.loss_agg) for b in tensors)
        self.opt.zero_grad(set_to_none=True)
        acc: dict[str, list[float]] = {}
        n_tokens = 0
        for b in tensors:
            lp, logits = token_logprobs(self.model, b.tokens, b.attn, want_logits=t.entropy_coef > 0)
            old = lp.detach()
            is_w, tis_stats = tis_weights(old, torch.where(b.has_engine_lp[:, None], b.engine_lp, old), b.mask,
                                          cap=t.tis_cap or None)
            if b.adv is not None:
                adv, adv_stats = b.adv * b.mask, {}
            else:
                adv, adv_stats = combined_advantages(
                    b.scores if use_rl else torch.full_like(b.scores, float("nan")),
                    b.teacher_lp if use_opd else None, old, b.mask,
                    w_rl=t.w_rl if use_rl else 0.0, w_opd=t.w_opd if use_opd else 0.0)
            knobs = dict(eps_clip=t.eps_clip, eps_clip_high=t.eps_clip_high, dual_clip=t.dual_clip or None,
                         agg=t.loss_agg, denominator=denom, is_weights=is_w)
            loss_fn = self.custom_loss or ppo_clip_loss
            loss, s = loss_fn(lp, old, adv, b.mask, **knobs)
            if b.ref_lp is not None:
                kl, kl_s = kl_loss(lp, b.ref_lp, b.mask, kind=t.kl_type, coef=t.kl_coef, agg=t.loss_agg,
                                   denominator=denom)
                loss = loss + kl
                s.update(kl_s)
            if logits is not None:
                ent, ent_s = entropy_bonus(logits, b.mask, coef=t.entropy_coef, agg=t.loss_agg, denominator=denom)
                loss = loss + ent
                s.update(ent_s)
            loss.backward()
            w = float(b.mask.sum())
            n_tokens += int(w)
            for k, v in {**s, **tis_stats, **adv_stats}.items():
                acc.setdefault(k, []).append(v * w)
            acc.setdefault("_w", []).append(w)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, t.grad_clip if t.grad_clip > 0 else float("inf"))
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.step_count += 1
        self.version += 1
        self.tokens_trained += n_tokens
        total_w = max(sum(acc.pop("_w")), 1.0)
        for k, vs in acc.items():
            stats[k] = sum(vs) / total_w
        zero_adv = sum(1 for s in samples if (s.reward in (None, 0) or not use_rl)
                       and not (use_opd and s.hint) and s.advantages is None)
        dt = time.perf_counter() - t0
        stats.update({
            "train/step": float(self.step_count), "train/policy_version": float(self.version),
            "train/samples": float(len(samples)), "train/micro_batches": float(len(batches)),
            "train/tokens": float(n_tokens), "train/tokens_per_s": n_tokens / dt if dt > 0 else 0.0,
            "train/step_s": dt, "train/grad_norm": float(grad_norm) if math.isfinite(float(grad_norm)) else -1.0,
            "train/zero_adv_frac": zero_adv / len(samples), "train/lr": t.lr,
        })
        if stats.get("train/logprob_diff_abs_mean", 0.0) > 0.5:
            log.warning("trainer and engine logprobs differ by %.3f on average: check that the engine serves the "
                        "trained weights (train/logprob_diff_abs_mean)", stats["train/logprob_diff_abs_mean"])
        self.last = stats
        return stats
