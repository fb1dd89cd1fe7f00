"""The trainer: samples in, one train step (one or more optimizer updates), new weights out.

One code path for full fine-tuning and LoRA: the only difference is which
parameters the optimizer sees, how the served weights are produced (LoRA
deltas are merged into a copy, never into the trained modules), and where the
frozen base weights come from (a copy of the model for full fine-tuning; under
LoRA the same model with its adapter switched off, so no copy is kept).

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

A step (`Trainer.step`):
1. staleness: response tokens more than `max_staleness` versions older than
   the reference version are removed from the loss mask (per token: an engine
   that swaps weights mid-response yields samples from two versions), samples
   with no trainable token left are dropped, counted and warned about. The
   reference is the version the engine serves; without an engine (`clawloop
   train`) the caller passes the newest version in its data, never the
   trainer's own counter, which says nothing about the data;
2. OPD: each sample's hint is chosen (`hints.py`), the teacher scores the
   student's sampled response after the hinted prompt (rendered as the turn
   was: `continue_final_message` when the turn continued an assistant
   message), in micro-batches under the token budget: the logprob of each
   sampled token and its K most likely tokens (`opd_target` topk/nucleus, and
   the top-1 that `opd_credit` divergence cuts at: `losses/credit.py`);
3. RL scores (`losses.centre_rewards`, over the whole step): each sample's
   reward as it is (any float, never its sign), centred per group where
   samples share a group id; an ungrouped one (a live turn) minus the mean
   baseline (the leave-one-out mean of the last `baseline_window` judged rewards),
   a negative result scaled by `negative_weight` (0 by default: a -1 says "not
   this" but not where, and spread over the answer it pushes down the right
   tokens too; bench/RESULTS.md "Why the loop made the model worse");
   rollout-buffer samples arrive with their advantages already computed;
4. the batch is cut into `num_steps_per_rollout` mini-batches (slime's
   meaning), each into micro-batches under the token budget; the aggregation
   denominator covers a whole mini-batch (`step_denominator`), so gradient
   accumulation equals one big batch;
5. old logprobs come from before the first update. With one update they are
   the forward's own logprobs, detached (the PPO ratio is exactly 1, so the
   clip cannot act: there is nothing yet to clip); with N updates a no-grad
   forward over the whole batch comes first, and from the second update on the
   ratio moves and the clip acts (`train/clip_frac`);
6. per mini-batch, per micro-batch: forward with grad (over every token, but
   logits only for the micro-batch's loss window, the first to the last
   trained position: `window_logits`, `batch.loss_window`; a 28 k-token
   agent prompt before a 200-token answer never has its (L, V) logits);
   TIS weights (old vs the engine's logprobs, per token); the method's
   objective (`Trainer._objective`:
   one pure function per method, the table in `losses/__init__.py`; each
   builds its per-token advantages with `losses.combined_advantages`, score
   and/or teacher - old, and takes the PPO-clipped loss, or the custom loss in
   its place; under the default `opd_target` topk the OPD term is the top-K
   reverse KL up to the divergence point, `losses.distill_loss`); then the
   anchor KL (`anchor_coef` > 0), the KL to the base weights (`kl_coef` > 0;
   measured whenever the base weights are at hand) and the entropy bonus (the
   entropy is measured on every step); backward. Then clip gradients, one
   AdamW update (`lr` 0: `auto_lr`).

Metrics over micro-batches and updates are merged by `metrics.merge_stats`
(shares of a loss add up, maxima are maxima).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import logging
import math
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from clawloop.engines.base import LoraAdapter
from clawloop.gateway.capture import IMAGES_DIR
from clawloop.losses import (
    anchor_kl_loss,
    anchor_positions,
    behaviour_logprobs,
    binary_rl_loss,
    centre_rewards,
    combine_loss,
    distill_loss,
    entropy_bonus,
    entropy_from_logits,
    kl_loss,
    load_custom_loss,
    logprob_diff_stats,
    opd_loss,
    ppo_clip_loss,
    rl_term_rows,
    staleness_histogram,
    staleness_token_mask,
    step_denominator,
    teacher_trust,
    tis_weights,
    trusted_agreement,
)
from clawloop.losses.plugins import custom_loss_inputs
from clawloop.records import Sample
from clawloop.trainer.batch import MicroBatch, TeacherSignal, budget_groups, pad_rows, split_even, tensorize
from clawloop.quant import load_4bit
from clawloop.trainer.device import auto_lr, resolve_train_device
from clawloop.trainer.hints import hint_candidates, longest_hint, pick_by_overlap, topk_overlap
from clawloop.trainer.metrics import merge_stats
from clawloop.trainer.rehearsal import Rehearsal, recover_step
from clawloop.trainer.vision import SampleImages, vision_model_class

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


def continues_final_message(tokenizer: Any, s: Sample) -> bool:
    """Whether the sample's prompt was rendered with `continue_final_message` (the client prefilled
    the start of the assistant's answer). The turn does not record it; its prompt ids tell: only
    an assistant-last conversation can be one, and then the rendering that gives back the prompt
    ids decides (if neither does, the continuation: a generation prompt after an assistant
    message is the rarer request)."""
    from clawloop.gateway.render import render_prompt

    if not s.messages or s.messages[-1].get("role") != "assistant":
        return False
    prompt = list(s.tokens[:s.prompt_len])
    if render_prompt(tokenizer, s.messages, s.tools, continue_final=True) == prompt:
        return True
    return render_prompt(tokenizer, s.messages, s.tools) != prompt


def _merged_lora_weight(mod: Any, w: torch.Tensor) -> torch.Tensor:
    """`w` + the "default" adapter's delta (scaling x B @ A), a new tensor. A plain LoRA Linear takes
    one addmm; peft's `get_delta_weight` makes two full-size temporaries before the sum, which was
    most of a LoRA publish on CPU. Anything else (DoRA, fan_in_fan_out, other layer types) goes
    through peft."""
    from peft.tuners.lora import Linear

    if (type(mod) is Linear and not mod.fan_in_fan_out and not mod.use_dora.get("default", False)
            and w.dim() == 2):
        a, b = mod.lora_A["default"].weight, mod.lora_B["default"].weight  # (r, in), (out, r)
        return torch.addmm(w, b.to(w.dtype), a.to(w.dtype), alpha=mod.scaling["default"])  # (out, in)
    return w + mod.get_delta_weight("default").to(w.dtype)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def newest_version(samples: Sequence[Sample]) -> int:
    """The newest policy version behind any response token of `samples` (0 for none)."""
    return max((max(s.response_versions, default=s.policy_version) for s in samples), default=0)


def _entropy_metric(logits: torch.Tensor, mask: torch.Tensor, chunk: int = 1024) -> float:
    """Mean entropy over the valid positions of `logits` (B, T, V), without a graph and without a
    second (B, T, V) tensor: the valid rows are taken `chunk` at a time."""
    with torch.no_grad():
        where = mask.bool().nonzero()  # (N, 2)
        if where.shape[0] == 0:
            return 0.0
        total = 0.0
        for part in where.split(chunk):
            total += float(entropy_from_logits(logits[part[:, 0], part[:, 1]].float()).sum())  # (c,) summed
        return total / where.shape[0]


LOGPROB_CHUNK = 1024
"""Positions per piece when logprobs are taken from logits: without a graph, one piece's (B, chunk, V)
float32 log-softmax is all that exists beside the logits, never a second (B, L, V) tensor."""


def chunked_logprobs(logits: torch.Tensor, targets: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """log_softmax(logits.float())[target] per position, `chunk` positions at a time: (B, W) from logits
    (B, W, V) and targets (B, W). Bit for bit the whole-tensor result (softmax is per position), so the PPO
    ratio of a no-grad pass against a grad pass is exactly 1 and a custom loss that takes its own
    log_softmax gets the same numbers. With a graph each piece's log-softmax is kept for the backward
    (what the whole tensor would keep); without one, each is freed before the next."""
    chunk = chunk or LOGPROB_CHUNK
    parts = [torch.log_softmax(logits[:, a:a + chunk].float(), dim=-1)  # (B, c, V)
             .gather(-1, targets[:, a:a + chunk, None]).squeeze(-1)  # (B, c)
             for a in range(0, logits.shape[1], chunk)]
    if not parts:
        return logits.new_zeros(targets.shape, dtype=torch.float32)
    return torch.cat(parts, dim=1)


@functools.cache
def _keeps_logits_window(cls: type) -> bool:
    return "logits_to_keep" in inspect.signature(cls.forward).parameters


def window_logits(model: torch.nn.Module, tokens: torch.Tensor, attn: torch.Tensor, start: int, end: int, *,
                  autocast_dtype: torch.dtype | None = None, mm: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
    """The logits of predicted positions start..end-1 only (position t predicts token t + 1): (B, end-start, V),
    in the model's dtype. The forward runs over every token (the window's context); the output layer runs on
    the window alone where the model takes transformers' `logits_to_keep`, which is what keeps a 28 k-token
    prompt's (L, V) logits from existing when only its answer is trained (a model without it: sliced after).
    `mm`: a vision-language model's image inputs (`vision.SampleImages.batch_inputs`)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft: the wrapped model
    extra = mm or {}
    with _autocast(tokens.device, autocast_dtype):
        if _keeps_logits_window(type(base)):
            keep = torch.arange(start, end, device=tokens.device)  # (W,)
            return model(input_ids=tokens, attention_mask=attn, use_cache=False, logits_to_keep=keep, **extra).logits
        return model(input_ids=tokens, attention_mask=attn, use_cache=False, **extra).logits[:, start:end]


