#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random
rng = random.Random(9)
levels = ["DEBUG", "INFO", "INFO", "INFO", "WARNING", "ERROR", "CRITICAL"]
msgs = ["request served", "cache miss for key user:42", "db timeout after 30s", "retrying job 17",
        "disk usage at 91%", "worker crashed", "ERROR budget reached", "connection reset by peer"]
out = []
t = 4 * 86400 + 13 * 3600 + 50 * 60
for _ in range(900):
    t += rng.randint(1, 9)
    d, s = divmod(t, 86400)
    lvl = rng.choice(levels)
    out.append(f"2024-03-{1 + d:02d} {s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d} {lvl:<8} [svc] {rng.choice(msgs)}")
out.insert(400, "2024-03-05 14:00:00 ERROR    [svc] boundary start")
out.insert(650, "2024-03-05 14:59:59 CRITICAL [svc] boundary end")
out.insert(300, "2024-03-04 14:30:00 ERROR    [svc] wrong day")
open("app.log", "w").write("\n".join(out) + "\n")
EOF
