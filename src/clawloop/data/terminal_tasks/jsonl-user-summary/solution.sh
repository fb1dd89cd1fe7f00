#!/bin/bash
python3 - <<'EOF'
import json
summary, skipped = {}, 0
for line in open("events.jsonl"):
    try:
        e = json.loads(line)
    except json.JSONDecodeError:
        skipped += 1
        continue
    s = summary.setdefault(e["user"], {"events": 0, "first": e["ts"], "last": e["ts"], "view_ms": 0})
    s["events"] += 1
    s["first"] = min(s["first"], e["ts"])
    s["last"] = max(s["last"], e["ts"])
    if e["type"] == "page_view":
        s["view_ms"] += e["duration_ms"]
json.dump(summary, open("summary.json", "w"), indent=2)
open("skipped.txt", "w").write(f"{skipped}\n")
EOF
