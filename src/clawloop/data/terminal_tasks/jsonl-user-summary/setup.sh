#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import json, random
rng = random.Random(29)
lines = []
for i in range(500):
    if i % 37 == 5:
        lines.append('{"user": "u3", "type": "page_view", "ts": "2024-07-0')
        continue
    if i % 53 == 7:
        lines.append("<<garbage>>")
        continue
    e = {"user": f"u{rng.randint(1, 9)}", "type": rng.choice(["page_view", "click", "page_view", "purchase"]),
         "ts": f"2024-07-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z",
         "duration_ms": rng.randint(10, 9000)}
    lines.append(json.dumps(e))
open("events.jsonl", "w").write("\n".join(lines) + "\n")
EOF
