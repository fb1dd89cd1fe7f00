#!/bin/bash
python3 - <<'EOF'
import sqlite3
db = sqlite3.connect("metrics.db")
db.execute("CREATE INDEX idx_events_user_time ON events(user_id, created_at)")
db.execute("CREATE VIEW daily_active_users AS SELECT substr(created_at, 1, 10) AS day, "
           "COUNT(DISTINCT user_id) AS users FROM events GROUP BY day")
db.commit()
EOF
