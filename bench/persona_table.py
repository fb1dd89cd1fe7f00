"""The README's persona table from `clawloop eval` runs (issue #27 item 6): one row per persona of each run,
the score with its halves (`correct`, `form`; `correct`'s change with its standard error paired over the
problems where the run recorded it, `correct_change_se`) and `correct` within and outside the persona's form, the
updates reached, the publish gate's refusals and fallbacks (counted in the run's `up.log`s when its `--data-dir` is
given) and the run's minutes.

    .venv/bin/python bench/persona_table.py bench/eval_s16_binary_heldout.json:/tmp/X/ev/d_binary_heldout ...

Each argument is `EVAL.json[:DATA_DIR]`; method and wording are read from the file name
(`..._{method}_{wording}.json`) unless the JSON names them.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

HEAD = ("| method | wording | persona | score | correct | form | right in form | right off form | updates (of 16) "
        "| gate refusals | fallbacks | run minutes | its sums | other sums |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def _arrow(a: float, b: float, delta: bool = False, bold_at: float | None = None) -> str:
    out = f"{a:.2f} → {b:.2f}"
    if delta:
        d = f"{b - a:+.2f}".replace("-", "−")
        out += f" (**{d}**)" if bold_at is not None and b - a >= bold_at else f" ({d})"
    return out


def refusals(data_dir: str, persona: str, what: str = "publish gate: refused candidate") -> str:
    """Lines holding `what` in the persona's `up.log`s: refusals (every refusal is logged so, one that led to a
    fallback too, since the s19 session's change), or with `what="serving falls back"` the fallbacks."""
    logs = list(Path(data_dir, persona).rglob("up.log")) if data_dir else []
    if not logs:
        return "—"
    return str(sum(what in line for p in logs for line in p.read_text(errors="replace").splitlines()))


def rows(arg: str) -> list[str]:
    path, _, data_dir = arg.partition(":")
    d = json.loads(Path(path).read_text())
    m = re.search(r"(?:^|_)(binary|opd|combine)_(corpus|heldout)", Path(path).stem)
    method, wording = d.get("method") or (m and m.group(1)) or "?", d.get("wording") or (m and m.group(2)) or "?"
    out = []
    for name, p in d["personas"].items():
        out.append("| " + " | ".join([
            method, wording, name, _arrow(p["before"], p["after"], True, 0.25),
            _arrow(p["correct_before"], p["correct_after"], True).replace(")", f" ± {p['correct_change_se']:.2f})")
            if p.get("correct_change_se") is not None else _arrow(p["correct_before"], p["correct_after"], True),
            _arrow(p["form_before"], p["form_after"]),
            _arrow(p["correct_in_form_before"], p["correct_in_form_after"]),
            _arrow(p["correct_off_form_before"], p["correct_off_form_after"]),
            str(p["updates"]), refusals(data_dir, name), refusals(data_dir, name, "serving falls back"),
            f"{d.get('minutes', 0):.1f}",
            _arrow(p["correct_sums_before"], p["correct_sums_after"], True) if "correct_sums_after" in p else "—",
            # `clawloop eval --wide-sums`: other held-out sums beside the fixed problems' (RESULTS 14)
            _arrow(p["correct_wide_before"], p["correct_wide_after"], True) if "correct_wide_after" in p else "—"])
            + " |")
    return out


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    print(HEAD)
    for a in argv:
        print("\n".join(rows(a)))


if __name__ == "__main__":
    main(sys.argv[1:])
