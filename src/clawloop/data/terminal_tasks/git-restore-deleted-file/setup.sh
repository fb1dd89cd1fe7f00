#!/bin/bash
set -euo pipefail
git init -q -b main handbook
cd handbook
mkdir -p docs
printf '# API\n\nGET /items\n' > docs/api.md
printf '# Intro\n' > docs/intro.md
git add . && git commit -qm "Start handbook"
printf '# API\n\nGET /items\nPOST /items\n' > docs/api.md
git commit -qam "Document POST"
printf '# API\n\nGET /items\nPOST /items\nDELETE /items/{id}\n' > docs/api.md
git commit -qam "Document DELETE"
git rm -q docs/api.md
printf '# Intro\n\nWelcome.\n' > docs/intro.md
git add . && git commit -qm "Reorganize docs"
printf '# FAQ\n' > docs/faq.md && git add . && git commit -qm "Add FAQ"
