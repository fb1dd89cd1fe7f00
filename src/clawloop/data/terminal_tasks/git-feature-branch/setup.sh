#!/bin/bash
set -euo pipefail
git init -q -b main api
cd api
printf 'def handler(req):\n    return {"ok": True}\n' > app.py
git add app.py && git commit -qm "Add handler"
printf '# API\n' > README.md
git add README.md && git commit -qm "Add README"
git checkout -q -b experiment
printf 'x = 1\n' > scratch.py && git add scratch.py && git commit -qm "Scratch work"
git checkout -q main
