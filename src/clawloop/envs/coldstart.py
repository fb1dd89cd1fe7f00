"""A supervised cold start from a track's reference solutions, before RL (`clawloop env coldstart`).

    clawloop env coldstart --track toolcall --tools-config calculator.json --out /tmp/cold --steps 320
    clawloop up --model-path /tmp/cold --buffer ...             # RL from there

RL can only reinforce what the policy sometimes does. A model that never makes a right call gets no
positive episode to learn from, and RL on the outcome teaches it to drop the tool instead (the
tool-call track on the tiny model: an exact calculator call in ~1 % of episodes). The usual remedy
(ReTool, SWE agents' SFT stage) is a short supervised stage on reference solutions first, so RL starts
from a policy that can make the call. This is that stage, on the track's own `oracle()` solutions:

1. every training task's reference solution is played through the real environment (sandboxed, as
   `clawloop env check` plays it), and only episodes that score the track's maximum are kept (and,
   where the environment reports it, whose tool call gave the answer): the tool's real output is in
   the conversation, not a guess;
2. each kept episode is rendered with the model's chat template and tools exactly as the gateway
   renders them; the loss is the assistant's tokens only (through its end-of-turn token);
3. `--steps` AdamW steps of token-mean cross-entropy on random batches of episodes, with a
   `--replay` share of the model's own greedy answers to the tasks' questions asked without tools
   (self-distillation: what it could do before stays a target), then the model is saved to `--out`
   (written beside it and renamed into place: nothing half-written).

`coldstart.json` in the output records the recipe, the tasks used (and those left out, with why) and
the loss curve; a tiny-model build's `build_info.json` is carried over with the recipe added. What the
stage does to held-out tasks and to the model's other skills is measured by the track's bench
(`bench/agent_toolcall_learning.py --cold-start-steps N`), not here.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import random
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawloop.envs.base import EnvOptions, Task, get_track

log = logging.getLogger(__name__)


@dataclass
class Demo:
    task_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    reward: float


@dataclass
class ColdStartResult:
    out: str
    demos: int
    skipped: list[str] = field(default_factory=list)
    """Tasks whose reference solution did not score the maximum (not trained on), with the reason."""
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


def play_reference(track_name: str, task: Task, opts: EnvOptions, slot: int) -> tuple[Demo | None, str]:
    """The task's reference solution played through its environment: the whole conversation (opening,
    the oracle's messages, what the environment answered), kept only when it scores the maximum."""
    track = get_track(track_name)
    env = track.make_env(task, opts, slot=slot)
    try:
        obs = env.reset()
        msgs = [dict(m) for m in obs.messages]
        for m in env.oracle()[: opts.max_steps]:
            msgs.append(dict(m))
            out = env.step(m)
            msgs.extend(dict(x) for x in out.messages)
            if out.done:
                break
        ev = env.evaluate()
    finally:
        env.close()
    best = track.max_reward(task)
    if ev.reward < best - 1e-9:
        return None, f"{task.task_id}: reference scored {ev.reward:g} < {best:g}"
    d = ev.details or {}
    if d.get("n_calls") and d.get("exact_call") is False:
        # the answer is right but no call's result was it (a wrong reference expression): as a
        # demonstration it would teach the answer to ignore the tool
        return None, (f"{task.task_id}: reference's tool calls did not give the answer "
                      f"(reference {d.get('reference')!r})")
    return Demo(task.task_id, msgs, obs.tools, float(ev.reward)), ""


def demonstrations(track_name: str, opts: EnvOptions, task_ids: list[str] | None = None,
                   parallel: int = 4) -> tuple[list[Demo], list[str]]:
    """(verified reference episodes, why the others were left out) for the track's tasks (or `task_ids`)."""
    track = get_track(track_name)
    tasks = track.load_tasks(opts)
    if task_ids:  # ids, or shell-style patterns ("math-*")
        known = {t.task_id: t for t in tasks}
        chosen: dict[str, Task] = {}
        missing = []
        for pat in task_ids:
            hits = [k for k in known if fnmatch.fnmatchcase(k, pat)] if any(c in pat for c in "*?[") else (
                [pat] if pat in known else [])
            if not hits:
                missing.append(pat)
            chosen.update((k, known[k]) for k in hits)
        if missing:
            raise ValueError(f"--tasks: no such {track_name} task: {', '.join(missing[:5])}")
        tasks = list(chosen.values())
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as ex:
        results = list(ex.map(lambda it: play_reference(track_name, it[1], opts, it[0]), enumerate(tasks)))
    demos = [d for d, _ in results if d is not None]
    return demos, [why for d, why in results if d is None]