def token_logprobs(model: torch.nn.Module, tokens: torch.Tensor, attn: torch.Tensor,
                   want_logits: bool = False, *, autocast_dtype: torch.dtype | None = None,
                   start: int = 0, end: int | None = None,
                   mm: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(tokens[:, t+1] | tokens[:, :t+1]) for t in start..end-1 (default: 0..L-2): (B, W), and with
    `want_logits` the window's float32 logits (B, W, V).

    `autocast_dtype` (bf16 on CUDA) covers the model's forward only: the logprobs are taken in float32,
    in pieces (`chunked_logprobs`). Only the window's logits are computed (`window_logits`)."""
    end = tokens.shape[1] - 1 if end is None else end
    logits = window_logits(model, tokens, attn, start, end, autocast_dtype=autocast_dtype, mm=mm)  # (B, W, V)
    lp = chunked_logprobs(logits, tokens[:, start + 1:end + 1])  # (B, W)
    return lp, (logits.float() if want_logits else None)


def check_teacher_vocab(policy_tokenizer: Any, teacher_tokenizer: Any, path: str) -> None:
    """A teacher model scores the policy's token ids: a different vocabulary is a ConfigError."""
    from clawloop.config import ConfigError

    pv, tv = policy_tokenizer.get_vocab(), teacher_tokenizer.get_vocab()
    if pv == tv:
        return
    differ = sum(1 for tok, i in pv.items() if tv.get(tok) != i)
    raise ConfigError(f"train.teacher_model: {path} does not share the policy's tokenizer ({len(tv)} tokens vs "
                      f"{len(pv)}; {differ} of the policy's tokens are missing or have other ids there). The "
                      "teacher scores the policy's token ids, so it needs the same vocabulary")


class Trainer:
    """Owns the trained model, the optimizer, the teacher / reference weights, and
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
        self.pad_id = self.tokenizer.pad_token_id or 0
        model_cls = vision_model_class(self.model_path) or AutoModelForCausalLM  # a VLM: the class the engine serves
        self.load_in_4bit = bool(cfg.model.load_in_4bit)
        """QLoRA (`quant.py`): NF4 linear layers, the rest float32 on CPU / bf16 on CUDA (frozen: autocast's)."""
        base = (load_4bit(model_cls, self.model_path, self.autocast_dtype or torch.float32, self.device)
                if self.load_in_4bit else model_cls.from_pretrained(self.model_path, dtype=torch.float32).to(self.device))
        self.vocab_size = int(base.get_output_embeddings().weight.shape[0])
        self.images = (SampleImages.for_model(base, self.model_path, Path(cfg.data_dir) / IMAGES_DIR)
                       if model_cls is not AutoModelForCausalLM else None)
        """A vision-language policy's stored images, rebuilt into pixel inputs per sample (`vision.py`); None: text."""
        self.use_lora = bool(t.use_lora)
        self.use_rl = t.method in ("binary", "combine")
        self.use_opd = t.method in ("opd", "combine")
        self.opd_target = t.opd_target if self.use_opd else ""
        self.topk = (t.distill_topk or 16) if self.opd_target in ("topk", "nucleus") else 0
        self.token_opd = self.opd_target == "advantage"
        # Frozen base weights for the OPD teacher (--teacher frozen) and the KL reference: under LoRA the
        # model with its adapter switched off is exactly that, so only full fine-tuning keeps a copy.
        # the anchor holds the positions of a corrected answer the teacher did not name, and (anchor_rl) the
        # answers with an RL term too: KL-regularised RL, so binary has it as well
        self.anchors = t.anchor_coef > 0 and (self.use_opd or (self.use_rl and t.anchor_rl))
        needs_frozen = (self.use_opd and t.teacher == "frozen") or t.kl_coef > 0 or self.anchors
        self.rehearsal: Rehearsal | None = None
        """Right answers from the start replayed each update (`rehearsal.py`); set and built by the loop's owner."""
        self.frozen = None
        if needs_frozen and not self.use_lora:
            self.frozen = copy.deepcopy(base).eval().requires_grad_(False)
        self.measures_kl = t.kl_coef > 0 or self.use_lora or self.frozen is not None
        """Whether each step measures the KL to the base weights (`train/kl`): a KL term is on, or the base
        weights are at hand anyway (LoRA, or the copy OPD's frozen teacher keeps); a full fine-tune without
        one would need a copy of the model for a metric."""
        self.teacher_model = None
        if self.use_opd and t.teacher == "model":
            self.teacher_model = self._load_teacher_model(t.teacher_model)
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
        self.lr = t.lr or auto_lr(sum(p.numel() for p in self.model.parameters()), self.use_lora)
        kw = dict(lr=self.lr, betas=(t.adam_beta1, t.adam_beta2), weight_decay=t.weight_decay)
        opt_params = self.masters if self.masters is not None else self.params
        try:  # one fused kernel instead of a per-parameter loop (CPU and CUDA, torch >= 2.4)
            self.opt = torch.optim.AdamW(opt_params, fused=True, **kw)
        except (RuntimeError, TypeError):
            self.opt = torch.optim.AdamW(opt_params, **kw)
        self.n_trained = sum(p.numel() for p in self.params)
        self.eps_state = [0.0, 0]
        """`_relative_eps`: the EMA of the clipped gradient's mean square, and its update count."""
        self.last_eps = 1e-8
        log.info("trainer on %s%s, lr %g, %d optimizer update(s) a batch, float32 master weights%s%s", self.device,
                 " with bf16 autocast" if self.autocast_dtype is not None else "", self.lr, t.num_steps_per_rollout,
                 ", AdamW state in CPU memory" if self.offload else "", ", LoRA" if self.use_lora else "")
        self.custom_loss = load_custom_loss(t.custom_loss_function_path) if t.custom_loss_function_path else None
        self.step_count = 0
        self.version = 0
        self.tokens_trained = 0
        self.reward_history: deque[float] = deque(maxlen=t.baseline_window)
        """Recent rewards of ungrouped samples, for the mean baseline (`losses.running_baseline`)."""
        self.rewards_observed = False
        """True once a caller records every judged reward with `observe_reward` (the loop does: turns that
        carry no signal, such as -1s under `negative_weight` 0, still belong in the baseline)."""
        self.last: dict[str, float] = {}

    def _load_teacher_model(self, path: str) -> torch.nn.Module:
        """--teacher-model: another model, frozen, on the trainer's device; same vocabulary or a ConfigError."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from clawloop.config import ConfigError

        if not Path(path).is_dir():
            raise ConfigError(f"train.teacher_model: {path!r} is not a model folder")
        check_teacher_vocab(self.tokenizer, AutoTokenizer.from_pretrained(path), path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(self.device)
        if int(model.get_output_embeddings().weight.shape[0]) < len(self.tokenizer):
            raise ConfigError(f"train.teacher_model: {path} has {model.get_output_embeddings().weight.shape[0]} "
                              f"output rows for a {len(self.tokenizer)}-token vocabulary")
        log.info("OPD teacher: %s", path)
        return model.eval().requires_grad_(False)


    # -- weights ---------------------------------------------------------------
    def served_state_dict(self) -> dict[str, torch.Tensor]:
        """Full weights as the engine serves them: a detached CPU copy (the engine writes it to
        disk or loads it into its own model, wherever the trainer runs); LoRA deltas merged."""
        with torch.no_grad():
            if not self.use_lora or self.load_in_4bit:  # 4-bit: served as trained, the adapter unmerged on top
                return {k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()}
            from peft.tuners.lora import LoraLayer

            inner = self.model.base_model.model
            sd = {}
            lora = {name + ".weight": mod for name, mod in inner.named_modules()
                    if isinstance(mod, LoraLayer) and hasattr(mod, "get_delta_weight")}
            for k, v in inner.state_dict().items():
                if "lora_" in k:
                    continue
                k2 = k.replace(".base_layer.", ".")
                w = v.detach()
                sd[k2] = _merged_lora_weight(lora[k2], w).cpu() if k2 in lora else w.to("cpu", copy=True)
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

    def _relative_eps(self, grad_norm: float) -> None:
        """`train.adam_eps_rel`: AdamW's eps = rel x sqrt(mean over the trained parameters of its bias-corrected
        second moment). The mean of the elementwise EMA of g**2 is the EMA of ||g||**2 / n, so it follows
        from the clipped gradient norms alone (no pass over the optimizer state). A step after a non-finite
        norm leaves it as it was."""
        rel, b2 = self.tc.adam_eps_rel, self.tc.adam_beta2
        if rel <= 0 or not math.isfinite(grad_norm):
            return
        clip = self.tc.grad_clip if self.tc.grad_clip > 0 else float("inf")
        g2 = min(grad_norm, clip) ** 2 / max(1, self.n_trained)
        self.eps_state[0] = b2 * self.eps_state[0] + (1 - b2) * g2
        self.eps_state[1] += 1
        eps = rel * math.sqrt(self.eps_state[0] / (1 - b2 ** self.eps_state[1]))
        for g in self.opt.param_groups:
            g["eps"] = max(eps, 1e-8)
        self.last_eps = eps

    def _optimizer_step(self) -> torch.Tensor:
        """Clip the gradients and step AdamW; returns the gradient norm before clipping.

        Offloaded: the clipped gradients go to the CPU masters, AdamW steps there (its state
        lives beside them), and the new weights are copied back to the device."""
        t = self.tc
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, t.grad_clip if t.grad_clip > 0 else float("inf"))
        self._relative_eps(float(grad_norm))
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

    # -- frozen weights, teacher ----------------------------------------------
    @contextlib.contextmanager
    def frozen_model(self) -> Iterator[torch.nn.Module]:
        """The base weights: the frozen copy, or under LoRA the model with its adapter switched off."""
        if self.use_lora:
            with self.model.disable_adapter():
                yield self.model
        elif self.frozen is not None:
            yield self.frozen
        else:
            raise RuntimeError("frozen_model: this trainer keeps no frozen copy (no frozen teacher, kl_coef 0)")

    @contextlib.contextmanager
    def teacher(self) -> Iterator[torch.nn.Module]:
        """The OPD teacher (`train.teacher`): frozen base weights, the live policy, or --teacher-model."""
        if self.tc.teacher == "model":
            yield self.teacher_model
        elif self.tc.teacher == "policy":
            yield self.model
        else:
            with self.frozen_model() as m:
                yield m

    def teacher_prompt_ids(self, s: Sample, hint: str) -> list[int]:
        """The teacher's prompt: the sample's conversation with the hint, rendered as the turn was."""
        from clawloop.gateway.render import render_prompt

        return render_prompt(self.tokenizer, teacher_messages(s.messages or [], hint), s.tools,
                             continue_final=continues_final_message(self.tokenizer, s))

    def score_responses(self, model: torch.nn.Module, rows: list[tuple[list[int], list[int]]], *, topk: int = 0,
                        probe: list[torch.Tensor] | None = None) -> list[dict[str, torch.Tensor]]:
        """Run `model` (no grad, eval mode) over prompt + response rows, in micro-batches under the
        token budget. Per row, on the response positions: "lp" (n,) the logprob of each response id;
        with `topk`, "topk_ids" / "topk_lp" (n, K); with `probe[i]` (n, K') ids, "probe_lp" (n, K')
        their logprobs. CPU tensors. Every prompt must have at least one token."""
        out: list[dict[str, torch.Tensor]] = [{} for _ in rows]
        if not rows:
            return out
        seqs = [list(p) + list(r) for p, r in rows]
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                for group in budget_groups([len(x) for x in seqs], self.tc.micro_batch_tokens):
                    tokens = pad_rows([seqs[i] for i in group], self.pad_id, torch.long, self.device)  # (B, L)
                    attn = pad_rows([[1] * len(seqs[i]) for i in group], 0, torch.long, self.device)  # (B, L)
                    lo = min(len(rows[i][0]) - 1 for i in group)  # the responses' positions only (window_logits)
                    hi = max(len(rows[i][0]) - 1 + len(rows[i][1]) for i in group)
                    logits = window_logits(model, tokens, attn, lo, hi,
                                           autocast_dtype=self.autocast_dtype)  # (B, W, V')
                    for j, i in enumerate(group):
                        prompt, resp = rows[i]
                        a, n = len(prompt) - 1 - lo, len(resp)
                        # a teacher with padded extra output rows: the policy's vocabulary only
                        logp = torch.log_softmax(logits[j, a:a + n, :self.vocab_size].float(), dim=-1)  # (n, V)
                        ids = torch.tensor(resp, dtype=torch.long, device=self.device)  # (n,)
                        out[i]["lp"] = logp.gather(-1, ids[:, None]).squeeze(-1).cpu()  # (n,)
                        if topk:
                            v, ix = logp.topk(min(topk, logp.shape[-1]), dim=-1)  # (n, K)
                            out[i]["topk_lp"], out[i]["topk_ids"] = v.cpu(), ix.cpu()
                        if probe is not None:
                            out[i]["probe_lp"] = logp.gather(-1, probe[i].to(self.device)).cpu()  # (n, K')
        finally:
            model.train(was)
        return out

    def choose_hints(self, samples: list[Sample]) -> tuple[list[str | None], dict[str, float]]:
        """The hint each sample's teacher sees (`train.hint_selection`, see hints.py) and stats."""
        # an image sample gets no teacher: the hinted prompt is re-rendered, its image placeholders not expanded
        cands = [hint_candidates(s) if s.messages and s.prompt_len > 0 and not self._has_images(s) else []
                 for s in samples]
        hints = [longest_hint(c) for c in cands]
        multi = [i for i, c in enumerate(cands) if len(c) > 1]
        untaught = sum(1 for s in samples if self._has_images(s) and hint_candidates(s))
        stats = {"train/hint_multi_candidate_samples": float(len(multi)),
                 "train/hint_image_samples_untaught": float(untaught)}  # hinted, but no teacher for images yet
        if self.tc.hint_selection != "overlap" or not multi:
            return hints, stats
        student = self.score_responses(self.model, [(samples[i].tokens[:samples[i].prompt_len],
                                                     samples[i].response_ids) for i in multi],
                                       topk=self.tc.hint_overlap_topk)
        rows, probes, owner = [], [], []
        for j, i in enumerate(multi):
            for h in cands[i]:
                rows.append((self.teacher_prompt_ids(samples[i], h), samples[i].response_ids))
                probes.append(student[j]["topk_ids"])
                owner.append(i)
        with self.teacher() as teacher:
            scored = self.score_responses(teacher, rows, probe=probes)
        overlaps: dict[int, list[float]] = {}
        for i, r in zip(owner, scored):
            overlaps.setdefault(i, []).append(topk_overlap(r["probe_lp"]))
        chosen, changed = [], 0
        for i in multi:
            k = pick_by_overlap(cands[i], overlaps[i])
            changed += cands[i][k] != hints[i]
            hints[i] = cands[i][k]
            chosen.append(overlaps[i][k])
        stats["train/hint_overlap"] = sum(chosen) / len(chosen)
        stats["train/hint_not_longest_frac"] = changed / len(multi)
        return hints, stats

    def _has_images(self, s: Sample) -> bool:
        return self.images is not None and self.images.token_id in s.tokens[:s.prompt_len]

    def teacher_signals(self, samples: list[Sample], hints: list[str | None]) -> list[TeacherSignal | None]:
        """The teacher's view of each sample with a hint (None without one): per-token logprobs, and
        the top-K per response position with `distill_topk`. A sample that arrives with its own
        `teacher_logprobs` (scored elsewhere) keeps them for the token-level advantage."""
        idx = [i for i, h in enumerate(hints)
               if h and samples[i].prompt_len > 0 and not (self.token_opd and samples[i].teacher_logprobs)]
        rows = [(self.teacher_prompt_ids(samples[i], hints[i]), samples[i].response_ids) for i in idx]
        cut = self.use_opd and self.tc.opd_credit == "divergence"
        with self.teacher() as teacher:
            scored = self.score_responses(teacher, rows, topk=self.topk or (1 if cut else 0))
        out: list[TeacherSignal | None] = [None] * len(samples)
        if self.token_opd:
            for i, s in enumerate(samples):
                if s.teacher_logprobs and len(s.teacher_logprobs) == len(s.tokens):
                    out[i] = TeacherSignal(list(s.teacher_logprobs))
        for i, r in zip(idx, scored):
            top1 = [-1] * samples[i].prompt_len + r["topk_ids"][:, 0].tolist() if cut else None
            out[i] = TeacherSignal([0.0] * samples[i].prompt_len + r["lp"].tolist(),
                                   r.get("topk_ids") if self.topk else None, r.get("topk_lp") if self.topk else None,
                                   top1=top1)
        return out

    def teacher_logprobs_for(self, samples: list[Sample]) -> list[list[float] | None]:
        """Teacher logprobs of each sample's response tokens (aligned with tokens), None without a hint."""
        hints, _ = self.choose_hints(samples)
        return [None if sig is None else sig.logprobs for sig in self.teacher_signals(samples, hints)]

    # -- samples ---------------------------------------------------------------
    def observe_reward(self, s: Sample) -> None:
        """Record an ungrouped sample's reward for the mean baseline, whether or not it is trained on."""
        self.rewards_observed = True
        if s.group_id is None and s.advantages is None and s.reward is not None and math.isfinite(float(s.reward)):
            self.reward_history.append(float(s.reward))

    def rl_scores(self, samples: list[Sample]) -> tuple[list[float], dict[str, float]]:
        """Each sample's RL score (`losses.centre_rewards`): its reward as it is (any finite float), centred
        per group where samples share a `group_id` (GRPO; groups of any size), an ungrouped one minus the mean
        baseline and scaled by `negative_weight` when negative; nan where there is none or the sample brings
        its own advantages."""
        idx = [i for i, s in enumerate(samples)
               if s.advantages is None and s.reward is not None and math.isfinite(float(s.reward))]
        out = [float("nan")] * len(samples)
        if not idx:
            return out, {}
        rewards = torch.tensor([float(samples[i].reward) for i in idx], dtype=torch.float32)  # (n,)
        groups = [samples[i].group_id for i in idx]
        normed, stats = centre_rewards(rewards, groups, baseline=self.tc.baseline, history=self.reward_history,
                                       history_has_batch=self.rewards_observed,
                                       negative_weight=self.tc.negative_weight)  # (n,)
        if self.tc.baseline == "mean" and not self.rewards_observed:  # the loop did not record them: do it here
            self.reward_history.extend(rewards[[k for k, g in enumerate(groups) if g is None]].tolist())
        for i, v in zip(idx, normed.tolist()):
            out[i] = v * samples[i].rl_weight  # an answer after a correction: `train.retry_weight`
        return out, stats

    def _micro_batches(self, samples: list[Sample]) -> list[list[Sample]]:
        return [[samples[i] for i in g] for g in budget_groups([len(s.tokens) for s in samples],
                                                                self.tc.micro_batch_tokens)]

    def _tensorize(self, samples: list[Sample], teacher: list[TeacherSignal | None], scores: list[float],
                   ref: bool) -> MicroBatch:
        """`batch.tensorize`, plus the base weights' logprobs (`ref`: for the KL) and logits (for the anchor)."""
        # a custom loss sees whole rows (its inputs line up with `tokens`); the built-in ones the loss window
        b = tensorize(samples, teacher, scores, pad_id=self.pad_id, device=self.device, window=self.custom_loss is None)
        b.mm = self.images.batch_inputs(samples, b.tokens) if self.images is not None else None
        if ref or self.anchors:
            with self.frozen_model() as base:
                ref_lp, b.ref_logits = self._eval_logprobs(base, b.tokens, b.attn, want_logits=self.anchors,
                                                           start=b.start, end=b.end, mm=b.mm)
            b.ref_lp = ref_lp if ref else None
        return b

    def _eval_logprobs(self, model: torch.nn.Module, tokens: torch.Tensor, attn: torch.Tensor,
                       want_logits: bool = False, *, start: int = 0, end: int | None = None,
                       mm: dict[str, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                return token_logprobs(model, tokens, attn, want_logits, autocast_dtype=self.autocast_dtype,
                                      start=start, end=end, mm=mm)
        finally:
            model.train(was)

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

    # -- old logprobs, objective, loss -----------------------------------------
    def _set_old(self, b: MicroBatch, old: torch.Tensor, logits: torch.Tensor | None) -> None:
        """Fill the batch's old logprobs (B, W) and TIS weights: what every update reuses."""
        t = self.tc
        old = old.detach()
        behaviour = torch.where(b.has_engine_lp[:, None], b.engine_lp, old)  # (B, W)
        if bool(b.tempered.any()):
            # Sampled at T != 1 / top-p < 1: the behaviour logprob is the tempered, truncated one.
            # The trainer's logits stand in for the engine's; the engine/trainer drift measured on
            # the raw distribution (engine - old) is carried over, so with T = 1 this is exact.
            with torch.no_grad():
                lq = behaviour_logprobs(logits.detach(), b.targets, b.temperature, b.top_p)  # (B, W)
            behaviour = torch.where(b.tempered[:, None], lq + (behaviour - old), behaviour)
        b.is_w, tis_stats = tis_weights(old, behaviour, b.mask, cap=t.tis_cap or None)
        if b.constrained is not None and bool(b.constrained.any()):
            # drift is engine vs trainer on the same distribution: constrained rows measure the mask
            tis_stats.update(logprob_diff_stats(old, behaviour, b.mask * (~b.constrained)[:, None]))
            tis_stats["train/constrained_frac"] = float(b.constrained.float().mean())
        b.fixed_stats = dict(tis_stats)
        b.old = old

    def _trust(self, b: MicroBatch, lp: torch.Tensor,
               logits: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The teacher's agreement as the credit reads it, and the positions a distribution target may teach:
        under `--opd-trust surer` only where the hinted teacher is the surer of the two, a disagreement
        elsewhere not counting as the divergence point (`losses/credit.teacher_trust`)."""
        if (self.tc.opd_trust != "surer" or b.teacher_agrees is None or b.topk_lp is None or b.topk_ids is None
                or b.teacher_lp is None):
            return b.teacher_agrees, None
        trusted = teacher_trust(b.teacher_agrees, b.teacher_lp, b.topk_ids[..., 0], b.topk_lp[..., 0], lp, logits,
                                b.has_topk)  # (B, W)
        return trusted_agreement(b.teacher_agrees, trusted, b.has_topk), trusted

    def _objective(self, b: MicroBatch, lp: torch.Tensor, logits: torch.Tensor, denom: float,
                   use_pg: bool, agrees: torch.Tensor | None = None,
                   trusted: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """The method's objective on one micro-batch: one pure function per method (`losses/__init__.py`
        has the table), each building its own advantages from the batch's signals. A custom loss stands in
        for the PPO clip inside it, with the micro-batch's inputs bound. `use_pg`: some sample of the step
        has a policy-gradient signal (always, except under a distribution target without scores)."""
        t = self.tc
        policy_loss = ppo_clip_loss
        if self.custom_loss is not None:
            policy_loss = functools.partial(self.custom_loss, **custom_loss_inputs(b, logits, t))  # scores, teacher..
        pg = dict(policy_loss=policy_loss, eps_clip=t.eps_clip, eps_clip_high=t.eps_clip_high,
                  dual_clip=t.dual_clip or None, agg=t.loss_agg, denominator=denom, is_weights=b.is_w)
        pre = dict(pre_advantages=b.pre_adv, has_pre=b.has_pre) if use_pg else {}
        if self.opd_target in ("topk", "nucleus"):
            return distill_loss(lp, b.old, logits, b.mask, teacher_topk_ids=b.topk_ids, teacher_topk_logprobs=b.topk_lp,
                                has_topk=b.has_topk, teacher_agrees=agrees, teacher_trusted=trusted,
                                target=self.opd_target,
                                top_p=t.opd_nucleus_p, w_opd=t.w_opd, scores=b.scores if self.use_rl else None,
                                w_rl=t.w_rl if self.use_rl else 1.0, **pre, **pg)
        if t.method == "binary":
            return binary_rl_loss(lp, b.old, b.scores, b.mask, w_rl=t.w_rl, **pre, **pg)
        opd = dict(teacher_agrees=b.teacher_agrees, opd_clip=t.opd_clip or None, w_opd=t.w_opd)
        if t.method == "opd":
            return opd_loss(lp, b.old, b.teacher_lp, b.mask, **opd, **pre, **pg)
        return combine_loss(lp, b.old, b.scores, b.teacher_lp, b.mask, w_rl=t.w_rl, **opd, **pre, **pg)

    def _loss(self, b: MicroBatch, lp: torch.Tensor, logits: torch.Tensor, denom: float,
              use_pg: bool) -> tuple[torch.Tensor, dict[str, float]]:
        """The micro-batch's share of the update's loss, and its stats: the objective, then the regularisers."""
        t = self.tc
        stats = dict(b.fixed_stats)
        terms: list[torch.Tensor] = []
        agrees, trusted = self._trust(b, lp, logits)
        if use_pg or b.topk_ids is not None:
            obj, s = self._objective(b, lp, logits, denom, use_pg, agrees, trusted)
            terms.append(obj)
            stats.update(s)
        if b.ref_logits is not None:
            amask = anchor_positions(b.mask, b.scores, b.has_pre, agrees, rl_rows=t.anchor_rl)  # (B, W)
            weights = None
            if t.anchor_rl and t.anchor_rl_coef != t.anchor_coef:  # the RL rows at their own coefficient
                rl = rl_term_rows(b.scores, b.has_pre)  # (B,)
                weights = torch.where(rl[:, None], t.anchor_rl_coef / max(t.anchor_coef, 1e-12), 1.0) \
                    .to(torch.float32).expand_as(amask)  # (B, W)
            an, s = anchor_kl_loss(logits, b.ref_logits, amask, coef=t.anchor_coef, agg=t.loss_agg, denominator=denom,
                                   weights=weights)
            terms.append(an)
            stats.update(s)
        if b.ref_lp is not None:
            kl, s = kl_loss(lp, b.ref_lp, b.mask, kind=t.kl_type, coef=t.kl_coef, agg=t.loss_agg, denominator=denom)
            terms.append(kl)
            stats.update(s)
        if t.entropy_coef > 0:
            ent, s = entropy_bonus(logits, b.mask, coef=t.entropy_coef, agg=t.loss_agg, denominator=denom)
            terms.append(ent)
            stats.update(s)
        else:
            stats["train/entropy"] = _entropy_metric(logits, b.mask)
        loss = sum(terms) if terms else lp.sum() * 0.0  # nothing to learn here: a zero with a graph
        stats["train/loss"] = float(loss.detach())
        return loss, stats

    # -- the step ------------------------------------------------------------
    def recover_step(self, draws: int = 4) -> dict[str, float]:
        """One update on rehearsal alone: `rehearsal.recover_step` (the publish gate's recovery step)."""
        return recover_step(self, draws)

    def step(self, samples: list[Sample], served_version: int | None = None) -> dict[str, float]:
        """One train step on `samples` (`num_steps_per_rollout` optimizer updates); returns stats (train/...).

        `served_version`: the version the engine serves, the staleness reference. None (no engine): the
        newest version among `samples` (`TrainerLoop` passes the newest in everything it has read)."""
        t0 = time.perf_counter()
        t = self.tc
        current = newest_version(samples) if served_version is None else served_version
        hist = staleness_histogram([s.policy_version for s in samples], current) if samples else {}
        mixed = sum(1 for s in samples if s.mixed_versions)
        n_in = len(samples)
        samples, masked, dropped = self._mask_stale_tokens(samples, current)
        stats: dict[str, float] = {"train/stale_dropped": float(dropped), "train/stale_tokens_masked": float(masked),
                                   "train/mixed_version_samples": float(mixed)}
        for k, n in hist.items():
            stats[f"train/staleness_{k}"] = float(n)
        if dropped:
            log.warning("%d of %d samples dropped as stale: every response token is more than %d versions older "
                        "than v%d (train/stale_dropped)", dropped, n_in, t.max_staleness, current)
        if self.images is not None:  # a VLM: samples whose stored images are missing are skipped, not guessed
            samples, image_stats = self.images.keep_loadable(samples)
            stats.update(image_stats)
        if not samples:
            stats["train/skipped_step"] = 1.0
            self.last = stats
            return stats

        # signals that do not change during the step: hints, teacher, RL scores
        hints, hint_stats = self.choose_hints(samples) if self.use_opd else ([None] * len(samples), {})
        teacher = self.teacher_signals(samples, hints) if self.use_opd else [None] * len(samples)
        scores, score_stats = self.rl_scores(samples) if self.use_rl else ([float("nan")] * len(samples), {})
        stats.update(hint_stats)
        stats.update(score_stats)
        use_pg = self.use_rl or self.token_opd or any(s.advantages is not None for s in samples)

        minis = []  # per optimizer update: its micro-batches
        for idx in split_even(len(samples), t.num_steps_per_rollout):
            part = [samples[i] for i in idx]
            by_id = {id(s): (teacher[i], scores[i]) for i, s in zip(idx, part)}
            minis.append([self._tensorize(mb, [by_id[id(s)][0] for s in mb], [by_id[id(s)][1] for s in mb],
                                          ref=self.measures_kl) for mb in self._micro_batches(part)])
        if len(minis) > 1:  # old logprobs of the whole batch before the first update
            with torch.no_grad():
                for mbs in minis:
                    for b in mbs:
                        tempered = bool(b.tempered.any())
                        old, logits = token_logprobs(self.model, b.tokens, b.attn, want_logits=tempered,
                                                     autocast_dtype=self.autocast_dtype, start=b.start,
                                                     end=b.end, mm=b.mm)  # (B, W)
                        self._set_old(b, old, logits)

        updates: list[tuple[dict[str, float], float, float]] = []
        grad_norms: list[float] = []
        rehearsed: list[dict[str, float]] = []
        n_tokens = n_tempered = 0
        for mbs in minis:
            denom = step_denominator([b.mask for b in mbs], t.loss_agg, tokens_per_sample=t.fixed_denominator_tokens)
            self.opt.zero_grad(set_to_none=True)
            parts = []
            for b in mbs:
                lp, logits = token_logprobs(self.model, b.tokens, b.attn, want_logits=True,
                                            autocast_dtype=self.autocast_dtype, start=b.start,
                                            end=b.end, mm=b.mm)  # (B, W), (B, W, V)
                if b.old is None:  # one update: this forward is from before it
                    self._set_old(b, lp, logits)
                loss, s = self._loss(b, lp, logits, denom, use_pg)
                loss.backward()
                del logits
                w = float(b.mask.sum())
                n_tokens += int(w)
                n_tempered += int(b.tempered.sum())
                parts.append((s, w, float(b.rows)))
            if self.rehearsal is not None:  # its own token-mean: the method's numbers stay as they are
                rloss, rs = self.rehearsal.loss(self.model, self.device, self.pad_id, self.autocast_dtype)
                if rloss is not None:
                    rloss.backward()
                    rehearsed.append(rs)
            g = float(self._optimizer_step())
            grad_norms.append(g if math.isfinite(g) else -1.0)
            merged = merge_stats(parts, losses="sum")
            updates.append((merged, sum(p[1] for p in parts), sum(p[2] for p in parts)))
        stats.update(merge_stats(updates, losses="mean"))
        for key in ("train/rehearsal_kl", "train/rehearsal_rows"):
            if rehearsed:
                stats[key] = sum(r[key] for r in rehearsed) / len(rehearsed)
        self.step_count += 1
        self.version += 1
        self.tokens_trained += n_tokens
        no_signal = sum(1 for s, sc, tch in zip(samples, scores, teacher)
                        if not (self.use_rl and math.isfinite(sc) and sc != 0) and tch is None
                        and not (s.advantages is not None and any(a != 0 for a in s.advantages)))
        dt = time.perf_counter() - t0
        stats.update({
            "train/step": float(self.step_count), "train/policy_version": float(self.version),
            "train/samples": float(len(samples)), "train/micro_batches": float(sum(len(m) for m in minis)),
            "train/updates": float(len(minis)), "train/tokens": float(n_tokens),
            "train/tokens_per_s": n_tokens / dt if dt > 0 else 0.0, "train/step_s": dt,
            "train/grad_norm": sum(grad_norms) / len(grad_norms), "train/grad_norm_max": max(grad_norms),
            "train/adam_eps": self.last_eps,
            "train/zero_adv_frac": no_signal / len(samples), "train/tempered_samples": float(n_tempered),
            "train/lr": self.lr,
        })
        if no_signal == len(samples):
            log.warning("dead learning signal: none of the %d samples of step %d has a non-zero score, a teacher or "
                        "an advantage (train/zero_adv_frac=1.0)", len(samples), self.step_count)
        if stats.get("train/logprob_diff_abs_mean", 0.0) > 0.5:
            log.warning("trainer and engine logprobs differ by %.3f on average: check that the engine serves the "
                        "trained weights (train/logprob_diff_abs_mean)", stats["train/logprob_diff_abs_mean"])
        self.last = stats
        return stats
