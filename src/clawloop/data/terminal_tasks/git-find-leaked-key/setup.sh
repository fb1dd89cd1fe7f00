#!/bin/bash
set -euo pipefail
git init -q -b main webapp
cd webapp
mkdir -p config src
printf 'PORT=8000\n' > config/app.env
printf 'console.log("hi")\n' > src/index.js
git add . && git commit -qm "Scaffold"
for i in 1 2 3; do printf 'step %s\n' "$i" >> src/index.js; git commit -qam "Work in progress $i"; done
printf 'API_KEY=sk_live_9f8e7d6c5b4a\nREGION=eu-west-1\n' > config/secrets.env
printf 'step 4\n' >> src/index.js
git add . && git commit -qm "Wire up payments"
for i in 5 6; do printf 'step %s\n' "$i" >> src/index.js; git commit -qam "Work in progress $i"; done
git rm -q config/secrets.env && git commit -qm "Remove local config"
printf 'API_KEY=\n' > config/example.env && git add . && git commit -qm "Document settings"
