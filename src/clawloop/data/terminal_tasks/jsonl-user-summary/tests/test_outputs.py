import json
from pathlib import Path


def parsed():
    good, bad = [], 0
    for line in Path("events.jsonl").read_text().splitlines():
        try:
            good.append(json.loads(line))
        except ValueError:
            bad += 1
    return good, bad


def test_skipped_count():
    assert Path("skipped.txt").read_text().strip() == str(parsed()[1])


def test_summary():
    want = {}
    for e in parsed()[0]:
        s = want.setdefault(e["user"], {"events": 0, "first": e["ts"], "last": e["ts"], "view_ms": 0})
        s["events"] += 1
        s["first"], s["last"] = min(s["first"], e["ts"]), max(s["last"], e["ts"])
        s["view_ms"] += e["duration_ms"] if e["type"] == "page_view" else 0
    assert json.load(open("summary.json")) == want
