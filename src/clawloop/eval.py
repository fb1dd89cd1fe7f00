"""`clawloop eval`: is the model getting better for the people who use it?

Two modes.

**Personas** (the default) — OpenClaw-RL's personalisation evaluation, made
reusable. Simulated users with a persona and a hidden preference talk to the
policy; a rater scores the *first* answer to each of K held-out problems
against the persona's rubric (a 0-10 score, reported in [0, 1]):

    clawloop eval --personas student,teacher                       # built-in users, tiny model, CPU
    clawloop eval --personas student --url http://127.0.0.1:8000   # a running clawloop (it trains)
    clawloop eval --personas student,teacher --user-model-url http://host:8001/v1 --rater-url http://host:8002/v1

For each persona: `before` = the rater's mean over the K problems; then the
persona's users hold conversations (main turns, so a clawloop captures, judges
and trains on them: up to `--turns` tries per problem, a correction after each
answer that misses the preference, thanks and the next problem after one that
fits) until the policy has advanced `--train-updates` versions, measuring after
each update; `after` = the last measure. The measure asks every problem once
as a side turn (never trained on) with fixed seeds, so two measures differ only
by the policy. Without `--url`, each persona gets a fresh `clawloop up` (the
tiny model, or `--model-path`), as the reference ran one job per persona; with
`--url` the personas share that server one after the other. An endpoint that
does not report a policy version (not a clawloop) is measured once.

The personas (`clawloop.users.PERSONAS`), as in the reference: a *student*
who wants homework answers that do not look AI-written, and a *teacher* who
wants friendly grading comments. Built-in users and rater (no LLM, CPU): the
student's preference is the tiny model's bare answer style, the teacher's a
sentence ending with an exclamation mark; the rater gives 5 of 10 for the
right result and 5 for the form. With `--user-model-url` an LLM plays the
persona (writes the opening message and every reply, and says when it is
satisfied); with `--rater-url` an LLM scores against the rubric (`--rater-votes`
scores averaged; replies without a readable 0-10 score are counted as invalid
and left out).

Problems: `--problem-set tiny` = the tiny model's held-out arithmetic and fact
questions (pairs kept out of its training corpus); `word` = 24 GSM8K-style
word problems written for clawloop (`clawloop/data/eval_word_problems.jsonl`).
The default is `tiny` with built-in users and `word` with LLM users.

**Checkpoint** — what the seed's `openclaw-test/run_eval.sh --model-path CKPT
--eval-tasks "conversation,coding,tool-use"` does, on clawloop's own data
(nothing is downloaded):

    clawloop eval --model-path BASE --model-path TRAINED --eval-tasks conversation,coding,tool-use

Each `--model-path` is served by `clawloop serve` (no training; or `--url` is
evaluated as it is) and scored on:
- `conversation`: the persona measure above, once per persona (no training).
- `coding`: pass@1 on 20 Python function problems written for clawloop
  (`clawloop/data/eval_coding.jsonl`, HumanEval-shaped: a signature and
  docstring, hidden asserts); the answer's code runs with the asserts in the
  agent sandbox (bubblewrap/unshare, no network, time and memory limits).
- `tool-use`: the tool-call track's held-out problems (arithmetic pairs kept
  out of the tiny model's corpus) as multi-step episodes with a `calculator`
  tool: success (right final answer), tool use (episodes with a well-formed
  call) and well-formed calls.

Both modes write `--out` (JSON) and a PNG beside it, print one line per
persona or task, and post their results to a clawloop's dashboard
(`/api/results`: `--url` when it is a clawloop, and `--post-url`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from clawloop.progress import Progress
from clawloop.users import (PERSONAS, LLMRater, LLMUser, Persona, Rater, RuleRater, RuleUser, Server, User,
                            base_url, converse, personas_from, policy_version, post_result)

EVAL_TASKS = ("conversation", "coding", "tool-use")
PARTS = ("correct", "form", "correct_in_form", "correct_off_form", "correct_sums", "correct_facts")
"""The built-in rater's halves, the right results within and outside the persona's form, and per kind of
question (the tiny problem set's sums and facts: a model can lose one while it gains the other)."""
PROBLEM_SETS = ("auto", "tiny", "word")
CODING_FILE = "data/eval_coding.jsonl"
WORD_FILE = "data/eval_word_problems.jsonl"
CALCULATOR = {"tools": [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]}


def _jsonl(name: str) -> list[dict[str, Any]]:
    from importlib import resources

    text = resources.files("clawloop").joinpath(name).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def problems(kind: str, n: int, seed: int) -> list[dict[str, str]]:
    """K evaluation problems as {"question", "answer"}."""
    if kind == "tiny":
        from clawloop.tinymodel.corpus import heldout_questions

        return heldout_questions(n, seed=seed + 1, distinct=True)
    rows = _jsonl(WORD_FILE)
    if n > len(rows):
        raise ValueError(f"--problems {n}: the word set has {len(rows)} problems")
    return [{"question": r["question"], "answer": r["answer"]} for r in rows[:n]]


def training_problems(kind: str) -> list[dict[str, str]] | None:
    """What users ask while the policy trains: the corpus's generator (None) or the word set."""
    return None if kind == "tiny" else [{"question": r["question"], "answer": r["answer"]} for r in _jsonl(WORD_FILE)]


# ---------------------------------------------------------------- the persona measure


class Measure:
    """The first answer to each problem, asked `samples` times as a side turn with fixed seeds, rated for
    a persona. One sampled answer per problem makes 32 problems a measure with a standard error of ~0.07,
    more than the 0.05 a user would call "no loss"; several per problem shrink the sampling part of it
    (the problems are the same before and after, so their own spread mostly cancels in the change)."""

    def __init__(self, persona: Persona, user: User, rater: Rater, probs: list[dict[str, str]], seed: int,
                 max_tokens: int, parallel: int = 8, samples: int = 1):
        if samples < 1:
            raise ValueError("--samples-per-problem: must be >= 1")
        self.persona, self.user, self.rater, self.problems = persona, user, rater, probs
        self.seed, self.max_tokens, self.parallel, self.samples = seed, max_tokens, parallel, samples
        rng = random.Random(seed)
        self.openings = [user.opening(p, random.Random(rng.random())) for p in probs]

    def __call__(self, client: Any, label: str) -> dict[str, Any]:
        jobs = [(k, j) for k in range(len(self.problems)) for j in range(self.samples)]

        def one(job: tuple[int, int]) -> tuple[float | None, int, str]:
            k, j = job
            raw = client.chat.completions.with_raw_response.create(
                model="clawloop", messages=[{"role": "user", "content": self.openings[k]}],
                max_tokens=self.max_tokens, temperature=1.0, seed=self.seed + k * self.samples + j,
                extra_headers={"X-Turn-Type": "side", "X-Session-Id": f"eval-{self.persona.name}-{k}"})
            answer = raw.parse().choices[0].message.content or ""
            version = int(raw.headers.get("x-policy-version", -1))
            return self.rater.score(self.persona, self.problems[k], answer), version, answer

        out: list[tuple[float | None, int, str]] = []
        with Progress(len(jobs), f"eval {self.persona.name} {label}") as bar, \
                ThreadPoolExecutor(self.parallel) as ex:
            for r in ex.map(one, jobs):
                out.append(r)
                bar.update(1)
        probs = [self.problems[k] for k, _ in jobs]
        valid = [s for s, _, _ in out if s is not None]
        parts: dict[str, float] = {}
        if isinstance(self.rater, RuleRater) and out:  # the two halves of the built-in score, apart
            got = [self.rater.parts(self.persona, p, a) for p, (_, _, a) in zip(probs, out)]
            parts = {k: sum(g[k] for g in got) / len(got) for k in ("correct", "form")}
            # right results among the answers in the persona's form and among the others: a model can be
            # better at a task in one form than another, so a move between forms changes `correct` by
            # itself; these two say whether the model lost what it knew within a form
            for key, want in (("correct_in_form", True), ("correct_off_form", False)):
                sel = [g["correct"] for g in got if g["form"] == want]
                parts[key] = sum(sel) / len(sel) if sel else None
            for key, kinds in (("correct_sums", ("add", "sub")), ("correct_facts", ("fact",))):
                sel = [g["correct"] for g, p in zip(got, probs) if p.get("skill") in kinds]
                if sel:
                    parts[key] = sum(sel) / len(sel)
        return {"score": sum(valid) / len(valid) if valid else None, "rated": len(valid), "asked": len(out),
                **parts,
                "policy_version": max(v for _, v, _ in out) if out else -1,
                "answers": [{"question": p["question"], "opening": self.openings[k], "answer": a, "score": s}
                            for (k, _), p, (s, _, a) in zip(jobs, probs, out)]}


def wide_sums(client: Any, problems_asked: list[dict[str, str]], n: int, seed: int, max_tokens: int,
              samples: int = 2, parallel: int = 8) -> dict[str, Any] | None:
    """`correct` on `n` other held-out sums (`samples` seeded replies each at T=1, asked plainly, side turns):
    the persona measure's 24 sums are a fixed set, and a fixed set of 24 lost 1.6x what the sums at large lost
    on versions the gate passed (bench/RESULTS.md "Why the loop made the model worse" 14); this says which
    of the two a drop of `correct_sums` is. None with n 0."""
    if n <= 0:
        return None
    from clawloop.tinymodel.corpus import extract_answer, heldout_questions

    asked = {p["question"] for p in problems_asked}
    pool: list[dict[str, str]] = []  # n distinct sums (the held-out facts are too few to draw them distinct too)
    for q in heldout_questions(8 * n + 32, seed=seed):
        if q["skill"] != "fact" and q["question"] not in asked and len(pool) < n:
            asked.add(q["question"])
            pool.append(q)
    # a seed per reply: one seed for every question would draw the same random numbers for all of them, and
    # an unlucky draw at the digits would then miss most of the sums at once
    jobs = [(q, seed + i * samples + j) for i, q in enumerate(pool[:n]) for j in range(samples)]

    def one(job: tuple[dict[str, str], int]) -> tuple[bool, int]:
        q, s = job
        raw = client.chat.completions.with_raw_response.create(
            model="clawloop", messages=[{"role": "user", "content": q["question"]}], max_tokens=max_tokens,
            temperature=1.0, seed=s, extra_headers={"X-Turn-Type": "side", "X-Session-Id": "eval-wide"})
        answer = raw.parse().choices[0].message.content or ""
        return extract_answer(answer) == q["answer"], int(raw.headers.get("x-policy-version", -1))

    with ThreadPoolExecutor(parallel) as ex:
        got = list(ex.map(one, jobs))
    return {"correct": sum(ok for ok, _ in got) / len(got), "sums": len(jobs) // samples, "samples": samples,
            "policy_version": max(v for _, v in got)}


def change_se(before: list[dict[str, Any]], after: list[dict[str, Any]], probs: list[dict[str, str]]
              ) -> float | None:
    """The standard error of the change of `correct`, paired by problem: each problem's right share after minus
    before, their standard deviation over the square root of their number. The problems are the same before and
    after, but a version moves some sums one way and others the other (a run's 24 sums: 4+56 from 10 of 12 right
    to 1, others up): this says how far the measure's 32 problems alone may carry a change. None: too few."""
    from clawloop.tinymodel.corpus import extract_answer

    want = {p["question"]: p["answer"].strip().lower() for p in probs}

    def share(answers: list[dict[str, Any]]) -> dict[str, float]:
        per: dict[str, list[bool]] = {}
        for x in answers:
            if x["question"] in want:
                per.setdefault(x["question"], []).append(extract_answer(x["answer"]) == want[x["question"]])
        return {q: sum(v) / len(v) for q, v in per.items()}

    b, a = share(before), share(after)
    d = [a[q] - b[q] for q in b if q in a]
    if len(d) < 2:
        return None
    mean = sum(d) / len(d)
    return math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))


