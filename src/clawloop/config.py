"""The one config tree. Defaults live here and nowhere else.

Sources, lowest to highest precedence: defaults → YAML file (`--config`) → environment variables →
command-line flags. Every field has one canonical flag (`--port`) and may have aliases that users of
OpenClaw-RL and slime already type (`OPENCLAW_PORT`, `--model-path`, `MAJORITY_VOTE_N`, …). The env vars
`ROLLOUT_ARGS`, `OPTIMIZER_ARGS`, `LORA_ARGS` and `CKPT_ARGS` hold strings of flags, as the public launch
scripts pass them; they are parsed like flags but rank with the environment.

An unknown YAML key, flag or flag inside one of those env strings is an error that names it. Names we
recognise but do not implement are refused with a message that says what to use instead; nothing is
accepted and ignored.

    cfg = load_config(["--port", "9000"])     # the CLI does this
    cfg.serve.port                              # 9000

The resolved config as written to disk, secrets masked, is `clawloop.config_out`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config value or name is wrong; the message names the key."""


def opt(default: Any, help: str, *, flags: tuple[str, ...] = (), env: tuple[str, ...] = (),
        choices: tuple[Any, ...] | None = None) -> Any:
    """A config field: default, one-line help, alias flags and env vars."""
    kw: dict[str, Any] = {"metadata": {"help": help, "flags": flags, "env": env, "choices": choices}}
    if isinstance(default, (list, dict)):
        kw["default_factory"] = lambda d=default: type(d)(d)
    else:
        kw["default"] = default
    return field(**kw)


@dataclass
class ModelConfig:
    path: str = opt("", "Policy model (HF folder). Empty: the embedded tiny model, built on first use.",
                    flags=("--model-path", "--model", "--hf-checkpoint"), env=("MODEL_PATH", "BASE_MODEL_PATH"))
    backend: str = opt("hf", "Inference engine (bench: the tokenizer's ids at a set pace, no model: engines/bench.py).",
                       flags=("--backend",), choices=("hf", "vllm", "bench"))
    device: str = opt("auto", "Device for the hf engine: auto, cpu, cuda, cuda:N.")
    dtype: str = opt("auto", "Weights dtype: auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16, float16.",
                     choices=("auto", "float32", "bfloat16", "float16"))
    load_in_4bit: bool = opt(False, "QLoRA: an NF4 base in trainer and hf engine, LoRA on top (docs/GPU.md).", flags=("--load-in-4bit",))
    max_batch_size: int = opt(32, "Most sequences the hf engine decodes in one batch.")
    admit_wait_ms: float = opt(0.0, "While the hf engine decodes a batch, how long new requests may wait to be "
                                    "prefilled together (0: at the next step).")
    max_model_len: int = opt(0, "Longest prompt + completion, in tokens; longer prompts get a 400. 0: 32768 for the "
                                "embedded tiny model, so OpenClaw's ~29 k-token prompt fits (trained on 2048 "
                                "positions, RoPE carries it past them: README, Use it from OpenClaw), 2048 for a "
                                "model you name (set your model's context).", flags=("--max-model-len", "--model-max-model-len"))
    threads: int = opt(0, "torch threads for the hf engine (0: leave torch's default).")
    engine_urls: list = opt([], "vLLM servers someone else runs (repeatable): attach instead of starting one; "
                            "started with VLLM_SERVER_DEV_MODE=1 and --enable-scale-out for token ids and publishes.",
                            flags=("--engine-url",))
    engine_replicas: int = opt(1, "vLLM servers to start (--backend vllm); sessions are spread over them.", flags=("--engine-replicas",))
    vllm_python: str = opt("", "Python of the vLLM environment (default: .venv-vllm/bin/python from `make vllm`).",
                           flags=("--vllm-python",), env=("VLLM_PYTHON",))
    vllm_args: list = opt([], "Extra arguments for the vLLM server, e.g. --vllm-args=--enforce-eager (repeatable).",
                          flags=("--vllm-args",))
    gpu_memory_utilization: float = opt(0.0, "vLLM's share of GPU memory (0: vLLM's default; lower it to colocate "
                                             "the trainer on the same GPU).", flags=("--gpu-memory-utilization",))
    kv_cache_gib: float = opt(1.0, "KV cache size of a CPU vLLM server (VLLM_CPU_KVCACHE_SPACE), GiB.")
    start_timeout_s: float = opt(900.0, "How long a started vLLM server may take to become healthy.")
    request_timeout_s: float = opt(600.0, "Longest a vLLM generation may stay silent before it is treated as hung.")
    health_interval_s: float = opt(2.0, "How often vLLM replicas are health-checked.")
    max_restarts: int = opt(5, "Restarts of a crashed vLLM replica (with backoff) before it is given up.")
    keep_weights: int = opt(3, "Weight folders kept in DATA_DIR/weights (vLLM full publish to attached/Ray servers).")
    sleep_while_training: bool = opt(False, "Colocated on one GPU: put vLLM to sleep during each train step "
                                            "(requests wait, none is refused).", flags=("--colocate",))
    bench_step_ms: float = opt(0.0, "--backend bench: pause between a request's steps (0: none).")
    bench_tokens_per_step: int = opt(1, "--backend bench: tokens a request gets per step, as one engine event.")
    bench_completion_tokens: int = opt(0, "--backend bench: tokens before the eos (0: until max_tokens).")


@dataclass
class ServeConfig:
    host: str = opt("127.0.0.1", "Address the gateway binds.", flags=("--host",), env=("OPENCLAW_HOST",))
    port: int = opt(8000, "Port the gateway binds.", flags=("--port",), env=("OPENCLAW_PORT",))
    api_keys: list = opt([], "API keys clients must send as `Authorization: Bearer KEY` (repeatable): `NAME=KEY` "
                             "makes the key tenant NAME, a bare `KEY` is tenant `default`. Each tenant's turns carry "
                             "its name and its session ids are its own. Empty: no key needed.",
                         flags=("--api-key",), env=("OPENCLAW_API_KEY", "CLAWLOOP_API_KEY"))
    insecure: bool = opt(False, "Allow binding a non-loopback address without an API key.", flags=("--insecure",))
    metrics_auth: bool = opt(False, "Ask for an API key (any tenant's) on /metrics too (needs --api-key).",
                             flags=("--metrics-auth",))
    served_model_name: str = opt("clawloop", "Model id reported by /v1/models (any id is accepted in requests).")
    max_body_bytes: int = opt(8 * 1024 * 1024, "Largest request body; bigger bodies get a 413.")
    default_max_tokens: int = opt(256, "Completion length when the request sets none.")
    max_concurrent_generations: int = opt(128, "Choices generated at once over all requests (a request with n choices takes "
                                               "n); the rest wait in the queue.", flags=("--max-concurrent-generations",))
    max_queued_requests: int = opt(512, "Requests that may wait for generation slots; one more gets a 429 "
                                        "with Retry-After.", flags=("--max-queued-requests",))
    request_timeout_s: float = opt(600.0, "Longest a chat request may take, queueing included (0: no limit); then it "
                                          "gets a 504 and its generation is aborted.", flags=("--request-timeout",))
    constrain_tool_calls: bool = opt(True, "Constrain tool calls to the offered tools' names and parameter "
                                           "schemas (grammar-constrained decoding); off: the model's calls are "
                                           "parsed as written and may be invalid.", flags=("--constrain-tool-calls",))
    json_whitespace: int = opt(0, "Whitespace characters constrained JSON (response_format, tool arguments) may put "
                                  "in a gap: 0 (default) none, json.dumps' separators only, so a weak model cannot "
                                  "pad a reply with newlines until max_tokens (vLLM's disable_any_whitespace); N "
                                  "allows pretty-printed JSON.", flags=("--json-whitespace",))
    close_json_tokens: int = opt(16, "In the last N tokens of a constrained reply's max_tokens, inside an unclosed "
                                     "JSON value (response_format, tool arguments), choose the likeliest token "
                                     "that closes it, so a weak model's JSON ends valid instead of cut (both "
                                     "engines); 0: off.", flags=("--close-json-tokens",))
    reasoning_parser: str = opt("auto", "Reasoning split: qwen3 (<think>), mistral ([THINK]), none; auto: by template.",
                                flags=("--reasoning-parser",), choices=("auto", "none", "qwen3", "mistral"))
    tool_parser: str = opt("auto", "Tool calls: hermes/qwen25 (<tool_call>), llama3_json, mistral; auto: by template.",
                           choices=("auto", "hermes", "qwen25", "llama3_json", "mistral"),
                           flags=("--tool-parser", "--tool-call-parser"))
    stream_interval_ms: float = opt(0.0, "Least time between two writes to a stream (0: each chunk when ready).")
    gc_freeze: bool = opt(True, "Once started, put every object then alive (model, tokenizer, libraries) out of the "
                                "garbage collector's way (gc.freeze), so its full collections do not pause serving "
                                "for a walk over them; gateway/gc_* in /metrics time the collections.",
                          flags=("--gc-freeze",))
    status: bool = opt(True, "Live terminal status (only when stdout is a terminal).")


