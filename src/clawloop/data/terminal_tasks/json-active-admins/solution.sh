#!/bin/bash
python3 - <<'EOF'
import json
users = json.load(open("users.json"))["users"]
active = [u for u in users if u["status"] == "active"]
json.dump(sorted(u["email"] for u in active if "admin" in u["roles"]), open("admin_emails.json", "w"), indent=2)
counts = {}
for u in active:
    counts[u["team"]["name"]] = counts.get(u["team"]["name"], 0) + 1
json.dump(counts, open("active_by_team.json", "w"), indent=2)
EOF
