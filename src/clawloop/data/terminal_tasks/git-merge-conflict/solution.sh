#!/bin/bash
cd site
git merge translations >/dev/null || true
printf 'Hello, world!\nHola, mundo!\nSee you soon\n' > greeting.txt
git add greeting.txt
git commit -q --no-edit