def render(tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
           ) -> tuple[list[int], list[int]] | None:
    """(token ids of the conversation, 1 on the assistant's tokens) as the gateway renders it: each
    assistant message is what follows the prompt before it with the generation prompt, through the
    end-of-turn token. None when the template does not render turn by turn (a prefix is not a prefix)."""
    def ids(msgs: list[dict[str, Any]], gen: bool) -> list[int]:
        text = tok.apply_chat_template(msgs, tools=tools or None, add_generation_prompt=gen, tokenize=False)
        return list(tok.encode(text, add_special_tokens=False))

    full = ids(messages, False)
    mask = [0] * len(full)
    eos = tok.eos_token_id
    for i, m in enumerate(messages):
        if m.get("role") != "assistant":
            continue
        pre, upto = ids(messages[:i], True), ids(messages[: i + 1], False)
        if upto[: len(pre)] != pre or full[: len(upto)] != upto or len(upto) <= len(pre):
            return None
        span = upto[len(pre):]
        end = len(pre) + (span.index(eos) + 1 if eos in span else len(span))
        for k in range(len(pre), end):
            mask[k] = 1
    return (full, mask) if any(mask) else None


def read_prompts(path: str) -> list[str]:
    """Prompts to replay from a file: JSONL objects with "prompt" (or "question"), or one prompt per line."""
    try:
        lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    except OSError as e:
        raise ValueError(f"--replay-prompts {path}: {e.strerror or e}") from None
    out = []
    for i, ln in enumerate(lines, 1):
        if ln.lstrip().startswith("{"):
            try:
                obj = json.loads(ln)
            except json.JSONDecodeError as e:
                raise ValueError(f"--replay-prompts {path}:{i}: not JSON: {e.msg}") from None
            text = obj.get("prompt") or obj.get("question") if isinstance(obj, dict) else None
            if not isinstance(text, str) or not text.strip():
                raise ValueError(f"--replay-prompts {path}:{i}: no 'prompt' string")
            out.append(text)
        else:
            out.append(ln.strip())
    if not out:
        raise ValueError(f"--replay-prompts {path}: no prompts")
    return out


REPLAY_TINY = 512
"""Corpus questions (never the held-out pairs) replayed for the tiny model beside the tasks' own."""


def tiny_model_questions(model_path: str, n: int, seed: int) -> list[str]:
    """`n` questions of the tiny model's corpus (its training distribution, no held-out pair) when
    `model_path` is a tiny-model build, else none."""
    info = Path(model_path) / "build_info.json"
    try:
        if not str(json.loads(info.read_text()).get("name", "")).startswith("tiny-chat"):
            return []
    except (OSError, ValueError, AttributeError):
        return []
    from clawloop.tinymodel.corpus import sample_question

    rng = random.Random(f"coldstart-replay-{seed}")
    return [sample_question(rng)["question"] for _ in range(n)]


def own_answers(model: Any, tok: Any, questions: list[str], max_new: int = 24, batch: int = 64
                ) -> list[list[dict[str, Any]]]:
    """The model's own greedy answers to `questions` asked plainly (no tools, no system): replay data."""
    import torch

    out = []
    model.eval()
    side = tok.padding_side
    tok.padding_side = "left"
    try:
        for i in range(0, len(questions), batch):
            qs = questions[i: i + batch]
            texts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=False) for q in qs]
            enc = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
            with torch.no_grad():
                gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False, eos_token_id=tok.eos_token_id,
                                     pad_token_id=tok.pad_token_id)
            for q, g in zip(qs, gen[:, enc["input_ids"].shape[1]:]):
                reply = tok.decode(g, skip_special_tokens=True).strip()
                if reply:
                    out.append([{"role": "user", "content": q}, {"role": "assistant", "content": reply}])
    finally:
        tok.padding_side = side
    return out


def batches_of(rows: list[tuple[list[int], list[int]]], plain: list[tuple[list[int], list[int]]], *, steps: int,
               batch_size: int, n_plain: int, seed: int) -> list[list[tuple[list[int], list[int]]]]:
    """`steps` batches: `batch_size - n_plain` random rows of `rows` and `n_plain` of `plain` each."""
    rng = random.Random(seed)
    n_plain = n_plain if plain else 0
    return [[rows[rng.randrange(len(rows))] for _ in range(batch_size - n_plain)]
            + [plain[rng.randrange(len(plain))] for _ in range(n_plain)] for _ in range(steps)]


