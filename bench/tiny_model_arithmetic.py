"""How the tiny model adds, by operand layout, and what it says to "What is 12+7?".

    .venv/bin/python bench/tiny_model_arithmetic.py [MODEL_DIR ...]

Greedy replies to 200 random additions per layout (2+1, 1+2 and 2+2 digits,
canonical "What is a+b?" phrasing; most pairs were seen in training, so this
measures reading the layout, not generalisation: the build's held-out figure
does that), and 100 replies to "What is 12+7?" sampled at temperature 1.
Prints a table and, last, one JSON line. Default model: the cached tiny model.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

LAYOUTS = {"2+1": ((10, 99), (0, 9)), "1+2": ((0, 9), (10, 99)), "2+2": ((10, 99), (10, 99))}


def measure(model_dir: str, n: int = 200, samples: int = 100) -> dict[str, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clawloop.tinymodel import corpus
    from clawloop.tinymodel.build import generate_replies

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    rng = random.Random(0)
    out: dict[str, float] = {}
    for name, (ra, rb) in LAYOUTS.items():
        pairs = [(rng.randint(*ra), rng.randint(*rb)) for _ in range(n)]
        prompts = [{"messages": [{"role": "user", "content": f"What is {a}+{b}?"}]} for a, b in pairs]
        replies = generate_replies(model, tok, prompts, max_new_tokens=12)
        out[name] = sum(corpus.extract_answer(r) == str(a + b) for r, (a, b) in zip(replies, pairs)) / n
    replies = generate_replies(model, tok, [{"messages": [{"role": "user", "content": "What is 12+7?"}]}] * samples,
                               max_new_tokens=12, sample_seed=0)
    out["12+7 sampled"] = sum(corpus.extract_answer(r) == "19" for r in replies) / samples
    return out


def main(argv: list[str] | None = None) -> int:
    dirs = (argv if argv is not None else sys.argv[1:]) or []
    if not dirs:
        from clawloop.tinymodel.build import build_tiny_model

        dirs = [str(build_tiny_model())]  # the cached one, built if missing
    rows = []
    print(f"{'model':<40} " + " ".join(f"{k:>13}" for k in (*LAYOUTS, "12+7 sampled")))
    for d in dirs:
        r = measure(d)
        rows.append({"model": d, **r})
        print(f"{d[-40:]:<40} " + " ".join(f"{v:>13.0%}" for v in r.values()))
    print(json.dumps({"bench": "tiny_model_arithmetic", "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
