"""`clawloop demo`: does the model learn from its users? A user simulator.

Simulated users talk to `clawloop up` through the official `openai` client,
in multi-turn sessions (`X-Session-Id`). Every user shares one hidden
preference about the form of an answer (`--preference`, e.g. `bare`: only the
number). When an answer fits, the user thanks and asks the next question; when
not, the user corrects ("just the number, please") and the assistant tries
again. Those replies are the next states the judge reads; nothing else tells
the model what the users want.

`--wording heldout` makes the users talk in phrasings of their own: the
corrections and thanks of `clawloop/data/demo_wording_heldout.json`, written
apart from the tiny model's corpus and the offline judge's rules, which
contain none of them (tests/test_demo.py checks). The default, `corpus`, uses
the corpus's own correction phrases, which the rules were written to read, so
it measures the loop with a judge that understands every user; `heldout`
measures it with users the judge was not written for.

Satisfaction = the fraction of answers to held-out questions that already fit
the preference, sampled at temperature 1 with fixed seeds, sent as side turns
so that measuring never trains. It is measured before training (baseline)
and after every policy update. Users pause while it is measured, so each
point belongs to exactly one served version.

    clawloop demo --method combine --updates 16 --out result.json
    clawloop demo --method binary --wording heldout --preference upper --updates 8

Writes `result.json` (baseline, final, curve) and a PNG plot beside it; the
last line printed is `method=... baseline=0.XX final=0.XX updates=N minutes=M wording=... preference=...
judged(+1/0/-1)=P/Z/N hints=H` (the judge's verdicts on the users' replies).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from clawloop.progress import Progress
from clawloop.tinymodel.corpus import STYLES, fits_style, heldout_questions
from clawloop.users import (WORDINGS, Server, Wording, base_url, free_port, policy_version, post_result,  # noqa: F401
                            run_user)

_free_port = free_port

def Up(args: argparse.Namespace, data_dir: str) -> Server:
    """`clawloop up` for the demo: offline judge, the run's method, batch size, lr and seed."""
    flags = ["--method", args.method, "--rollout-batch-size", str(args.batch_size),
             *(["--lr", str(args.lr)] if args.lr is not None else []),
             "--judge", "offline", "--seed", str(args.seed), "--no-serve-status",
             "--capture-session-idle-timeout-s", "30"]
    if args.model_path:
        flags += ["--model-path", args.model_path]
    return Server(flags + list(args.up_args), data_dir)


version = policy_version


JUDGE_GAUGES = ("judge_judged", "judge_score_pos", "judge_score_zero", "judge_score_neg", "judge_hints")


def judge_counts(url: str) -> dict[str, float]:
    """The judge's verdict counts from /metrics: how many user replies it read as +1, 0, -1, with hints."""
    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        short = name.removeprefix("clawloop_")
        if short in JUDGE_GAUGES:
            out[short] = float(value)
    return out


def satisfaction(client: Any, preference: str, questions: list[dict[str, str]], seed: int) -> tuple[float, int]:
    """Fraction of held-out answers that fit; also the served version seen."""
    def ask(k: int) -> tuple[bool, int]:
        q = questions[k]
        raw = client.chat.completions.with_raw_response.create(
            model="clawloop", messages=[{"role": "user", "content": q["question"]}], max_tokens=24,
            temperature=1.0, seed=seed + k, extra_headers={"X-Turn-Type": "side", "X-Session-Id": f"eval-{k}"})
        r = raw.parse()
        return fits_style(r.choices[0].message.content or "", preference), int(raw.headers["x-policy-version"])

    with ThreadPoolExecutor(8) as ex:
        res = list(ex.map(ask, range(len(questions))))
    return sum(ok for ok, _ in res) / len(res), max(v for _, v in res)


