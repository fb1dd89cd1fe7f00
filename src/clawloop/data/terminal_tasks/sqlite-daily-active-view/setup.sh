#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import random, sqlite3
rng = random.Random(17)
db = sqlite3.connect("metrics.db")
db.execute("CREATE TABLE events (id INTEGER PRIMARY KEY, user_id INTEGER NOT NULL, kind TEXT NOT NULL, created_at TEXT NOT NULL)")
for i in range(1, 1201):
    day = rng.randint(1, 9)
    db.execute("INSERT INTO events VALUES (?, ?, ?, ?)", (i, rng.randint(1, 25 + 5 * day), rng.choice(["login", "view", "buy"]),
               f"2024-05-{day:02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"))
db.commit()
EOF
