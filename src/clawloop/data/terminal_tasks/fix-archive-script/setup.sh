#!/bin/bash
set -euo pipefail
chmod +x archive_reports.sh
mkdir -p reports/old
for f in "sales q1.csv" "sales q2.csv" inventory.csv "notes.txt" "old/2019.csv"; do printf 'data for %s\n' "$f" > "reports/$f"; done
