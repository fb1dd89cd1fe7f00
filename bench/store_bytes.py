"""Store bytes per turn on a long agent conversation, before and after prompts were stored once
(issue #28 item 3), side by side in one run.

    .venv/bin/python bench/store_bytes.py                        # 28 242-token system prompt, 20 turns
    .venv/bin/python bench/store_bytes.py --turns 40 --system-tokens 7125

The conversation is OpenClaw's shape, synthesised: its default prompt (a ~39 k-character system
prompt, ~6 k characters of tool schemas: 28 242 tokens with the tiny tokenizer) and then, every
turn, a short user message, ~150 sampled tokens with their logprobs, and the whole conversation
resent. Ids are drawn from the tiny model's vocabulary (what `make run` serves: up to 4 digits in
JSON). Each turn is written as capture writes it (a pending row at the request's start, the
response at its end, `prompt_stored`), with a flush after each.

"Before" is the store at BEFORE (the commit before chunks.py), run from `git archive` of that
commit in a child process; "after" is this working tree's, in another child. Bytes are SQLite
pages in use after a WAL checkpoint (page_count - freelist_count, times page_size), measured after
every turn; the file size after close is printed too. Also: seconds to write a turn, and to read
the session back (`session_turns`).

Prints a table and, last, one JSON line with every number.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from revision import unpack_source  # bench/revision.py (this folder is sys.path[0])

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BEFORE = "db8563a232808bd0c48c6ea66f7b0d0d0bfd35f9"
"""The last commit whose store kept every turn's prompt, messages and tools whole."""

VOCAB = 1182  # the tiny model's


def conversation(turns: int, system_tokens: int, seed: int = 0):
    """Yield the request of each turn: (messages, tools, prompt_ids, response_ids, response_logprobs, text)."""
    rng = random.Random(seed)
    words = "the agent reads files runs tools and answers the user with care about every step".split()
    system = " ".join(rng.choice(words) for _ in range(39_000 // 6))[:39_000]
    tools = [{"type": "function", "function": {
        "name": f"tool_{k}", "description": " ".join(rng.choice(words) for _ in range(40)),
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "n": {"type": "integer"}},
                       "required": ["path"]}}} for k in range(20)]
    prompt = [rng.randrange(3, VOCAB) for _ in range(system_tokens)]
    messages = [{"role": "system", "content": system}]
    for i in range(turns):
        user = {"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randrange(10, 60)))}
        messages = messages + [user]
        prompt = prompt + [rng.randrange(3, VOCAB) for _ in range(len(user["content"]) // 4 + 8)]
        resp = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(100, 200))]
        lps = [-rng.random() * 3 for _ in resp]
        text = " ".join(rng.choice(words) for _ in range(len(resp) // 2))
        yield list(messages), tools, list(prompt), resp, lps, text
        messages = messages + [{"role": "assistant", "content": text}]
        prompt = prompt + resp + [rng.randrange(3, VOCAB) for _ in range(4)]


def worker(db: str, turns: int, system_tokens: int) -> dict:
    """Write the conversation into a fresh store at `db` with whichever clawloop is on sys.path."""
    from clawloop.records import Turn
    from clawloop.store import SQLiteStore

    store = SQLiteStore(db)
    c = store._reader()

    def used() -> int:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages, free, size = (c.execute(f"PRAGMA {p}").fetchone()[0]
                             for p in ("page_count", "freelist_count", "page_size"))
        return (pages - free) * size

    empty = used()
    sizes, write_s, prompt_tokens = [], [], []
    for i, (msgs, tools, prompt, resp, lps, text) in enumerate(conversation(turns, system_tokens)):
        key = f"r{i}"
        t0 = time.perf_counter()
        store.begin_turn(Turn("s", i, messages=msgs, tools=tools, prompt_ids=prompt, finish_reason="pending",
                              trainable=False, request_id=key), key)
        store.finish_turns([Turn("s", i, messages=msgs, tools=tools, prompt_ids=prompt, response_ids=resp,
                                 response_logprobs=lps, response_text=text, request_id=key)], key, prompt_stored=True)
        store.flush()
        write_s.append(time.perf_counter() - t0)
        if i > 0:
            store.set_next_state("s", i - 1, msgs[-1]).result()
        sizes.append(used() - empty)
        prompt_tokens.append(len(prompt))
    t0 = time.perf_counter()
    got = store.session_turns("s")
    read_s = time.perf_counter() - t0
    assert len(got) == turns and got[-1].prompt_ids == prompt and got[-1].messages == msgs
    store.close()
    return {"bytes": sizes, "write_s": write_s, "read_s": read_s, "prompt_tokens": prompt_tokens,
            "file_bytes": os.path.getsize(db)}


def run(src: Path, db: Path, args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src)}
    code = (f"import json, sys; sys.path.insert(0, {str(HERE)!r}); import store_bytes; "
            f"print(json.dumps(store_bytes.worker({str(db)!r}, {args.turns}, {args.system_tokens})))")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=db.parent)
    if p.returncode != 0:
        raise SystemExit(f"{src}: {p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--system-tokens", type=int, default=28_242)
    ap.add_argument("--before", default=BEFORE, help="git revision whose store is 'before'")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="store-bytes-"))
    unpack_source(args.before, tmp / "before")
    before = run(tmp / "before" / "src", tmp / "before.db", args)
    after = run(ROOT / "src", tmp / "after.db", args)
    n = args.turns
    print(f"{n} turns, system prompt {args.system_tokens} tokens; prompt at the last turn {after['prompt_tokens'][-1]}")
    print("| | before | after | before / after |")
    print("|---|---|---|---|")

    def row(name: str, b: float, a: float, unit: str = "") -> None:
        print(f"| {name} | {b:,.0f}{unit} | {a:,.0f}{unit} | {b / a:.1f}x |" if a else f"| {name} | {b} | {a} | |")

    bb, ab = before["bytes"], after["bytes"]
    row("bytes after turn 1", bb[0], ab[0])
    row(f"bytes after turn {n}", bb[-1], ab[-1])
    row("bytes per turn (total / turns)", bb[-1] / n, ab[-1] / n)
    row(f"bytes added by turns 2-{n} per turn", (bb[-1] - bb[0]) / (n - 1), (ab[-1] - ab[0]) / (n - 1))
    half = n // 2
    row(f"bytes added per turn, turns {half + 1}-{n}", (bb[-1] - bb[half - 1]) / (n - half),
        (ab[-1] - ab[half - 1]) / (n - half))
    row("file after close", before["file_bytes"], after["file_bytes"])
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"| write a turn, median | {med(before['write_s']) * 1e3:.1f} ms | {med(after['write_s']) * 1e3:.1f} ms | |")
    print(f"| read the session back | {before['read_s'] * 1e3:.1f} ms | {after['read_s'] * 1e3:.1f} ms | |")
    print(json.dumps({"bench": "store_bytes", "turns": n, "system_tokens": args.system_tokens,
                      "before_rev": args.before, "before": before, "after": after, "ratio_total": bb[-1] / ab[-1],
                      "ratio_added_per_turn": (bb[-1] - bb[0]) / max(1, ab[-1] - ab[0])}))


if __name__ == "__main__":
    main()