def make_user(persona: Persona, a: argparse.Namespace, client_for: Any) -> User:
    if a.user_model_url:
        return LLMUser(persona, client_for(a.user_model_url), a.user_model)
    from clawloop.users import Wording

    return RuleUser(persona.style, Wording(a.wording), check_answer=True)


def make_rater(a: argparse.Namespace, client_for: Any) -> Rater:
    return LLMRater(client_for(a.rater_url), a.rater_model, votes=a.rater_votes) if a.rater_url else RuleRater()


def train_persona(a: argparse.Namespace, url: str, client: Any, persona: Persona, user: User, measure: Measure,
                  t0: float) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Conversations until the policy advanced `--train-updates` versions; a measure after each update."""
    curve: list[dict[str, Any]] = []
    stats = {"answers": 0, "satisfied": 0, "problems": 0}
    rng = random.Random(a.seed + 7)
    train_set = training_problems(a.problem_set)
    v0 = last_v = policy_version(url)
    rounds = 0
    with Progress(a.train_updates, f"eval {persona.name} training") as bar:
        while last_v - v0 < a.train_updates and time.time() - t0 < a.max_minutes * 60:
            with ThreadPoolExecutor(a.users) as ex:
                futs = [ex.submit(converse, client, user, random.Random(rng.random()),
                                  f"{persona.name}-u{u}-r{rounds}", a.turns, problems=train_set,
                                  max_tokens=a.max_tokens, per_problem=a.tries) for u in range(a.users)]
                for f in futs:
                    s = f.result()
                    stats["answers"] += s["answers"]
                    stats["satisfied"] += s["fit"]
                    stats["problems"] += s["problems"]
            rounds += 1
            if not await_update(url, last_v, a.settle_s):
                continue
            m = measure(client, f"after update {policy_version(url) - v0}")
            last_v = m["policy_version"]
            curve.append({"updates": last_v - v0, "policy_version": last_v, "score": m["score"], "rated": m["rated"],
                          **{k: m[k] for k in PARTS if k in m},
                          "minutes": (time.time() - t0) / 60, "answers": m["answers"]})
            bar.update(min(last_v - v0, a.train_updates) - bar.done, note=f"score {_fmt(m['score'])}")
    return curve, stats


def await_update(url: str, version: int, settle_s: float, grace_s: float = 1.5) -> bool:
    """After a round of conversations, wait up to `settle_s` for the policy to move past `version`, so
    the next round talks to it. A clawloop says in /health whether its trainer is stepping or still
    waiting for samples: once the round's last turns had `grace_s` to be judged and read, a trainer
    that is not stepping and has fewer than a batch waiting will not publish; the next round starts at
    once instead of idling (binary, which trains only on accepted answers, needs several rounds a batch).
    Returns whether the version moved."""
    start = time.time()
    while time.time() - start < settle_s:
        health = httpx.get(base_url(url) + "/health", timeout=10).json()
        if int(health["policy_version"]) != version:
            return True
        train = health.get("train")
        if train is not None and time.time() - start >= grace_s and not train["busy"] \
                and train["pending_samples"] < train["batch_size"]:
            return False
        time.sleep(0.2)
    return policy_version(url) != version


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def run_personas(a: argparse.Namespace, client_for: Any) -> dict[str, Any]:
    personas = personas_from(a.personas)
    t0 = time.time()
    out: dict[str, Any] = {"mode": "personas", "personas": {}}
    for persona in personas:
        server = None
        if a.url:
            url = base_url(a.url)
        else:
            data = str(Path(a.data_dir or tempfile.mkdtemp(prefix="clawloop-eval-")) / persona.name)
            flags = ["--method", a.method, "--rollout-batch-size", str(a.batch_size),
                     *(["--lr", str(a.lr)] if a.lr is not None else []), "--judge", "offline",
                     "--seed", str(a.seed), "--no-serve-status", "--capture-session-idle-timeout-s", "30"]
            server = Server(flags + (["--model-path", a.model_path[0]] if a.model_path else []) + a.up_args, data)
            url = server.url
            print(f"eval: {persona.name}: clawloop up on {url} (data {data})", flush=True)
        try:
            client = client_for(url + "/v1")
            user = make_user(persona, a, client_for)
            rater = make_rater(a, client_for)
            measure = Measure(persona, user, rater, problems(a.problem_set, a.problems, a.seed), a.seed + 10_000,
                              a.max_tokens, samples=a.samples_per_problem)
            before = measure(client, "before")
            wide = a.wide_sums if a.problem_set == "tiny" else 0
            wide_before = wide_sums(client, measure.problems, wide, a.seed + 20_000, a.max_tokens)
            try:
                trains = a.train_updates > 0 and policy_version(url) >= 0
            except Exception:  # noqa: BLE001 - not a clawloop: no policy version, measured once
                trains = False
                print(f"eval: {url} reports no policy version; measured once, not trained", flush=True)
            curve, stats = train_persona(a, url, client, persona, user, measure, time.time()) if trains else ([], {})
            after = curve[-1]["score"] if curve else None
            wide_after = wide_sums(client, measure.problems, wide, a.seed + 20_000, a.max_tokens) if curve else None
            rec = {"before": before["score"], "after": after, "updates": curve[-1]["updates"] if curve else 0,
                   **{f"{k}_before": before[k] for k in PARTS if k in before},
                   **{f"{k}_after": curve[-1][k] for k in PARTS if curve and k in curve[-1]},
                   "policy_version_before": before["policy_version"], "rated": before["rated"],
                   "asked": before["asked"], "curve": curve, "answers_before": before["answers"],
                   "users": stats, "user": "llm" if a.user_model_url else "rules",
                   "rater": "llm" if a.rater_url else "rules"}
            if curve and isinstance(rater, RuleRater):
                rec["correct_change_se"] = change_se(before["answers"], curve[-1]["answers"], measure.problems)
            if wide_before is not None:
                rec.update({"correct_wide_before": wide_before["correct"], "wide_sums": wide_before["sums"],
                            **({"correct_wide_after": wide_after["correct"],
                                "correct_wide_version": wide_after["policy_version"]} if wide_after else {})})
            if isinstance(rater, LLMRater):
                rec["rater_invalid"] = rater.invalid
                rec["rater_calls"] = rater.calls
            out["personas"][persona.name] = rec
            parts = "".join(f" {k}={_fmt(rec.get(k + '_before'))}->{_fmt(rec.get(k + '_after'))}"
                            for k in PARTS + ("correct_wide",) if k + "_before" in rec)
            if rec.get("correct_change_se") is not None:
                parts += f" correct_change_se={rec['correct_change_se']:.3f}"
            print(f"persona={persona.name} before={_fmt(rec['before'])} after={_fmt(after)} "
                  f"updates={rec['updates']} rated={rec['rated']}/{rec['asked']} user={rec['user']} "
                  f"rater={rec['rater']}{parts}", flush=True)
        finally:
            if server is not None:
                server.stop()
    out["minutes"] = (time.time() - t0) / 60
    return out


# ---------------------------------------------------------------- checkpoint tasks


def extract_code(text: str, entry_point: str, prompt: str) -> str:
    """The program in an answer: its fenced block (the one defining `entry_point` first), else the text;
    a body without the `def` line is completed under the prompt's signature."""
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", text, re.S)
    code = next((b for b in blocks if f"def {entry_point}" in b), blocks[0] if blocks else text)
    if f"def {entry_point}" not in code:
        code = prompt + code
    return code


