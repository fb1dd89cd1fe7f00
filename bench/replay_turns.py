"""Which of a persona evaluation's training turns cost the model its skills? (issue #27, RESULTS "Why the
loop made the model worse" 11.)

Replays the judged turns a `clawloop eval` run stored (its `--data-dir`, one persona's `clawloop.db`) through
a fresh `Trainer` (the config's defaults, rehearsal included; samples as the loop builds them: token-exact,
the engine's logprobs, the offline judge's verdict), in the order they were judged, `--batch` trained
samples an update; every judged turn is read for the mean baseline as the loop reads it. `--only` trains
on some kinds of turn alone:

- `first`: a session's first answer;
- `fresh`: a later answer whose previous turn was not judged negative (a new question after a thanks);
- `retry`: an answer given right after a correction (the previous turn judged negative), its RL score
  scaled by `--retry-weight` as the loop does (`train__retry_weight=0` in `--settings`: not trained);
- `relabel` (with `--relabel`): a retry's accepted answer put after the corrected turn's own prompt (the
  question it answers, without the correction), as hindsight.

After every quarter of `--updates` the model answers fresh held-out questions (`form_cost.measure`: never
in the corpus, 2 samples each at T=1): the persona's form, right sums, right facts.

    .venv/bin/python bench/replay_turns.py --db DATA/student/clawloop.db --style bare --only first+fresh,first+fresh+retry
    .venv/bin/python bench/replay_turns.py --db DATA/teacher/clawloop.db --style exclaim --settings default,train__retry_weight=0

Replayed turns are off-policy after the first batches (they were sampled from the run's later versions);
the evaluation's own `correct` and the publish gate are the measure; this says which turns move it.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import shutil
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from form_cost import measure, setting_flags  # noqa: E402

from clawloop.config import load_config  # noqa: E402
from clawloop.gateway.render import render_prompt  # noqa: E402
from clawloop.records import Sample  # noqa: E402
from clawloop.store import open_store  # noqa: E402
from clawloop.tinymodel.build import default_model_dir  # noqa: E402
from clawloop.tinymodel.corpus import heldout_questions  # noqa: E402
from clawloop.trainer.loop import has_signal  # noqa: E402



def _scratch(prefix: str) -> str:
    """A data dir for one trainer, removed when the process exits (the trainer writes nothing kept)."""
    path = tempfile.mkdtemp(prefix=prefix)
    atexit.register(shutil.rmtree, path, True)
    return path

def read_turns(db: str, tok, relabel: bool) -> list[tuple[str, Sample]]:
    """(kind, sample) of every judged main turn of the run's training sessions, in judgement order."""
    store = open_store(db)
    rows = []
    try:
        for sid, turns in store.iter_sessions():
            if sid.startswith("eval-"):  # the measure's side turns
                continue
            by_index = {t.index: t for t in turns}
            for t in turns:
                j = store.get_judgement(t.id, "offline")
                if t.type != "main" or j is None or not t.response_ids:
                    continue
                prev = by_index.get(t.index - 1)
                pj = store.get_judgement(prev.id, "offline") if prev is not None else None
                kind = "first" if prev is None else ("retry" if pj is not None and pj.value < 0 else "fresh")
                rows.append((t.id, kind, Sample.from_turn(t, j)))
                if relabel and kind == "retry" and j.value > 0:
                    p, r = render_prompt(tok, prev.messages, prev.tools), list(t.response_ids)
                    rows.append((t.id + 0.5, "relabel", Sample(
                        tokens=p + r, loss_mask=[0] * len(p) + [1] * len(r), rollout_logprobs=[0.0] * (len(p) + len(r)),
                        prompt_len=len(p), reward=j.value, policy_version=t.policy_version, messages=prev.messages)))
    finally:
        store.close()
    rows.sort(key=lambda r: r[0])
    return [(kind, s) for _, kind, s in rows]


def replay(model: str, rows: list[tuple[str, Sample]], only: str, setting: str, style: str, method: str,
           updates: int, batch: int, probe: list[dict[str, str]]) -> list[dict[str, float]]:
    from clawloop.trainer import Trainer
    from clawloop.trainer.rehearsal import Rehearsal

    flags, _ = setting_flags(setting)
    cfg = load_config({"model__path": model, "data_dir": _scratch("replay-"),
                       "serve__gc_freeze": "false", "train__method": method,
                       "train__rollout_batch_size": str(batch), **flags}, env={})
    torch.manual_seed(0)
    tr = Trainer(cfg, model, device="cpu")
    tr.rehearsal = Rehearsal.from_config(cfg, model)
    if tr.rehearsal is not None:
        tr.rehearsal.build(tr)
    kinds = set(only.split("+")) if only else None
    curve = [{"update": 0, **measure(tr, probe, style, seed=1000)}]
    stream = iter(rows)
    for u in range(updates):
        keep: list[Sample] = []
        for kind, s in stream:
            if kind == "retry":  # as the loop weighs it (`--retry-weight`)
                s.rl_weight = tr.tc.retry_weight
            tr.observe_reward(s)
            if (kinds is None or kind in kinds) and has_signal(s, method, tr.tc.negative_weight):
                keep.append(s)
            if len(keep) >= batch:
                break
        if not keep:
            break
        tr.step(keep)
        if (u + 1) % max(1, updates // 4) == 0:
            curve.append({"update": u + 1, **measure(tr, probe, style, seed=1000)})
    return curve


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="one persona's clawloop.db from a `clawloop eval --data-dir`")
    ap.add_argument("--model", default=str(default_model_dir()), help="the model the run started from")
    ap.add_argument("--style", default="bare", help="the persona's form: bare (student) or exclaim (teacher)")
    ap.add_argument("--method", default="binary")
    ap.add_argument("--only", default="", help="comma separated runs, each kinds joined by +; '' (default): all")
    ap.add_argument("--settings", default="default", help="comma separated, as bench/form_cost.py")
    ap.add_argument("--relabel", action="store_true", help="also build the `relabel` kind")
    ap.add_argument("--updates", type=int, default=12)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--probe", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from transformers import AutoTokenizer

    rows = read_turns(a.db, AutoTokenizer.from_pretrained(a.model), a.relabel)
    count = collections.Counter((k, (s.reward or 0) > 0) for k, s in rows)
    print("judged turns by kind (kind, accepted): " + ", ".join(f"{k}: {v}" for k, v in sorted(count.items())), flush=True)
    probe = heldout_questions(a.probe)
    out = []
    for only in a.only.split(","):
        for setting in a.settings.split(","):
            curve = replay(a.model, rows, only, setting, a.style, a.method, a.updates, a.batch, probe)
            for c in curve:
                print(f"{only or 'all'} {setting} u{c['update']}: form {c['form']:.3f} sums {c['sums']:.3f} "
                      f"facts {c['facts']:.3f}", flush=True)
            out.append({"only": only or "all", "setting": setting, "curve": curve})
    if a.out:
        Path(a.out).write_text(json.dumps({"db": a.db, "model": a.model, "style": a.style, "method": a.method,
                                           "runs": out}, indent=1))


if __name__ == "__main__":
    main()
