#!/bin/bash
set -euo pipefail
git init -q -b main reports
cd reports
printf 'def build():\n    return "reprot"\n' > generator.py
git add . && git commit -qm "Add report generator"
printf 'monthly\n' > schedule.txt
git add . && git commit -qm "Add schedule"
printf 'def build():\n    return "report"\n' > generator.py
git commit -qam "Fix tpyo in reprot generatr"
printf '## 1.0.1\n- fix typo in report title\n' > CHANGELOG.md
