#!/bin/bash
set -euo pipefail
python3 - <<'EOF'
import json, random
rng = random.Random(23)
teams = [{"id": 1, "name": "platform"}, {"id": 2, "name": "payments"}, {"id": 3, "name": "growth"}, {"id": 4, "name": "legacy"}]
users = []
for i in range(60):
    team = rng.choice(teams)
    status = "inactive" if team["name"] == "legacy" else rng.choice(["active", "active", "suspended", "invited"])
    roles = rng.sample(["admin", "dev", "viewer", "billing"], rng.randint(0, 2))
    users.append({"id": i, "email": f"user{i:02d}@{team['name']}.example", "status": status, "roles": roles,
                  "team": team, "profile": {"name": f"User {i}", "tz": rng.choice(["UTC", "CET", "PST"])}})
json.dump({"exported_at": "2024-06-01T00:00:00Z", "users": users}, open("users.json", "w"), indent=2)
EOF