def check_code(row: dict[str, Any], code: str, workspace: Path, *, sandbox: str = "auto",
               allow_unsandboxed: bool = False, slot: int = 0) -> dict[str, Any]:
    """Run `code` with the problem's asserts in the agent sandbox; passed only when every assert ran (a random
    mark printed after the last one, so an early `exit(0)` does not pass)."""
    import uuid

    from clawloop.envs.sandbox import Limits, Sandbox

    box = Sandbox(workspace, level=sandbox, allow_unsandboxed=allow_unsandboxed,
                  limits=Limits(memory_mb=1024, disk_mb=16), slot=slot)
    mark = uuid.uuid4().hex
    (box.workspace / "check.py").write_text(code + "\n\n" + "".join(f"assert {t}, {t!r}\n" for t in row["tests"])
                                            + f"print({mark!r})\n")
    box.own_workspace()
    res = box.run(f"cd {box.cwd} && python3 -I check.py", timeout_s=10)
    return {"passed": res.returncode == 0 and not res.timed_out and mark in res.output,
            "output": res.output.replace(mark, "")[-300:], "sandbox": box.level}


def run_coding(url: str, client: Any, a: argparse.Namespace) -> dict[str, Any]:
    rows = _jsonl(CODING_FILE)[: a.coding_problems]
    work = Path(tempfile.mkdtemp(prefix="clawloop-eval-coding-"))

    def one(k: int) -> dict[str, Any]:
        row = rows[k]
        r = client.chat.completions.create(
            model="clawloop", max_tokens=a.code_max_tokens, temperature=0.0, seed=k,
            messages=[{"role": "user", "content": "Complete this Python function. Reply with the whole function in "
                                                  f"a ```python code block.\n\n{row['prompt']}"}],
            extra_headers={"X-Turn-Type": "side", "X-Session-Id": f"eval-coding-{k}"})
        answer = r.choices[0].message.content or ""
        code = extract_code(answer, row["entry_point"], row["prompt"])
        return {"task_id": row["task_id"], "answer": answer,
                **check_code(row, code, work / row["task_id"], sandbox=a.sandbox,
                             allow_unsandboxed=a.allow_unsandboxed, slot=k)}

    try:
        with Progress(len(rows), "eval coding") as bar, ThreadPoolExecutor(4) as ex:
            results = []
            for x in ex.map(one, range(len(rows))):
                results.append(x)
                bar.update(1, note=f"{x['task_id']}: {'pass' if x['passed'] else 'fail'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the answers and their outputs are in the result
    return {"pass@1": sum(x["passed"] for x in results) / max(1, len(results)), "problems": len(results),
            "sandbox": results[0]["sandbox"] if results else None, "results": results}


def tool_use_eval(url: str, tools: str, task_ids: list[str], samples: int, max_tokens: int, *,
                  sandbox: str = "auto", allow_unsandboxed: bool = False, label: str = "eval tool-use"
                  ) -> dict[str, Any]:
    """Held-out tool-call episodes through the gateway (side traffic). success: right final answer;
    tool_use: episodes with a well-formed call; well_formed: parsed calls / attempted calls (an attempt is a
    parsed call or a `<tool_call>` block that did not parse; None when nothing was attempted)."""
    import statistics

    from clawloop.envs.rollout import AgentRollout

    ro = AgentRollout("toolcall", {"remote_engine_url": base_url(url) + "/v1", "remote_buffer_url": "http://unused",
                                   "tools_config": tools, "max_steps": 4, "max_tokens": max_tokens,
                                   "sampling_params": {"temperature": 1.0}, "num_process": 8, "sandbox": sandbox,
                                   "allow_unsandboxed": allow_unsandboxed})
    jobs = [t for t in task_ids for _ in range(samples)]
    items = []
    try:
        with Progress(len(jobs), label) as bar, ThreadPoolExecutor(8) as ex:
            for x in ex.map(lambda t: ro.run_episode(t, "model"), jobs):
                bar.update(1)
                if x is not None:
                    items.append(x)
    finally:
        ro.pool.shutdown()
    parsed = sum(x["extra_info"]["well_formed_calls"] for x in items)
    broken = sum(m.get("content", "").count("<tool_call>") for x in items for m in x["messages"]
                 if m["role"] == "assistant")
    return {"episodes": len(items),
            "success": sum(x["extra_info"]["success"] for x in items) / max(1, len(items)),
            "tool_use": sum(x["extra_info"]["well_formed_calls"] > 0 for x in items) / max(1, len(items)),
            "well_formed": parsed / (parsed + broken) if parsed + broken else None,
            "mean_steps": statistics.mean(x["extra_info"]["n_steps"] for x in items) if items else 0.0,
            "versions": sorted({v for x in items for v in x["extra_info"]["policy_versions"]})}


def run_checkpoints(a: argparse.Namespace, client_for: Any) -> dict[str, Any]:
    tasks = [t.strip() for t in a.eval_tasks.split(",") if t.strip()]
    bad = [t for t in tasks if t not in EVAL_TASKS]
    if bad or not tasks:
        raise ValueError(f"--eval-tasks: unknown task(s) {bad}; choose from {', '.join(EVAL_TASKS)}")
    targets = [("url", a.url)] if a.url else [(p, p) for p in (a.model_path or [""])]
    out: dict[str, Any] = {"mode": "checkpoint", "tasks": tasks, "models": {}}
    t0 = time.time()
    for name, target in targets:
        server = None
        if a.url:
            url = base_url(target)
        else:
            data = tempfile.mkdtemp(prefix="clawloop-eval-ckpt-")
            server = Server((["--model-path", target] if target else []) + ["--no-serve-status"] + a.up_args,
                            data, command="serve")
            url = server.url
            print(f"eval: {target or 'the default tiny model'}: clawloop serve on {url}", flush=True)
        label = name or "tiny-model"
        rec: dict[str, Any] = {}
        try:
            client = client_for(url + "/v1")
            if "conversation" in tasks:
                rec["conversation"] = {}
                for persona in personas_from(a.personas):
                    m = Measure(persona, make_user(persona, a, client_for), make_rater(a, client_for),
                                problems(a.problem_set, a.problems, a.seed), a.seed + 10_000, a.max_tokens,
                                samples=a.samples_per_problem)(client, "conversation")
                    rec["conversation"][persona.name] = {"score": m["score"], "rated": m["rated"],
                                                         "asked": m["asked"], "answers": m["answers"]}
                    print(f"model={label} task=conversation persona={persona.name} score={_fmt(m['score'])} "
                          f"rated={m['rated']}/{m['asked']}", flush=True)
            if "coding" in tasks:
                rec["coding"] = run_coding(url, client, a)
                print(f"model={label} task=coding pass@1={rec['coding']['pass@1']:.2f} "
                      f"problems={rec['coding']['problems']} sandbox={rec['coding']['sandbox']}", flush=True)
            if "tool-use" in tasks:
                from clawloop.envs.toolcall import generated_problems

                tools = Path(tempfile.mkdtemp(prefix="clawloop-eval-tools-")) / "calculator.json"
                tools.write_text(json.dumps(CALCULATOR))
                ids = [p["instance_id"] for p in generated_problems()][: a.tool_use_tasks]
                try:
                    rec["tool-use"] = tool_use_eval(url, str(tools), ids, a.tool_use_samples, a.max_tokens + 24,
                                                    sandbox=a.sandbox, allow_unsandboxed=a.allow_unsandboxed)
                finally:
                    shutil.rmtree(tools.parent, ignore_errors=True)
                tu = rec["tool-use"]
                print(f"model={label} task=tool-use success={tu['success']:.2f} tool_use={tu['tool_use']:.2f} "
                      f"well_formed={_fmt(tu['well_formed'])} episodes={tu['episodes']}", flush=True)
        finally:
            if server is not None:
                server.stop()
                shutil.rmtree(data, ignore_errors=True)  # the server's scratch store: scores are in the result
        out["models"][label] = rec
    out["minutes"] = (time.time() - t0) / 60
    return out


# ---------------------------------------------------------------- outputs


def headline(result: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """{model or persona: {metric: value}}: what the plot and the dashboard show."""
    if result["mode"] == "personas":
        return {p: {"before": r["before"], "after": r["after"]} for p, r in result["personas"].items()}
    out = {}
    for model, rec in result["models"].items():
        row: dict[str, float | None] = {}
        for persona, r in rec.get("conversation", {}).items():
            row[f"conversation/{persona}"] = r["score"]
        if "coding" in rec:
            row["coding pass@1"] = rec["coding"]["pass@1"]
        if "tool-use" in rec:
            row["tool-use success"] = rec["tool-use"]["success"]
            row["tool-use tool use"] = rec["tool-use"]["tool_use"]
        out[model] = row
    return out


def plot(result: dict[str, Any], png: Path, title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    table = headline(result)
    groups = list(table)
    metrics = list(dict.fromkeys(m for row in table.values() for m in row))
    curves = {p: r for p, r in result.get("personas", {}).items() if r["curve"]}
    width_in = max(5.0, 1.6 * len(groups) * max(1, len(metrics)) / 2 + 2)
    if curves:  # before/after bars, and each persona's curve with the built-in rater's two halves
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(width_in + 5, 3.6))
        for k, (p, r) in enumerate(curves.items()):
            pts = [(0, r["before"], r.get("correct_before"), r.get("form_before"))] + [
                (c["updates"], c["score"], c.get("correct"), c.get("form")) for c in r["curve"]]
            color = f"C{k}"
            ax2.plot([x[0] for x in pts], [x[1] for x in pts], marker="o", color=color, label=f"{p} score")
            for j, (part, style) in enumerate((("correct", "--"), ("form", ":"))):
                if pts[0][2 + j] is not None:
                    ax2.plot([x[0] for x in pts], [x[2 + j] for x in pts], style, color=color, label=f"{p} {part}")
        ax2.set_xlabel("policy update")
        ax2.set_ylim(0, 1.05)
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=7)
    else:
        fig, ax = plt.subplots(figsize=(width_in, 3.6))
    width = 0.8 / max(1, len(metrics))
    for j, metric in enumerate(metrics):
        xs = [i + j * width for i in range(len(groups))]
        ys = [table[g].get(metric) or 0.0 for g in groups]
        bars = ax.bar(xs, ys, width, label=metric)
        for b, g in zip(bars, groups):
            v = table[g].get(metric)
            ax.annotate("n/a" if v is None else f"{v:.2f}", (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=8)
    ax.set_xticks([i + width * (len(metrics) - 1) / 2 for i in range(len(groups))], groups)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("score")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def dashboard_results(result: dict[str, Any], a: argparse.Namespace) -> list[dict[str, Any]]:
    """The records POSTed to /api/results: one per persona (its curve), one per checkpoint (scores only)."""
    now = time.time()
    who = f"{'llm' if a.user_model_url else 'rule'} users, {'llm' if a.rater_url else 'rule'} rater"
    if result["mode"] == "personas":
        out = []
        for name, r in result["personas"].items():
            halves = ("correct", "form")  # the built-in rater's: plotted beside the score
            curve = ([{"updates": 0, "score": r["before"], **{k: r[k + "_before"] for k in halves
                                                               if r.get(k + "_before") is not None}}]
                     if r["before"] is not None else []) + [
                {"updates": int(c["updates"]), "score": c["score"],
                 **{k: c[k] for k in halves if c.get(k) is not None}} for c in r["curve"] if c["score"] is not None]
            wording = "" if a.user_model_url else f", {a.wording} wording"
            out.append({"kind": "eval", "name": f"persona {name}, {a.method}{wording} ({who})", "created_at": now,
                        "curve": curve,
                        "summary": {"before": r["before"], "after": r["after"], "updates": r["updates"],
                                    "method": a.method,
                                    **{f"{k}_{w}": r[f"{k}_{w}"] for k in PARTS for w in ("before", "after")
                                       if f"{k}_{w}" in r},
                                    "rated": f"{r['rated']}/{r['asked']}", "problem_set": a.problem_set,
                                    "problems": a.problems}})
        return out
    return [{"kind": "eval", "name": f"checkpoint {model}", "created_at": now, "curve": [],
             "summary": {k: v for k, v in row.items()}} for model, row in headline(result).items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="clawloop eval", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--personas", default="student,teacher", help=f"Built-in: {', '.join(PERSONAS)}.")
    ap.add_argument("--url", default="", help="The policy: any OpenAI-compatible base URL (a clawloop trains on the "
                                              "persona conversations). Default: start clawloop.")
    ap.add_argument("--model-path", action="append", default=[],
                    help="Policy model (personas mode) or checkpoint(s) to evaluate (with --eval-tasks); repeat "
                         "to compare checkpoints side by side.")
    ap.add_argument("--eval-tasks", default="", help=f"Checkpoint mode: a comma list of {', '.join(EVAL_TASKS)}.")
    ap.add_argument("--problems", type=int, default=16, help="K held-out problems per persona.")
    ap.add_argument("--samples-per-problem", type=int, default=4,
                    help="Sampled answers per problem in each persona measure (seeded, the same before and after): "
                         "1 gives 32 problems a standard error of ~0.07, 4 about half of it.")
    ap.add_argument("--wide-sums", type=int, default=128,
                    help="Tiny set: also `correct` on this many other held-out sums (2 samples each) before and after, "
                         "beside the fixed problems' (correct_wide_*); 0: off.")
    ap.add_argument("--problem-set", default="auto", choices=PROBLEM_SETS)
    ap.add_argument("--turns", type=int, default=4, help="Assistant turns per training conversation.")
    ap.add_argument("--tries", type=int, default=3, help="Tries at one problem before the user moves on.")
    ap.add_argument("--users", type=int, default=4, help="Concurrent simulated users while training.")
    ap.add_argument("--train-updates", type=int, default=8,
                    help="Policy updates between the before and after measures (0: measure once).")
    ap.add_argument("--user-model-url", default="", help="An LLM plays the users (OpenAI-compatible base URL).")
    ap.add_argument("--user-model", default="", help="Its model name (default: the first it lists).")
    ap.add_argument("--rater-url", default="", help="An LLM rates the answers (OpenAI-compatible base URL).")
    ap.add_argument("--rater-model", default="")
    ap.add_argument("--rater-votes", type=int, default=1)
    ap.add_argument("--wording", default="corpus", choices=("corpus", "heldout"),
                    help="Built-in users' phrases (see `clawloop demo --help`).")
    ap.add_argument("--max-tokens", type=int, default=0, help="Per answer (default 24 on the tiny set, 512 else).")
    ap.add_argument("--coding-problems", type=int, default=20)
    ap.add_argument("--code-max-tokens", type=int, default=256)
    ap.add_argument("--tool-use-tasks", type=int, default=20)
    ap.add_argument("--tool-use-samples", type=int, default=1)
    ap.add_argument("--sandbox", default="auto", choices=("auto", "bwrap", "unshare", "none"))
    ap.add_argument("--allow-unsandboxed", action="store_true")
    ap.add_argument("--method", default="combine", choices=("binary", "opd", "combine"))
    ap.add_argument("--batch-size", type=int, default=16, help="--rollout-batch-size of the started clawloop up.")
    ap.add_argument("--lr", type=float, default=None, help="--lr of the started clawloop up (default: its own).")
    ap.add_argument("--settle-s", type=float, default=10.0,
                    help="After a round of conversations, the longest wait for a new policy version; a clawloop's "
                         "/health says when its trainer has less than a batch and is not stepping, and the next "
                         "round starts at once.")
    ap.add_argument("--max-minutes", type=float, default=7.0,
                    help="Training time per persona; a policy that stops advancing (the publish gate refusing every "
                         "candidate) ends its persona's training here, with what was reached.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default="")
    ap.add_argument("--out", default="eval-result.json")
    ap.add_argument("--post-url", default="", help="Also post the results to this clawloop's dashboard.")
    ap.add_argument("up_args", nargs=argparse.REMAINDER, help="After `--`: extra flags for the started clawloop.")
    a = ap.parse_args(argv)
    a.up_args = [x for x in a.up_args if x != "--"]
    if a.problem_set == "auto":
        a.problem_set = "word" if a.user_model_url else "tiny"
    if a.max_tokens <= 0:
        a.max_tokens = 24 if a.problem_set == "tiny" else 512
    try:
        personas_from(a.personas)
        bad = [t.strip() for t in a.eval_tasks.split(",") if t.strip() and t.strip() not in EVAL_TASKS]
        if bad:
            raise ValueError(f"--eval-tasks: unknown task(s) {', '.join(bad)}; choose from {', '.join(EVAL_TASKS)}")
        if a.rater_votes < 1:
            raise ValueError("--rater-votes must be at least 1")
        if a.samples_per_problem < 1:
            raise ValueError("--samples-per-problem must be at least 1")
        if a.data_dir and not a.url and not a.eval_tasks:
            # a persona's folder that holds a run already would be resumed: its checkpoint measured as "before"
            used = [p for p in (Path(a.data_dir) / n.name for n in personas_from(a.personas))
                    if p.is_dir() and any(p.iterdir())]
            if used:
                raise ValueError(f"--data-dir {a.data_dir}: {', '.join(str(p) for p in used)} already holds a run "
                                 "(its trainer would resume from its checkpoint and be measured as the start); "
                                 "give an empty or new folder")
    except ValueError as e:
        ap.error(str(e))
    import openai

    key = os.environ.get("OPENCLAW_API_KEY", "none")

    def client_for(url: str) -> Any:
        return openai.OpenAI(base_url=url.rstrip("/") if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1",
                             api_key=key, max_retries=2, timeout=300)

    try:
        result = run_checkpoints(a, client_for) if a.eval_tasks else run_personas(a, client_for)
    except ValueError as e:
        print(f"clawloop eval: {e}", file=sys.stderr)
        return 2
    result.update({"seed": a.seed, "problem_set": a.problem_set, "problems": a.problems,
                   "samples_per_problem": a.samples_per_problem,
                   "user": "llm" if a.user_model_url else "rules", "rater": "llm" if a.rater_url else "rules"})
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, out)
    title = ("clawloop eval: personas before/after" if result["mode"] == "personas"
             else f"clawloop eval: {a.eval_tasks}")
    png = plot(result, out.with_suffix(".png"), title)
    print(f"eval: wrote {out}" + (f" and {png}" if png else ""), flush=True)
    for target in [u for u in dict.fromkeys([a.post_url, a.url]) if u]:
        ids = [post_result(target, r) for r in dashboard_results(result, a)]
        if all(ids):
            print(f"eval: results posted to {base_url(target)}/#/results", flush=True)
    return 0
