#!/bin/bash
set -euo pipefail
git init -q -b main service
cd service
printf 'DEBUG = False\nWORKERS = 4\n' > settings.py
printf 'def run():\n    pass\n' > app.py
git add . && git commit -qm "Initial service"
printf 'DEBUG = False\nWORKERS = 8\n' > settings.py
git commit -qam "Scale up workers"
printf 'DEBUG = True\nWORKERS = 8\nLOG_SQL = True\n' > settings.py
git commit -qam "Turn on debugging to chase the login bug"
printf 'def run():\n    print("running")\n' > app.py
git commit -qam "Log startup"
printf 'timeout: 30\n' > deploy.yaml
git add deploy.yaml && git commit -qm "Add deploy config"
