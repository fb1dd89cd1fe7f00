"""OpenClaw against `clawloop up`: latency per turn, prompt tokens per turn, store bytes per turn.

    .venv/bin/python bench/openclaw_latency.py [--profiles default lean] [--sessions 1] [--turns 3]

Needs `make openclaw`. For each profile (integrations/openclaw/openclaw.json, the default as OpenClaw
installs it; openclaw-lean.json, minimal tools, no skills, no bootstrap files) it starts a fresh
`clawloop up` (the shipped tiny model, default flags, as `make run`) on a free loopback port with its
own data dir, then runs `openclaw agent --local` for each turn in a home of its own, and prints one JSON
line per profile:

- `wall_s`: seconds of each `openclaw agent` command (OpenClaw's own start, its model calls, exit);
  the first is the first answer a new user waits for.
- `model_s`: seconds clawloop spent on the LLM calls of that turn (its request-time histogram's sum,
  before and after the turn), so `wall_s - model_s` is OpenClaw's own time.
- `calls`: LLM calls OpenClaw made in that turn (clawloop's request count).
- `prompt_tokens`, `types`, `sessions`: per stored turn, in arrival order, from the store after
  the server stopped; `linked`: turns with a next state.
- `store_bytes_per_turn`: the store file(s) after a clean stop, over the turns stored.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "integrations" / "openclaw"))
from openclaw_driver import OpenClaw, missing  # noqa: E402

from clawloop.store import open_store  # noqa: E402
from clawloop.users import Server  # noqa: E402

MESSAGES = ["What is 2+3?", "Thanks, that is right. What is 4+4?", "No, I meant 4*4, not 4+4.",
            "Thanks! What is 7+1?", "Great. What is 6-2?"]


def _request_totals(url: str) -> tuple[float, float]:
    count = total = 0.0
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("clawloop_request_seconds_count "):
            count = float(line.split()[-1])
        elif line.startswith("clawloop_request_seconds_sum "):
            total = float(line.split()[-1])
    return count, total


def run_profile(profile: str, sessions: int, turns: int, work: Path) -> dict:
    data = work / f"data-{profile}"
    server = Server([], str(data))
    rows = []
    try:
        oc = OpenClaw(work / f"openclaw-{profile}", server.url, profile=profile)
        for s in range(sessions):
            for i in range(turns):
                c0, t0 = _request_totals(server.url)
                wall, _ = oc.agent(f"bench-{s}", MESSAGES[i % len(MESSAGES)])
                c1, t1 = _request_totals(server.url)
                rows.append({"wall_s": round(wall, 1), "model_s": round(t1 - t0, 1), "calls": int(c1 - c0)})
    finally:
        server.stop()
    store = open_store(data / "clawloop.db")
    try:
        stored = sorted((t for _, ts in store.iter_sessions() for t in ts), key=lambda t: t.id)
    finally:
        store.close()
    size = sum(p.stat().st_size for p in data.glob("clawloop.db*"))
    return {"profile": profile, "turns": rows,
            "prompt_tokens": [len(t.prompt_ids) for t in stored], "types": [t.type for t in stored],
            "sessions": len({t.session_id for t in stored}), "linked": sum(t.next_state is not None for t in stored),
            "stored_turns": len(stored), "store_bytes_per_turn": size // max(1, len(stored))}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", nargs="+", default=["default", "lean"], choices=["default", "lean"])
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    if missing():
        print(missing(), file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="clawloop-openclaw-") as tmp:
        for profile in args.profiles:
            print(json.dumps(run_profile(profile, args.sessions, args.turns, Path(tmp))), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
