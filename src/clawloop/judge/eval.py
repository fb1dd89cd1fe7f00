"""`clawloop judge-eval`: score a judge on a labelled JSONL set.

    clawloop judge-eval                                  # offline judge, packaged set
    clawloop judge-eval --data heldout                   # the held-out set (see below)
    clawloop judge-eval --data hint-direction            # hints that contradict the reply
    clawloop judge-eval --data F.jsonl --judge http://127.0.0.1:8001/v1 --judge-model qwen
    clawloop judge-eval --judge self --model-path ./my-model

Each line: `{"prompt": str | messages (optional), "response": str,
"next_state": {"role": "user"|"tool", "content": str}, "label": 1|-1|0}`
(other keys, like `note`, are ignored). Prints a confusion matrix (rows: label,
columns: verdict; `fail` = the judge could not answer), the wrong-sign rate
(+1 read as -1 or -1 read as +1: the verdicts that train the model backwards)
and, as the last line, `accuracy=0.XXX n=N`. `--judge` takes offline | self |
frozen | url | a URL; every other config flag (`--judge-model`,
`--majority-vote-n`, ...) applies.

Two labelled sets ship. `judge_eval.jsonl` (the default) grew with the offline
judge's rules, so its score is an upper bound. `judge_eval_heldout.jsonl`
(`--data heldout`) was written from how people reply to an assistant before
its author read the rules' phrase lists, and must never be used to tune them:
its score was the honest estimate of the offline judge on users it was not
written for (issue #27 read its misses for kinds of reply, so it is less so now).

`--data hint-direction` (`judge_hint_direction.jsonl`) checks the OPD hints
rather than the scores: style demands, plain and negated ("in capitals" / "no
capitals"), each row naming the styles whose instruction would contradict it
(`forbid`) and, where the demand implies one, the style expected (`expect`).
It also prints `contradicting_hints=K` (a hint that is the tiny model's
instruction for a forbidden style: the teacher told to do what the user
refused) and `expected_style_hints=k/m`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

from clawloop.config import ConfigError, add_config_arguments, load_config
from clawloop.judge.base import Judge, JudgeUnavailable
from clawloop.judge.offline import style_hint
from clawloop.records import Judgement, Turn
from clawloop.tinymodel.corpus import STYLES

LABELS = (1, 0, -1)
EVAL_RETRIES = 2


PACKAGED_SETS = {"default": "data/judge_eval.jsonl", "heldout": "data/judge_eval_heldout.jsonl",
                 "hint-direction": "data/judge_hint_direction.jsonl"}


def default_data_path(name: str = "default") -> Any:
    return resources.files("clawloop").joinpath(PACKAGED_SETS[name])


def load_eval_set(path: Any = None) -> list[dict[str, Any]]:
    """The labelled examples of `path` (default: the packaged set; `heldout`: the held-out one), validated."""
    if path is None or str(path) in PACKAGED_SETS:
        src = default_data_path(str(path or "default"))
    else:
        src = Path(path)
    rows = []
    with src.open("r", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
            except ValueError as e:
                raise ConfigError(f"{src}:{n}: not JSON: {e}") from None
            ns = ex.get("next_state")
            if isinstance(ns, str):
                ns = ex["next_state"] = {"role": "user", "content": ns}
            if ex.get("label") not in LABELS or not isinstance(ns, dict) or ns.get("role") not in ("user", "tool"):
                raise ConfigError(f"{src}:{n}: needs label in 1/0/-1 and next_state {{role: user|tool, content}}")
            named = [*(ex.get("forbid") or ()), *([ex["expect"]] if ex.get("expect") else [])]
            if any(s not in STYLES for s in named):
                raise ConfigError(f"{src}:{n}: forbid/expect name styles, one of {', '.join(STYLES)}")
            rows.append(ex)
    return rows


def example_turn(ex: dict[str, Any], i: int) -> Turn:
    prompt = ex.get("prompt")
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    else:
        messages = list(prompt or [])
    return Turn(session_id="judge-eval", index=i, id=i, messages=messages, response_text=ex.get("response") or "",
                next_state=dict(ex["next_state"]))


async def judge_examples(judge: Judge, rows: list[dict[str, Any]], *, concurrency: int = 4,
                         timeout_s: float = 60.0) -> list[Judgement | None]:
    """The judge's judgement of each example (None when it failed every try)."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(i: int, ex: dict[str, Any]) -> Judgement | None:
        async with sem:
            for _ in range(1 + EVAL_RETRIES):
                try:
                    return await asyncio.wait_for(judge.judge(example_turn(ex, i)), timeout_s)
                except (JudgeUnavailable, asyncio.TimeoutError) as e:
                    logging.getLogger(__name__).warning("example %d: %s", i, e or "timeout")
            return None

    return list(await asyncio.gather(*(one(i, ex) for i, ex in enumerate(rows))))


async def evaluate(judge: Judge, rows: list[dict[str, Any]], *, concurrency: int = 4,
                   timeout_s: float = 60.0) -> list[int | None]:
    """The judge's score for each example (None when it failed every try)."""
    js = await judge_examples(judge, rows, concurrency=concurrency, timeout_s=timeout_s)
    return [None if j is None else j.score for j in js]