def plot(curve: list[dict[str, float]], baseline: float, out: Path, title: str) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    xs = [0] + [c["update"] for c in curve]
    ys = [baseline] + [c["satisfaction"] for c in curve]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(xs, ys, marker="o")
    ax.set_xlabel("policy update")
    ax.set_ylabel("form only: answers in the asked style (held-out)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    png = out.with_suffix(".png")
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return png


def demo_result(result: dict[str, Any]) -> dict[str, Any]:
    """The run as the dashboard's learning-curve record (POST /api/results)."""
    curve = [{"updates": 0, "score": result["baseline"]}] + [
        {"updates": int(c["update"]), "score": c["satisfaction"], "policy_version": c["policy_version"]}
        for c in result["curve"]]
    summary = {k: result[k] for k in ("method", "preference", "wording", "baseline", "final", "updates", "minutes",
                                      "batch_size", "lr", "seed", "users_fit_rate")}
    summary["judged(+1/0/-1)"] = "/".join(f"{result['judge'].get(k, 0):.0f}" for k in
                                          ("judge_score_pos", "judge_score_zero", "judge_score_neg"))
    return {"kind": "demo", "name": f"form only: {result['method']}, preference={result['preference']}, "
                                    f"{result['wording']} wording", "created_at": time.time(), "curve": curve,
            "summary": summary}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="clawloop demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--method", default="combine", choices=("binary", "opd", "combine"))
    ap.add_argument("--updates", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preference", default="bare", choices=STYLES, help="The users' hidden preference.")
    ap.add_argument("--wording", default="corpus", choices=WORDINGS,
                    help="How users phrase corrections and thanks: the corpus's phrases, or a held-out set the "
                         "corpus and the judge's rules do not contain.")
    ap.add_argument("--users", type=int, default=4, help="Concurrent simulated users.")
    ap.add_argument("--turns", type=int, default=4, help="Turns per session.")
    ap.add_argument("--eval-questions", type=int, default=48)
    ap.add_argument("--batch-size", type=int, default=16, help="--rollout-batch-size of the trainer.")
    ap.add_argument("--lr", type=float, default=None, help="--lr of the started clawloop up (default: its own).")
    ap.add_argument("--model-path", default="", help="Policy model (default: the tiny model, built if missing).")
    ap.add_argument("--url", default="", help="Use a running `clawloop up` at this base URL instead of starting one; "
                                              "the learning curve is then posted to its dashboard (/api/results).")
    ap.add_argument("--post-url", default="", help="Post the learning curve to this clawloop's dashboard too "
                                                   "(default: --url when given).")
    ap.add_argument("--out", default="demo-result.json")
    ap.add_argument("--data-dir", default="", help="Data dir for the started `up` (default: a temp dir).")
    ap.add_argument("--max-minutes", type=float, default=30.0)
    ap.add_argument("--settle-s", type=float, default=10.0,
                    help="After each round of sessions, wait this long at most for the policy to update.")
    ap.add_argument("up_args", nargs=argparse.REMAINDER, help="After `--`: extra flags for `clawloop up`.")
    a = ap.parse_args(argv)
    a.up_args = [x for x in a.up_args if x != "--"]
    import openai

    if not a.url and not a.model_path:
        from clawloop.tinymodel.build import build_tiny_model, default_model_dir

        if not (default_model_dir() / "config.json").exists():
            build_tiny_model()
    t0 = time.time()
    up = None
    if a.url:
        url = base_url(a.url)
    else:
        data = a.data_dir or tempfile.mkdtemp(prefix="clawloop-demo-")
        Path(data).mkdir(parents=True, exist_ok=True)
        up = Up(a, data)
        url = up.url
        print(f"demo: clawloop up on {url} (data {data}, log {up.log.name})", flush=True)
    client = openai.OpenAI(base_url=url + "/v1", api_key=os.environ.get("OPENCLAW_API_KEY", "none"), max_retries=2,
                           timeout=120)
    rng = random.Random(a.seed)
    wording = Wording(a.wording)
    questions = heldout_questions(a.eval_questions, seed=a.seed + 1)
    curve: list[dict[str, float]] = []
    users_fit = users_answers = 0
    try:
        v0 = version(url)
        baseline, _ = satisfaction(client, a.preference, questions, seed=10_000)
        print(f"demo: baseline satisfaction {baseline:.2f} at policy v{v0}", flush=True)
        last_v, sessions = v0, 0
        with Progress(a.updates, "demo updates") as bar:
            while last_v - v0 < a.updates and time.time() - t0 < a.max_minutes * 60:
                with ThreadPoolExecutor(a.users) as ex:
                    futs = [ex.submit(run_user, client, a.preference, random.Random(rng.random()),
                                      f"user{u}-s{sessions}", a.turns, wording) for u in range(a.users)]
                    for f in futs:
                        s = f.result()
                        users_fit += s["fit"]
                        users_answers += s["answers"]
                sessions += 1
                # give the judge and the trainer a moment to turn this round into an update
                deadline = time.time() + a.settle_s
                while version(url) == last_v and time.time() < deadline:
                    time.sleep(0.2)
                v = version(url)
                if v == last_v:
                    continue
                sat, seen = satisfaction(client, a.preference, questions, seed=10_000)
                last_v = seen
                curve.append({"update": seen - v0, "policy_version": seen, "satisfaction": sat,
                              "minutes": (time.time() - t0) / 60})
                print(f"demo: update {seen - v0} (v{seen}) satisfaction {sat:.2f} "
                      f"[{(time.time() - t0) / 60:.1f} min]", flush=True)
                bar.update(min(seen - v0, a.updates) - bar.done, note=f"satisfaction {sat:.2f}")
        judged = judge_counts(url)
    finally:
        if up is not None:
            up.stop()
    minutes = (time.time() - t0) / 60
    final = curve[-1]["satisfaction"] if curve else baseline
    out = Path(a.out)
    result = {"method": a.method, "preference": a.preference, "wording": a.wording, "baseline": baseline,
              "final": final,
              "curve": curve, "updates": curve[-1]["update"] if curve else 0, "minutes": minutes, "seed": a.seed,
              "batch_size": a.batch_size, "lr": a.lr if a.lr is not None else "default",
              "users_fit_rate": users_fit / max(users_answers, 1),
              "judge": judged}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    png = plot(curve, baseline, out, f"clawloop demo (form only, not correctness): {a.method}, "
                                     f"preference={a.preference}, {a.wording} wording")
    if png:
        print(f"demo: wrote {out} and {png}", flush=True)
    post_to = [u for u in dict.fromkeys([a.post_url, a.url]) if u]
    for target in post_to:
        rid = post_result(target, demo_result(result))
        if rid:
            print(f"demo: learning curve posted to {base_url(target)}/#/results ({rid})", flush=True)
    verdicts = "/".join(f"{judged.get(k, 0):.0f}" for k in ("judge_score_pos", "judge_score_zero", "judge_score_neg"))
    print(f"method={a.method} baseline={baseline:.2f} final={final:.2f} updates={result['updates']} "
          f"minutes={minutes:.1f} wording={a.wording} preference={a.preference} "
          f"judged(+1/0/-1)={verdicts} hints={judged.get('judge_hints', 0):.0f}")
    return 0