@dataclass
class CaptureConfig:
    enabled: bool = opt(True, "Capture turns for training (interception).", flags=("--enable-rl-intercept",))
    session_idle_timeout_s: float = opt(600.0, "A session with no request for this long is closed and its last turn judged.")
    sweep_interval_s: float = opt(5.0, "How often idle sessions are looked for.")


@dataclass
class JudgeConfig:
    kind: str = opt("offline", "Judge: offline (rules, no LLM), self (the served policy), frozen (a frozen copy "
                    "of the base model), url (an OpenAI-compatible endpoint, see --judge-url).",
                    flags=("--judge",), choices=("offline", "self", "frozen", "url", "none"))
    url: str = opt("", "OpenAI-compatible base URL of the judge (sets --judge url).", flags=("--judge-url",))
    model: str = opt("", "Model name sent to the judge endpoint.", flags=("--judge-model",),
                     env=("JUDGE_MODEL_PATH", "PRM_MODEL_PATH"))
    api_key: str = opt("", "API key for the judge endpoint.", flags=("--judge-api-key",), env=("JUDGE_API_KEY",))
    majority_vote_n: int = opt(1, "Judge calls per turn.", flags=("--majority-vote-n",), env=("MAJORITY_VOTE_N",))
    majority_vote_threshold: float = opt(0.5, "Fraction of the valid votes the winning verdict needs, else 0.",
                                         flags=("--majority-vote-threshold",), env=("MAJORITY_VOTE_THRESHOLD",))
    num_workers: int = opt(2, "Concurrent judgements.", flags=("--num-judge-workers",))
    queue_size: int = opt(64, "Bound on turns fetched from the store and waiting for a worker.")
    timeout_s: float = opt(60.0, "Per judge call.")
    max_retries: int = opt(3, "Retries of a failed call within one attempt (with backoff); the turn stays pending after.")
    temperature: float = opt(0.6, "Sampling temperature of LLM judge calls.")
    max_tokens: int = opt(4096, "Longest judge reply in tokens, reasoning included (thinking judges need thousands).",
                          flags=("--judge-max-tokens", "--prm-max-new-tokens"), env=("PRM_MAX_NEW_TOKENS",))
    max_malformed: int = opt(6, "Judge replies without a valid verdict a turn may get before it is stored as 0, "
                                "all votes malformed (judge/gave_up); 0: retry forever.")
    hints: bool = opt(True, "Extract OPD hints.")
    custom_rm_path: str = opt("", "Custom reward: file.py:fn or pkg.module:fn; fn(turn) -> float | Judgement, "
                              "get_reward_model(config) (OpenClaw-RL) or fn(args, sample) (slime).",
                              flags=("--custom-rm-path",))
    poll_interval_s: float = opt(0.5, "How often the store is polled for turns to judge.")