def wrong_sign(labels: list[int], preds: list[int | None]) -> int:
    """How many examples were scored with the opposite sign of their label (+1 as -1, -1 as +1)."""
    return sum(1 for lab, p in zip(labels, preds) if lab and p and lab == -p)


def confusion_report(labels: list[int], preds: list[int | None]) -> tuple[str, float]:
    cols: list[int | None] = [*LABELS, None]
    m = Counter(zip(labels, preds))
    head = "label\\judge " + "".join(f"{('fail' if c is None else f'{c:+d}'):>7}" for c in cols) + "    total"
    lines = [head]
    for lab in LABELS:
        row = [m[(lab, c)] for c in cols]
        lines.append(f"{lab:+d}{'':10}" + "".join(f"{v:>7}" for v in row) + f"{sum(row):>9}")
    correct = sum(m[(lab, lab)] for lab in LABELS)
    acc = correct / len(labels) if labels else 0.0
    return "\n".join(lines), acc


def hint_direction(rows: list[dict[str, Any]], hints: list[str | None]) -> dict[str, Any]:
    """Contradicting hints on hint-direction rows: a hint that is the instruction of a style the row
    `forbid`s. Also counts rows whose `expect`ed style got exactly its instruction."""
    instr = {s: style_hint(s) for s in STYLES}
    contradicting, expected, hit = [], 0, 0
    for i, (ex, hint) in enumerate(zip(rows, hints)):
        if hint is not None and any(hint == instr[s] for s in ex.get("forbid") or ()):
            contradicting.append(i)
        if ex.get("expect"):
            expected += 1
            hit += hint == instr[ex["expect"]]
    return {"contradicting": contradicting, "expected": expected, "expected_hit": hit}


def _split_judge_flag(argv: list[str]) -> list[str]:
    """`--judge URL` -> `--judge-url URL` (the config's --judge takes a kind)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        val = None
        if a == "--judge" and i + 1 < len(argv):
            val, i = argv[i + 1], i + 2
        elif a.startswith("--judge="):
            val, i = a.split("=", 1)[1], i + 1
        else:
            out.append(a)
            i += 1
            continue
        if val.startswith(("http://", "https://")):
            out += ["--judge-url", val]
        else:
            out += ["--judge", val]
    return out


def judge_eval_main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="clawloop judge-eval", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False)
    p.add_argument("--data", default=None, help="Labelled JSONL (default: the packaged judge_eval.jsonl; "
                                                "`heldout`: the packaged held-out set; `hint-direction`: "
                                                "negated and plain style demands, hints checked).")
    p.add_argument("--show-errors", action="store_true", help="Print every misjudged example.")
    add_config_arguments(p, ("judge", "model"))  # the judge, and the model a frozen or self judge loads
    values = vars(p.parse_args(_split_judge_flag(argv)))
    data, show = values.pop("data"), values.pop("show_errors")
    cfg = load_config(values)
    logging.basicConfig(level=getattr(logging, cfg.log_level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    rows = load_eval_set(data)
    return asyncio.run(_run(cfg, rows, show))


async def _run(cfg: Any, rows: list[dict[str, Any]], show: bool) -> int:
    from clawloop.judge.loop import make_judge

    engine = None
    if cfg.judge.kind == "self" and not cfg.judge.custom_rm_path:  # no served engine here: load the policy
        from clawloop.engines import make_engine

        engine = make_engine(cfg)
        await engine.start()
    judge = make_judge(cfg, engine)
    try:
        js = await judge_examples(judge, rows, concurrency=cfg.judge.num_workers * cfg.judge.majority_vote_n,
                                  timeout_s=cfg.judge.timeout_s)
    finally:
        await judge.close()
        if engine is not None:
            await engine.stop()
    labels = [int(ex["label"]) for ex in rows]
    preds = [None if j is None else j.score for j in js]
    hints = [None if j is None else j.hint for j in js]
    directed = any("forbid" in ex for ex in rows)
    report = hint_direction(rows, hints) if directed else None
    if show:
        bad = set(report["contradicting"]) if report else set()
        for i, (ex, lab, pred) in enumerate(zip(rows, labels, preds)):
            if lab != pred or i in bad:
                ns = ex["next_state"]
                print(f"label={lab:+d} judge={'fail' if pred is None else f'{pred:+d}'} "
                      f"{ns['role']}: {json.dumps(ns['content'], ensure_ascii=False)[:120]}"
                      + (f"  hint={hints[i]!r}" if directed else ""))
    table, acc = confusion_report(labels, preds)
    wrong = wrong_sign(labels, preds)
    print(f"judge={judge.name}")
    print(table)
    print(f"wrong_sign={wrong / max(1, len(rows)):.3f} ({wrong} of {len(rows)})")
    if report is not None:
        print(f"contradicting_hints={len(report['contradicting'])} n={len(rows)}")
        print(f"expected_style_hints={report['expected_hit']}/{report['expected']}")
    print(f"accuracy={acc:.3f} n={len(rows)}")
    return 0
