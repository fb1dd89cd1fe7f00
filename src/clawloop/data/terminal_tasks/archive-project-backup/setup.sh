#!/bin/bash
set -euo pipefail
mkdir -p project/src/utils project/logs project/node_modules/left-pad project/docs
printf 'print("hello")\n' > project/src/app.py
printf 'def slug(s):\n    return s.lower()\n' > project/src/utils/text.py
printf 'SECRET=dev-only\n' > project/.env
printf '# Project\n' > project/README.md
printf 'guide\n' > project/docs/guide.md
printf 'started\n' > project/logs/app.log
printf 'old\n' > project/logs/app.1.log
printf 'debug\n' > project/src/debug.log
printf 'module.exports = 1\n' > project/node_modules/left-pad/index.js
