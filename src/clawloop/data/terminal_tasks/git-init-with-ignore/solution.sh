#!/bin/bash
cd project
git init -q -b main
printf 'build/\n*.pyc\n' > .gitignore
git add -A
git commit -qm "Initial commit"
