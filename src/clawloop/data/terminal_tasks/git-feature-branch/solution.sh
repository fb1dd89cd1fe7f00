#!/bin/bash
cd api
git checkout -q -b feature/rate-limit main
cat > ratelimit.py <<'EOF'
def allow(count, limit):
    return count < limit
EOF
git add ratelimit.py
git commit -qm "Add rate limiter"