def train(model: Any, batches: list[list[tuple[list[int], list[int]]]], *, lr: float, seed: int, pad_id: int,
          warmup: int = 10, log_every: int = 20, base: Any = None, soft: set[int] | None = None) -> list[float]:
    """One AdamW step of token-mean cross-entropy on the masked tokens of each batch. Rows whose `id()` is
    in `soft` (replay rows) are trained towards `base`'s whole next-token distribution instead of their
    tokens (KL(base || model)): the model keeps what it would have said, not one greedy sample of it."""
    import torch

    torch.manual_seed(seed)
    steps = len(batches)
    soft = soft or set()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * min(1.0, (step + 1) / max(1, warmup))
        batch = batches[step]
        T = max(len(t) for t, _ in batch)
        ids = torch.full((len(batch), T), pad_id, dtype=torch.long)  # (B, T)
        attn = torch.zeros((len(batch), T), dtype=torch.long)  # (B, T)
        mask = torch.zeros((len(batch), T), dtype=torch.float32)  # (B, T)
        for b, (t, m) in enumerate(batch):
            ids[b, : len(t)] = torch.tensor(t)
            attn[b, : len(t)] = 1
            mask[b, : len(m)] = torch.tensor(m, dtype=torch.float32)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()  # (B, T-1, V)
        per_tok = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (B, T-1)
        is_soft = torch.tensor([id(r) in soft for r in batch])  # (B,)
        if base is not None and bool(is_soft.any()):
            with torch.no_grad():
                ref = torch.log_softmax(base(input_ids=ids[is_soft], attention_mask=attn[is_soft]).logits[:, :-1]
                                        .float(), -1)  # (S, T-1, V)
            lp = torch.log_softmax(logits[is_soft], -1)  # (S, T-1, V)
            per_tok = per_tok.clone()
            per_tok[is_soft] = (ref.exp() * (ref - lp)).sum(-1)  # KL(base || model) per position
        m = mask[:, 1:]  # (B, T-1)
        loss = (per_tok * m).sum() / m.sum().clamp(min=1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(round(float(loss.detach()), 4))
        if log_every and (step + 1) % log_every == 0:
            log.info("cold start step %d/%d loss %.4f", step + 1, steps, sum(losses[-log_every:]) / log_every)
    model.eval()
    return losses


def cold_start(model_path: str, out: str, track_name: str, opts: EnvOptions, *, steps: int = 1920, lr: float = 3e-4,
               batch_size: int = 8, replay: float = 0.75, task_ids: list[str] | None = None, seed: int = 0,
               parallel: int = 4, replay_prompts: list[str] | None = None) -> ColdStartResult:
    """Play, render, train, save (see the module's doc). `replay`: the share of each batch's rows that are
    the model's own plain answers (0: none), to `replay_prompts` (default: the tasks' questions, and for
    the tiny model also `REPLAY_TINY` questions of its own corpus)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if steps < 1:
        raise ValueError(f"--steps must be >= 1, got {steps}")
    if not 0 <= replay < 1:
        raise ValueError(f"--replay must be in [0, 1), got {replay}")
    dest = Path(out)
    if dest.exists() and any(dest.iterdir()):
        raise ValueError(f"--out {out}: exists and is not empty (choose a new folder)")
    t0 = time.monotonic()
    demos, skipped = demonstrations(track_name, opts, task_ids, parallel)
    if not demos:
        raise ValueError(f"no reference solution of the {track_name} track scored the maximum: nothing to learn from "
                         f"({'; '.join(skipped[:3])})")
    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    rows = [r for r in (render(tok, d.messages, d.tools) for d in demos) if r is not None]
    if not rows:
        raise ValueError("the chat template does not render the reference episodes turn by turn: cannot mask the "
                         "assistant's tokens")
    plain: list[tuple[list[int], list[int]]] = []
    if replay > 0:
        questions = list(replay_prompts or [])
        if not questions:
            questions = [d.messages[next(i for i, m in enumerate(d.messages) if m.get("role") == "user")]["content"]
                         for d in demos]
            questions += tiny_model_questions(model_path, REPLAY_TINY, seed)
        plain = [r for r in (render(tok, c, None) for c in own_answers(model, tok, questions)) if r is not None]
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    batches = batches_of(rows, plain, steps=steps, batch_size=batch_size,
                         n_plain=min(batch_size - 1, round(batch_size * replay)), seed=seed)
    base = None
    if plain:
        import copy

        base = copy.deepcopy(model).eval()
        for p in base.parameters():
            p.requires_grad_(False)
    losses = train(model, batches, lr=lr, seed=seed, pad_id=pad, base=base, soft={id(r) for r in plain})
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        src_info = Path(model_path) / "build_info.json"
        info: dict[str, Any] = {}
        if src_info.exists():
            info = {k: v for k, v in json.loads(src_info.read_text()).items() if k != "files"}
        recipe = {"from": str(model_path), "track": track_name, "steps": steps, "lr": lr, "batch_size": batch_size,
                  "replay": replay, "replay_rows": len(plain), "seed": seed, "demos": len(rows),
                  "tasks": [d.task_id for d in demos], "skipped": skipped, "final_loss": losses[-1],
                  "seconds": round(time.monotonic() - t0, 1)}
        if info:  # a tiny-model build stays one (the publish gate's built-in checks know it by its name)
            info["cold_start"] = recipe
            (tmp / "build_info.json").write_text(json.dumps(info, indent=1) + "\n")
        (tmp / "coldstart.json").write_text(json.dumps({**recipe, "losses": losses}, indent=1) + "\n")
        if dest.exists():
            dest.rmdir()
        tmp.rename(dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ColdStartResult(str(dest), len(rows), skipped, losses, round(time.monotonic() - t0, 1))
