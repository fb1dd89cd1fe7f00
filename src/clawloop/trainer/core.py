"""The trainer: samples in, one optimizer step, new weights out.

One code path for full fine-tuning and LoRA: the only difference is which
parameters the optimizer sees and how the served weights are produced
(LoRA deltas are merged into a copy, never into the trained modules).

Placement: `train.device` (auto: cuda when torch sees one) and TRAIN_GPUS pick
one device (`resolve_train_device`); every tensor of a step lives there. On
CUDA the forwards run under bf16 autocast while the master weights, gradients
and AdamW state stay float32, and logprobs are taken with log_softmax on
float32 logits, so the PPO ratio and the TIS weights are not bf16 noise. With
`offload_optimizer_state` the optimizer steps float32 copies of the trainable
weights kept in CPU memory (its state lives beside them), and the result is
copied back to the device: AdamW's two moments are twice the weights, which is
what does not fit beside a big model on one GPU. The published weights are
always CPU tensors.

A step:
1. remove response tokens more than `max_staleness` versions older than the
   served policy from the loss mask (per token: an engine that swaps weights
   mid-response yields samples from two versions) and drop samples with no
   trainable token left;
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

import contextlib
import copy
import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
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
    staleness_histogram,
    staleness_token_mask,
    tis_weights,
    behaviour_logprobs,
)
from clawloop.engines.base import LoraAdapter
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
    temperature: torch.Tensor  # (B,) sampling temperature (1: the raw distribution)
    top_p: torch.Tensor  # (B,)

    @property
    def tempered(self) -> torch.Tensor:
        """(B,) rows sampled from something other than the raw distribution the engine logprobs describe."""
        return (self.temperature != 1.0) | (self.top_p < 1.0)


def resolve_train_device(device: str = "auto", train_gpus: Sequence[Any] = ()) -> torch.device:
    """The trainer's device from `train.device` and `train.train_gpus` (TRAIN_GPUS).

    auto: cuda when torch sees a CUDA device, else cpu. auto or cuda with TRAIN_GPUS: cuda:<first
    id>; with several ids only the first is used until data-parallel training exists. Plain cuda
    without TRAIN_GPUS is cuda:0. cuda:N names the device itself (a TRAIN_GPUS that disagrees is
    ignored, with a warning). Ids count the GPUs this process sees, so CUDA_VISIBLE_DEVICES
    renumbers them. Asking for cuda where torch sees none is a ConfigError, not a silent CPU run.
    """
    from clawloop.config import ConfigError

    dev = str(device).strip().lower()
    gpus = [str(g).strip() for g in train_gpus if str(g).strip()]
    if dev not in ("auto", "cpu", "cuda") and not (dev.startswith("cuda:") and dev[5:].isdigit()):
        raise ConfigError(f"train.device: must be auto, cpu, cuda or cuda:N, got {device!r}")
    bad = [g for g in gpus if not g.isdigit()]
    if bad:
        raise ConfigError(f"train.train_gpus: must be GPU ids like 0,1, got {bad[0]!r}")
    if dev == "cpu":
        if gpus:
            log.warning("train.device is cpu: TRAIN_GPUS=%s ignored", ",".join(gpus))
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if dev != "auto":
            raise ConfigError(f"train.device: {dev} asked for, but torch sees no CUDA device "
                              "(use --train-device cpu or auto)")
        if gpus:
            log.warning("TRAIN_GPUS=%s, but torch sees no CUDA device: the trainer runs on cpu", ",".join(gpus))
        return torch.device("cpu")
    key = "train.device"
    if dev.startswith("cuda:"):
        index = int(dev[5:])
        if gpus and int(gpus[0]) != index:
            log.warning("train.device %s and TRAIN_GPUS=%s disagree: the trainer uses %s", dev, ",".join(gpus), dev)
    elif gpus:
        key, index = "train.train_gpus", int(gpus[0])
        if len(gpus) > 1:
            log.warning("TRAIN_GPUS=%s: the trainer uses cuda:%d only (no data-parallel training yet)",
                        ",".join(gpus), index)
    else:
        index = 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"{key}: cuda:{index} does not exist, torch sees {count} CUDA device(s)")
    return torch.device("cuda", index)


def _pad(rows: list[list[Any]], value: Any, dtype: torch.dtype, device: torch.device | None = None) -> torch.Tensor:
    L = max(len(r) for r in rows)
    out = torch.full((len(rows), L), value, dtype=dtype)
    for i, r in enumerate(rows):
        out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out if device is None else out.to(device)


def _sampling(s: Sample, key: str) -> float:
    """A sample's sampling parameter; 1.0 (the raw distribution) when it was not recorded."""
    v = (s.sampling or {}).get(key)
    return 1.0 if v is None else float(v)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def token_logprobs(model: torch.nn.Module, tokens: torch.Tensor, attn: torch.Tensor,
                   want_logits: bool = False, *,
                   autocast_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for t in 0..L-2: (B, L-1).

    `autocast_dtype` (bf16 on CUDA) covers the model's forward only: the log_softmax runs on
    float32 logits outside it."""
    with _autocast(tokens.device, autocast_dtype):
        out = model(input_ids=tokens, attention_mask=attn, use_cache=False)
    logits = out.logits[:, :-1, :].float()  # (B, L-1, V)
    lp = torch.log_softmax(logits, dim=-1).gather(-1, tokens[:, 1:, None]).squeeze(-1)  # (B, L-1)
    return lp, (logits if want_logits else None)


class Trainer:
    """Owns the trained model, the optimizer, the frozen reference/teacher, and
    the policy version of the weights it produces."""

    def __init__(self, cfg: Any, model_path: str, *, tokenizer: Any = None,
                 device: str | torch.device | None = None, _force_offload: bool = False):
        """`device` None: resolved from `train.device` and TRAIN_GPUS (`resolve_train_device`).
        `_force_offload` runs the CPU-offloaded optimizer on a CPU trainer too (tests only: it
        is how the offload path is compared with the plain one where there is no GPU)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t = cfg.train
        self.cfg = cfg
        self.tc = t
        self.model_path = str(model_path)
        self.device = torch.device(device) if device is not None else resolve_train_device(t.device, t.train_gpus)
        # bf16 matmuls on CUDA; on CPU autocast is slower than float32 and changes nothing we need
        self.autocast_dtype = torch.bfloat16 if self.device.type == "cuda" else None
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
        self.offload = bool(t.offload_optimizer_state) and (self.device.type != "cpu" or _force_offload)
        if t.offload_optimizer_state and not self.offload:
            log.info("offload_optimizer_state: the trainer runs on cpu, where the optimizer state already "
                     "lives; nothing to offload")
        # the optimizer's own parameters: float32 CPU masters when offloading, else the model's
        self.masters: list[torch.Tensor] | None = None
        if self.offload:
            self.masters = [p.detach().to("cpu", dtype=torch.float32, copy=True) for p in self.params]
        kw = dict(lr=t.lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay)
        opt_params = self.masters if self.masters is not None else self.params
        try:  # one fused kernel instead of a per-parameter loop (CPU and CUDA, torch >= 2.4)
            self.opt = torch.optim.AdamW(opt_params, fused=True, **kw)
        except (RuntimeError, TypeError):
            self.opt = torch.optim.AdamW(opt_params, **kw)
        log.info("trainer on %s%s, float32 master weights%s%s", self.device,
                 " with bf16 autocast" if self.autocast_dtype is not None else "",
                 ", AdamW state in CPU memory" if self.offload else "", ", LoRA" if self.use_lora else "")
        self.custom_loss = load_custom_loss(t.custom_loss_function_path) if t.custom_loss_function_path else None
        self.step_count = 0
        self.version = 0
        self.tokens_trained = 0
        self.last: dict[str, float] = {}

    # -- weights ---------------------------------------------------------------
    def served_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights as the engine serves them: a detached CPU copy (the engine writes it to
        disk or loads it into its own model, wherever the trainer runs); LoRA deltas merged."""
        with torch.no_grad():
            if not self.use_lora:
                return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
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
                w = v.detach()
                sd[k2] = (w + deltas[k2].to(w.dtype)).cpu() if k2 in deltas else w.to("cpu", copy=True)
            return sd

    def lora_adapter(self) -> LoraAdapter:
        """The trained adapter as engines that hot-load adapters take it (vLLM): CPU tensors under
        peft's saved names, and the config as peft writes `adapter_config.json`. Publishing it
        moves megabytes where the merged weights are the whole model."""
        if not self.use_lora:
            raise RuntimeError("lora_adapter: this trainer trains all weights (train.use_lora is off)")
        from peft import get_peft_model_state_dict

        with torch.no_grad():
            sd = {k: v.detach().to("cpu", copy=True).contiguous()
                  for k, v in get_peft_model_state_dict(self.model).items()}
        return LoraAdapter(state_dict=sd, config=self.lora_config())

    def lora_config(self) -> dict[str, Any]:
        """peft's `adapter_config.json` content for the trained adapter (JSON types only)."""
        conf = self.model.peft_config["default"].to_dict()
        # what PeftModel.save_pretrained changes before writing: sets become lists, inference mode
        # on, the base model named
        conf = {k: (sorted(v, key=str) if isinstance(v, (set, frozenset)) else v) for k, v in conf.items()}
        conf["inference_mode"] = True
        conf["base_model_name_or_path"] = self.model_path
        return json.loads(json.dumps(conf, default=lambda x: sorted(x, key=str) if isinstance(x, (set, frozenset))
                                     else getattr(x, "value", str(x))))

    def reload_masters(self) -> None:
        """Copy the model's weights into the offloaded float32 masters (after a checkpoint load)."""
        if self.masters is None:
            return
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                m.copy_(p.detach())

    def _optimizer_step(self) -> torch.Tensor:
        """Clip the gradients and step AdamW; returns the gradient norm before clipping.

        Offloaded: the clipped gradients go to the CPU masters, AdamW steps there (its state
        lives beside them), and the new weights are copied back to the device."""
        t = self.tc
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, t.grad_clip if t.grad_clip > 0 else float("inf"))
        if self.masters is None:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            return grad_norm
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                m.grad = None if p.grad is None else p.grad.to("cpu", dtype=torch.float32)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            for p, m in zip(self.params, self.masters):
                p.copy_(m)
                p.grad = None
        return grad_norm

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
            tokens = _pad(seqs, self.tokenizer.pad_token_id or 0, torch.long, self.device)  # (B, L)
            attn = _pad([[1] * len(x) for x in seqs], 0, torch.long, self.device)  # (B, L)
            was = teacher.training
            teacher.eval()
            lp, _ = token_logprobs(teacher, tokens, attn, autocast_dtype=self.autocast_dtype)  # (B, L-1)
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
        dev = self.device
        tokens = _pad([s.tokens for s in samples], pad, torch.long, dev)  # (B, L)
        attn = _pad([[1] * len(s.tokens) for s in samples], 0, torch.long, dev)  # (B, L)
        mask = _pad([s.loss_mask[1:] for s in samples], 0, torch.long, dev)  # (B, L-1)
        has_engine = torch.tensor([any(x != 0.0 for x in s.rollout_logprobs) for s in samples], device=dev)  # (B,)
        engine_lp = _pad([s.rollout_logprobs[1:] for s in samples], 0.0, torch.float32, dev)  # (B, L-1)
        scores = torch.tensor([float("nan") if s.reward is None else float(s.reward) for s in samples],
                              device=dev)  # (B,)
        tl = None
        if teacher is not None and any(t is not None for t in teacher):
            tl = _pad([(t[1:] if t is not None else [float("nan")] * (len(s.tokens) - 1))
                       for s, t in zip(samples, teacher)], float("nan"), torch.float32, dev)  # (B, L-1)
        adv = None
        if any(s.advantages is not None for s in samples):
            adv = _pad([(s.advantages[1:] if s.advantages is not None else [0.0] * (len(s.tokens) - 1))
                        for s in samples], 0.0, torch.float32, dev)  # (B, L-1)
        ref_lp = None
        if ref and self.frozen is not None:
            with torch.no_grad():
                ref_lp, _ = token_logprobs(self.frozen, tokens, attn, autocast_dtype=self.autocast_dtype)
        temps = torch.tensor([_sampling(s, "temperature") for s in samples], device=dev)  # (B,)
        top_p = torch.tensor([_sampling(s, "top_p") for s in samples], device=dev)  # (B,)
        return _Batch(tokens, attn, mask, engine_lp, has_engine, scores, tl, adv, ref_lp, temps, top_p)

    def _mask_stale_tokens(self, samples: list[Sample], current: int) -> tuple[list[Sample], int, int]:
        """The staleness bound per token: (samples with stale response tokens taken out of their loss
        mask, tokens so masked, samples dropped because no trainable token was left)."""
        out, masked, dropped = [], 0, 0
        for s in samples:
            versions = ([s.policy_version] * len(s.tokens) if s.rollout_versions is None
                        else s.rollout_versions)
            keep, n = staleness_token_mask(torch.tensor(versions), torch.tensor(s.loss_mask), current,
                                           self.tc.max_staleness)  # (T,)
            masked += n
            if n == 0:
                out.append(s)
            elif not bool(keep.any()):
                dropped += 1
            else:
                out.append(dataclasses.replace(s, loss_mask=keep.long().tolist()))
        return out, masked, dropped

    # -- the step ------------------------------------------------------------
    def step(self, samples: list[Sample], served_version: int | None = None) -> dict[str, float]:
        """One optimizer step on `samples`; returns stats (train/...)."""
        t0 = time.perf_counter()
        t = self.tc
        current = self.version if served_version is None else served_version
        hist = staleness_histogram([s.policy_version for s in samples], current) if samples else {}
        mixed = sum(1 for s in samples if s.mixed_versions)
        samples, masked, dropped = self._mask_stale_tokens(samples, current)
        stats: dict[str, float] = {"train/stale_dropped": float(dropped), "train/stale_tokens_masked": float(masked),
                                   "train/mixed_version_samples": float(mixed)}
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
        n_tempered = 0
        for b in tensors:
            tempered = bool(b.tempered.any())
            lp, logits = token_logprobs(self.model, b.tokens, b.attn, want_logits=t.entropy_coef > 0 or tempered,
                                        autocast_dtype=self.autocast_dtype)  # (B, L-1)
            old = lp.detach()
            behaviour = torch.where(b.has_engine_lp[:, None], b.engine_lp, old)  # (B, L-1)
            if tempered:
                # Sampled at T != 1 / top-p < 1: the behaviour logprob is the tempered, truncated one.
                # The trainer's logits stand in for the engine's; the engine/trainer drift measured on
                # the raw distribution (engine - old) is carried over, so with T = 1 this is exact.
                with torch.no_grad():
                    lq = behaviour_logprobs(logits.detach(), b.tokens[:, 1:], b.temperature, b.top_p)  # (B, L-1)
                behaviour = torch.where(b.tempered[:, None], lq + (behaviour - old), behaviour)
                n_tempered += int(b.tempered.sum())
            is_w, tis_stats = tis_weights(old, behaviour, b.mask, cap=t.tis_cap or None)
            if t.entropy_coef <= 0:
                logits = None
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
        grad_norm = self._optimizer_step()
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
            "train/zero_adv_frac": zero_adv / len(samples), "train/tempered_samples": float(n_tempered), "train/lr": t.lr,
        })
        if stats.get("train/logprob_diff_abs_mean", 0.0) > 0.5:
            log.warning("trainer and engine logprobs differ by %.3f on average: check that the engine serves the "
                        "trained weights (train/logprob_diff_abs_mean)", stats["train/logprob_diff_abs_mean"])
        self.last = stats
        return stats
