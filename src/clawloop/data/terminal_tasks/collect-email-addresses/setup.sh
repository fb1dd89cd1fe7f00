#!/bin/bash
set -euo pipefail
mkdir -p mail/inbox mail/sent
cat > mail/inbox/001.eml <<'EOF'
From: Bob Smith <Bob.Smith@Example.com>
To: team@corp.example.org
Subject: Lunch?

Ping alice@corp.example.org, she knows. Or mail carol_ng+lists@mail.example.net.
EOF
cat > mail/inbox/002.eml <<'EOF'
From: "Dave" <dave@startup.io>
To: TEAM@corp.example.org
Cc: bob.smith@example.com

Reply to support@help-desk.example.com (not to noreply@startup.io).
EOF
cat > mail/sent/003.txt <<'EOF'
To: ops-alerts@corp.example.org
I spoke to Alice (alice@CORP.example.org) and to x.y-z@sub.domain.example.co.uk today.
Nothing else to report; the meeting is at 10 @ room 4.
EOF