@dataclass
class TrainConfig:
    enabled: bool = opt(True, "Run the trainer in `clawloop up`.")
    method: str = opt("combine", "Objective: binary (judge score as advantage), opd (hint-conditioned teacher; "
                      "token-level advantage, or top-K reverse KL with --distill-topk), combine (both).",
                      flags=("--method",), choices=("binary", "opd", "combine"))
    source: str = opt("store", "Where samples come from.", choices=("store", "buffer"))
    buffer_url: str = opt("", "Rollout buffer URL for --source buffer.", flags=("--buffer-url",))
    rollout_batch_size: int = opt(8, "Samples with a non-zero signal per train step.", flags=("--rollout-batch-size",))
    n_samples_per_prompt: int = opt(1, "Group size for rollout-buffer tasks.", flags=("--num-rollouts-per-prompt",))
    micro_batch_tokens: int = opt(4096, "Token budget of one micro-batch (training and teacher forwards).")
    advantage_estimator: str = opt("grpo", "Buffer items with agent steps: grpo (each step gets its trajectory's "
                                           "group advantage) or step_wise (outcome + prm_step_coef * step PRM, "
                                           "z-normalised per task group and step index; constant buckets dropped).",
                                   flags=("--advantage-estimator",), choices=("grpo", "step_wise"))
    num_steps_per_rollout: int = opt(1, "Optimizer updates per batch, as in slime: the batch is cut into N mini-batches, old "
                                        "logprobs are taken before the first update, so the PPO clip acts from the second update "
                                        "on.", flags=("--num-steps-per-rollout",))
    lr: float = opt(0.0, "AdamW learning rate. 0: by the trained parameters' count (`trainer.device.auto_lr`): 5e-4 under 10 M "
                         "(the shipped tiny model), 1e-5 above (full fine-tuning of a real model), 1e-4 for LoRA.", flags=("--lr",))
    weight_decay: float = opt(0.0, "AdamW weight decay.", flags=("--weight-decay",))
    adam_beta1: float = opt(0.9, "AdamW beta1.", flags=("--adam-beta1",))
    adam_beta2: float = opt(0.98, "AdamW beta2.", flags=("--adam-beta2",))
    adam_eps_rel: float = opt(1.0, "AdamW eps as a multiple of the gradient's RMS (from the clipped norms): a weight with a far "
                              "smaller gradient steps in proportion, not a full lr, and does not drift (RESULTS 'Why the loop "
                              "made the model worse' 10). 0: fixed 1e-8.", flags=("--adam-eps-rel",))
    grad_clip: float = opt(1.0, "Max gradient norm (0: off).", flags=("--clip-grad",))
    eps_clip: float = opt(0.2, "PPO clip below 1.", flags=("--eps-clip",))
    eps_clip_high: float = opt(0.28, "PPO clip above 1.", flags=("--eps-clip-high",))
    dual_clip: float = opt(0.0, "Dual-clip constant c > 1 (0: off).", flags=("--eps-clip-c",))
    loss_agg: str = opt("token-mean", "Loss aggregation over a step's tokens.", flags=("--loss-agg",),
                        choices=("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "fixed-denominator"))
    fixed_denominator_tokens: int = opt(256, "--loss-agg fixed-denominator: the step's loss is divided by samples x this (Dr. "
                                             "GRPO: the longest response allowed), not by its token count.", flags=("--fixed-denominator-tokens",))
    baseline: str = opt("mean", "RL baseline for ungrouped samples (live turns): mean (the leave-one-out mean of the "
                        "last --baseline-window judged rewards is subtracted) or none (the raw reward: a stream of "
                        "mostly -1 pushes down every sampled token).", flags=("--baseline",), choices=("mean", "none"))
    negative_weight: float = opt(0.0, "Weight of a negative advantage on an ungrouped sample (a live turn): a -1 "
                                 "says 'not this' but not where, and spread over every token it pushes down the "
                                 "uncertain right ones (the digits of a right result in the wrong form); with a "
                                 "teacher (opd, combine) the OPD term says where. 1: as it is.",
                                 flags=("--negative-weight",))
    retry_weight: float = opt(0.0, "RL weight of an answer given right after a correction (the previous turn judged "
                              "negative): it does what the user just asked, under words the user will not repeat. 0: the form "
                              "from first answers alone (with --rehearsal-choices it kept the student's facts: RESULTS 13).",
                              flags=("--retry-weight",))
    baseline_window: int = opt(256, "How many recent rewards the mean baseline averages: every judged turn the "
                                    "trainer read, trained on or not.", flags=("--baseline-window",))
    w_rl: float = opt(1.0, "Weight of the RL term (the score, or a rollout group's advantage).")
    w_opd: float = opt(1.0, "Weight of the OPD term (teacher - old advantage, or the top-K KL).")
    teacher: str = opt("frozen", "OPD teacher, given the hinted prompt: frozen (the base weights; under LoRA the "
                       "adapter switched off), policy (the live policy), model (--teacher-model).",
                       flags=("--teacher",), choices=("frozen", "policy", "model"))
    teacher_model: str = opt("", "OPD teacher that is another model (HF folder, e.g. the judge's); it must share the "
                             "policy's tokenizer. Sets --teacher model.", flags=("--teacher-model",))
    opd_clip: float = opt(0.0, "OPD: bound |teacher - old| logprob per token before it becomes an advantage (0: off).",
                          flags=("--opd-clip",))
    opd_credit: str = opt("divergence", "OPD: which response tokens the teacher's view reaches. divergence: up to "
                          "the first token the teacher would not pick itself (its top-1), never pushing down a token "
                          "it would pick; later tokens get 0, since a teacher reading a response that left its path "
                          "is no evidence about the rest. all: every token (OPD as published).",
                          flags=("--opd-credit",), choices=("divergence", "all"))
    opd_trust: str = opt("surer", "OPD with a distribution target (topk, nucleus): where the hinted teacher's view "
                         "counts. surer: where it is the surer of the two (agreeing, surer of the token than the "
                         "student is of its own top token; disagreeing, preferring its token over the written one "
                         "more than the student prefers the written one over it). A hint can make the teacher unsure "
                         "of what it does not concern, e.g. the digits of a sum under a style hint: those positions "
                         "are left to the anchor and a disagreement there is not the divergence point. all: every "
                         "position up to the divergence point.", flags=("--opd-trust",), choices=("surer", "all"))
    opd_target: str = opt("topk", "What the OPD term teaches: topk (reverse KL to the hinted teacher's K most "
                          "likely tokens plus a tail bin, K = --distill-topk), nucleus (the student's mass on the "
                          "teacher's top-p nucleus: the teacher vetoes, the student keeps its own preferences inside), "
                          "advantage (teacher - old logprob as a per-token advantage, OPD as published).",
                          flags=("--opd-target",), choices=("topk", "nucleus", "advantage"))
    opd_nucleus_p: float = opt(0.9, "--opd-target nucleus: the teacher's nucleus holds this much of its probability.",
                               flags=("--opd-nucleus-p",))
    distill_topk: int = opt(0, "How many of the teacher's most likely tokens it reports per position (K for "
                            "--opd-target topk, the cap of the nucleus for nucleus); 0: 16.", flags=("--distill-topk",))
    hint_selection: str = opt("longest", "Which of a turn's hints the teacher sees: longest, or overlap (the one whose "
                              "teacher distribution puts the most mass on the student's top-K tokens).",
                              flags=("--hint-selection",), choices=("longest", "overlap"))
    hint_overlap_topk: int = opt(20, "--hint-selection overlap: how many of the student's top tokens are compared.")
    anchor_coef: float = opt(1.0, "OPD's anchor (opd, combine): coefficient of a full-distribution KL to the base "
                             "weights on a corrected answer's positions other than the one the teacher named (its "
                             "divergence point), and on samples with no RL term; it holds what the correction did not "
                             "concern, e.g. the digits after a rejected opener. 0: off.", flags=("--anchor-coef",))
    anchor_rl: bool = opt(False, "The anchor also holds every position of answers with an RL term (binary, combine): a "
                                 "KL-regularised policy gradient that keeps an accepted answer's near-certain tokens (the "
                                 "digits) where they were, at --anchor-rl-coef. Off by default: it also held a random model "
                                 "against a synthetic reward (bench/RESULTS.md).", flags=("--anchor-rl",))
    anchor_rl_coef: float = opt(1.0, "--anchor-rl's coefficient.", flags=("--anchor-rl-coef",))
    rehearsal_rows: int = opt(32, "Rehearsal (`trainer/rehearsal.py`): replies the model got right at start (checks like the gate's, "
                              "the tiny model's corpus sums, --regression-set) replayed each update, holding the tokens it was "
                              "sure of; rows per update, 0: off.", flags=("--rehearsal-rows",))
    rehearsal_choices: float = opt(0.05, "Rehearsal also holds where the model chose (the first token): mass moves freely among "
                                   "its tokens >= this x its top one's there, not to the rest (RESULTS 13). 0: off.", flags=("--rehearsal-choices",))
    rehearsal_coef: float = opt(1.0, "Rehearsal's coefficient (reverse KL to the start's top-K).", flags=("--rehearsal-coef",))
    rehearsal_sure: float = opt(0.9, "Rehearsal holds a token the model gave >= this probability.", flags=("--rehearsal-sure",))
    rehearsal_forms: bool = opt(False, "Tiny model: rehearse its sums and facts asked in each style too.", flags=("--rehearsal-forms",))
    kl_coef: float = opt(0.0, "KL-to-reference coefficient (0: off).", flags=("--kl-coef", "--kl-loss-coef"))
    kl_type: str = opt("low_var_kl", "KL estimator.", flags=("--kl-loss-type",), choices=("k1", "k2", "k3", "low_var_kl"))
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient.", flags=("--entropy-coef",))
    tis_cap: float = opt(2.0, "Truncated importance sampling cap (0: off).")
    max_staleness: int = opt(4, "Mask response tokens more than this many policy versions older than the served one "
                             "(`clawloop train` without an engine: the newest version in its data).",
                             flags=("--max-staleness",))
    use_lora: bool = opt(False, "Train a LoRA adapter instead of all weights.", flags=("--use-lora",))
    lora_rank: int = opt(16, "LoRA rank.", flags=("--lora-rank",))
    lora_alpha: int = opt(32, "LoRA alpha.", flags=("--lora-alpha",))
    lora_dropout: float = opt(0.0, "LoRA dropout.", flags=("--lora-dropout",))
    lora_target_modules: list = opt(["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                    "Modules LoRA wraps.", flags=("--target-modules",))
    save_interval: int = opt(0, "Checkpoint every N steps (0: only at shutdown).", flags=("--save-interval",))
    save_dir: str = opt("", "Checkpoint directory (default: DATA_DIR/checkpoints).",
                        flags=("--save-dir", "--save"), env=("CKPT_SAVE_DIR",))
    resume_from_checkpoint: str = opt("", "Checkpoint dir or `latest` to resume from.",
                                      flags=("--resume-from-checkpoint", "--load"), env=("RESUME_CKPT",))
    publish_interval: int = opt(1, "Publish weights to the engine every N steps.")
    threads: int = opt(1, "torch threads the trainer may use (protects serving on small machines).")
    nice: int = opt(-1, "CPU priority of the trainer's thread, as nice(1): 0..19 (higher yields more to serving); "
                        "-1: 10 when the trainer computes on the CPU, 0 on a GPU. Linux only.", flags=("--train-nice",))
    seed: int = opt(1234, "Trainer seed.", flags=("--seed",))
    device: str = opt("auto", "Trainer device: auto (cuda when available), cpu, cuda, cuda:N.", flags=("--train-device",))
    train_gpus: list = opt([], "GPU ids for the trainer, e.g. 0,1 (the first is used; with ROLLOUT_GPUS).",
                           env=("TRAIN_GPUS",))
    rollout_gpus: list = opt([], "GPU ids for the engine replicas, one replica per id unless --engine-replicas.",
                             env=("ROLLOUT_GPUS",))
    offload_optimizer_state: bool = opt(False, "Keep AdamW state in CPU memory (GPU memory for big models).",
                                        flags=("--offload-optimizer-state",))
    custom_loss_function_path: str = opt("", "Custom loss: file.py:fn or pkg.module:fn.",
                                         flags=("--custom-loss-function-path",))


@dataclass
class GateConfig:
    """The publish gate (trainer/gate.py): a trained version is scored on a regression set before it is served."""

    enabled: bool = opt(True, "Score every trained version on the regression set before it is published; one that "
                              "loses more than --regression-tolerance is not served (--no-publish-gate: off).",
                        flags=("--publish-gate",))
    regression_set: str = opt("", "Your own checks: a JSONL file, one per line, a prompt (\"prompt\" or \"messages\") "
                                  "and one checker: \"answer\" (the exact reply), \"regex\" or \"check\" "
                                  "(file.py:fn or pkg.module:fn, fn(reply, case) -> bool | float); see "
                                  "examples/regression_set.jsonl.", flags=("--regression-set",))
    tolerance: float = opt(0.05, "Most a group of checks may lose against its score at start (absolute, 0.05 = 5 "
                                 "points of pass rate) before a version is refused.", flags=("--regression-tolerance",))
    builtin: str = opt("auto", "The built-in checks (held-out arithmetic and style instructions, what the tiny model "
                               "could do at start): auto (on for the embedded tiny model), on, off.",
                       flags=("--gate-builtin",), choices=("auto", "on", "off"))
    backoff: float = opt(0.5, "On a refused candidate the learning rate is multiplied by this (down to 1/8 of --lr), "
                              "each passed one divides it back up to --lr. 1: off.", flags=("--gate-backoff",))
    retries: int = opt(3, "A refused candidate's batch is trained again from the last good weights at the backed-off "
                          "rate, up to this many times (a line search). 0: off.", flags=("--gate-retries",))
    samples: int = opt(4, "Replies sampled per check at --gate-temperature, fixed seeds (paired); 0: one greedy reply.", flags=("--gate-samples",))
    temperature: float = opt(1.0, "Sampling temperature of the checks.", flags=("--gate-temperature",))
    builtin_checks: int = opt(64, "Checks per group each candidate is read on (built-in arithmetic, instructions).")
    rotations: int = opt(8, "Fresh questions per published version: rounds of gate.builtin_checks (a set read every time is learnt; "
                            "a --regression-set group larger than a round rotates too); 1: one set.", flags=("--gate-rotations",))
    confirm: bool = opt(True, "A candidate that passes its round is read on the next before it is served (rotations > 1; RESULTS 16).", flags=("--gate-confirm",))
    hold: float = opt(16.0, "A refusal at the shortest step doubles rehearsal's coefficient, up to this multiple; a pass halves it (1: off).", flags=("--gate-hold",))
    max_tokens: int = opt(24, "Longest reply to a check, in tokens; a regression-set line may set its own.")
    batch_size: int = opt(64, "Checks generated at once on the trainer's model.")


@dataclass
class BufferConfig:
    host: str = opt("127.0.0.1", "Rollout buffer bind address.", flags=("--buffer-host",))
    port: int = opt(8889, "Rollout buffer port.", flags=("--buffer-port",))
    generator_dir: str = opt("", "Folder of *_generator.py files (the built-ins are always there).", flags=("--generator-dir",))
    rollout_function_path: str = opt("", "A rollout function run as one more generator: file.py:fn or pkg.module:fn, "
                                     "fn(data) like a generator's run_rollout; its task type is its module's "
                                     "TASK_TYPE, else the function's name.", flags=("--rollout-function-path",))
    custom_generate_function_path: str = opt("", "How the built-in generators get one answer: file.py:fn or "
                                             "pkg.module:fn, fn(args, sample, sampling_params) -> sample (slime) or "
                                             "fn(messages, sampling_params) -> str | dict.",
                                             flags=("--custom-generate-function-path",))
    group_timeout_s: float = opt(300.0, "A group with no write for this long is finished or dropped.")
    min_group_ratio: float = opt(0.5, "A stale group is kept if at least this fraction of it arrived.")
    max_body_bytes: int = opt(16 * 1024 * 1024, "Largest /buffer/write body (413 above).")


@dataclass
class EnvConfig:
    track: str = opt("", "Agent track whose rollout `clawloop buffer` starts at once (toolcall, terminal, swe, "
                         "gui); empty: wait for POST /start_rollout.", flags=("--env-type",), env=("ENV_TYPE",),
                     choices=("", "toolcall", "terminal", "swe", "gui"))
    max_steps: int = opt(20, "Agent steps per episode.", flags=("--max-steps",), env=("MAX_STEPS",))
    parallel_envs: int = opt(4, "Environments run at once (the env pool's capacity).", flags=("--parallel-envs",),
                             env=("PARALLEL_ENVS",))
    tools_config: str = opt("", "toolcall: JSON file of tool definitions (default: the code_interpreter tool).",
                            flags=("--tools-config",), env=("TOOLS_CONFIG",))
    task_dir: str = opt("", "A user's own tasks: terminal-bench task folders (terminal), a SWE-bench instances "
                            "file or folder (swe), a problems JSONL (toolcall).", flags=("--task-dir",),
                        env=("SWE_BENCH_PATH",))
    sandbox: str = opt("auto", "Where agent commands run: auto (bwrap, else unshare), bwrap, unshare, none "
                               "(needs --allow-unsandboxed).", flags=("--sandbox",),
                       choices=("auto", "bwrap", "unshare", "none"))
    allow_unsandboxed: bool = opt(False, "Allow agent commands to run as plain subprocesses when no sandbox works.",
                                  flags=("--allow-unsandboxed",))
    command_timeout_s: float = opt(120.0, "Longest one agent command or tool call may run (SWE reference: 180).",
                                   flags=("--command-timeout",))
    memory_mb: int = opt(4096, "Address space per sandboxed process, MB.")
    disk_mb: int = opt(512, "Workspace quota per environment, MB.")
    screenshot_backend: str = opt("playwright", "gui: how the system chromium is driven: playwright or selenium "
                                                "(chromedriver).", flags=("--screenshot-backend",),
                                  env=("SCREENSHOT_BACKEND",), choices=("playwright", "selenium"))
    gui_observation: str = opt("dom", "gui: what the agent sees each step: dom (an element list with refs, for "
                                      "text models), screenshot (a PNG as an image_url part, for VLMs) or both.",
                               flags=("--gui-observation",), choices=("dom", "screenshot", "both"))
    pool_url: str = opt("", "Use the env pool at this URL (`clawloop envpool`) instead of a local one.",
                        flags=("--env-pool-url",))
    lease_ttl_s: float = opt(600.0, "An env lease with no call or heartbeat for this long is reaped.")
    num_repeat_per_sample: int = opt(8, "Episodes per task (the GRPO group).", flags=("--n-samples-per-task",))
    num_tasks: int = opt(0, "Tasks per rollout (0: all).", flags=("--num-tasks",))
    max_tokens: int = opt(512, "Longest assistant message per step, tokens.", flags=("--step-max-tokens",))
    prm: str = opt("none", "Per-step process reward: none, offline (rules on the observation), self (the served "
                           "policy), url (--prm-url), frozen (a frozen model, --prm-model or the base).",
                   flags=("--prm",), choices=("none", "offline", "self", "url", "frozen"))
    prm_url: str = opt("", "OpenAI-compatible endpoint of the PRM (--prm url).", flags=("--prm-url",))
    prm_model: str = opt("", "PRM model name at --prm-url, or folder for --prm frozen.", flags=("--prm-model",))
    prm_votes: int = opt(0, "PRM calls per step, majority-voted (0: 1 for terminal, 3 otherwise, as the reference).",
                         flags=("--prm-m",))
    prm_step_coef: float = opt(1.0, "Weight of a step's PRM score beside the outcome reward.", flags=("--prm-step-coef",))

    def payload(self) -> dict[str, Any]:
        """The /start_rollout keys this section supplies (the payload's own keys win)."""
        d = {"max_steps": self.max_steps, "parallel_envs": self.parallel_envs, "tools_config": self.tools_config,
             "task_dir": self.task_dir, "sandbox": self.sandbox, "allow_unsandboxed": self.allow_unsandboxed,
             "command_timeout_s": self.command_timeout_s, "memory_mb": self.memory_mb, "disk_mb": self.disk_mb,
             "env_pool_url": self.pool_url, "prm": self.prm, "prm_url": self.prm_url, "prm_model": self.prm_model,
             "prm_votes": self.prm_votes, "prm_step_coef": self.prm_step_coef, "num_tasks": self.num_tasks,
             "max_tokens": self.max_tokens, "screenshot_backend": self.screenshot_backend,
             "gui_observation": self.gui_observation}
        return {k: v for k, v in d.items() if v not in ("", 0) or k in ("prm_step_coef", "allow_unsandboxed")}


@dataclass
class RayConfig:
    mode: str = opt("", "Run the loops on a Ray cluster: auto (attach to a running one, ray.init(address=\"auto\")), "
                        "local (start one in this process: loopback, no dashboard); empty: one process, no Ray. "
                        "Engine replicas count --engine-replicas.", flags=("--ray",), choices=("", "auto", "local"))
    num_cpus: int = opt(2, "--ray local: CPUs the local cluster offers.", flags=("--ray-num-cpus",))
    object_store_mb: int = opt(256, "--ray local: object store size, MiB (published weights travel through it).",
                               flags=("--ray-object-store-mb",))
    temp_dir: str = opt("", "--ray local: Ray's session folder (default: a fresh folder under /tmp; socket paths "
                            "must stay short). --ray auto: the --temp-dir the cluster was started with, where its "
                            "address is found (default /tmp/ray; RAY_ADDRESS wins).", flags=("--ray-temp-dir",))
    name: str = opt("", "Prefix of this clawloop's Ray actor names (`ray kill-actor --namespace clawloop --name "
                        "NAME-engine-0`); default clawloop-PORT. Two clawloops on one cluster need different ones.",
                    flags=("--ray-name",))
    trainer_workers: int = opt(1, "Data-parallel trainer actors (one torch.distributed group: gloo on CPU, nccl "
                                  "on GPU); 0: the trainer stays in this process.", flags=("--trainer-workers",))
    judge_workers: int = opt(0, "Judge engine actors for --judge frozen (the --judge-model folder, else the base "
                                "model), never weight-synced; the judge loop stays in this process and spreads its "
                                "calls over them. 0: a frozen judge runs in this process.", flags=("--judge-workers",))
    judge_num_cpus: float = opt(-1.0, "CPUs reserved per judge actor (-1: as --engine-num-cpus's auto rule).",
                                flags=("--judge-num-cpus",))
    judge_num_gpus: float = opt(0.0, "GPUs per judge actor.", flags=("--judge-num-gpus",))
    env_workers: int = opt(0, "Env-pool actors `clawloop buffer --ray` starts for its track (ENV_TYPE), each on a "
                              "node offering the --env-resource custom resource; generators spread their "
                              "environments over them. 0: environments run in the generator processes.",
                           flags=("--env-workers",))
    env_resource: str = opt("env", "Custom Ray resource that env-pool actors ask for ({NAME: 1}); --ray local "
                                   "offers num_cpus of it.", flags=("--env-resource",))
    env_num_cpus: float = opt(1.0, "CPUs reserved per env-pool actor.", flags=("--env-num-cpus",))
    engine_num_cpus: float = opt(-1.0, "CPUs reserved per engine actor. -1 (auto): 1 when the cluster has a CPU "
                                       "for every actor clawloop starts, else the cluster's CPUs shared evenly "
                                       "among them (a reservation, not a thread count: --threads sets those).",
                                 flags=("--engine-num-cpus",))
    engine_num_gpus: float = opt(0.0, "GPUs per engine actor (the hf engine runs on cuda when > 0).",
                                 flags=("--engine-num-gpus",))
    trainer_num_cpus: float = opt(-1.0, "CPUs reserved per trainer actor (-1: auto, as --engine-num-cpus).",
                                  flags=("--trainer-num-cpus",))
    trainer_num_gpus: float = opt(0.0, "GPUs per trainer actor (> 0: cuda and nccl).", flags=("--trainer-num-gpus",))
    placement: str = opt("PACK", "Placement-group strategy of the engine replicas (the trainer group is always "
                                 "PACK: its all-reduce wants one node).", flags=("--ray-placement",),
                         choices=("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"))
    max_restarts: int = opt(3, "Restarts Ray gives a dead engine actor (it comes back on the current weights); the "
                               "trainer group restarts from its latest checkpoint this many times.",
                            flags=("--ray-max-restarts",))
    token_timeout_s: float = opt(60.0, "Longest an engine actor may stay silent on a request (queueing and prefill "
                                       "included) before it is treated as hung and the request moves on.")
    replica_wait_s: float = opt(60.0, "Longest a request waits for an engine actor to come back when none is up, "
                                      "then 503.")
    health_interval_s: float = opt(1.0, "How often engine and trainer actors are checked.")
    step_timeout_s: float = opt(600.0, "Longest one data-parallel train step may take before the group is restarted.")
    start_timeout_s: float = opt(300.0, "Longest actors may take to come up (model load).")


@dataclass
class Config:
    data_dir: str = opt("./clawloop-data", "Store, checkpoints, logs and the resolved config.",
                        flags=("--data-dir", "--rl-buffer-dir"))
    store: str = opt("", "Empty: the SQLite file in data_dir; or a postgresql://user:pw@host:port/db URL that several "
                         "gateways, judges and trainers share (docs/SCALING.md).", flags=("--store",))
    log_level: str = opt("info", "Log level.", choices=("debug", "info", "warning", "error"))
    model: ModelConfig = field(default_factory=ModelConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    capture: CaptureConfig = field(default_factory=CaptureConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    ray: RayConfig = field(default_factory=RayConfig)


# Names users of other tools type that we deliberately do not implement.
REFUSED = {
}

ENV_FLAG_STRINGS = ("ROLLOUT_ARGS", "OPTIMIZER_ARGS", "LORA_ARGS", "CKPT_ARGS")
SECTIONS = ("model", "serve", "capture", "judge", "train", "gate", "buffer", "env", "ray")


@dataclass
class _Leaf:
    path: tuple[str, ...]
    f: dataclasses.Field
    typ: Any

    @property
    def key(self) -> str:
        return ".".join(self.path)

    @property
    def dest(self) -> str:
        return "__".join(self.path)

    @property
    def canonical_flag(self) -> str:
        flags = self.f.metadata["flags"]
        if flags:
            return flags[0]
        return "--" + "-".join(self.path).replace("_", "-")

    @property
    def all_flags(self) -> list[str]:
        names = [self.canonical_flag, *self.f.metadata["flags"]]
        dotted = "--" + self.key.replace("_", "-")
        names.append(dotted)
        return list(dict.fromkeys(names))

    @property
    def envs(self) -> list[str]:
        return ["CLAWLOOP_" + "_".join(self.path).upper(), *self.f.metadata["env"]]


def _leaves(cls: type = Config, prefix: tuple[str, ...] = ()) -> list[_Leaf]:
    hints = typing.get_type_hints(cls)
    out: list[_Leaf] = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            out.extend(_leaves(t, prefix + (f.name,)))
        else:
            out.append(_Leaf(prefix + (f.name,), f, t))
    return out


LEAVES = _leaves()


def _coerce(leaf: _Leaf, value: Any, source: str) -> Any:
    t = leaf.typ
    try:
        if t is bool:
            if isinstance(value, bool):
                v: Any = value
            elif str(value).strip().lower() in ("1", "true", "yes", "on"):
                v = True
            elif str(value).strip().lower() in ("0", "false", "no", "off", ""):
                v = False
            else:
                raise ValueError(value)
        elif t is int:
            if isinstance(value, bool):
                raise ValueError(value)
            v = int(value)
        elif t is float:
            v = float(value)
        elif t is list:
            if isinstance(value, str):
                v = [x.strip() for x in value.split(",") if x.strip()]
            elif isinstance(value, list):
                v = list(value)
            else:
                raise ValueError(value)
        else:
            v = str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {leaf.key} expects {t.__name__}, got {value!r}") from None
    choices = leaf.f.metadata["choices"]
    if choices and v not in choices:
        raise ConfigError(f"{source}: {leaf.key} must be one of {', '.join(map(str, choices))}, got {v!r}")
    return v


def _set(cfg: Config, leaf: _Leaf, value: Any) -> None:
    obj: Any = cfg
    for p in leaf.path[:-1]:
        obj = getattr(obj, p)
    setattr(obj, leaf.path[-1], value)


def _flatten_yaml(d: dict, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and (prefix + (k,))[0] in SECTIONS and len(prefix) == 0:
            out.update(_flatten_yaml(v, prefix + (k,)))
        else:
            out[prefix + (str(k),)] = v
    return out


def build_parser(prog: str = "clawloop") -> argparse.ArgumentParser:
    """An argparse parser with every config field; values default to SUPPRESS so
    only flags actually given show up."""
    p = argparse.ArgumentParser(prog=prog, add_help=False, allow_abbrev=False)
    add_config_arguments(p)
    return p


def leaf_in(leaf: _Leaf, scope: tuple[str, ...] | None) -> bool:
    """Whether a command whose `scope` is these sections and dotted keys takes this leaf as a flag
    (None: every leaf). The top-level keys (data_dir, log_level) belong to every command."""
    return scope is None or len(leaf.path) == 1 or leaf.path[0] in scope or leaf.key in scope


def leaf_of_flag(arg: str) -> _Leaf | None:
    """The config leaf a command-line flag (`--lr`, `--lr=1`, `--no-publish-gate`) names, if any."""
    name = arg.split("=", 1)[0]
    for leaf in LEAVES:
        if name in leaf.all_flags or (leaf.typ is bool and name == "--no-" + leaf.canonical_flag[2:]):
            return leaf
    return None


def add_config_arguments(p: argparse.ArgumentParser, scope: tuple[str, ...] | None = None) -> None:
    """The config's flags on `p`: those of `scope` (sections like "train", or dotted keys like
    "serve.insecure"; None: all). A command takes only the flags it uses: nothing is accepted and
    ignored (`clawloop export --lr 1` is an error naming the flag, see `foreign_flag_error`)."""
    p.add_argument("--config", default=argparse.SUPPRESS, help="YAML config file.")
    groups: dict[str, Any] = {}
    for leaf in LEAVES:
        if not leaf_in(leaf, scope):
            continue
        section = leaf.path[0] if len(leaf.path) > 1 else "general"
        g = groups.setdefault(section, p.add_argument_group(f"{section} options"))
        help_ = leaf.f.metadata["help"] + f" [{leaf.key}; default: {_default_of(leaf)!r}]"
        if leaf.typ is bool:
            g.add_argument(*leaf.all_flags, dest=leaf.dest, nargs="?", const="true",
                           default=argparse.SUPPRESS, help=help_)
            neg = "--no-" + leaf.canonical_flag[2:]
            g.add_argument(neg, dest=leaf.dest, action="store_const", const="false",
                           default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        elif leaf.typ is list:
            g.add_argument(*leaf.all_flags, dest=leaf.dest, action="append", default=argparse.SUPPRESS, help=help_)
        else:
            g.add_argument(*leaf.all_flags, dest=leaf.dest, default=argparse.SUPPRESS, help=help_)
    for name, why in REFUSED.items():
        if name.startswith("--"):
            p.add_argument(name, dest="__refused__" + name, nargs="?", default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS)


def _default_of(leaf: _Leaf) -> Any:
    obj: Any = Config()
    for part in leaf.path:
        obj = getattr(obj, part)
    return obj


class _RaisingParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise ConfigError(message)


def _parse_flag_string(s: str, source: str) -> dict[str, Any]:
    p = _RaisingParser(prog=source, add_help=False, allow_abbrev=False)
    add_config_arguments(p)
    try:
        ns, unknown = p.parse_known_args(shlex.split(s))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None
    if unknown:
        raise ConfigError(f"{source}: unknown flag {unknown[0]!r}")
    return vars(ns)


def apply_namespace(cfg: Config, values: dict[str, Any], source: str) -> None:
    by_dest = {leaf.dest: leaf for leaf in LEAVES}
    for dest, raw in values.items():
        if dest.startswith("__refused__"):
            name = dest.removeprefix("__refused__")
            raise ConfigError(f"{source}: {name} is not supported: {REFUSED[name]}")
        leaf = by_dest.get(dest)
        if leaf is None:
            continue
        if leaf.typ is list and isinstance(raw, list):
            flat: list[str] = []
            for item in raw:
                flat.extend(x.strip() for x in str(item).split(",") if x.strip())
            raw = flat
        _set(cfg, leaf, _coerce(leaf, raw, source))


def load_config(flag_values: dict[str, Any] | None = None, *, config_file: str | None = None,
                env: dict[str, str] | None = None) -> Config:
    """Resolve the config. `flag_values` is `vars()` of a namespace built with
    `add_config_arguments` (only given flags present)."""
    env = dict(os.environ if env is None else env)
    flag_values = dict(flag_values or {})
    cfg = Config()

    if config_file is None:
        config_file = flag_values.pop("config", None) or env.get("CLAWLOOP_CONFIG") or None
    else:
        flag_values.pop("config", None)
    if config_file:
        try:
            data = yaml.safe_load(Path(config_file).read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"--config: no such file {config_file!r}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{config_file}: not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{config_file}: top level must be a mapping")
        by_path = {leaf.path: leaf for leaf in LEAVES}
        for path, value in _flatten_yaml(data).items():
            leaf = by_path.get(path)
            if leaf is None:
                raise ConfigError(f"{config_file}: unknown config key {'.'.join(path)!r}")
            _set(cfg, leaf, _coerce(leaf, value, config_file))

    for name in REFUSED:
        if not name.startswith("--") and env.get(name):
            raise ConfigError(f"env {name} is not supported: {REFUSED[name]}")
    _check_model_envs(env)
    for leaf in LEAVES:
        for name in leaf.envs:
            if name in env and env[name] != "":
                _set(cfg, leaf, _coerce(leaf, env[name], f"env {name}"))
                break
    for name in ENV_FLAG_STRINGS:
        if env.get(name):
            apply_namespace(cfg, _parse_flag_string(env[name], f"env {name}"), f"env {name}")

    apply_namespace(cfg, flag_values, "command line")
    if cfg.judge.url and cfg.judge.kind == "offline":
        cfg.judge.kind = "url"
    if cfg.train.teacher_model and cfg.train.teacher == "frozen":  # the default: --teacher-model alone says it
        cfg.train.teacher = "model"
    if not cfg.model.max_model_len:  # 0, the default: by the model served (ModelConfig.max_model_len)
        cfg.model.max_model_len = 32768 if not cfg.model.path else 2048
    validate(cfg)
    return cfg


def _check_model_envs(env: dict[str, str]) -> None:
    """JUDGE_MODEL_PATH and PRM_MODEL_PATH both name judge.model: two different values would leave one ignored."""
    judge, prm = env.get("JUDGE_MODEL_PATH", ""), env.get("PRM_MODEL_PATH", "")
    if judge and prm and judge != prm and not env.get("CLAWLOOP_JUDGE_MODEL"):
        raise ConfigError(f"judge.model: env JUDGE_MODEL_PATH={judge!r} and PRM_MODEL_PATH={prm!r} differ, and clawloop "
                          "has one judge model (it scores and writes hints); set one of them, or CLAWLOOP_JUDGE_MODEL")


def validate(cfg: Config) -> None:
    def need(ok: bool, key: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"{key}: {why}")

    need(0 < cfg.serve.port < 65536, "serve.port", f"must be 1..65535, got {cfg.serve.port}")
    need("://" not in cfg.store or cfg.store.startswith(("postgresql://", "postgres://")), "store",
         f"{cfg.store.split('://')[0]}:// is not a store: give a postgresql:// URL, a SQLite file, or nothing")
    need(cfg.serve.close_json_tokens >= 0, "serve.close_json_tokens", f"must be >= 0, got {cfg.serve.close_json_tokens}")
    need(cfg.serve.json_whitespace >= 0, "serve.json_whitespace", f"must be >= 0, got {cfg.serve.json_whitespace}")
    need(0 < cfg.buffer.port < 65536, "buffer.port", f"must be 1..65535, got {cfg.buffer.port}")
    need(cfg.model.max_batch_size >= 1, "model.max_batch_size", "must be >= 1")
    need(cfg.model.admit_wait_ms >= 0, "model.admit_wait_ms", "must be >= 0")
    need(cfg.judge.majority_vote_n >= 1, "judge.majority_vote_n", "must be >= 1")
    need(0.0 < cfg.judge.majority_vote_threshold <= 1.0, "judge.majority_vote_threshold", "must be in (0, 1]")
    need(cfg.judge.num_workers >= 1, "judge.num_workers", "must be >= 1")
    need(cfg.judge.kind != "url" or bool(cfg.judge.url), "judge.url", "--judge url needs --judge-url")
    need(cfg.judge.max_tokens >= 1, "judge.max_tokens", "must be >= 1")
    need(cfg.judge.max_malformed >= 0, "judge.max_malformed", "must be >= 0 (0: retry forever)")
    need(cfg.train.rollout_batch_size >= 1, "train.rollout_batch_size", "must be >= 1")
    need(-1 <= cfg.train.nice <= 19, "train.nice", f"must be 0..19, or -1 for auto, got {cfg.train.nice}")
    need(cfg.train.lr >= 0, "train.lr", "must be > 0, or 0 for the rate by model size")
    need(cfg.train.dual_clip == 0 or cfg.train.dual_clip > 1, "train.dual_clip", "must be 0 (off) or > 1")
    need(cfg.train.source != "buffer" or bool(cfg.train.buffer_url), "train.buffer_url",
         "--source buffer needs --buffer-url")
    validate_train(cfg.train, need)
    validate_gate(cfg.gate, need)
    need(0.0 <= cfg.buffer.min_group_ratio <= 1.0, "buffer.min_group_ratio", "must be in [0, 1]")
    need(cfg.serve.max_body_bytes > 0, "serve.max_body_bytes", "must be > 0")
    need(cfg.serve.max_concurrent_generations >= 1, "serve.max_concurrent_generations", "must be >= 1")
    need(cfg.serve.max_queued_requests >= 0, "serve.max_queued_requests", "must be >= 0")
    need(cfg.serve.request_timeout_s >= 0, "serve.request_timeout_s", "must be >= 0 (0: no limit)")
    need(not cfg.serve.metrics_auth or bool(cfg.serve.api_keys), "serve.metrics_auth",
         "--metrics-auth needs at least one --api-key")
    api_key_tenants(cfg.serve.api_keys)  # raises on an empty or repeated key
    need(cfg.model.engine_replicas >= 1, "model.engine_replicas", "must be >= 1")
    need(not cfg.model.engine_urls or cfg.model.backend == "vllm", "model.engine_urls",
         "--engine-url attaches to vLLM servers: it needs --backend vllm")
    need(not cfg.model.load_in_4bit or (cfg.train.use_lora and cfg.model.backend == "hf"), "model.load_in_4bit",
         "LoRA adapters train on the frozen 4-bit base, which only the hf engine serves: needs --use-lora, --backend hf")
    need(0.0 <= cfg.model.gpu_memory_utilization < 1.0, "model.gpu_memory_utilization", "must be in [0, 1)")
    dev = cfg.train.device
    need(dev in ("auto", "cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit()), "train.device",
         f"must be auto, cpu, cuda or cuda:N, got {dev!r}")
    for key, ids in (("train.train_gpus", cfg.train.train_gpus), ("train.rollout_gpus", cfg.train.rollout_gpus)):
        need(all(str(i).isdigit() for i in ids), key, f"must be GPU ids like 0,1,2, got {','.join(map(str, ids))!r}")
    e = cfg.env
    need(e.max_steps >= 1, "env.max_steps", "must be >= 1 (MAX_STEPS)")
    need(e.parallel_envs >= 1, "env.parallel_envs", "must be >= 1 (PARALLEL_ENVS)")
    need(e.num_repeat_per_sample >= 1, "env.num_repeat_per_sample", "must be >= 1")
    need(e.command_timeout_s > 0, "env.command_timeout_s", "must be > 0")
    need(e.prm_votes >= 0, "env.prm_votes", "must be >= 0")
    need(e.prm != "url" or bool(e.prm_url), "env.prm_url", "--prm url needs --prm-url")
    need(e.sandbox != "none" or e.allow_unsandboxed, "env.sandbox",
         "none runs agent commands unsandboxed: add --allow-unsandboxed to mean it")
    need(not e.tools_config or Path(e.tools_config).is_file(), "env.tools_config",
         f"no such file {e.tools_config!r} (TOOLS_CONFIG)")
    need(not e.task_dir or Path(e.task_dir).exists(), "env.task_dir", f"no such file or folder {e.task_dir!r}")
    validate_ray(cfg, need)


def validate_train(t: TrainConfig, need: Any) -> None:
    """The train section's cross-field rules; `need(ok, key, why)` raises a ConfigError naming the key."""
    for key in ("micro_batch_tokens", "num_steps_per_rollout", "fixed_denominator_tokens", "hint_overlap_topk"):
        need(getattr(t, key) >= 1, f"train.{key}", "must be >= 1")
    for key in ("max_staleness", "opd_clip", "baseline_window", "distill_topk", "anchor_coef", "anchor_rl_coef",
                "tis_cap", "rehearsal_rows", "rehearsal_coef", "adam_eps_rel"):
        need(getattr(t, key) >= 0, f"train.{key}", "must be >= 0 (0: off)" if key != "baseline_window" else "must be >= 0")
    for key in ("negative_weight", "retry_weight"):
        need(0 <= getattr(t, key) <= 1, f"train.{key}", "must be in [0, 1]")
    need(0 < t.rehearsal_sure <= 1, "train.rehearsal_sure", "must be in (0, 1]")
    need(0 <= t.rehearsal_choices < 1, "train.rehearsal_choices", "must be in [0, 1)")
    need(t.opd_target != "advantage" or t.distill_topk == 0, "train.distill_topk",
         "does nothing with --opd-target advantage (the per-token advantage uses no top-K); use --opd-target topk")
    need(0 < t.opd_nucleus_p <= 1, "train.opd_nucleus_p", "must be in (0, 1]")
    need(t.distill_topk == 0 or t.method in ("opd", "combine"), "train.distill_topk",
         f"top-K distillation is the OPD term: it needs --method opd or combine, not {t.method}")
    need(t.teacher != "model" or bool(t.teacher_model), "train.teacher_model", "--teacher model needs --teacher-model PATH")
    need(not t.teacher_model or t.teacher == "model", "train.teacher",
         f"--teacher-model is given, but --teacher is {t.teacher!r}; drop one of them")


def validate_gate(g: GateConfig, need: Any) -> None:
    """The gate section's rules; `need(ok, key, why)` raises a ConfigError naming the key."""
    need(0.0 <= g.tolerance <= 1.0, "gate.tolerance", f"must be in [0, 1] (a pass-rate difference), got {g.tolerance}")
    need(0.0 < g.backoff <= 1.0, "gate.backoff", f"must be in (0, 1] (1: off), got {g.backoff}")
    need(g.hold >= 1.0, "gate.hold", f"must be >= 1 (1: off), got {g.hold}")
    for key in ("builtin_checks", "max_tokens", "batch_size", "rotations"):
        need(getattr(g, key) >= 1, f"gate.{key}", "must be >= 1")
    for key in ("samples", "retries"):
        need(getattr(g, key) >= 0, f"gate.{key}", "must be >= 0 (0: off)")
    need(g.temperature > 0, "gate.temperature", f"must be > 0 (greedy: --gate-samples 0), got {g.temperature}")
    need(not g.regression_set or Path(g.regression_set).is_file(), "gate.regression_set",
         f"no such file {g.regression_set!r} (--regression-set)")


def validate_ray(cfg: Config, need: Any) -> None:
    """The ray section's rules (checked whatever the mode, so a YAML file is wrong before it is used)."""
    r = cfg.ray
    need(r.num_cpus >= 1, "ray.num_cpus", "must be >= 1")
    need(r.object_store_mb >= 80, "ray.object_store_mb", "must be >= 80 (Ray's smallest object store)")
    need(r.trainer_workers >= 0, "ray.trainer_workers", "must be >= 0 (0: the trainer stays in this process)")
    need(r.judge_workers >= 0, "ray.judge_workers", "must be >= 0")
    need(r.env_workers >= 0, "ray.env_workers", "must be >= 0")
    need(r.env_num_cpus >= 0, "ray.env_num_cpus", "must be >= 0")
    need(bool(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", r.env_resource)), "ray.env_resource",
         f"must be a resource name like env, got {r.env_resource!r}")
    for key in ("engine_num_cpus", "trainer_num_cpus", "judge_num_cpus"):
        need(getattr(r, key) >= 0 or getattr(r, key) == -1, f"ray.{key}", "must be >= 0, or -1 (auto)")
    for key in ("engine_num_gpus", "trainer_num_gpus", "judge_num_gpus"):
        need(getattr(r, key) >= 0, f"ray.{key}", "must be >= 0")
    need(r.max_restarts >= 0, "ray.max_restarts", "must be >= 0")
    need(not r.name or bool(re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", r.name)), "ray.name",
         f"letters, digits, '_', '.', '-' (at most 64), got {r.name!r}")
    for key in ("token_timeout_s", "replica_wait_s", "health_interval_s", "step_timeout_s", "start_timeout_s"):
        need(getattr(r, key) > 0, f"ray.{key}", "must be > 0")
    need(r.trainer_num_gpus == 0 or r.trainer_num_gpus >= 1 or r.trainer_workers <= 1, "ray.trainer_num_gpus",
         "nccl needs a whole GPU per trainer actor (0, or >= 1)")
    if r.mode:
        need(cfg.model.backend in ("hf", "vllm"), "ray.mode", f"--ray runs hf or vLLM engine replicas; --backend "
             f"{cfg.model.backend} is not supported with it")
        need(not cfg.model.engine_urls, "ray.mode", "--engine-url attaches to servers someone else runs; with --ray "
             "clawloop places the vLLM servers itself (--engine-replicas N --engine-num-gpus 1)")
        need(not cfg.train.rollout_gpus, "train.rollout_gpus", "with --ray, Ray assigns the GPUs: drop ROLLOUT_GPUS "
             "and give --engine-num-gpus")
        need(not cfg.model.sleep_while_training, "model.sleep_while_training", "--colocate is not supported with "
             "--ray: give the trainer and the engines their own GPUs")
        need(r.mode == "auto" or r.num_cpus >= r.engine_num_cpus, "ray.engine_num_cpus",
             f"an engine actor asks for {r.engine_num_cpus} CPUs, the local cluster has {r.num_cpus}")
        need(r.mode == "auto" or r.num_cpus >= r.trainer_num_cpus, "ray.trainer_num_cpus",
             f"a trainer actor asks for {r.trainer_num_cpus} CPUs, the local cluster has {r.num_cpus}")
        need(r.mode == "auto" or r.num_cpus >= r.judge_num_cpus, "ray.judge_num_cpus",
             f"a judge actor asks for {r.judge_num_cpus} CPUs, the local cluster has {r.num_cpus}")
    need(r.judge_workers == 0 or bool(r.mode), "ray.judge_workers", "judge actors run on Ray: add --ray auto|local")
    need(r.judge_workers == 0 or cfg.judge.kind == "frozen", "ray.judge_workers",
         f"judge actors serve a frozen judge model (--judge frozen [--judge-model DIR]); --judge is "
         f"{cfg.judge.kind!r}")
    need(r.env_workers == 0 or bool(r.mode), "ray.env_workers", "env-pool actors run on Ray: add --ray auto|local")


DEFAULT_TENANT = "default"
_TENANT = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def parse_api_key(entry: str) -> tuple[str, str]:
    """`NAME=KEY` → (NAME, KEY); a bare `KEY` → ("default", KEY). NAME is 1-64 of `A-Za-z0-9_.-`.
    A bare key that ends in `=` padding stays one key; a key with `=` inside needs the NAME= form."""
    name, sep, key = entry.partition("=")
    if sep and _TENANT.fullmatch(name) and key.strip("="):
        return name, key
    return DEFAULT_TENANT, entry


def api_key_tenants(entries: list[str]) -> list[tuple[str, str]]:
    """(tenant, key) per configured key; an empty or repeated key is a ConfigError."""
    out, seen = [], set()
    for entry in entries:
        tenant, key = parse_api_key(str(entry))
        if not key.strip():
            raise ConfigError(f"serve.api_keys: tenant {tenant!r} has an empty key")
        if key in seen:
            raise ConfigError(f"serve.api_keys: a key is given twice (tenant {tenant!r})")
        seen.add(key)
        out.append((tenant, key))
    return out
